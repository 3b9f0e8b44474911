"""The smooth top-k SVM's rows of :mod:`softtopk.ops.svm_subsets` as two Triton kernels (optional,
CUDA): one program per row computes the loss, and one its gradient (recomputing the row's
polynomials), in float64, where the torch path dispatches about fifty ops forward and forty
backward (:mod:`softtopk.ops.svm_kernels` has the formulas, which are the torch path's).

Scope: ``k <= SUBSET_K``, float ``τ`` and ``α``, rows of at most :data:`MAX_ENTRIES` classes;
:func:`softtopk.ops.svm_rows.smooth_topk_svm_rows` keeps the torch path for longer rows, under
``torch.compile`` and ``vmap`` and off CUDA (:mod:`softtopk.ops.triton_gate`). ``±inf`` and NaN
follow the torch path (the limits of :func:`softtopk.ops.svm_rows.extended_svm_rows`). The tests
run the kernels under ``TRITON_INTERPRET=1`` on the CPU against the torch path, values and
gradients; on a GPU they are timed by ``benchmarks/bench_gpu.py`` (``benchmarks/results/gpu_runs.md``).
"""

from __future__ import annotations

import torch

from . import triton_gate
from ._function import Function
from .svm_subsets import FAR, SOFTPLUS_LINEAR, SUBSET_K

MAX_ENTRIES = 4096  # a row held in one program


def _launch(x: torch.Tensor, k: int) -> dict:
    """The kernels' compile-time arguments for rows ``x`` (R, C)."""
    width = triton_gate.lanes(x.shape[-1])
    return {"K": k, "KP": 1 << k.bit_length(), "W": width, "FAR": FAR, "LINEAR": SOFTPLUS_LINEAR}


class TritonSmoothTopKRows(Function):
    """``(logits (R, C), label (R,), k, τ, α)`` → the smooth top-k SVM loss of each row (R,)."""

    @staticmethod
    def forward(logits: torch.Tensor, label: torch.Tensor, k: int, tau: float, alpha: float):
        from . import svm_kernels as kernels  # imports triton: only once a kernel runs

        loss = logits.new_empty(logits.shape[0])
        if logits.shape[0]:
            kernels.forward[(logits.shape[0],)](
                logits, label, loss, logits.shape[1], tau, alpha, torch.finfo(logits.dtype).max, **_launch(logits, k)
            )
        return loss

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        logits, label, ctx.k, ctx.tau, ctx.alpha = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, label)

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad):
        from . import svm_kernels as kernels

        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        logits, label = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        if logits.shape[0]:
            kernels.backward[(logits.shape[0],)](
                *(logits, label, grad.contiguous(), grad_logits, logits.shape[1]),
                *(ctx.tau, ctx.alpha, torch.finfo(logits.dtype).max),
                **_launch(logits, ctx.k),
            )
        return grad_logits, None, None, None, None


def usable(logits: torch.Tensor, k: int, tau: object, alpha: object) -> bool:
    """Whether the smooth top-k SVM's rows ``logits`` (R, C) run on the kernels."""
    fits = logits.shape[-1] <= MAX_ENTRIES and 0 < k <= SUBSET_K and isinstance(alpha, float)
    return fits and triton_gate.usable(logits, k, tau)


def triton_rows(logits: torch.Tensor, label: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """The smooth top-k SVM loss ``(R,)`` of rows ``logits`` (R, C) with labels ``label`` (R,)."""
    return TritonSmoothTopKRows.apply(logits.contiguous(), label.contiguous(), k, tau, alpha)
