"""Noised (stochastically smoothed) top-k hinge losses (Garcin et al., ICML 2022; pytopk).

The top-k calibrated hinge loss :math:`\\max(0, 1 + s_{[k+1]} - s_y)` is zero exactly when the
label's score beats the (k+1)-th largest score of the **full** score vector by the margin 1. Its
smoothed version replaces :math:`s_{[k+1]}` by the Monte-Carlo Gaussian smoothing of
:func:`softtopk.ops.perturbed.noised_kth_value`,

.. math::
    \\operatorname{top}_{k+1,\\epsilon}(s) = \\frac{1}{S} \\sum_{b=1}^{S} (s + \\epsilon Z_b)_{[k+1]},
    \\qquad Z_b \\sim \\mathcal N(0, I),

whose gradient is the exact gradient of the estimate (a mean of ``S`` one-hots): at most ``S + 1``
non-zero entries per row of the loss gradient. The hinge is applied to the Monte-Carlo average.

* balanced: :math:`\\ell = \\max(0, 1 + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)`;
* imbalanced: LDAM margins :math:`m_c = m_{\\max}\\, n_c^{-1/4} / \\max_{c'} n_{c'}^{-1/4}` (the rarest
  class gets ``max_m``) and :math:`\\ell = \\max(0, \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y))`.

Noise: ``Z`` has shape ``input.shape + (S,)`` and, unless given, is drawn by one call
``torch.randn(input.shape + (S,), generator=generator)`` in float32 (cast to float64 for float64
inputs). For ``(N, C)`` input and the global RNG this is the draw pytopk 0.1.0 makes, so a seeded
run gives pytopk's values (see :mod:`softtopk.compat.pytopk`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
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
from ..ops.perturbed import check_generator, check_n_samples, noised_kth_value

__all__ = [
    "bal_noised_topk",
    "check_cls_num_list",
    "imbal_noised_topk",
    "ldam_margins",
]


# ---------------------------------------------------------------------------------- validation


def _check_k(k: Any, classes: int | None = None) -> int:
    """``k`` an int with ``1 <= k <= C - 1`` (the loss uses the (k+1)-th largest of C scores)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if classes is not None and k >= classes:
        raise ValueError(
            f"k must be smaller than the number of classes C = {classes} (the loss uses the (k+1)-th "
            f"largest score), got k = {k}"
        )
    return int(k)


def _check_epsilon(epsilon: Any) -> float:
    epsilon = check_real("epsilon", epsilon, positive=False)
    if epsilon < 0:
        raise ValueError(f"epsilon must be a non-negative finite number, got {epsilon!r}")
    return epsilon


def _check_max_m(max_m: Any) -> float:
    max_m = check_real("max_m", max_m, positive=False)
    if max_m < 0:
        raise ValueError(f"max_m must be a non-negative finite number, got {max_m!r}")
    return max_m


def check_cls_num_list(cls_num_list: Any, classes: int | None = None) -> tuple[float, ...]:
    """Per-class training counts as a tuple of positive finite floats (length ``classes`` when given).

    pytopk silently turns a zero count into a NaN margin (and every other margin into 0); here a
    zero, negative or non-finite count is a ``ValueError``.
    """
    if hasattr(cls_num_list, "tolist"):  # torch tensors, numpy arrays
        cls_num_list = cls_num_list.tolist()
    if isinstance(cls_num_list, (str, bytes)) or not isinstance(cls_num_list, Sequence) or len(cls_num_list) == 0:
        raise TypeError(f"cls_num_list must be a non-empty sequence of class counts, got {cls_num_list!r}")
    if any(isinstance(n, bool) or not isinstance(n, numbers.Real) for n in cls_num_list):
        raise TypeError(f"cls_num_list must hold real numbers (class counts), got {list(cls_num_list)!r}")
    counts = tuple(float(n) for n in cls_num_list)
    bad = [(c, n) for c, n in enumerate(counts) if not (math.isfinite(n) and n > 0)]
    if bad:
        c, n = bad[0]
        raise ValueError(
            f"cls_num_list must hold positive finite class counts, got {n!r} for class {c} "
            "(a class without training examples has no LDAM margin)"
        )
    if classes is not None and len(counts) != classes:
        raise ValueError(
            f"cls_num_list must have one count per class, C = {classes}, got length {len(counts)}"
        )
    return counts


def ldam_margins(cls_num_list: Sequence[float], max_m: float) -> torch.Tensor:
    """LDAM margins :math:`m_c = m_{\\max} n_c^{-1/4} / \\max_{c'} n_{c'}^{-1/4}` as a float64 tensor ``(C,)``.

    Computed in double precision in the same order as pytopk (``n**-1/4`` as ``1 / n**0.25``, then
    times ``max_m / max``), so casting to float32 gives pytopk's ``m_list``.

    Example:
        >>> from softtopk.losses.noised import ldam_margins
        >>> ldam_margins([5, 15, 10], 0.3)
        tensor([0.3000, 0.2280, 0.2523], dtype=torch.float64)
    """
    counts = check_cls_num_list(cls_num_list)
    max_m = _check_max_m(max_m)
    inverse = [1.0 / n**0.25 for n in counts]
    factor = max_m / max(inverse)
    return torch.tensor([v * factor for v in inverse], dtype=torch.float64)


def _noise_rows(
    input: torch.Tensor, n_samples: int, generator: torch.Generator | None, noise: torch.Tensor | None
) -> torch.Tensor:
    """Noise ``input.shape + (S,)`` (given or drawn) as rows ``(R, C, S)`` matching :func:`class_rows`."""
    if noise is None:
        noise = torch.randn((*input.shape, n_samples), generator=generator, device=input.device, dtype=torch.float32)
    else:
        if not isinstance(noise, torch.Tensor) or not noise.is_floating_point():
            raise TypeError(f"noise must be a floating torch.Tensor or None, got {type(noise).__name__} "
                            f"{getattr(noise, 'dtype', noise)!r}")
        if noise.dim() != input.dim() + 1 or noise.shape[:-1] != input.shape or noise.shape[-1] < 1:
            want = ", ".join(str(s) for s in input.shape)
            raise ValueError(f"noise must have shape input.shape + (S,) = ({want}, S) with S >= 1, "
                             f"got {tuple(noise.shape)}")
    return noise.movedim(1, -2).reshape(-1, input.shape[1], noise.shape[-1])


def _noised_hinge(
    input: Any,
    target: Any,
    *,
    k: Any,
    epsilon: float,
    n_samples: int,
    generator: torch.Generator | None,
    noise: torch.Tensor | None,
    margins: torch.Tensor | float,
    scale: float | None,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
) -> torch.Tensor:
    """``max(0, scale * (margin_y + top_{k+1,eps}(s) - s_y))`` reduced; shared by functions, modules
    and :mod:`softtopk.compat.pytopk` (same operation order as pytopk, for bitwise equal results)."""
    input = check_class_input(input)
    classes = input.shape[1]
    k = _check_k(k, classes)
    check_reduction(reduction)
    target = check_class_target(input, target, ignore_index)
    weight = check_class_weight(weight, classes)

    logits, flat_target, safe_target = class_rows(input, target, ignore_index)
    rows_noise = _noise_rows(input, n_samples, generator, noise)
    top = noised_kth_value(logits, k + 1, epsilon=epsilon, noise=rows_noise, dim=-1)
    label_score = logits.gather(1, safe_target.unsqueeze(1)).squeeze(1)
    if isinstance(margins, torch.Tensor):
        margins = margins.to(device=logits.device, dtype=logits.dtype)[safe_target]
    hinge = (margins + top) - label_score
    if scale is not None:
        hinge = scale * hinge
    return reduce_loss(
        torch.relu(hinge),
        flat_target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        shape=target.shape,
        input=input,
    )


# ---------------------------------------------------------------------------------- functions


def bal_noised_topk(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    k: int,
    epsilon: float,
    n_samples: int = 5,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Balanced noised top-k hinge loss (Garcin et al., ICML 2022; pytopk's ``BalNoisedTopK``).

    .. math::
        \\ell(s, y) = \\max\\big(0,\\ 1 + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y\\big), \\qquad
        \\operatorname{top}_{k+1,\\epsilon}(s) = \\frac{1}{S}\\sum_{b=1}^{S} (s + \\epsilon Z_b)_{[k+1]}

    with :math:`v_{[j]}` the j-th largest entry of the full score vector (label included) and
    :math:`Z_b` iid standard Gaussian. ``epsilon = 0`` is the exact top-k hinge
    :math:`\\max(0, 1 + s_{[k+1]} - s_y)` with a one-hot subgradient.

    Args:
        input: scores ``(N, C)`` or ``(N, C, d1, ...)``, floating (float16/bfloat16 computed in float32).
        target: class indices ``(N)`` or ``(N, d1, ...)`` in ``[0, C)`` or ``ignore_index``.
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale, a finite number ``>= 0``.
        n_samples: number of noise draws ``S``, an int ``>= 1``. Default 5. Ignored when ``noise``
            is given (its last axis is ``S``).
        generator: a :class:`torch.Generator` on the input's device type, or ``None`` (global RNG).
        noise: optional fixed standard noise ``input.shape + (S,)``; by default drawn as
            ``torch.randn(input.shape + (S,), generator=generator)`` in float32.
        weight: optional per-class weights ``(C,)``, as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``.
        - target: ``(N)`` or ``(N, d1, ...)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch
        >>> from softtopk.losses.noised import bal_noised_topk
        >>> scores = torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]])
        >>> labels = torch.tensor([0, 2])
        >>> bal_noised_topk(scores, labels, k=1, epsilon=0.0, reduction="none")  # 1 + s_[2] - s_y
        tensor([0.5000, 6.5000])
        >>> g = torch.Generator().manual_seed(0)
        >>> bal_noised_topk(scores, labels, k=1, epsilon=1.0, generator=g)
        tensor(2.9793)

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022.
    """
    return _noised_hinge(
        input, target, k=k, epsilon=_check_epsilon(epsilon), n_samples=check_n_samples("n_samples", n_samples),
        generator=check_generator("generator", generator, getattr(input, "device", None)), noise=noise,
        margins=1.0, scale=None, weight=weight, ignore_index=ignore_index, reduction=reduction,
    )


def imbal_noised_topk(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    k: int,
    epsilon: float,
    max_m: float,
    cls_num_list: Sequence[float],
    scale: float = 50.0,
    n_samples: int = 5,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Imbalanced noised top-k hinge loss with LDAM margins (Garcin et al., ICML 2022; pytopk's
    ``ImbalNoisedTopK``).

    .. math::
        \\ell(s, y) = \\max\\big(0,\\ \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)\\big),
        \\qquad m_c = m_{\\max} \\frac{n_c^{-1/4}}{\\max_{c'} n_{c'}^{-1/4}}

    with :math:`n_c` the training count of class ``c`` (the rarest class gets ``max_m``) and
    :math:`\\operatorname{top}_{k+1,\\epsilon}` as in :func:`bal_noised_topk`. ``scale`` only
    multiplies the hinge: the default 50 assumes normalised features and last layer (cosine
    logits); use 1 for raw logits.

    Args:
        input, target, k, epsilon, n_samples, generator, noise, weight, ignore_index, reduction:
            as in :func:`bal_noised_topk`.
        max_m: the largest margin, a finite number ``>= 0``.
        cls_num_list: per-class training counts, ``C`` positive numbers (a zero count is an error).
        scale: positive multiplier of the hinge. Default 50.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``.
        - target: ``(N)`` or ``(N, d1, ...)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch
        >>> from softtopk.losses.noised import imbal_noised_topk
        >>> scores = torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]])
        >>> labels = torch.tensor([0, 2])
        >>> imbal_noised_topk(scores, labels, k=1, epsilon=0.0, max_m=0.3, cls_num_list=[5, 15, 10],
        ...                   scale=1.0, reduction="none")  # m_y + s_[2] - s_y
        tensor([0.0000, 5.7523])
        >>> g = torch.Generator().manual_seed(0)
        >>> imbal_noised_topk(scores, labels, k=1, epsilon=0.1, max_m=0.3, cls_num_list=[5, 15, 10],
        ...                   generator=g)
        tensor(142.4531)

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022. K. Cao, C. Wei, A. Gaidon,
        N. Arechiga, T. Ma, "Learning Imbalanced Datasets with Label-Distribution-Aware Margin
        Loss", NeurIPS 2019.
    """
    epsilon = _check_epsilon(epsilon)
    n_samples = check_n_samples("n_samples", n_samples)
    generator = check_generator("generator", generator, getattr(input, "device", None))
    scale = check_real("scale", scale, positive=True)
    input = check_class_input(input)
    check_cls_num_list(cls_num_list, input.shape[1])
    return _noised_hinge(
        input, target, k=k, epsilon=epsilon, n_samples=n_samples, generator=generator, noise=noise,
        margins=ldam_margins(cls_num_list, max_m), scale=scale, weight=weight, ignore_index=ignore_index,
        reduction=reduction,
    )
