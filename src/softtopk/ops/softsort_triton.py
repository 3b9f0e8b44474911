"""The SoftSort mask of :mod:`softtopk.ops.softsort` as two Triton kernels (optional, CUDA).

The torch path builds the ``(B, k, n)`` distances of every entry to the ``k`` largest scores, a
softmax per rank and their sum: O(n k) memory and about ten ops each way. Here one ``torch.topk``
of ``k + 1`` values is followed by one program per row that passes over the row twice: each rank's
normaliser ``Z_r = Σ_i exp(-|x_i - t_r|/τ)`` (``t_r`` is an entry of the row, at distance 0: every
term is at most 1 and ``Z_r >= 1``, so no maximum is needed), then the mask
``Σ_r exp(-|x_i - t_r|/τ) / Z_r``. The backward kernel recomputes the weights ``P`` from the saved
``Z``: ``ḡ_r = Σ_i P_ri g_i``, ``w = P (g - ḡ_r) sign(x_i - t_r)/τ``, and ``∂x_i = -Σ_r w_ri``
plus ``Σ_i w_ri`` on the entry of ``t_r``, the torch path's backward. Memory O(n + k) per row.
``±inf`` and NaN follow the torch path: infinite scores as the dtype's largest finite magnitude
(an infinite distance weighs 0), a row with at most ``k`` entries above ``-inf`` selects them with
gradient 0, a NaN makes its row NaN.

Rows of many ranks or entries (``n k`` above :data:`ROW_WORK`) take the tiled kernels instead:
the rank sums by programs of ``RB`` ranks over :data:`CHUNK` entries, whose partial sums one
``sum`` adds, the entries' sums by programs of ``BLOCK`` entries over every rank; the backward
adds the ranks' own gradients (per block) and scatters them onto their entries. So a few long
rows, or a thousand ranks, spread over the whole GPU instead of one program per row, with memory
O(n k / BLOCK) per row for the backward's per-block sums.

Scope: the distance ``|·|`` (``power=1``, the default), an int ``k < n`` and a float ``τ``;
:func:`~softtopk.ops.softsort.softsort_mask` keeps the torch path for a tensor ``τ``, another
power, under ``torch.compile`` and ``vmap`` and off CUDA (:mod:`softtopk.ops.triton_gate`), and
the ranks (``soft_topk_ranks``, top-k cross-entropy) always take it. The tests run the kernels
under ``TRITON_INTERPRET=1`` on the CPU against the torch path, values and gradients; on a GPU
they are timed by ``benchmarks/bench_gpu.py`` (``benchmarks/results/gpu_runs.md``).
"""

from __future__ import annotations

import torch

from . import triton_gate
from ._function import Function
from .compute import topk_rows

ROW_WORK = 1 << 17  # n k of the rows one program takes each; above, the tiled kernels
CHUNK = 4096  # entries of a rank sum's program in the tiled kernels
TILE = 4096  # float32 entries of a program's (ranks, entries) tile; half as many in float64


def _launch(x: torch.Tensor, k: int) -> dict:
    """The kernels' tile: ``RB`` ranks (at most 16) by ``BLOCK`` entries."""
    ranks = triton_gate.rank_block(k)
    tile = TILE // (2 if x.dtype == torch.float64 else 1)
    return {"RB": ranks, "BLOCK": min(triton_gate.block_for(x.shape[-1]), tile // ranks)}


class TritonSoftSort(Function):
    """``(x (B, n), τ, k)`` → the mask (B, n), with what the backward recomputes from: the rows
    with ``±inf`` as finite stand-ins, their ``k + 1`` largest values, the positions of the ``k``
    largest and each rank's normaliser."""

    @staticmethod
    def forward(x: torch.Tensor, tau: float, k: int):
        from . import softsort_kernels as kernels  # imports triton: only once a kernel runs

        xs = x.nan_to_num(nan=float("nan")).contiguous()  # ±inf → ±max, NaN stays
        top, index = topk_rows(xs, k + 1)
        top, index = top.contiguous(), index[..., :k].contiguous()
        mask, (rows, n), low, launch = torch.empty_like(xs), xs.shape, torch.finfo(xs.dtype).min, _launch(xs, k)
        if rows and _tiled(xs, k):
            z = _rank_sums(kernels, xs, top, xs, xs, tau, k)
            kernels.mask_entries[(rows, -(-n // launch["BLOCK"]))](xs, top, z, mask, n, k, tau, low, **launch)
        else:
            z = xs.new_empty((rows, k))
            if rows:
                kernels.mask_forward[(rows,)](xs, top, z, mask, n, k, tau, low, **launch)
        return mask, xs, top, index, z

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, ctx.tau, ctx.k = inputs
        _, xs, top, index, z = output
        ctx.tiled = _tiled(xs, ctx.k)  # the forward's layout (ROW_WORK may change before the backward)
        ctx.mark_non_differentiable(xs, top, index, z)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(xs, top, index, z)

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, *_):
        from . import softsort_kernels as kernels

        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None
        xs, top, index, z = ctx.saved_tensors
        grad_x = torch.empty_like(xs)
        if xs.shape[0] and ctx.tiled:
            _tiled_backward(kernels, xs, top, index, z, grad.contiguous(), grad_x, ctx.tau, ctx.k)
        elif xs.shape[0]:
            low = torch.finfo(xs.dtype).min
            kernels.mask_backward[(xs.shape[0],)](
                *(xs, top, index, z, grad.contiguous(), grad_x),
                *(xs.shape[-1], ctx.k, ctx.tau, low),
                **_launch(xs, ctx.k),
            )
        return grad_x, None, None


def _tiled(xs: torch.Tensor, k: int) -> bool:
    """Whether rows ``xs`` take the tiled kernels (module docstring)."""
    return xs.shape[-1] * k > ROW_WORK


def _rank_sums(kernels, xs, top, z, g, tau: float, k: int) -> torch.Tensor:
    """``Z_r`` (B, k) (``g`` is ``xs``: unread), or ``ḡ_r`` (``g`` the mask's gradient, ``z`` the
    normalisers), by the tiled kernels: each chunk's share, then their sum."""
    n, launch = xs.shape[-1], _launch(xs, k)
    chunk, chunks = triton_gate.chunking(n, CHUNK)
    parts = xs.new_empty((xs.shape[0], chunks, k))
    grid = (xs.shape[0], -(-k // launch["RB"]), chunks)
    low = torch.finfo(xs.dtype).min
    kernels.rank_parts[grid](xs, top, z, g, parts, n, k, tau, low, GRAD=g is not xs, CHUNK=chunk, **launch)
    return parts.sum(1) if parts.shape[1] > 1 else parts.view(parts.shape[0], k)


def _tiled_backward(kernels, xs, top, index, z, grad, grad_x, tau: float, k: int) -> None:
    """Writes the rows' gradient into ``grad_x`` by the tiled kernels."""
    n, launch = xs.shape[-1], _launch(xs, k)
    mean = _rank_sums(kernels, xs, top, z, grad, tau, k)
    blocks = -(-n // launch["BLOCK"])
    cols = xs.new_empty((xs.shape[0], blocks, k))
    low = torch.finfo(xs.dtype).min
    kernels.grad_entries[(xs.shape[0], blocks)](xs, top, z, mean, grad, grad_x, cols, n, k, tau, low, **launch)
    grad_x.scatter_add_(-1, index, cols.sum(1))  # each t_r's gradient onto its entry


def usable(x: torch.Tensor, k: int, tau: object) -> bool:
    """Whether the SoftSort mask of rows ``x`` runs on the kernels (``triton_gate.usable`` first: it
    checks that ``k`` is an int before the sizes compare it)."""
    return triton_gate.usable(x, k, tau) and 0 < k < x.shape[-1]


def triton_mask(x: torch.Tensor, k: int, tau: float) -> torch.Tensor:
    """The SoftSort mask of rows ``x`` (B, n) by the kernels."""
    return TritonSoftSort.apply(x, tau, k)[0]
