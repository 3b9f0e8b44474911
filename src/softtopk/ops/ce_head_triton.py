"""Top-k cross-entropy's head as two Triton kernels (optional, CUDA): each row's loss from its
selected scores and the label's relaxed ranks, ``-log(floor(w . ranks + p_1 softmax(scores)_y))``
with the ``'sort'``/``'sm'``/``'smce'`` variants, in one launch forward and one backward, where the
torch path (:class:`softtopk.losses.topk_ce._Head` and the reduction's masking) dispatches about
twelve ops forward and twelve backward. The backward recomputes the softmax instead of saving it.

Scope: selections of at most :data:`MAX_M` scores, on CUDA outside ``torch.compile`` and
``vmap`` (:mod:`softtopk.ops.triton_gate`); the tests run the kernels under
``TRITON_INTERPRET=1`` on the CPU against the torch path (``tests/test_ce_head_triton.py``).
"""

from __future__ import annotations

import torch

from . import triton_gate
from ._function import Function
from .compute import constant

MAX_M = 1024  # scores a program's rows hold
FLOOR = 1e-7  # the floor of the relaxed probability: p (1 - 2 FLOOR) + FLOOR
MODES = {"sort": 0, "sm": 1, "smce": 2}


def usable(scores: torch.Tensor) -> bool:
    """Whether the head of rows ``scores`` (R, m) runs on the kernels."""
    return triton_gate.usable(scores) and scores.shape[-1] <= MAX_M


def _launch(scores: torch.Tensor, ranks: torch.Tensor, p1: float, mode: str) -> tuple[tuple, dict]:
    """The grid and the kernels' scalar arguments for rows ``scores`` (R, m), ``ranks`` (R, K)."""
    rows, m = scores.shape
    width = triton_gate.lanes(m, 2)
    block = max(1, min(64, 2048 // width))
    options = {"MODE": MODES[mode], "ROWS": block, "MP": width, "KP": triton_gate.lanes(ranks.shape[1], 2)}
    return (-(-rows // block),), {"p1": p1, "keep": 1 - 2 * FLOOR, "floor": FLOOR, **options}


def head(
    scores: torch.Tensor,
    label_ranks: torch.Tensor,
    position: torch.Tensor,
    masked: torch.Tensor,
    kept: torch.Tensor,
    weights: tuple[float, ...],
    p1: float,
    mode: str,
) -> torch.Tensor:
    """:class:`TritonHead` on rows laid out as the kernels read them (contiguous; a no-op for
    the selection's and the label kernels' outputs)."""
    rows = (scores, label_ranks, position, masked, kept)
    return TritonHead.apply(*(t.contiguous() for t in rows), weights, p1, mode)


class TritonHead(Function):
    """``(scores (R, m), label_ranks (R, K), position (R,), masked (R,), kept (R,), weights, p1,
    mode)`` -> each row's loss (R,) by :func:`forward_rows`, the gradients by :func:`backward_rows`."""

    @staticmethod
    def forward(scores, label_ranks, position, masked, kept, weights, p1, mode):
        return forward_rows(scores, label_ranks, position, masked, kept, weights, p1, mode)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs[:5])
        ctx.weights, ctx.p1, ctx.mode = inputs[5:]

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad):
        if grad is None:
            return (None,) * 8
        scores, ranks, position, masked, kept = ctx.saved_tensors
        grads = backward_rows(grad, scores, ranks, position, masked, kept, ctx.weights, ctx.p1, ctx.mode)
        return *grads, None, None, None, None, None, None


def forward_rows(scores, label_ranks, position, masked, kept, weights, p1: float, mode: str) -> torch.Tensor:
    """Each row's loss (R,) of contiguous rows ``scores`` (R, m), ``label_ranks`` (R, K),
    ``position``, ``masked``, ``kept`` (R,): ``inf`` where ``masked`` (the label at ``-inf``), 0
    where not ``kept`` (an ignored target), both with gradient 0; the torch path's ``_Head``
    otherwise (``mode``: ``'sort'``, or ``'sm'``/``'smce'`` with ``p1 > 0``)."""
    from . import ce_head_kernels as kernels  # imports triton: only once a kernel runs

    loss = scores.new_empty(scores.shape[0])
    if scores.shape[0]:
        grid, args = _launch(scores, label_ranks, p1, mode)
        w = constant(weights, scores)
        kernels.head_forward[grid](
            scores, label_ranks, w, position, kept, masked, loss, *scores.shape, label_ranks.shape[1], **args
        )
    return loss


def backward_rows(
    grad, scores, label_ranks, position, masked, kept, weights, p1: float, mode: str, weight=None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The gradients of :func:`forward_rows`' scores (None for ``'sort'``) and label ranks from the
    losses' ``grad`` (R,), or from the gradient ``grad`` (0-dim) of their reduction and the weight
    ``weight`` it gave each kept row (:func:`softtopk.ops.reduce_triton.reduce_rows`), recomputing
    the softmax."""
    from . import ce_head_kernels as kernels

    grad_scores = torch.empty_like(scores) if mode != "sort" else None
    grad_ranks = torch.empty_like(label_ranks)
    if scores.shape[0]:
        grid, args = _launch(scores, label_ranks, p1, mode)
        kernels.head_backward[grid](
            grad.contiguous(),
            grad if weight is None else weight,  # read only with SCALAR
            scores,
            label_ranks,
            constant(weights, scores),
            position,
            kept,
            masked,
            grad_ranks if grad_scores is None else grad_scores,  # unwritten for 'sort'
            grad_ranks,
            *scores.shape,
            label_ranks.shape[1],
            SCALAR=weight is not None,
            **args,
        )
    return grad_scores, grad_ranks
