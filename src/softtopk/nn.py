"""Module twins of the functional losses: same parameter names and defaults; forward calls functional."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ._methods import resolve
from ._validation import check_class_weight, check_reduction
from .functional import soft_topk, soft_topk_ranks
from .knn import DifferentiableKNN, KNNOutput
from .losses.noised_modules import BalNoisedTopK, ImbalNoisedTopK
from .losses.smooth_svm_modules import SmoothTop1SVM, SmoothTopkSVM, Top1SVM, TopkSVM
from .losses.topk_ce import check_m, check_p_k, check_top1_mode, topk_cross_entropy

__all__ = [
    "BalNoisedTopK",
    "DifferentiableKNN",
    "ImbalNoisedTopK",
    "KNNOutput",
    "SmoothTop1SVM",
    "SmoothTopkSVM",
    "SoftTopK",
    "SoftTopKRanks",
    "Top1SVM",
    "TopKCrossEntropyLoss",
    "TopkSVM",
]


class SoftTopK(torch.nn.Module):
    """Module form of :func:`softtopk.soft_topk`: a relaxed k-hot mask of the ``k`` largest entries
    along ``dim``. Parameters are checked at construction.

    Shape:
        input ``(*)`` with ``n = input.shape[dim] >= k``; output the same shape.

    Example:
        >>> import torch, softtopk
        >>> layer = softtopk.SoftTopK(2, method="softsort", tau=0.01)
        >>> layer(torch.tensor([0.5, -1.0, 2.0, 1.0])).round(decimals=3)
        tensor([0., 0., 1., 1.])
    """

    _output, _operator = "mask", staticmethod(soft_topk)

    def __init__(self, k: int, *, method: str = "lapsum", dim: int = -1, **params: Any) -> None:
        super().__init__()
        _, self.params = resolve(method, params, self._output)
        self.k, self.method, self.dim = k, method, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._operator(x, self.k, method=self.method, dim=self.dim, **self.params)

    def extra_repr(self) -> str:
        params = "".join(f", {key}={value!r}" for key, value in self.params.items())
        return f"k={self.k}, method={self.method!r}, dim={self.dim}{params}"


class SoftTopKRanks(SoftTopK):
    """Module form of :func:`softtopk.soft_topk_ranks`: output ``input.shape + (k,)``, entry
    ``[..., i, r]`` the weight of item ``i`` at rank ``r`` (0 = largest)."""

    _output, _operator = "ranks", staticmethod(soft_topk_ranks)


class TopKCrossEntropyLoss(torch.nn.Module):
    """Top-k cross-entropy over relaxed ranks (Petersen et al., ICML 2022): a drop-in for
    ``nn.CrossEntropyLoss`` that rewards the label for being among the top κ, κ ~ ``P_K``.

    .. math::
        \\ell(s, y) = -\\log\\Big(\\big\\lfloor p_1\\, \\mathrm{softmax}(s)_y
            + \\textstyle\\sum_{\\kappa \\ge 2} p_\\kappa\\, q_\\kappa(y) \\big\\rfloor\\Big),
        \\qquad q_\\kappa(y) = \\sum_{r < \\kappa} R[y, r]

    (``top1_mode='sm'``; ``'sort'`` uses :math:`q_1` for the first term, ``'smce'`` adds
    :math:`p_1` CE to :math:`(\\sum_{\\kappa\\ge2} p_\\kappa)(-\\log\\lfloor\\sum_{\\kappa\\ge2}p_\\kappa q_\\kappa\\rfloor)`).
    ``R`` are the relaxed top-K ranks of ``method`` (K = ``len(p_k)``); ``⌊p⌋ = p(1-2e-7)+1e-7``.

    Args:
        p_k: ``P_K``, the weights of top-1 ... top-K; non-negative, summing to 1.
        method: any ranks-capable method (see :func:`softtopk.methods`). Default
            ``'splitter_selection'``.
        m: relax only the ``m`` largest scores (``K < m < C``), the label always included;
            ``None`` relaxes all ``C`` classes. The selected scores enter in descending order, so the
            loss does not depend on class order (difftopk put the label on wire 0).
        top1_mode: ``'sm'`` (default), ``'smce'`` or ``'sort'``.
        weight: optional per-class weights ``(C,)`` (a buffer), as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.
        **params: the method's parameters, e.g. ``steepness=1.0, distribution='logistic_phi',
            art_lambda=0.5`` for networks or ``tau=2.0`` for NeuralSort/SoftSort.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating.
        - target: ``(N)`` or ``(N, d1, ...)``, integer class indices in ``[0, C)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch, softtopk
        >>> loss_fn = softtopk.TopKCrossEntropyLoss([0.2] * 5, method="bitonic", m=16,
        ...                                         distribution="logistic_phi", steepness=1.0, art_lambda=0.5)
        >>> logits = torch.randn(8, 100, requires_grad=True)
        >>> loss_fn(logits, torch.randint(0, 100, (8,))).backward()
        >>> bool(torch.isfinite(logits.grad).all())
        True

    Reference:
        F. Petersen, H. Kuehne, C. Borgelt, O. Deussen, "Differentiable Top-k Classification
        Learning", ICML 2022.
    """

    def __init__(
        self,
        p_k: Sequence[float],
        *,
        method: str = "splitter_selection",
        m: int | None = None,
        top1_mode: str = "sm",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        **params: Any,
    ) -> None:
        super().__init__()
        self.p_k = check_p_k(p_k)
        _, self.params = resolve(method, params, "ranks")
        self.method = method
        self.m = check_m(m, len(self.p_k))
        self.top1_mode = check_top1_mode(top1_mode)
        self.ignore_index = ignore_index
        self.reduction = check_reduction(reduction)
        self.register_buffer("weight", check_class_weight(weight, None))

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return topk_cross_entropy(
            input,
            target,
            self.p_k,
            method=self.method,
            m=self.m,
            top1_mode=self.top1_mode,
            weight=self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            **self.params,
        )

    def extra_repr(self) -> str:
        params = ", ".join(f"{key}={value!r}" for key, value in self.params.items())
        return (
            f"p_k={list(self.p_k)}, method={self.method!r}, m={self.m}, top1_mode={self.top1_mode!r}, "
            f"reduction={self.reduction!r}, ignore_index={self.ignore_index}, {params}"
        )
