"""What every class loss shares: the ``nn.CrossEntropyLoss`` conventions (``(N, C, d1, ...)`` input,
class-index target, ``weight``, ``ignore_index``, ``reduction``), written once as :func:`class_loss`
and the Module base :class:`ClassLoss`. A loss family supplies only its per-row loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .._layout import class_rows, in_input_dtype, reduce_loss
from .._validation import (
    check_class_input,
    check_class_target,
    check_class_weight,
    check_ignore_index,
    check_reduction,
)

PerRow = Callable[..., torch.Tensor]


def class_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    per_row: PerRow,
    *,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    masks_rows: bool = False,
    reduces: bool = False,
) -> torch.Tensor:
    """Apply ``per_row(logits (R, C), label (R,)) -> (R,)`` to ``input (N, C, d1, ...)`` and reduce
    as ``nn.CrossEntropyLoss`` does.

    ``logits`` are the rows of ``input`` with the class axis last, in the compute dtype (float32 for
    float16/bfloat16); ``label`` is safe to gather with (ignored targets read class 0 and are masked
    out of the reduction). ``'mean'`` is the weighted mean over non-ignored targets (0 when every
    target is ignored); the result has ``input``'s dtype (float32 under autocast). With
    ``masks_rows``, ``per_row(logits, label, kept)`` also takes the bool ``(R,)`` mask of the rows
    that count and returns 0, with gradient 0, at the others (an autograd Function can do so within
    its own ops, so the reduction adds no masking op forward or backward). With ``reduces`` (which
    implies ``masks_rows``), ``per_row(logits, label, kept, reduction)`` also takes the reduction it
    may apply itself, ``'sum'`` or ``'mean'`` where there is no ``weight`` (else ``'none'``), and
    returns the rows' losses or, reduced, a 0-dim tensor (one fused step instead of a few ops).

    Values are never read on an accelerator: the target's range and the weights' signs are checked
    only for CPU tensors outside ``torch.compile``/``vmap`` (as PyTorch's own losses do; on CUDA a
    check would synchronise), one host read each (:func:`softtopk._validation.values_checked`).
    """
    input = check_class_input(input)
    reduction = check_reduction(reduction)
    ignore_index = check_ignore_index(ignore_index)
    target = check_class_target(input, target, ignore_index)
    weight = check_class_weight(weight, input.shape[1])
    logits, label, kept = class_rows(input, target, ignore_index)
    if reduces:
        per_sample = per_row(logits, label, kept, reduction if weight is None else "none")
        if per_sample.dim() == 0:  # reduced by per_row
            return in_input_dtype(per_sample, input)
    else:
        per_sample = per_row(logits, label, kept) if masks_rows else per_row(logits, label)
    return reduce_loss(
        per_sample,
        label,
        kept,
        weight=weight,
        reduction=reduction,
        shape=target.shape,
        input=input,
        masked=masks_rows or reduces,
    )


class ClassLoss(torch.nn.Module):
    """Module base of the class losses: the ``weight`` buffer (moves with ``.to()``, saved in
    ``state_dict``), ``ignore_index`` and ``reduction``, checked at construction.

    A family Module names its functional twin (``_function``) and the attributes it passes on as
    keywords (``_param_names``, in ``extra_repr``'s order), and inherits ``forward`` and ``extra_repr``."""

    weight: torch.Tensor | None
    _function: Callable[..., torch.Tensor]
    _param_names: tuple[str, ...] = ()

    def __init__(
        self, *, weight: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.register_buffer("weight", check_class_weight(weight, None))
        self.ignore_index = check_ignore_index(ignore_index)
        self.reduction = check_reduction(reduction)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self._function(input, target, **self._family_kwargs(), **self._class_kwargs())

    def extra_repr(self) -> str:
        return self._repr(**self._family_kwargs())

    def _family_kwargs(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names}

    def _class_kwargs(self) -> dict[str, Any]:
        return {"weight": self.weight, "ignore_index": self.ignore_index, "reduction": self.reduction}

    def _repr(self, **params: Any) -> str:
        """``extra_repr`` from the family's parameters, then the non-default class options."""
        parts = [f"{key}={value!r}" for key, value in params.items()]
        parts.append(f"reduction={self.reduction!r}")
        if self.ignore_index != -100:
            parts.append(f"ignore_index={self.ignore_index}")
        if self.weight is not None:
            parts.append("weight=True")
        return ", ".join(parts)
