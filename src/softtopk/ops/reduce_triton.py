"""A class loss's reduction as one Triton kernel (optional, CUDA), for the losses whose rows come
from kernels in one autograd node (top-k cross-entropy's, :mod:`softtopk.ops.topk_ce_triton`; the
noised hinge's, :mod:`softtopk.ops.noised_triton`): where :func:`softtopk._layout.reduce_loss`
launches four ops forward (two sums, a clamp, a division) and its autograd nodes three more
backward, one program sums the rows, counts the kept ones for the mean and writes the weight of
each kept row, which the loss's backward kernel reads with the reduced loss's gradient.

The sum runs in ``BLOCK`` lanes, then across them: another order than ``torch.sum``'s, so the
result may differ from the torch path in the last bits. One program reads every row: it suits the
batches of a classifier, not millions of rows (a segmentation loss's pixels), for which
:data:`MAX_ROWS` keeps the torch ops.
"""

from __future__ import annotations

import torch

from . import triton_gate

MAX_ROWS = 1 << 16  # rows one program reduces; above, the loss's rows go to reduce_loss


def kernel_reduction(rows: int, reduction: str) -> str:
    """The reduction a loss's kernels apply to ``rows`` rows themselves: ``reduction`` (``'sum'``
    or ``'mean'``) up to :data:`MAX_ROWS` rows, else ``'none'`` (the rows are returned)."""
    return reduction if reduction in ("sum", "mean") and rows <= MAX_ROWS else "none"


def reduce_rows(loss: torch.Tensor, kept: torch.Tensor, mean: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum of the rows' losses ``loss`` (R,), or with ``mean`` their mean over the rows ``kept``
    (0 where none is; the others' losses are 0), and the weight of each kept row in it (0-dim each:
    1, or ``1 / max(kept, 1)``)."""
    from . import reduce_kernels as kernels  # imports triton: only once the kernel runs

    out, weight = loss.new_empty(()), loss.new_empty(())
    kernels.reduce_rows[(1,)](loss, kept, out, weight, loss.shape[0], MEAN=mean, BLOCK=triton_gate.BLOCK)
    return out, weight
