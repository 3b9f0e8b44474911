"""The networks' label sweep of :mod:`softtopk.ops.sorting_networks` as two Triton kernels
(optional, CUDA): what top-k cross-entropy runs on its ``m`` selected scores.

The torch path dispatches about ten small ops per layer of the network, forward and backward
(a gather of the partner wires, the difference, the swap probability, the lerp, and in the
backward the weighted gradients and their partners' share). Here one program holds a few rows of
``W`` wires (``n`` rounded up to a power of 2) in registers and runs every layer: the forward
relaxes the values with the label's one-hot row riding along and saves each layer's differences
and swap probabilities; the backward sweeps the layers in reverse from the output wires. The
formulas are the torch path's (``∂(α d)/∂d = α + d α'`` on the values, the riding row's share
``e α'``, each partner's share ``(g - g_d)[p]``), in the rows' dtype, with ``atan`` in float64.

Scope: the Cauchy swap (the default), a float steepness and rows of at most :data:`MAX_WIRES`
wires (``m = 16`` by default), an int ``k``; :func:`softtopk.ops.sorting_networks.network_label_ranks`
keeps the torch path for the other distributions, a per-row steepness, longer rows, under
``torch.compile`` and ``vmap`` and off CUDA (:mod:`softtopk.ops.triton_gate`). The tests run the
kernels under ``TRITON_INTERPRET=1`` on the CPU against the torch path, values and gradients.
"""

from __future__ import annotations

import torch

from . import triton_gate
from ._function import Function

MAX_WIRES = 64  # the kernels hold (rows, wires, k) products in registers
_ROW_ENTRIES = 128  # rows x wires per program


def _shape(n: int, k: int) -> tuple[int, int, int]:
    """(rows per program, wires W, ranks KW) for rows of ``n`` and ``k`` output ranks."""
    wires = 1 << max(1, (n - 1).bit_length())
    return max(1, _ROW_ENTRIES // wires), wires, 1 << max(0, (k - 1).bit_length())


class TritonLabelSweep(Function):
    """``(x (B, n), position (B,), partner (L, n), sign (L, n), out_wires (k,), β, far)`` →
    ``P[b, position[b], :k]`` (B, k) and the saved differences, swap probabilities and riding-row
    differences ``(L, B, W)`` each."""

    @staticmethod
    def forward(x, position, partner, sign, out_wires, beta: float, far: float):
        from . import networks_kernels as kernels  # imports triton: only once a kernel runs

        x = x.contiguous()
        rows, n = x.shape
        k, depth = out_wires.shape[0], partner.shape[0]
        per, wires, kw = _shape(n, k)
        out = x.new_empty((rows, k))
        saved = x.new_empty((3, depth, rows, wires))
        if rows:
            kernels.label_forward[(triton_grid(rows, per),)](
                *(x, position.contiguous(), partner, sign, out_wires, out, saved[0], saved[1], saved[2]),
                *(rows, n, k, depth, rows * wires, beta, far),
                ROWS=per,
                W=wires,
                KW=kw,
            )
        return out, saved

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _, partner, sign, out_wires, ctx.beta, ctx.far = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, partner, sign, out_wires, output[1])

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, _saved):
        from . import networks_kernels as kernels

        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None, None
        x, partner, sign, out_wires, saved = ctx.saved_tensors
        x = x.contiguous()
        rows, n = x.shape
        k, depth = out_wires.shape[0], partner.shape[0]
        per, wires, kw = _shape(n, k)
        grad_x = torch.empty_like(x)
        if rows:
            kernels.label_backward[(triton_grid(rows, per),)](
                *(grad.contiguous(), x, partner, sign, out_wires, saved[0], saved[1], saved[2], grad_x),
                *(rows, n, k, depth, rows * wires, ctx.beta, ctx.far),
                ROWS=per,
                W=wires,
                KW=kw,
            )
        return grad_x, None, None, None, None, None, None


def triton_grid(rows: int, per: int) -> int:
    """Programs for ``rows`` rows, ``per`` each."""
    return -(-rows // per)


def usable(x: torch.Tensor, k: object, params: dict, mode: str) -> bool:
    """Whether the label sweep of rows ``x`` runs on the kernels: the Cauchy swap with a float
    steepness whose infinities saturate (``mode``), at most :data:`MAX_WIRES` wires, and
    :func:`softtopk.ops.triton_gate.usable`'s device and context."""
    steepness = params["steepness"]
    if params["distribution"] != "cauchy" or mode != "stand-in" or isinstance(steepness, torch.Tensor):
        return False
    return x.shape[-1] <= MAX_WIRES and triton_gate.usable(x, k, float(steepness))


def label_sweep(x: torch.Tensor, position: torch.Tensor, plan: tuple, steepness: float, far: float) -> torch.Tensor:
    """``P[b, position[b], :k]`` (B, k) of rows ``x`` (B, n) through the network ``plan``
    (:func:`softtopk.ops.sorting_networks._plan`'s tuple) by the kernels."""
    _, partner, sign, out_wires = plan[:4]
    return TritonLabelSweep.apply(x, position, partner, sign[..., 0], out_wires, float(steepness), far)[0]
