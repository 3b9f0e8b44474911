"""The noised top-k hinge of :mod:`softtopk.losses.noised` as two Triton kernels (optional, CUDA):
one program a row forms the row's noised scores from its standard draws, takes each draw's
``(k+1)``-th largest and the hinge of their mean, and one more writes the row's gradient, where
the torch path (:class:`softtopk.ops.noised_hinge.NoisedHinge`, after the draws' scaling) launches
about ten ops forward and eight backward (:mod:`softtopk.ops.noised_kernels` has the formulas).

Scope: the loss's own draws (a caller's ``noise`` keeps the torch path, whose roundings are
pytopk's op for op), rows whose ``C x S`` block fits a program (:data:`MAX_BLOCK`), on CUDA outside
``torch.compile`` and ``vmap`` (:mod:`softtopk.ops.triton_gate`). The draws are the torch path's;
the kernel may round ``s + ε Z`` as one fused multiply-add and sums the mean in its own order, so
values may differ from it in the last bits. The tests run the kernels under ``TRITON_INTERPRET=1``
on the CPU against the torch path (``tests/test_noised_triton.py``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import reduce_triton, triton_gate
from ._function import Function
from .compute import constant

MAX_BLOCK = 1 << 14  # classes x draws a program holds


def _widths(classes: int, samples: int) -> tuple[int, int]:
    return triton_gate.lanes(classes), triton_gate.lanes(samples, 2)


def usable(logits: torch.Tensor, samples: int) -> bool:
    """Whether the hinge of rows ``logits`` (R, C) with ``samples`` draws runs on the kernels."""
    width, draws = _widths(logits.shape[-1], samples)
    return triton_gate.usable(logits) and width * draws <= MAX_BLOCK


class OwnDraws(NamedTuple):
    """A loss's own standard draws (R, C, S) (float32) and their scale ``epsilon``, which the
    forward kernel applies."""

    draws: torch.Tensor
    epsilon: float


def hinge(
    logits: torch.Tensor,
    label: torch.Tensor,
    noise: torch.Tensor,
    epsilon: float,
    margins: torch.Tensor | float,
    scale: float | None,
    k: int,
    kept: torch.Tensor,
    reduction: str = "none",
) -> torch.Tensor:
    """``relu(scale * (margin_y + top_{k+1,eps}(s) - s_y))`` of rows ``logits`` (R, C) with labels
    ``label`` (R,) and standard draws ``noise`` (R, C, S) (float32), 0 where not ``kept``;
    ``margins`` per class (C,) or one float, ``scale`` None for 1; with ``reduction`` ``'sum'`` or
    ``'mean'``, their sum or their mean over the kept rows, by one more kernel
    (:mod:`softtopk.ops.reduce_triton`)."""
    # per-class margins stay in their dtype: the kernel rounds the label's to the rows' as it loads it
    if isinstance(margins, torch.Tensor):
        margin = margins.to(logits.device).contiguous()
    else:
        margin = constant((margins,), logits)
    draws = OwnDraws(noise.contiguous(), epsilon)
    rows = (logits.contiguous(), label.contiguous(), draws, margin, scale, k, kept.contiguous())
    return TritonNoisedHinge.apply(*rows, reduction)[0]


class TritonNoisedHinge(Function):
    """:class:`~softtopk.ops.noised_hinge.NoisedHinge` on the kernels: ``(logits (R, C), label (R,),
    OwnDraws, margin (C,) per class or (1,), scale or None, k, kept (R,), reduction)`` -> the hinge
    of each row (R,) or its reduction (0-dim), each draw's class (R, S), and what the backward reads
    (the rows' hinge, reduced; and each kept row's weight in the reduction); the gradient of
    ``logits`` only."""

    @staticmethod
    def forward(logits, label, noise, margin, scale, k, kept, reduction):
        from . import noised_kernels as kernels  # imports triton: only once a kernel runs

        rows, classes = logits.shape
        samples = noise.draws.shape[-1]
        used = samples if noise.epsilon else 1  # epsilon = 0: the exact (k+1)-th value, one draw
        loss = logits.new_empty(rows)
        index = label.new_empty((rows, used), dtype=torch.int64)
        if rows:
            width, draws = _widths(classes, used)
            kernels.hinge_forward[(rows,)](
                logits,
                noise.draws,
                label,
                margin,
                kept,
                loss,
                index,
                classes,
                samples,
                used,
                float(noise.epsilon),
                1.0 if scale is None else float(scale),
                2.0 ** -math.ceil(math.log2(used)),
                MARGIN_STRIDE=int(margin.shape[0] > 1),
                KTH=k + 1,
                W=width,
                SP=draws,
                num_warps=4 if width * draws <= 4096 else 8,
            )
        if reduction == "none":
            return loss, index
        return (*reduce_triton.reduce_rows(loss, kept, reduction == "mean"), index, loss)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        logits, label, *_, ctx.scale, _, _, reduction = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        if reduction == "none":
            ctx.save_for_backward(label, output[1], output[0], None)
        else:
            ctx.save_for_backward(label, output[2], output[3], output[1])
        ctx.classes = logits.shape[1]

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, *_unused):
        from . import noised_kernels as kernels

        if grad is None:
            return (None,) * 8
        label, index, loss, weight = ctx.saved_tensors
        rows, used = index.shape
        grad_logits = loss.new_empty((rows, ctx.classes))
        if rows:
            width, draws = _widths(ctx.classes, used)
            scale = 1.0 if ctx.scale is None else float(ctx.scale)
            kernels.hinge_backward[(rows,)](
                *(grad.contiguous(), grad if weight is None else weight, loss, label, index, grad_logits),
                *(ctx.classes, used, scale),
                SCALAR=weight is not None,
                W=width,
                SP=draws,
            )
        return grad_logits, *(None,) * 7
