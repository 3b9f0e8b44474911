"""Layouts: the row view ``(B, n)`` of an operator's input along ``dim``, and the ``(N, C, d1, ...)``
class-loss layout with ``weight``, ``ignore_index`` and ``reduction`` as in ``nn.CrossEntropyLoss``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ._checks import check_bool
from .ops.compute import compute_dtype, zero_unless


def along_rows(
    x: torch.Tensor, dim: int, fn: Callable[[torch.Tensor], torch.Tensor], extra: int | None
) -> torch.Tensor:
    """Apply ``fn`` to the rows ``(B, n)`` of ``x`` along ``dim`` (in the compute dtype); put the
    result back in place, in ``x``'s dtype. ``fn`` returns ``(B, n)`` (``extra=None``) or ``(B, n, extra)``.
    A ``(B, n)`` input along its last dim goes to ``fn`` as it is: an identity ``movedim`` and
    ``reshape`` would still be views that autograd records and walks back, host time per call."""
    last, flat = dim == x.dim() - 1, x.dim() == 2
    moved = x if last else x.movedim(dim, -1)
    # explicit row count: reshape(-1, 0) is ambiguous for rows of length 0
    rows = moved if flat else moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])
    out = fn(rows.to(compute_dtype(x.dtype))).to(x.dtype)
    if not flat:
        out = out.reshape(moved.shape) if extra is None else out.reshape(*moved.shape, extra)
    return out if last else out.movedim(-1 if extra is None else -2, dim)


def on_device(name: str, value: torch.Tensor, device: torch.device, input: str = "x") -> torch.Tensor:
    """A tensor argument on the scores' ``device``: a 0-d CPU tensor is moved there (PyTorch's ops
    accept one beside any device's tensors; the move is a copy per call), any other must be there."""
    if value.device != device:
        if value.dim() or value.device.type != "cpu":
            raise ValueError(f"{name} must be on the same device as {input} ({device}), got a tensor on {value.device}")
        value = value.to(device)
    return value


def per_row(name: str, value: torch.Tensor, batch: torch.Size, device: torch.device) -> torch.Tensor:
    """A scalar or per-row tensor argument as ``(B, 1)``, aligned with :func:`along_rows`' rows, on
    the scores' ``device`` (:func:`on_device`)."""
    value = on_device(name, value, device)
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
    dtype, labels ``(R,)`` (int64, ``ignore_index`` replaced by 0: safe to gather with) and the bool
    ``(R,)`` mask of the rows that count (target not ``ignore_index``), the only ones
    :func:`reduce_loss` keeps. Two ops (and a cast for non-int64 targets or half inputs); no value
    is read."""
    logits = input if input.dim() == 2 else input.movedim(1, -1).reshape(-1, input.shape[1])
    logits = logits.to(compute_dtype(input.dtype))
    flat = target.reshape(-1)
    kept = flat != ignore_index
    return logits, zero_unless(kept, flat).long(), kept


def reduce_loss(
    per_sample: torch.Tensor,
    label: torch.Tensor,
    kept: torch.Tensor,
    *,
    weight: torch.Tensor | None,
    reduction: str,
    shape: torch.Size,
    input: torch.Tensor,
    masked: bool = False,
) -> torch.Tensor:
    """Reduce ``per_sample`` (R,) losses of rows with labels ``label`` (R,), keeping the rows of the
    bool mask ``kept`` (R,), as ``nn.CrossEntropyLoss`` does, in a few fused ops and without reading
    values.

    The result has ``input``'s dtype, except under autocast, where it stays float32 (as
    ``F.cross_entropy``'s does). ``'mean'`` divides by the summed weight of the kept rows; where no
    row is kept (or there are none) it returns 0 instead of PyTorch's NaN (no NaN leaves softtopk
    for finite input). ``'none'`` returns ``shape`` (the target's shape) with zeros at ignored
    targets. Ignored rows' losses (computed on label 0) never reach the result, not even as
    ``0 * inf``: they are set to 0 here, or already are (``masked``: the row function zeroed them
    and their gradients itself, which spares this masking's op forward and backward).
    """
    loss = per_sample if masked else zero_unless(kept, per_sample)
    if weight is None:
        if reduction == "mean":
            loss = loss.sum() / kept.sum().clamp_min(1)
        elif reduction == "sum":
            loss = loss.sum()
    else:
        sample_weight = zero_unless(kept, weight.to(per_sample.dtype).index_select(0, label))
        if reduction == "none":
            loss = loss * sample_weight
        else:
            loss = torch.linalg.vecdot(loss, sample_weight)
            if reduction == "mean":
                total = sample_weight.sum()
                loss = loss / total.masked_fill(total == 0, 1.0)
    if reduction == "none":
        loss = loss.reshape(shape)
    return in_input_dtype(loss, input)


def in_input_dtype(loss: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    """A class loss's result in ``input``'s dtype, or float32 under autocast (as ``F.cross_entropy``'s)."""
    autocast = torch.amp.is_autocast_available(input.device.type) and torch.is_autocast_enabled(input.device.type)
    return loss if autocast else loss.to(input.dtype)


def oriented(fn: Callable[[torch.Tensor], torch.Tensor], largest: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` on the rows, or on the negated rows for the ``k`` smallest (``largest=False``)."""
    return fn if check_bool("largest", largest) else (lambda rows: fn(-rows))
