"""The Laplace mask of :mod:`softtopk.ops.lapsum` as two fused Triton kernels (optional, CUDA).

The torch path is the reference and the path on every other device. Here one ``torch.topk`` of
``K = 2k`` candidates is followed by one program per row that

1. reads the candidates and solves the threshold ``t'`` exactly as ``lapsum._roots`` does (the
   prefix sums ``P_j`` and suffix sums ``Q_j`` of ``e^{∓a}`` in float64, the root
   ``½ log(Q/P) - asinh((k - j)/√(PQ))`` of each segment, the segment that holds it),
2. sums the rest of the row in one pass, and
3. writes the mask ``F(z)`` and ``d = F'(z)/τ`` with ``z = (y - ref)/τ - t'`` in a second pass:

``topk`` and one kernel forward, one kernel backward (``d ⊙ (g - Σ d g / Σ d)``, two passes over
the row in one program), where the torch path dispatches tens of small ops. The ``±inf`` rows
follow :mod:`softtopk._extended` as in the torch path: scores are clamped to the finite range, so
degenerate rows solve as ties at its ends and get ``d = 0``.

Scope: an int ``k`` and a float ``τ`` (the common case); :func:`lapsum_mask` keeps the torch
path for a tensor ``k`` or ``τ``, under ``torch.compile`` (Inductor fuses that path itself) and
under ``vmap``. They run by default wherever they can (:mod:`softtopk.ops.triton_gate`: an NVIDIA
GPU of compute capability 8.0 or more with triton installed; ``SOFTTOPK_TRITON=0`` turns them
off): ``benchmarks/bench_gpu.py`` measured them faster than the
torch path, forward and backward, at every mask shape it times (``benchmarks/results/gpu.md``).
The tests run them under ``TRITON_INTERPRET=1`` on the CPU against the torch path, values and
gradients, and compiled on a GPU where one is lent (``benchmarks/run_gpu.sh``).
"""

from __future__ import annotations

import torch

from ._function import Function
from .triton_gate import block_for


class ImplicitMask(Function):
    """A mask whose forward returns ``(mask, d)``, ``d`` its slope on the row, and whose threshold
    keeps each row's sum at ``k``: the backward is ``d ⊙ (g - Σ d g / Σ d)`` per row, one kernel
    (the Laplace mask's, and the sparse mask's of :mod:`softtopk.ops.sparse_triton`); only the
    first input, the rows, gets a gradient, and only once (a second derivative raises; none is
    promised on any path)."""

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output[1])
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(output[1])
        ctx.inputs = len(inputs)

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises instead of being 0
    def backward(ctx, grad: torch.Tensor, _d):
        return implicit_backward(ctx, grad, _rows_backward)


def implicit_backward(ctx, grad: torch.Tensor | None, rows_backward) -> tuple[torch.Tensor | None, ...]:
    """:class:`ImplicitMask`'s backward with ``rows_backward(d, grad) -> d ⊙ (g - Σ d g / Σ d)``
    (a Triton kernel here, a numba one in :mod:`softtopk.ops.lapsum_numba`)."""
    (d,) = ctx.saved_tensors
    rest = (None,) * (ctx.inputs - 1)
    if grad is None or not ctx.needs_input_grad[0]:
        return (None, *rest)
    return (rows_backward(d, grad), *rest)


def _rows_backward(d: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    from . import lapsum_kernels as kernels

    out = torch.empty(d.shape, dtype=grad.dtype, device=d.device)
    if d.shape[0]:
        kernels.mask_backward[(d.shape[0],)](
            d, grad.contiguous(), out, d.shape[1], torch.finfo(d.dtype).tiny, BLOCK=block_for(d.shape[1])
        )
    return out


class TritonLaplaceMask(ImplicitMask):
    """``lapsum._LaplaceMask`` for an int ``k`` and a float ``τ``: ``(x (B, n), τ, k, K, negate,
    hard, C, floor)`` → the mask (B, n) and the kernels' ``d``, saved for the backward."""

    @staticmethod
    def forward(x: torch.Tensor, tau: float, k: int, big: int, negate: bool, hard: int, clamp: float, floor: float):
        from . import lapsum_kernels as kernels  # imports triton: only once a kernel runs

        x = x.contiguous()
        rows, n = x.shape
        vals = x.topk(big, -1, largest=not negate).values.contiguous()
        mask, d = torch.empty_like(x), torch.empty_like(x)
        info = torch.finfo(x.dtype)
        if rows:
            kernels.mask_forward[(rows,)](
                x,
                vals,
                mask,
                d,
                n,
                big,
                k,
                tau,
                info.min,
                info.max,
                NEGATE=negate,
                KB=1 << big.bit_length(),
                BLOCK=block_for(n),
                C=clamp,
                FLOOR=floor,
            )  # KB: a power of 2 > big
        return hard_forward(x, mask, hard), d


def hard_forward(x: torch.Tensor, mask: torch.Tensor, hard: int) -> torch.Tensor:
    """``mask``, or for ``hard > 0`` the k-hot mask of ``torch.topk(x, hard)`` (the soft gradient)."""
    return torch.zeros_like(x).scatter_(-1, x.topk(hard, -1).indices, 1.0) if hard else mask


def kernel_mask(
    x: torch.Tensor, k: int, tau: float, *, hard: bool, clamp: float, floor: float, fn=TritonLaplaceMask
) -> torch.Tensor:
    """The Laplace mask of rows ``x`` (B, n) for ``0 < k < n`` by the kernels of ``fn`` (the
    complement ``1 - m(-x, n - k)`` for ``k > n/2``, as the torch path); ``clamp`` and ``floor``
    are the torch path's constants of the solve."""
    return fn.apply(x, tau, *candidates(x.shape[-1], k), k if hard else 0, clamp, floor)[0]


def candidates(n: int, k: int) -> tuple[int, int, bool]:
    """``(k', K, negate)`` for a mask of ``k`` of ``n``: the ``K`` candidates of ``k'`` (``k`` itself,
    or ``n - k`` of ``-x`` for the complement, ``negate``, when ``k > n/2``)."""
    return (n - k, min(2 * (n - k), n), True) if 2 * k > n else (k, 2 * k, False)
