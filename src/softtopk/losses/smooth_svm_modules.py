"""Module forms of the smooth top-k SVM losses (Berrada, Zisserman & Kumar, ICLR 2018).

:class:`SmoothTopkSVM`, :class:`SmoothTop1SVM`, :class:`TopkSVM` and :class:`Top1SVM` hold ``n_classes``
(checked against the input), ``k``, ``tau``, ``alpha``, a ``weight`` buffer, ``ignore_index`` and
``reduction``, and call the functions of :mod:`softtopk.losses.smooth_svm` (the math is documented there).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._validation import check_class_input, check_class_weight, check_real, check_reduction
from .smooth_svm import _check_alpha, _check_k, _check_n_classes, smooth_top1_svm, smooth_topk_svm, top1_svm, topk_svm

__all__ = ["SmoothTop1SVM", "SmoothTopkSVM", "Top1SVM", "TopkSVM"]


class _SVMLoss(nn.Module):
    """Shared state: ``n_classes`` (checked against the input at forward), ``weight`` buffer, reduction."""

    weight: torch.Tensor | None

    def __init__(
        self,
        n_classes: int,
        *,
        alpha: float = 1.0,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        super().__init__()
        self.n_classes = _check_n_classes(n_classes)
        self.alpha = _check_alpha(alpha)
        self.reduction = check_reduction(reduction)
        self.ignore_index = ignore_index
        self.register_buffer("weight", check_class_weight(weight, self.n_classes))

    def _check_input(self, input: torch.Tensor) -> None:
        input = check_class_input(input)
        if input.shape[1] != self.n_classes:
            raise ValueError(
                f"input has {input.shape[1]} classes (dim 1 of shape {tuple(input.shape)}), "
                f"but the loss was built with n_classes = {self.n_classes}"
            )

    def _kwargs(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "weight": self.weight,
            "ignore_index": self.ignore_index,
            "reduction": self.reduction,
        }

    def extra_repr(self) -> str:
        parts = [f"n_classes={self.n_classes}"]
        if hasattr(self, "k"):
            parts.append(f"k={self.k}")
        if hasattr(self, "tau"):
            parts.append(f"tau={self.tau}")
        parts += [f"alpha={self.alpha}", f"reduction={self.reduction!r}"]
        if self.ignore_index != -100:
            parts.append(f"ignore_index={self.ignore_index}")
        if self.weight is not None:
            parts.append("weight=True")
        return ", ".join(parts)


class SmoothTopkSVM(_SVMLoss):
    """Smooth top-k SVM loss :math:`L_{k,\\tau}` (Berrada et al., ICLR 2018); see :func:`smooth_topk_svm`.

    .. math::
        \\ell(s, y) = \\tau\\, \\mathrm{softplus}\\big(\\alpha/\\tau + \\log e_k - \\log e_{k-1} - s_y/(k\\tau)\\big),

    :math:`e_j` the elementary symmetric polynomials of :math:`\\{e^{s_j/(k\\tau)}\\}_{j \\ne y}`. Computed
    exactly in log space (no hard-loss fallback, no host sync); ``k``, ``tau`` and ``alpha`` are plain
    attributes read at every forward.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        k: the ``k`` of top-k, ``1 <= k < n_classes`` (default 5).
        tau: temperature :math:`\\tau > 0` (default 1).
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.
        weight: optional per-class weights ``(C,)`` (a buffer).
        ignore_index: target value that contributes nothing (default -100).

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``.
        - target: ``(N)`` or ``(N, d1, ...)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm_modules import SmoothTopkSVM
        >>> loss = SmoothTopkSVM(4, k=2)
        >>> loss
        SmoothTopkSVM(n_classes=4, k=2, tau=1.0, alpha=1.0, reduction='mean')
        >>> loss(torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]]), torch.tensor([0, 3]))
        tensor(0.9880)

    Reference:
        Berrada, Zisserman & Kumar, "Smooth Loss Functions for Deep Top-k Classification", ICLR 2018.
    """

    def __init__(
        self,
        n_classes: int,
        *,
        k: int = 5,
        tau: float = 1.0,
        alpha: float = 1.0,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        super().__init__(n_classes, alpha=alpha, reduction=reduction, weight=weight, ignore_index=ignore_index)
        self.k = _check_k(k, self.n_classes)
        self.tau = check_real("tau", tau, positive=True)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return smooth_topk_svm(input, target, k=self.k, tau=self.tau, **self._kwargs())


class SmoothTop1SVM(_SVMLoss):
    """Smooth top-1 SVM loss :math:`L_{1,\\tau}`; see :func:`smooth_top1_svm`.

    .. math::
        \\ell(s, y) = \\tau \\log \\sum_j \\exp\\big((s_j + \\alpha [j \\ne y] - s_y)/\\tau\\big)

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        tau: temperature :math:`\\tau > 0` (default 1).
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.
        weight: optional per-class weights ``(C,)`` (a buffer).
        ignore_index: target value that contributes nothing (default -100).

    Shape:
        As :class:`SmoothTopkSVM`.

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm_modules import SmoothTop1SVM
        >>> SmoothTop1SVM(4, alpha=0.0)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))
        tensor(2.1852)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """

    def __init__(
        self,
        n_classes: int,
        *,
        tau: float = 1.0,
        alpha: float = 1.0,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        super().__init__(n_classes, alpha=alpha, reduction=reduction, weight=weight, ignore_index=ignore_index)
        self.tau = check_real("tau", tau, positive=True)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return smooth_top1_svm(input, target, tau=self.tau, **self._kwargs())


class TopkSVM(_SVMLoss):
    """Hard top-k SVM loss :math:`\\max(0, \\alpha + (s_{\\setminus y,[k]} - s_y)/k)`; see :func:`topk_svm`.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        k: the ``k`` of top-k, ``1 <= k < n_classes`` (default 5).
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.
        weight: optional per-class weights ``(C,)`` (a buffer).
        ignore_index: target value that contributes nothing (default -100).

    Shape:
        As :class:`SmoothTopkSVM`.

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm_modules import TopkSVM
        >>> TopkSVM(4, k=2)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([2]))
        tensor(1.5000)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """

    def __init__(
        self,
        n_classes: int,
        *,
        k: int = 5,
        alpha: float = 1.0,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        super().__init__(n_classes, alpha=alpha, reduction=reduction, weight=weight, ignore_index=ignore_index)
        self.k = _check_k(k, self.n_classes)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return topk_svm(input, target, k=self.k, **self._kwargs())


class Top1SVM(_SVMLoss):
    """Hard top-1 (Crammer–Singer) SVM loss :math:`\\max(0, \\alpha + \\max_{j \\ne y} s_j - s_y)`.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.
        weight: optional per-class weights ``(C,)`` (a buffer).
        ignore_index: target value that contributes nothing (default -100).

    Shape:
        As :class:`SmoothTopkSVM`.

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm_modules import Top1SVM
        >>> Top1SVM(4)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))
        tensor(3.)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self._check_input(input)
        return top1_svm(input, target, **self._kwargs())
