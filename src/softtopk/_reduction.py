"""The one place that applies ``weight``, ``ignore_index`` and ``reduction`` to per-sample losses."""

from __future__ import annotations

import torch


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
    ``F.cross_entropy``'s does).

    ``'mean'`` divides by the summed weight of the non-ignored targets; where every target is
    ignored it returns 0 instead of PyTorch's NaN (no NaN leaves softtopk for finite input).
    ``'none'`` returns ``shape`` (the target's shape) with zeros at ignored targets.
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
