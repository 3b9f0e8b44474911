"""The NeuralSort mask of :mod:`softtopk.ops.neuralsort` as two Triton kernels (optional, CUDA),
and the label's row of its ranks (top-k cross-entropy's) as two more.

The torch path sorts the row, then builds every rank's logits from prefix sums and
``searchsorted`` (:mod:`softtopk.ops.neuralsort`'s formula), takes a softmax per rank, sums them
and puts the row back in its order: about twenty ops forward and twenty backward. Here one sort
is followed by one program per row that computes the same quantities in float64 (``searchsorted``
by bisection over the sorted row, the prefix sums by a scan), sums the ``k`` softmaxes and writes
the mask in the row's order; the backward kernel recomputes each rank's column and applies the
hand-written backward of the torch path (``α``, ``β`` and the prefix sums of ``α``). ``±inf``
entries follow the torch path's rule (``M`` and ``-M/2`` in the logits; a row with at most ``k``
entries above ``-inf`` selects them, with gradient 0); a NaN makes its row NaN. The label's
kernels compute the ranks' column of the label's item only (no rule for those rows: the ranks
have none), and the backward of that row alone.

Scope: an int ``k < n``, a float ``τ`` and rows of at most :data:`MAX_ENTRIES`;
:func:`~softtopk.ops.neuralsort.neuralsort_mask` and
:func:`~softtopk.ops.neuralsort.neuralsort_label_ranks` keep the torch path for a tensor ``τ``,
longer rows, the full ranks, under ``torch.compile`` and ``vmap`` and off CUDA
(:mod:`softtopk.ops.triton_gate`). The tests run the kernels under ``TRITON_INTERPRET=1`` on the
CPU against the torch path, values and gradients; on a GPU they are timed by
``benchmarks/bench_gpu.py`` (``benchmarks/results/gpu_runs.md``).
"""

from __future__ import annotations

import torch

from . import triton_gate
from ._function import Function
from .compute import sort_rows

MAX_ENTRIES = 2048  # a row held in one program


def _launch(x: torch.Tensor) -> dict:
    """The kernels' compile-time arguments for rows ``x`` (B, n)."""
    n = x.shape[-1]
    return {"STEPS": n.bit_length(), "W": 1 << max(4, (n - 1).bit_length()), "WIDE": x.dtype == torch.float64}


class TritonNeuralSort(Function):
    """``(x (B, n), position (B,) or None, τ, k, M)`` → the mask (B, n) for ``position`` None, else
    ``P[b, position[b], :k]`` (B, k), where each row's label lands (top-k cross-entropy's
    NeuralSort); and the sorted rows and their permutation, saved (``M`` the torch path's stand-in
    for ``+inf`` in the logits)."""

    @staticmethod
    def forward(x: torch.Tensor, position: torch.Tensor | None, tau: float, k: int, big: float):
        from . import neuralsort_kernels as kernels  # imports triton: only once a kernel runs

        ordered, order = sort_rows(x)
        ordered, order = ordered.contiguous(), order.contiguous()
        args: tuple[torch.Tensor, ...]
        if position is None:
            out = torch.empty_like(x)
            kernel, args = kernels.mask_forward, (ordered, order, out)
        else:
            out = x.new_empty((x.shape[0], k))
            kernel, args = kernels.label_forward, (ordered, order, position.contiguous(), out)
        if x.shape[0]:
            kernel[(x.shape[0],)](*args, x.shape[-1], k, tau, big, **_launch(x))
        return out, ordered, order

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, position, ctx.tau, ctx.k, ctx.big = inputs
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(output[1], output[2], position)

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, *_):
        from . import neuralsort_kernels as kernels

        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        ordered, order, position = ctx.saved_tensors
        grad_x = torch.empty_like(ordered)
        if ordered.shape[0]:
            label = position is not None
            kernels.backward[(ordered.shape[0],)](
                *(ordered, order, position.contiguous() if label else order, grad.contiguous(), grad_x),
                *(ordered.shape[-1], ctx.k, ctx.tau, ctx.big),
                **_launch(ordered),
                LABEL=label,
            )
        return grad_x, None, None, None, None


def usable(x: torch.Tensor, k: int, tau: object) -> bool:
    """Whether the NeuralSort mask of rows ``x`` runs on the kernels."""
    return triton_gate.usable(x, k, tau) and 0 < k < x.shape[-1] <= MAX_ENTRIES  # k an int first


def triton_mask(x: torch.Tensor, k: int, tau: float, big: float) -> torch.Tensor:
    """The NeuralSort mask of rows ``x`` (B, n) by the kernels, ``M = big``."""
    return TritonNeuralSort.apply(x, None, tau, k, big)[0]


def triton_label_ranks(x: torch.Tensor, position: torch.Tensor, k: int, tau: float, big: float) -> torch.Tensor:
    """``P[b, position[b], :k]`` (B, k) of rows ``x`` (B, n) by the kernels, ``M = big``."""
    return TritonNeuralSort.apply(x, position, tau, k, big)[0]
