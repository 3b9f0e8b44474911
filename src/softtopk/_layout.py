"""Layouts: the row view ``(B, n)`` of an operator's input along ``dim``, and the ``(N, C, d1, ...)``
class-loss layout with ``weight``, ``ignore_index`` and ``reduction`` as in ``nn.CrossEntropyLoss``."""

from __future__ import annotations

from typing import Callable

import torch

from .ops.compute import compute_dtype


def along_rows(
    x: torch.Tensor, dim: int, fn: Callable[[torch.Tensor], torch.Tensor], extra: int | None
) -> torch.Tensor:
    """Apply ``fn`` to the rows ``(B, n)`` of ``x`` along ``dim`` (in the compute dtype); put the
    result back in place, in ``x``'s dtype. ``fn`` returns ``(B, n)`` (``extra=None``) or ``(B, n, extra)``."""
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).to(compute_dtype(x.dtype))
    out = fn(rows).to(x.dtype)
    if extra is None:
        return out.reshape(moved.shape).movedim(-1, dim)
    return out.reshape(*moved.shape, extra).movedim(-2, dim)


def per_row(name: str, value: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """A scalar or per-row tensor argument as ``(B, 1)``, aligned with :func:`along_rows`' rows."""
    try:
        return value.expand(batch).reshape(-1, 1)
    except RuntimeError:
        raise ValueError(
            f"{name} must be a scalar or broadcastable to the batch shape {tuple(batch)} (x without dim), "
            f"got shape {tuple(value.shape)}"
        ) from None


def class_rows(
    input: torch.Tensor, target: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input (N, C, d1, ...)`` and ``target (N, d1, ...)`` as rows: logits ``(R, C)`` in the compute
    dtype, flat targets ``(R,)``, and flat targets with ``ignore_index`` replaced by 0 (safe to gather
    with; :func:`reduce_loss` masks those rows out)."""
    logits = input.movedim(1, -1).reshape(-1, input.shape[1]).to(compute_dtype(input.dtype))
    flat_target = target.reshape(-1).long()
    return logits, flat_target, torch.where(flat_target == ignore_index, 0, flat_target)


def reduce_loss(
    per_sample: torch.Tensor,
    target: torch.Tensor,
    *,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    shape: torch.Size,
    input: torch.Tensor,
) -> torch.Tensor:
    """Reduce ``per_sample`` (R,) losses for flat ``target`` (R,) as ``nn.CrossEntropyLoss`` does.

    The result has ``input``'s dtype, except under autocast, where it stays float32 (as
    ``F.cross_entropy``'s does). ``'mean'`` divides by the summed weight of the non-ignored targets;
    where every target is ignored it returns 0 instead of PyTorch's NaN (no NaN leaves softtopk for
    finite input). ``'none'`` returns ``shape`` (the target's shape) with zeros at ignored targets.
    """
    valid = target != ignore_index
    if weight is None:
        sample_weight = valid.to(per_sample.dtype)
    else:
        sample_weight = weight.to(per_sample.dtype)[torch.where(valid, target, 0)] * valid
    loss = torch.where(valid, per_sample, 0.0) * sample_weight
    if reduction == "none":
        loss = loss.reshape(shape)
    elif reduction == "sum":
        loss = loss.sum()
    else:
        total = sample_weight.sum()
        loss = loss.sum() / torch.where(total > 0, total, 1.0)
    return loss if torch.is_autocast_enabled(input.device.type) else loss.to(input.dtype)
