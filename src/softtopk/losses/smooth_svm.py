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

Numerics. Every row is shifted by the (detached) largest non-label score before anything else, so
the loss is shift invariant up to the rounding of the input itself; :math:`\\log e_{k-1}, \\log e_k` come
from :func:`softtopk.ops.esf.log_esf` (exact prefix sums, ``O(C k)``, with an analytic ``O(C k)``
backward; see that module for the numerics). There is no per-row switch to the hard loss (the
original's ``thresh``), so the loss is continuous in ``s`` everywhere, and the float32 result is the
exact smooth loss for every input (errors of order :math:`\\epsilon_{32} \\cdot \\max_j |s_j - \\max s|`, as any float32 computation of a
loss of that size).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from .._reduction import class_rows, reduce_loss
from .._validation import (
    check_class_input,
    check_class_target,
    check_class_weight,
    check_real,
    check_reduction,
)
from ..ops.esf import log_esf

__all__ = [
    "smooth_top1_svm",
    "smooth_topk_svm",
    "top1_svm",
    "topk_svm",
]


def _check_k(k: Any, classes: int | None) -> int:
    """``k`` as an int with ``1 <= k < classes`` (the number of classes ``n`` must exceed ``k``)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if classes is not None and k >= classes:
        raise ValueError(f"k must be smaller than the number of classes C = {classes}, got k = {k}")
    return int(k)


def _check_alpha(alpha: Any) -> float:
    alpha = check_real("alpha", alpha, positive=False)
    if alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    return alpha


def _check_n_classes(n_classes: Any) -> int:
    if isinstance(n_classes, bool) or not isinstance(n_classes, numbers.Integral):
        raise TypeError(f"n_classes must be an int, got {type(n_classes).__name__} {n_classes!r}")
    if n_classes < 2:
        raise ValueError(f"n_classes must be >= 2, got {n_classes}")
    return int(n_classes)


def _rows(
    input: Any, target: Any, k: Any, weight: Any, ignore_index: int, reduction: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Validate; return the validated target, logits ``(R, C)`` in the compute dtype, flat targets,
    labels safe to gather with, and the weight."""
    input = check_class_input(input)
    classes = input.shape[1]
    _check_k(k, classes)
    check_reduction(reduction)
    target = check_class_target(input, target, ignore_index)
    weight = check_class_weight(weight, classes)
    return (target, *class_rows(input, target, ignore_index), weight)


def _shifted_split(logits: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The label's score ``(R,)`` and the other scores ``(R, C)`` (label's entry ``-inf``), both
    shifted by the detached largest non-label score (the loss is shift invariant)."""
    label = label.unsqueeze(-1)
    others = logits.scatter(-1, label, -math.inf)
    shift = others.amax(-1, keepdim=True).detach()
    return (logits.gather(-1, label) - shift).squeeze(-1), others - shift


def _smooth_topk_rows(logits: torch.Tensor, label: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    label_score, others = _shifted_split(logits, label)
    scale = 1.0 / (k * tau)
    log_e = log_esf(others * scale, k)[:, k - 1 :]  # log e_{k-1}, log e_k
    margin = alpha / tau + (log_e[:, 1] - log_e[:, 0]) - label_score * scale
    # softplus as logaddexp: nn.functional.softplus returns x above 20 (an error of tau e^-20)
    return tau * torch.logaddexp(margin, torch.zeros_like(margin))


def _smooth_top1_rows(logits: torch.Tensor, label: torch.Tensor, tau: float, alpha: float) -> torch.Tensor:
    label_score, others = _shifted_split(logits, label)
    # tau * log(1 + sum_{j != y} exp((alpha + s_j - s_y) / tau)); the 1 is the label's own term
    terms = torch.cat([(others + alpha - label_score.unsqueeze(-1)) / tau, torch.zeros_like(others[:, :1])], -1)
    return tau * torch.logsumexp(terms, dim=-1)


def _hard_rows(logits: torch.Tensor, label: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    label_score, others = _shifted_split(logits, label)
    kth_other = others.topk(k, dim=-1).values[:, k - 1]
    return torch.clamp(alpha + (kth_other - label_score) / k, min=0.0)


def _reduce(per_sample, flat_target, target, input, weight, ignore_index, reduction):
    return reduce_loss(
        per_sample,
        flat_target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        shape=target.shape,
        input=input,
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
    """Smooth top-k SVM loss :math:`L_{k,\\tau}` of Berrada et al., exact for every input.

    .. math::
        \\ell(s, y) = \\tau\\, \\mathrm{softplus}\\big(\\alpha/\\tau + \\log e_k(e^{z_{\\setminus y}})
            - \\log e_{k-1}(e^{z_{\\setminus y}}) - z_y\\big), \\qquad z = s / (k\\tau),

    equal to the log-sum-exp over k-subsets of the module doc. No switch to the hard loss: continuous
    and with finite gradients everywhere.

    Args:
        input: scores (logits), floating.
        target: class indices.
        k: the ``k`` of top-k, ``1 <= k < C`` (default 5).
        tau: temperature :math:`\\tau > 0` (default 1). It acts after the division by ``k``, so values
            are not comparable across ``k``.
        alpha: margin :math:`\\alpha \\ge 0` (default 1); the effective margin on raw scores is ``k alpha``.
        weight: optional per-class weights ``(C,)``, as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (default; weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``.
        - target: ``(N)`` or ``(N, d1, ...)``, integers in ``[0, C)`` (or ``ignore_index``).
        - output: scalar, or the target's shape for ``reduction='none'``; in ``input``'s dtype
          (float16/bfloat16 are computed in float32; under autocast the loss is float32).

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm import smooth_topk_svm
        >>> logits = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]])
        >>> smooth_topk_svm(logits, torch.tensor([0, 3]), k=2, reduction="none")
        tensor([0.4741, 1.5019])

    Reference:
        L. Berrada, A. Zisserman, M. P. Kumar, "Smooth Loss Functions for Deep Top-k
        Classification", ICLR 2018.
    """
    check_real("tau", tau, positive=True)
    alpha = _check_alpha(alpha)
    target, logits, flat_target, label, weight = _rows(input, target, k, weight, ignore_index, reduction)
    per_sample = _smooth_topk_rows(logits, label, int(k), float(tau), alpha)
    return _reduce(per_sample, flat_target, target, input, weight, ignore_index, reduction)


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
    """Smooth top-1 SVM loss :math:`L_{1,\\tau}` (``smooth_topk_svm`` with ``k = 1``, one log-sum-exp).

    .. math::
        \\ell(s, y) = \\tau \\log \\sum_j \\exp\\big((s_j + \\alpha [j \\ne y] - s_y)/\\tau\\big)

    With ``alpha = 0`` and ``tau = 1`` this is the cross-entropy.

    Args:
        input: scores (logits), floating.
        target: class indices.
        tau: temperature :math:`\\tau > 0` (default 1).
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        weight: optional per-class weights ``(C,)``, as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.

    Shape:
        As :func:`smooth_topk_svm` (``C >= 2``).

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm import smooth_top1_svm
        >>> logits = torch.tensor([[3.0, 1.0, 0.0, -1.0]])
        >>> smooth_top1_svm(logits, torch.tensor([1]), alpha=0.0)  # = cross-entropy
        tensor(2.1852)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """
    check_real("tau", tau, positive=True)
    alpha = _check_alpha(alpha)
    target, logits, flat_target, label, weight = _rows(input, target, 1, weight, ignore_index, reduction)
    per_sample = _smooth_top1_rows(logits, label, float(tau), alpha)
    return _reduce(per_sample, flat_target, target, input, weight, ignore_index, reduction)


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
    """Hard top-k SVM loss, the limit :math:`\\tau \\to 0` of :func:`smooth_topk_svm`.

    .. math::
        \\ell(s, y) = \\max\\big(0,\\ \\alpha + (s_{\\setminus y,[k]} - s_y)/k\\big)

    with :math:`s_{\\setminus y,[k]}` the k-th largest score other than the label's.

    Args:
        input: scores (logits), floating.
        target: class indices.
        k: the ``k`` of top-k, ``1 <= k < C`` (default 5).
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        weight: optional per-class weights ``(C,)``, as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.

    Shape:
        As :func:`smooth_topk_svm`.

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm import topk_svm
        >>> logits = torch.tensor([[3.0, 1.0, 0.0, -1.0]])
        >>> topk_svm(logits, torch.tensor([2]), k=2)  # max(0, 1 + (1 - 0) / 2)
        tensor(1.5000)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """
    alpha = _check_alpha(alpha)
    target, logits, flat_target, label, weight = _rows(input, target, k, weight, ignore_index, reduction)
    per_sample = _hard_rows(logits, label, int(k), alpha)
    return _reduce(per_sample, flat_target, target, input, weight, ignore_index, reduction)


def top1_svm(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    alpha: float = 1.0,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Hard top-1 SVM loss (Crammer–Singer): :func:`topk_svm` with ``k = 1``.

    .. math::
        \\ell(s, y) = \\max\\big(0,\\ \\alpha + \\max_{j \\ne y} s_j - s_y\\big)

    Args:
        input: scores (logits), floating.
        target: class indices.
        alpha: margin :math:`\\alpha \\ge 0` (default 1).
        weight: optional per-class weights ``(C,)``, as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (default), ``'sum'`` or ``'none'``.

    Shape:
        As :func:`smooth_topk_svm` (``C >= 2``).

    Example:
        >>> import torch
        >>> from softtopk.losses.smooth_svm import top1_svm
        >>> top1_svm(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))  # 1 + 3 - 1
        tensor(3.)

    Reference:
        Berrada, Zisserman & Kumar, ICLR 2018.
    """
    return topk_svm(input, target, k=1, alpha=alpha, weight=weight, ignore_index=ignore_index, reduction=reduction)
