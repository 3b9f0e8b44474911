"""Two sweeps of :mod:`softtopk.ops.sorting_networks` as Triton kernels (optional, CUDA), one
forward and one backward each: the label sweep, what top-k cross-entropy runs on its ``m``
selected scores, and the mask sweep, what ``soft_topk`` with a network runs.

The torch path dispatches about ten small ops per layer of the network, forward and backward
(a gather of the partner wires, the difference, the swap probability, the lerp, and in the
backward the weighted gradients and their partners' share). Here one program holds a few rows of
``W`` wires (``n`` rounded up to a power of 2) and runs every layer:

* label sweep: the forward relaxes the values with the label's one-hot row riding along and saves
  each layer's differences and swap probabilities; the backward sweeps the layers in reverse from
  the output wires;
* mask sweep: the forward relaxes the values, then sweeps the mask's column ``c_(l-1) = M_l c_l``
  back from the output wires, saving each layer's column; the backward sweeps the gradient
  forward (``r_l = M_l r_(l-1)``, ``∂L/∂α_l = r_l (c_l - c_l[p])``), then the values backward.

The formulas are the torch path's (``∂(α d)/∂d = α + d α'`` on the values, the riding row's
share ``e α'``, each partner's share ``(g - g_d)[p]``), in the rows' dtype, with ``atan`` in
float64.

Scope: the Cauchy swap (the default), a float steepness, an int ``k`` and rows of at most
:data:`MAX_WIRES` wires (label sweep; ``m = 16`` by default) or :data:`MAX_MASK_WIRES` (mask);
the sweeps keep the torch path for the other distributions, a per-row steepness, longer rows,
under ``torch.compile`` and ``vmap`` and off CUDA (:mod:`softtopk.ops.triton_gate`). The tests run
the kernels under ``TRITON_INTERPRET=1`` on the CPU against the torch path, values and gradients;
on a GPU they are timed by ``benchmarks/bench_gpu.py`` (``benchmarks/results/gpu_runs.md``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import triton_gate
from ._function import Function

MAX_WIRES = 64  # the label sweep holds (rows, wires, k) products in registers
MAX_MASK_WIRES = 1024  # the mask's sweeps hold a row of wires in a program
_ROW_ENTRIES = 128  # rows x wires per program (at least one row)


def _shape(n: int, k: int) -> tuple[int, int, int]:
    """(rows per program, wires W, ranks KW) for rows of ``n`` and ``k`` output ranks."""
    wires = triton_gate.lanes(n, 2)
    return max(1, _ROW_ENTRIES // wires), wires, triton_gate.lanes(k, 1)


class LabelStage(NamedTuple):
    """The label sweep's launches through one network, without autograd (:class:`TritonLabelSweep`
    and top-k cross-entropy's one-node path, :mod:`softtopk.ops.topk_ce_triton`, wrap them):
    ``partner``, ``sign`` (L, n) and ``out_wires`` (k,) from the network's plan, ``β`` its
    steepness, ``far`` the stand-in of the infinities."""

    partner: torch.Tensor
    sign: torch.Tensor
    out_wires: torch.Tensor
    beta: float
    far: float

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``P[b, position[b], :k]`` (B, k) of contiguous rows ``x`` (B, n), and what the backward
        reads: the differences, swap probabilities and riding-row differences ``(3, L, B, W)``."""
        from . import networks_kernels as kernels  # imports triton: only once a kernel runs

        rows, n = x.shape
        k, depth = self.out_wires.shape[0], self.partner.shape[0]
        per, wires, kw = _shape(n, k)
        out = x.new_empty((rows, k))
        saved = x.new_empty((3, depth, rows, wires))
        if rows:
            kernels.label_forward[(triton_grid(rows, per),)](
                *(x, position, self.partner, self.sign, self.out_wires, out, saved),
                *(rows, n, k, depth, rows * wires, self.beta, self.far),
                ROWS=per,
                W=wires,
                KW=kw,
            )
        return out, (saved,)

    def backward(
        self, grad: torch.Tensor, x: torch.Tensor, position: torch.Tensor, saved: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The rows' gradient (B, n) from the ranks' ``grad`` (B, k) (``position`` rides in ``saved``)."""
        from . import networks_kernels as kernels

        rows, n = x.shape
        k, depth = self.out_wires.shape[0], self.partner.shape[0]
        per, wires, kw = _shape(n, k)
        grad_x = torch.empty_like(x)
        if rows:
            kernels.label_backward[(triton_grid(rows, per),)](
                *(grad.contiguous(), x, self.partner, self.sign, self.out_wires, saved[0], grad_x),
                *(rows, n, k, depth, rows * wires, self.beta, self.far),
                ROWS=per,
                W=wires,
                KW=kw,
            )
        return grad_x


class TritonLabelSweep(Function):
    """``(x (B, n), position (B,), stage)`` → ``P[b, position[b], :k]`` (B, k) by the
    :class:`LabelStage`'s kernels, and the planes they save."""

    @staticmethod
    def forward(x, position, stage):
        out, (saved,) = stage.forward(x.contiguous(), position.contiguous())
        return out, saved

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, position, ctx.stage = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, position, output[1])

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, _saved):
        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None
        x, position, saved = ctx.saved_tensors
        return ctx.stage.backward(grad, x.contiguous(), position, (saved,)), None, None


def triton_grid(rows: int, per: int) -> int:
    """Programs for ``rows`` rows, ``per`` each."""
    return -(-rows // per)


def usable(x: torch.Tensor, k: object, params: dict, mode: str, wires: int, n: int | None = None) -> bool:
    """Whether a sweep of rows ``x`` (of ``n`` entries, if given: rows like ``x``) runs on the
    kernels: the Cauchy swap with a float steepness whose infinities saturate (``mode``), at most
    ``wires`` wires, and
    :func:`softtopk.ops.triton_gate.usable`'s device and context."""
    steepness = params["steepness"]
    if params["distribution"] != "cauchy" or mode != "stand-in" or isinstance(steepness, torch.Tensor):
        return False
    return (x.shape[-1] if n is None else n) <= wires and triton_gate.usable(x, k, float(steepness))


def label_stage(plan: tuple, steepness: float, far: float) -> LabelStage:
    """The label sweep's kernels through the network ``plan``
    (:func:`softtopk.ops.networks.network_plan`'s tuple)."""
    _, partner, sign, out_wires = plan[:4]
    return LabelStage(partner, sign[..., 0], out_wires, float(steepness), far)


def label_sweep(x: torch.Tensor, position: torch.Tensor, stage: LabelStage) -> torch.Tensor:
    """``P[b, position[b], :k]`` (B, k) of rows ``x`` (B, n) by the ``stage``'s kernels."""
    return TritonLabelSweep.apply(x, position, stage)[0]


class TritonNetworkMask(Function):
    """``(x (B, n), start (n,), partner (L, n), sign (L, n), β, far)`` → the mask (B, n), the row sums
    of the top-k ranks (``start`` the indicator of the output wires of ranks ``0..k-1``), and the
    saved differences, swap probabilities and reverse-sweep columns ``(L, B, W)`` each."""

    @staticmethod
    def forward(x, start, partner, sign, beta: float, far: float):
        from . import networks_kernels as kernels

        x = x.contiguous()
        rows, n = x.shape
        per, wires, _ = _shape(n, 1)
        mask = torch.empty_like(x)
        saved = x.new_empty((3, partner.shape[0], rows, wires))
        if rows:
            kernels.mask_forward[(triton_grid(rows, per),)](
                *(x, start, partner, sign, mask, saved),
                *(rows, n, partner.shape[0], rows * wires, beta, far),
                ROWS=per,
                W=wires,
            )
        return mask, saved

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _, partner, sign, ctx.beta, ctx.far = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, partner, sign, output[1])

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, _saved):
        from . import networks_kernels as kernels

        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        x, partner, sign, saved = ctx.saved_tensors
        x = x.contiguous()
        rows, n = x.shape
        per, wires, _ = _shape(n, 1)
        grad_x = torch.empty_like(x)
        if rows:
            scratch = torch.empty_like(saved[0])  # each layer's ∂L/∂α (the saved tensors stay as they are)
            kernels.mask_backward[(triton_grid(rows, per),)](
                *(grad.contiguous(), x, partner, sign, saved, scratch, grad_x),
                *(rows, n, partner.shape[0], rows * wires, ctx.beta, ctx.far),
                ROWS=per,
                W=wires,
            )
        return grad_x, None, None, None, None, None


def mask_sweep(x: torch.Tensor, k: int, plan: tuple, steepness: float, far: float) -> torch.Tensor:
    """The network mask (B, n) of rows ``x`` (B, n) through the network ``plan`` by the kernels
    (before :func:`softtopk.ops.sorting_networks.network_mask`'s rule for rows of infinities)."""
    _, partner, sign = plan[:3]
    return TritonNetworkMask.apply(x, plan[5][k], partner, sign[..., 0], float(steepness), far)[0]
