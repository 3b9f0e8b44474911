"""Top-k cross-entropy's accelerator path as one autograd node (optional, CUDA): the selection's
Triton kernel (:mod:`softtopk.ops.label_select`), the method's kernels for the label's ranks (a
network's label sweep, :mod:`softtopk.ops.networks_triton`, or NeuralSort's,
:mod:`softtopk.ops.neuralsort_triton`) and the head's (:mod:`softtopk.ops.ce_head_triton`),
launched in turn by one ``torch.autograd.Function``, forward and backward, and for ``'sum'`` and
``'mean'`` without class weights a sixth kernel that reduces the rows in one program.

Chained as three Functions, the same launches cost the host three autograd nodes and their Python
forward and backward calls, and the reduction (``softtopk._layout.reduce_loss``) four ops forward
and two nodes of three more backward; here the backward adds the head's share of the selected
scores' gradient to the ranks' in place, and the head's backward kernel reads the reduced loss's
gradient with the weight the reduction gave each row. The rows' values and gradients are the
three Functions' bit for bit, the reduced ones within the last bits of a sum in another order
(``tests/test_topk_ce_triton.py``).

Scope: where the selection runs on its Triton kernel (CUDA with triton, outside
``torch.compile`` and ``vmap``, at most ``label_select.MAX_M`` scores from rows of at most
``label_select.MAX_CLASSES`` classes) and the method has a kernel stage for those scores (the
registry's ``label_stage``); elsewhere the loss chains the Functions (or takes the torch path).
The reduction's kernel takes batches of up to ``reduce_triton.MAX_ROWS`` rows (more go to the
torch ops), and not ``'smce'``'s rows, which the loss may still set to ``inf`` after the node.
"""

from __future__ import annotations

from typing import Protocol

import torch

from . import ce_head_triton, label_select, reduce_triton
from ._function import Function


class Stage(Protocol):
    """The label's ranks by a method's kernels, without autograd."""

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``P[b, position[b], :k]`` (B, k) of contiguous rows ``x`` (B, n), and what the backward reads."""
        ...

    def backward(
        self, grad: torch.Tensor, x: torch.Tensor, position: torch.Tensor, saved: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The rows' gradient (B, n) from the ranks' ``grad`` (B, k)."""
        ...


def usable(logits: torch.Tensor, m: int) -> bool:
    """Whether the loss of rows ``logits`` (R, C) with ``m`` selected scores can take one node."""
    return label_select.triton_usable(logits, m) and m <= ce_head_triton.MAX_M


def loss_rows(
    logits: torch.Tensor,
    label: torch.Tensor,
    kept: torch.Tensor,
    m: int,
    stage: Stage,
    weights: tuple[float, ...],
    p1: float,
    mode: str,
    reduction: str = "none",
) -> torch.Tensor:
    """Each row's loss (R,) of ``logits`` (R, C) with labels ``label`` (R,): the ``m`` selected
    scores, the ``stage``'s label ranks and the head (``weights``, ``p1``, ``mode``: as
    :func:`softtopk.ops.ce_head_triton.forward_rows`), 0 where ``kept`` (R,) is False; with
    ``reduction`` ``'sum'`` or ``'mean'``, their sum or their mean over the kept rows (0-dim, 0
    where none is kept)."""
    return TopKCERows.apply(logits, label, kept, m, stage, weights, p1, mode, reduction)[0]


class TopKCERows(Function):
    """``(logits (R, C), label (R,), kept (R,), m, stage, weights, p1, mode, reduction)`` -> the
    rows' losses (R,) or their reduction (0-dim), and what the backward reads: the selected scores,
    their classes and the label's position, the masked rows, the label's ranks, the stage's own and
    (reduced) each row's weight in the result."""

    @staticmethod
    def forward(logits, label, kept, m, stage, weights, p1, mode, reduction):
        scores, index, position, masked = label_select.triton_select(logits, label, m)
        ranks, saved = stage.forward(scores, position)
        kept = kept.contiguous()
        loss = ce_head_triton.forward_rows(scores, ranks, position, masked, kept, weights, p1, mode)
        if reduction == "none":
            return (loss, scores, index, position, masked, ranks, *saved)
        loss, weight = reduce_triton.reduce_rows(loss, kept, reduction == "mean")
        return (loss, scores, index, position, masked, ranks, *saved, weight)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(inputs[2], *output[1:])
        ctx.classes = inputs[0].shape[-1]
        ctx.stage, ctx.weights, ctx.p1, ctx.mode, reduction = inputs[4:]
        ctx.reduced = reduction != "none"

    @staticmethod
    @torch.autograd.function.once_differentiable  # kernels' outputs: a second derivative raises
    def backward(ctx, grad, *_unused):
        if grad is None:
            return (None,) * 9
        kept, scores, index, position, masked, ranks, *saved = ctx.saved_tensors
        weight = saved.pop() if ctx.reduced else None
        head = (scores, ranks, position, masked, kept.contiguous(), ctx.weights, ctx.p1, ctx.mode, weight)
        grad_scores, grad_ranks = ce_head_triton.backward_rows(grad, *head)
        grad_x = ctx.stage.backward(grad_ranks, scores, position, tuple(saved))
        if grad_scores is not None:
            grad_x = grad_x.add_(grad_scores)
        return label_select.to_classes(grad_x, index, ctx.classes), *(None,) * 8
