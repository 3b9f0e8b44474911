"""Smooth top-k SVM losses of Berrada, Zisserman & Kumar (ICLR 2018), computed exactly.

For scores :math:`s \\in \\mathbb{R}^C`, label :math:`y`, margin :math:`\\alpha \\ge 0` and temperature
:math:`\\tau > 0`, with :math:`\\mathcal{Y}^{(k)}` the k-subsets of classes,
:math:`\\mathcal{Y}^{(k)}_y` those containing ``y`` and :math:`\\Delta(A, y) = \\alpha\\,[y \\notin A]`,

.. math::
    L_{k,\\tau}(s, y) = \\tau \\log \\sum_{A \\in \\mathcal{Y}^{(k)}}
        e^{(\\Delta(A, y) + \\frac1k \\sum_{j \\in A} s_j)/\\tau}
        - \\tau \\log \\sum_{A \\in \\mathcal{Y}^{(k)}_y} e^{\\frac1k \\sum_{j \\in A} s_j / \\tau} .

With :math:`z_j = s_j / (k\\tau)` and :math:`e_j` the ``j``-th elementary symmetric polynomial of the
``C - 1`` values :math:`\\{e^{z_j}\\}_{j \\ne y}`, this factorises into

.. math::
    L_{k,\\tau}(s, y) = \\tau\\, \\mathrm{softplus}\\big(\\alpha/\\tau + \\log e_k - \\log e_{k-1} - z_y\\big).

Its limit :math:`\\tau \\to 0` is the hard top-k hinge
:math:`\\max\\big(0,\\ \\alpha + (s_{\\setminus y,[k]} - s_y)/k\\big)`, :math:`s_{\\setminus y,[k]}` the
k-th largest score other than the label's (for ``k = 1``: the Crammer–Singer multi-class hinge).

Numerics. For ``k <= 8`` the loss and its gradient are one autograd Function
(``softtopk.ops.svm_subsets.smooth_topk_rows``): scores relative to the k-th largest other score,
polynomials normalised by the top k's products, the gradient as inclusion probabilities, ``O(C k)``
fused steps. Larger ``k`` shifts every row by the (detached) k-th largest non-label score and takes
:math:`\\log e_{k-1}, \\log e_k` from the log-space ESF kernel ``softtopk.ops.esf.log_esf`` (exact
prefix sums, ``O(C k)``, analytic backward; see that module for the numerics). Either way the loss
is shift invariant up to the rounding of the input itself, and no value is read on the host.
``+inf`` scores give the limits of finite inputs (:func:`softtopk.ops.svm_rows.extended_svm_rows`:
with ``P < k`` other classes at ``+inf`` a finite loss, the top-k hinge over the others with ``k -
P``; with ``P >= k`` ``inf``, or the tied limit when the label is at ``+inf`` too), with finite
gradients. There is no per-row switch to the hard loss (the original's ``thresh``), so the loss is
continuous in ``s`` everywhere, and the float32 result is the exact smooth loss for every input
(errors of order :math:`\\epsilon_{32} \\cdot \\max_j |s_j - \\max s|`, as any float32 computation
of a loss of that size).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .._validation import check_class_input, check_int, check_real, check_scale
from ..ops.svm_rows import extended_svm_rows, hard_svm_rows, smooth_top1_svm_rows, smooth_topk_svm_rows
from ._base import ClassLoss, class_loss

__all__ = [
    "SmoothTop1SVM",
    "SmoothTopKSVM",
    "Top1SVM",
    "TopKSVM",
    "smooth_top1_svm",
    "smooth_topk_svm",
    "top1_svm",
    "topk_svm",
]


def _svm_params(k: Any, tau: Any, alpha: Any, input: torch.Tensor | None = None) -> tuple[int, float, float]:
    """The family's parameters, checked once for the functions and their Modules; given the
    ``input`` (the functions), also ``k < C`` and ``tau`` against its dtype. ``tau=None`` for the
    hard losses."""
    if input is None:
        k = check_int("k", k, low=1)
    else:
        classes = check_class_input(input).shape[1]
        k = check_int("k", k, low=1, high=classes - 1, why=" (k < C, the number of classes)")
    tau = None if tau is None else check_real("tau", tau, positive=True)
    alpha = check_real("alpha", alpha, low=0.0)
    if input is not None and tau is not None:
        check_scale("tau", tau, input.dtype)
    return k, tau, alpha


def _svm_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    k: int,
    rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
) -> torch.Tensor:
    """The class loss of ``rows(logits, label)``, under the ``+inf`` rules of a top-``k`` SVM loss
    (:func:`softtopk.ops.svm_rows.extended_svm_rows`)."""
    return class_loss(
        input,
        target,
        lambda s, y: extended_svm_rows(s, y, k, rows),
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
    )


def smooth_topk_svm(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    k: int = 5,
    tau: float = 1.0,
    alpha: float = 1.0,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Smooth top-k SVM loss of Berrada et al. See :class:`SmoothTopKSVM` for details.

    Example:
        >>> import torch, softtopk
        >>> logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]])
        >>> softtopk.smooth_topk_svm(logits, torch.tensor([0, 3]), k=2, reduction="none")
        tensor([0.4741, 1.5019])
    """
    k, tau, alpha = _svm_params(k, tau, alpha, input)
    rows = functools.partial(smooth_topk_svm_rows, k=k, tau=tau, alpha=alpha)  # the +inf limits included
    return class_loss(input, target, rows, weight=weight, ignore_index=ignore_index, reduction=reduction)


def smooth_top1_svm(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    tau: float = 1.0,
    alpha: float = 1.0,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Smooth top-1 SVM loss (one log-sum-exp). See :class:`SmoothTop1SVM` for details."""
    _, tau, alpha = _svm_params(1, tau, alpha, input)
    return _svm_loss(
        input, target, 1, lambda r, l: smooth_top1_svm_rows(r, l, tau, alpha), weight, ignore_index, reduction
    )


def topk_svm(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    k: int = 5,
    alpha: float = 1.0,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Hard top-k SVM loss, the limit ``tau -> 0`` of the smooth one. See :class:`TopKSVM` for details."""
    k, _, alpha = _svm_params(k, None, alpha, input)
    return _svm_loss(input, target, k, lambda r, l: hard_svm_rows(r, l, k, alpha), weight, ignore_index, reduction)


def top1_svm(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    alpha: float = 1.0,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Hard top-1 (Crammer–Singer) SVM loss. See :class:`Top1SVM` for details."""
    return topk_svm(input, target, k=1, alpha=alpha, weight=weight, ignore_index=ignore_index, reduction=reduction)


class SmoothTopKSVM(ClassLoss):
    r"""Smooth top-k SVM loss :math:`L_{k,\tau}` of Berrada et al., computed exactly.

    .. math::
        \ell(s, y) = \tau\, \mathrm{softplus}\big(\alpha/\tau + \log e_k - \log e_{k-1} - z_y\big),
        \qquad z = s / (k\tau),

    :math:`e_j` the elementary symmetric polynomials of :math:`\{e^{z_j}\}_{j \ne y}`: the log-sum-exp
    over k-subsets of the module doc, in log space, with no switch to the hard loss (continuous and
    with finite gradients everywhere). The functional form is :func:`softtopk.smooth_topk_svm`.

    Args:
        k: the ``k`` of top-k, ``1 <= k < C``. Default 5.
        tau: temperature :math:`\tau > 0`. Default 1. It acts after the division by ``k``, so values
            are not comparable across ``k``.
        alpha: margin :math:`\alpha \ge 0`. Default 1; the effective margin on raw scores is ``k alpha``.
        weight: optional per-class weights ``(C,)`` (a buffer), as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing. Default -100.
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating (float16/bfloat16 computed in float32).
        - target: ``(N)`` or ``(N, d1, ...)``, integers in ``[0, C)`` (or ``ignore_index``).
        - output: scalar, or the target's shape for ``reduction='none'``; in ``input``'s dtype
          (float32 under autocast).

    Example:
        >>> import torch, softtopk
        >>> loss = softtopk.SmoothTopKSVM(k=2)
        >>> loss
        SmoothTopKSVM(k=2, tau=1.0, alpha=1.0, reduction='mean')
        >>> loss(torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]]), torch.tensor([0, 3]))
        tensor(0.9880)

    Reference:
        L. Berrada, A. Zisserman, M. P. Kumar, "Smooth Loss Functions for Deep Top-k
        Classification", ICLR 2018.
    """

    _function = staticmethod(smooth_topk_svm)
    _param_names = ("k", "tau", "alpha")

    def __init__(
        self,
        *,
        k: int = 5,
        tau: float = 1.0,
        alpha: float = 1.0,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.k, self.tau, self.alpha = _svm_params(k, tau, alpha)


class SmoothTop1SVM(ClassLoss):
    r"""Smooth top-1 SVM loss :math:`L_{1,\tau}` (:class:`SmoothTopKSVM` with ``k = 1``).

    .. math::
        \ell(s, y) = \tau \log \sum_j \exp\big((s_j + \alpha [j \ne y] - s_y)/\tau\big)

    With ``alpha = 0`` and ``tau = 1`` this is the cross-entropy. The functional form is
    :func:`softtopk.smooth_top1_svm`.

    Args:
        tau: temperature :math:`\tau > 0`. Default 1.
        alpha: margin :math:`\alpha \ge 0`. Default 1.
        weight: as in :class:`SmoothTopKSVM`.
        ignore_index: as in :class:`SmoothTopKSVM`.
        reduction: as in :class:`SmoothTopKSVM`.

    Shape:
        As :class:`SmoothTopKSVM` (``C >= 2``).

    Example:
        >>> import torch, softtopk
        >>> softtopk.SmoothTop1SVM(alpha=0.0)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))  # = CE
        tensor(2.1852)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """

    _function = staticmethod(smooth_top1_svm)
    _param_names = ("tau", "alpha")

    def __init__(
        self,
        *,
        tau: float = 1.0,
        alpha: float = 1.0,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        _, self.tau, self.alpha = _svm_params(1, tau, alpha)


class TopKSVM(ClassLoss):
    r"""Hard top-k SVM loss, the limit :math:`\tau \to 0` of :class:`SmoothTopKSVM`.

    .. math::
        \ell(s, y) = \max\big(0,\ \alpha + (s_{\setminus y,[k]} - s_y)/k\big)

    with :math:`s_{\setminus y,[k]}` the k-th largest score other than the label's. The functional
    form is :func:`softtopk.topk_svm`.

    Args:
        k: the ``k`` of top-k, ``1 <= k < C``. Default 5.
        alpha: margin :math:`\alpha \ge 0`. Default 1.
        weight: as in :class:`SmoothTopKSVM`.
        ignore_index: as in :class:`SmoothTopKSVM`.
        reduction: as in :class:`SmoothTopKSVM`.

    Shape:
        As :class:`SmoothTopKSVM`.

    Example:
        >>> import torch, softtopk
        >>> softtopk.TopKSVM(k=2)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([2]))  # 1 + (1 - 0) / 2
        tensor(1.5000)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """

    _function = staticmethod(topk_svm)
    _param_names = ("k", "alpha")

    def __init__(
        self,
        *,
        k: int = 5,
        alpha: float = 1.0,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.k, _, self.alpha = _svm_params(k, None, alpha)


class Top1SVM(ClassLoss):
    r"""Hard top-1 (Crammer–Singer) SVM loss: :class:`TopKSVM` with ``k = 1``.

    .. math::
        \ell(s, y) = \max\big(0,\ \alpha + \max_{j \ne y} s_j - s_y\big)

    The functional form is :func:`softtopk.top1_svm`.

    Args:
        alpha: margin :math:`\alpha \ge 0`. Default 1.
        weight: as in :class:`SmoothTopKSVM`.
        ignore_index: as in :class:`SmoothTopKSVM`.
        reduction: as in :class:`SmoothTopKSVM`.

    Shape:
        As :class:`SmoothTopKSVM` (``C >= 2``).

    Example:
        >>> import torch, softtopk
        >>> softtopk.Top1SVM()(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))  # 1 + 3 - 1
        tensor(3.)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """

    _function = staticmethod(top1_svm)
    _param_names = ("alpha",)

    def __init__(
        self,
        *,
        alpha: float = 1.0,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        _, _, self.alpha = _svm_params(1, None, alpha)
