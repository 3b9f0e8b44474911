"""Smooth top-k SVM losses of Lapin et al. / Berrada et al., as difftopk's ``SmoothTopKLoss``.

For scores :math:`s \\in \\mathbb{R}^C`, label :math:`y`, margin :math:`\\alpha` and temperature
:math:`\\tau`, the smooth top-k hinge is a log-sum-exp over all k-subsets ``A`` of classes,

.. math::
    L_{k,\\tau}(s, y) = \\tau \\log \\sum_{|A| = k} e^{(\\alpha [y \\notin A] + \\frac1k \\sum_{j \\in A} s_j)/\\tau}
        - \\tau \\log \\sum_{|A| = k,\\ y \\in A} e^{\\frac1k \\sum_{j \\in A} s_j / \\tau} .

With :math:`z_j = s_j / (k\\tau)` and :math:`\\sigma_j` the ``j``-th elementary symmetric polynomial
of :math:`\\{e^{z_j}\\}_{j \\ne y}` (:func:`softtopk.ops.esf.log_esf`) this factorises into

.. math::
    L_{k,\\tau}(s, y)
        = \\tau\\, \\mathrm{softplus}\\big(\\alpha/\\tau + \\log\\sigma_k - \\log\\sigma_{k-1} - z_y\\big).

The hard top-k hinge (the limit :math:`\\tau \\to 0`) is
:math:`\\max\\big(0,\\ \\alpha + (s_{\\setminus y, [k]} - s_y)/k\\big)` with
:math:`s_{\\setminus y,[k]}` the k-th largest score other than the label's.
``smooth_hard_topk_loss`` uses it for the samples whose k-th and (k+1)-th largest scores (label
included) are at least :math:`k \\tau \\log 1000` apart, the smooth loss elsewhere: difftopk's rule.

References: M. Lapin, M. Hein, B. Schiele, "Loss Functions for Top-k Error", CVPR 2016;
L. Berrada, A. Zisserman, M. P. Kumar, "Smooth Loss Functions for Deep Top-k Classification",
ICLR 2018.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from .._reduction import class_rows, reduce_loss
from .._validation import check_class_input, check_class_target, check_class_weight, check_real, check_reduction
from .smooth_svm import _hard_rows as _hard
from .smooth_svm import _smooth_topk_rows as _smooth

__all__ = ["smooth_hard_topk_loss", "smooth_topk_loss"]

HARD_THRESHOLD = 1e3  # difftopk's (and Berrada's) ``thresh``: the hard switch needs a gap of kτ·log(1e3)


def _flatten(
    input: Any, target: Any, k: Any, tau: Any, alpha: Any, reduction: Any, weight: Any, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Validate; return logits ``(R, C)`` in the compute dtype, flat targets, safe labels, weight.

    ``R = N * d1 * ...``: the class axis is moved last and the rest flattened."""
    input = check_class_input(input)
    classes = input.shape[1]
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
    if not 1 <= k < classes:
        raise ValueError(f"k must satisfy 1 <= k < C = {classes} (the number of classes), got {k}")
    check_real("tau", tau, positive=True)
    check_real("alpha", alpha, positive=False)
    check_reduction(reduction)
    target = check_class_target(input, target, ignore_index)
    weight = check_class_weight(weight, classes)
    return (*class_rows(input, target, ignore_index), weight)


def smooth_topk_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    k: int,
    *,
    tau: float = 1.0,
    alpha: float = 1.0,
    reduction: str = "mean",
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Smooth top-k SVM loss :math:`L_{k,\\tau}` (module doc), as difftopk's ``SmoothTopKLoss``.

    .. math::
        \\ell(s, y) = \\tau\\, \\mathrm{softplus}\\big(\\alpha/\\tau + \\log\\sigma_k(e^{z_{\\setminus y}})
            - \\log\\sigma_{k-1}(e^{z_{\\setminus y}}) - z_y\\big), \\qquad z = s / (k\\tau)

    Args:
        input: scores, floating.
        target: class indices.
        k: the ``k`` of top-k, ``1 <= k < C``.
        tau: temperature :math:`\\tau > 0` (default 1; difftopk's ``tau``).
        alpha: margin :math:`\\alpha` (default 1, difftopk's fixed value).
        reduction: ``'mean'`` (default; weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.
        weight: optional per-class weights ``(C,)``, as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``.
        - target: ``(N)`` or ``(N, d1, ...)``, integers in ``[0, C)`` (or ``ignore_index``).
        - output: scalar, or the target's shape for ``reduction='none'``; in ``input``'s dtype
          (float16/bfloat16 are computed in float32; under autocast the loss is float32).

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_topk import smooth_topk_loss
        >>> logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]])
        >>> smooth_topk_loss(logits, torch.tensor([0, 3]), k=2, reduction="none")
        tensor([0.4741, 1.5019])

    References:
        Lapin, Hein & Schiele, CVPR 2016; Berrada, Zisserman & Kumar, ICLR 2018.
    """
    logits, flat_target, label, weight = _flatten(input, target, k, tau, alpha, reduction, weight, ignore_index)
    per_sample = _smooth(logits, label, k, tau, alpha)
    return reduce_loss(
        per_sample,
        flat_target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        shape=target.shape,
        input=input,
    )


def smooth_hard_topk_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    k: int,
    *,
    tau: float = 1.0,
    alpha: float = 1.0,
    reduction: str = "mean",
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Smooth top-k SVM loss with difftopk's per-sample switch to the hard top-k hinge.

    .. math::
        \\ell(s, y) = \\begin{cases}
            \\max\\big(0,\\ \\alpha + (s_{\\setminus y,[k]} - s_y)/k\\big)
                & \\text{if } s_{[k]} - s_{[k+1]} \\ge k \\tau \\log 1000 \\\\
            L_{k,\\tau}(s, y) & \\text{otherwise}
        \\end{cases}

    :math:`s_{[k]}` is the k-th largest score of the whole row (label included). The switch is a
    ``torch.where`` (no host sync, static shapes); as in difftopk the loss jumps where it fires.
    Arguments, shapes and dtypes as :func:`smooth_topk_loss`.

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_topk import smooth_hard_topk_loss
        >>> logits = torch.tensor([[30.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]])
        >>> smooth_hard_topk_loss(logits, torch.tensor([1, 3]), k=1, reduction="none")
        tensor([30.0000,  2.9608])
    """
    logits, flat_target, label, weight = _flatten(input, target, k, tau, alpha, reduction, weight, ignore_index)
    top = logits.topk(k + 1, dim=-1).values
    hard = (top[:, k - 1] - top[:, k]) >= k * tau * math.log(HARD_THRESHOLD)
    per_sample = torch.where(hard, _hard(logits, label, k, alpha), _smooth(logits, label, k, tau, alpha))
    return reduce_loss(
        per_sample,
        flat_target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        shape=target.shape,
        input=input,
    )
