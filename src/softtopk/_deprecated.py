"""Spellings of softtopk 0.1.0 kept for one release: ``SmoothTopkSVM`` and ``TopkSVM`` (now
:class:`~softtopk.SmoothTopKSVM` and :class:`~softtopk.TopKSVM`, without ``n_classes``). They take
0.1.0's arguments (``n_classes``, then the native class's keywords, which it checks), warn with a
``FutureWarning`` naming the replacement, and check the input's class count against ``n_classes`` as
0.1.0 did."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ._validation import check_class_weight, check_classes_match, check_int
from .losses.smooth_svm import SmoothTopKSVM, TopKSVM

__all__ = ["SmoothTopkSVM", "TopkSVM"]


class _ClassCount:
    """The 0.1.0 ``n_classes`` argument: stored, checked at construction and against every input."""

    n_classes: int
    k: int  # set by the native loss class this mixin precedes
    weight: torch.Tensor | None

    def _set_classes(self, n_classes: Any, new_name: str) -> None:
        old_name = type(self).__name__
        warnings.warn(
            f"softtopk.{old_name} is deprecated and will be removed in 0.3; use softtopk.{new_name}, "
            "which takes no n_classes",
            FutureWarning,
            stacklevel=3,
        )
        self.n_classes = check_int("n_classes", n_classes, low=2)
        check_int("k", self.k, low=1, high=self.n_classes - 1, why=" (k < n_classes)")
        check_class_weight(self.weight, self.n_classes)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return super().forward(check_classes_match(input, self.n_classes), target)  # type: ignore[misc]

    def extra_repr(self) -> str:
        return f"n_classes={self.n_classes}, {super().extra_repr()}"  # type: ignore[misc]


class SmoothTopkSVM(_ClassCount, SmoothTopKSVM):
    """Deprecated: use :class:`softtopk.SmoothTopKSVM` (the same loss and keywords, without ``n_classes``)."""

    def __init__(self, n_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._set_classes(n_classes, "SmoothTopKSVM")


class TopkSVM(_ClassCount, TopKSVM):
    """Deprecated: use :class:`softtopk.TopKSVM` (the same loss and keywords, without ``n_classes``)."""

    def __init__(self, n_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._set_classes(n_classes, "TopKSVM")
