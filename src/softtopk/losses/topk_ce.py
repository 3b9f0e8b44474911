"""Top-k cross-entropy (Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022).

With ``P_K = (p_1, ..., p_K)`` a distribution over "top-κ", the relaxed probability that the label
``y`` is among the top κ is :math:`q_\\kappa(y) = \\sum_{r < \\kappa} R[y, r]` (``R`` the relaxed
top-K ranks), and the per-sample loss is

.. math::
    \\ell = -\\log\\big(\\lfloor \\textstyle\\sum_\\kappa p_\\kappa\\, q_\\kappa(y) \\rfloor\\big),
    \\qquad \\lfloor p \\rfloor = p\\,(1 - 2\\cdot 10^{-7}) + 10^{-7}

(``top1_mode='sort'``). ``'sm'`` replaces :math:`q_1` by ``softmax(s)_y``; ``'smce'`` adds
:math:`p_1 \\cdot \\mathrm{CE}` to :math:`(\\sum_{\\kappa \\ge 2} p_\\kappa) \\cdot` the ``-log`` of the top-κ≥2 part.

Pre-selection with ``m``: only the ``m`` largest scores (the label's score replacing the m-th if the
label is not among them) are relaxed. Unlike difftopk, which feeds the label on wire 0 (where an
odd-even network gives a truly-top-5 label ~0.02 relaxed top-5 mass), the selected scores are fed in
sorted order, the label last among scores equal to it: the relaxed input depends only on the
values, so the loss is invariant to class order and to which class is the label.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import torch

from .._methods import resolve
from .._reduction import class_rows, reduce_loss
from .._validation import check_class_input, check_class_target, check_class_weight, check_reduction

TOP1_MODES = ("sm", "smce", "sort")
_FLOOR = 1e-7


def check_p_k(p_k: Any) -> tuple[float, ...]:
    """``P_K`` as a tuple of non-negative floats summing to 1 (within 1e-4, as difftopk)."""
    if isinstance(p_k, torch.Tensor):
        p_k = p_k.tolist()
    if isinstance(p_k, (str, bytes)) or not isinstance(p_k, Sequence) or len(p_k) == 0:
        raise TypeError(f"p_k must be a non-empty sequence of floats, got {p_k!r}")
    if any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in p_k):
        raise TypeError(f"p_k must hold real numbers, got {p_k!r}")
    values = tuple(float(p) for p in p_k)
    if any(not math.isfinite(p) or p < 0 for p in values):
        raise ValueError(f"p_k entries must be finite and >= 0, got {list(values)}")
    if abs(sum(values) - 1.0) > 1e-4:
        raise ValueError(f"p_k must sum to 1, got {list(values)} summing to {sum(values)}")
    return values


def check_top1_mode(top1_mode: Any) -> str:
    if top1_mode not in TOP1_MODES:
        raise ValueError(f"top1_mode must be one of {TOP1_MODES}, got {top1_mode!r}")
    return top1_mode


def check_m(m: Any, k: int, classes: int | None = None) -> int | None:
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, numbers.Integral):
        raise TypeError(f"m must be an int or None, got {type(m).__name__} {m!r}")
    if m <= k:
        raise ValueError(f"m must be larger than k = len(p_k) = {k}, got {m}")
    if classes is not None and m >= classes:
        raise ValueError(f"m must be smaller than the number of classes {classes}, got {m}")
    return m


def rank_weights(p_k: tuple[float, ...], top1_mode: str) -> tuple[float, ...]:
    """``w_r`` with ``sum_kappa p_kappa q_kappa(y) = sum_r w_r R[y, r]`` (without the softmax part)."""
    tail = [sum(p_k[r:]) for r in range(len(p_k))]
    if top1_mode != "sort":
        tail[0] = tail[1] if len(p_k) > 1 else 0.0
    return tuple(tail)


_GROUP = 8


def _top_indices(scores: torch.Tensor, m: int) -> torch.Tensor:
    """Indices (B, m) of the ``m`` largest scores per row, in descending order of value.

    ``torch.topk`` on CPU takes a slow ``nth_element`` path for rows shorter than ``64 m``. For
    rows of at least ``32 m`` scores this first splits each row into ``w = ceil(n / 8)`` strided
    blocks ``{j, j + w, ..., j + 7w}``, keeps the ``m`` blocks with the largest maxima, and takes the
    exact top-``m`` of their ``8 m`` scores: the kept maxima are ``m`` distinct scores, so the
    ``m``-th largest score is at least the smallest kept maximum, which bounds every score outside
    the kept blocks. Same values as ``torch.topk`` (indices may differ among ties), with both of its
    ``topk`` calls on rows of about ``8 m`` scores.
    """
    rows, n = scores.shape
    if n < 4 * _GROUP * m:
        return scores.topk(m, dim=-1).indices
    width = -(-n // _GROUP)
    if width * _GROUP != n:
        scores = torch.nn.functional.pad(scores, (0, width * _GROUP - n), value=float("-inf"))
    kept = scores.view(rows, _GROUP, width).amax(1).topk(m, dim=-1, sorted=False).indices
    offsets = torch.arange(0, width * _GROUP, width, device=scores.device)
    candidates = (kept.unsqueeze(-1) + offsets).view(rows, m * _GROUP)
    best = scores.gather(-1, candidates).topk(m, dim=-1).indices
    return candidates.gather(-1, best)


def _select(logits: torch.Tensor, target: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``m`` largest scores with the label's score forced in, in ascending order, and the label's
    position (last among the selected scores equal to it). Index ops only.

    Ascending order puts the score of rank ``r`` on the wire where the networks (max on the last
    wire, as in difftopk) output rank ``r``; fed descending, an odd-even network would have to carry
    every top score across all its wires, and a truly-top-5 label would keep little top-5 mass.
    """
    with torch.no_grad():
        index = _top_indices(logits, m)
        label = target.unsqueeze(-1)
        hit = index == label
        found = hit.any(-1, keepdim=True)
        last = torch.arange(m, device=logits.device) == m - 1
        index = torch.where(~found & last, label, index)
        own_slot = torch.where(found, hit.int().argmax(-1, keepdim=True), m - 1)
        label_score = logits.gather(-1, label)
        position = (logits.gather(-1, index) > label_score).sum(-1, keepdim=True)
        index = index.scatter(-1, own_slot, index.gather(-1, position)).scatter(-1, position, label)
    return logits.gather(-1, index.flip(-1)), m - 1 - position.squeeze(-1)


def topk_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    p_k: Sequence[float],
    *,
    method: str = "splitter_selection",
    m: int | None = None,
    top1_mode: str = "sm",
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    **params: Any,
) -> torch.Tensor:
    """Top-k cross-entropy of Petersen et al. (ICML 2022); see :class:`softtopk.TopKCrossEntropyLoss`.

    Shape:
        input ``(N, C)`` or ``(N, C, d1, ...)``; target ``(N)`` or ``(N, d1, ...)`` class indices;
        output a scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch, softtopk
        >>> logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
        >>> loss = softtopk.functional.topk_cross_entropy(
        ...     logits, torch.tensor([1]), [0.5, 0.5], method="softsort", tau=0.5)
        >>> round(loss.item(), 4)  # -log(.5 * softmax_1 + .5 * (R[1, 0] + R[1, 1]))
        0.7734
    """
    input = check_class_input(input)
    p_k = check_p_k(p_k)
    classes = input.shape[1]
    if len(p_k) > classes:
        raise ValueError(f"p_k must not be longer than the number of classes {classes}, got length {len(p_k)}")
    check_top1_mode(top1_mode)
    m = check_m(m, len(p_k), classes)
    check_reduction(reduction)
    target = check_class_target(input, target, ignore_index)
    weight = check_class_weight(weight, classes)
    spec, params = resolve(method, params, "ranks")

    logits, flat_target, safe_target = class_rows(input, target, ignore_index)
    scores, position = _select(logits, safe_target, classes if m is None else m)

    k = len(p_k)
    if spec.label_ranks is not None:
        label_ranks = spec.label_ranks(scores, position, k, **params)
    else:
        ranks = spec.ranks(scores, k, **params)
        label_ranks = ranks.gather(-2, position.view(-1, 1, 1).expand(-1, 1, k)).squeeze(-2)
    weights = torch.tensor(rank_weights(p_k, top1_mode), dtype=logits.dtype, device=logits.device)
    topk_mass = (label_ranks * weights).sum(-1)
    position = position.unsqueeze(-1)
    if top1_mode == "sm":
        topk_mass = topk_mass + p_k[0] * torch.softmax(scores, -1).gather(-1, position).squeeze(-1)
    per_sample = -torch.log(topk_mass * (1 - 2 * _FLOOR) + _FLOOR)
    if top1_mode == "smce":
        cross_entropy = -torch.log_softmax(scores, -1).gather(-1, position).squeeze(-1)
        per_sample = p_k[0] * cross_entropy + sum(p_k[1:]) * per_sample
    return reduce_loss(
        per_sample,
        flat_target,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
        shape=target.shape,
        input=input,
    )
