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
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .._layout import on_device
from .._registry import resolve
from .._validation import check_choice, check_class_input, check_int, check_p_k, check_scales
from ..ops import ce_head_triton, reduce_triton, topk_ce_triton
from ..ops._function import Function
from ..ops.ce_head_triton import FLOOR as _FLOOR
from ..ops.compute import constant, filled, label_row, zero_unless
from ..ops.label_select import LabelSelect
from ._base import ClassLoss, class_loss

__all__ = ["TopKCrossEntropyLoss", "topk_cross_entropy"]

TOP1_MODES = ("sm", "smce", "sort")
_MANY_CLASSES = 100  # above this, m=None (relax every class) is slow enough to say so


def _topk_ce_params(
    p_k: Any, method: Any, m: Any, top1_mode: Any, params: dict[str, Any], classes: int | None = None
) -> tuple[tuple[float, ...], int | None, str, Any, dict[str, Any]]:
    """The family's parameters, checked once for the function and its Module (against the number
    of classes ``C`` when known): ``p_k``, ``m``, ``top1_mode``, the method and its parameters."""
    p_k = check_p_k("p_k", p_k)
    if classes is not None and len(p_k) > classes:
        raise ValueError(f"p_k must not be longer than the number of classes {classes}, got length {len(p_k)}")
    if m is not None and not isinstance(m, _DefaultM):
        if isinstance(m, bool) or not isinstance(m, int):
            raise TypeError(f"m must be an int or None, got {type(m).__name__} {m!r}")
        check_int("m", m, low=len(p_k) + 1, why=f" (larger than k = len(p_k) = {len(p_k)})")
        if classes is not None:
            check_int("m", m, high=classes - 1, why=f" (smaller than the number of classes {classes})")
    top1_mode = check_choice("top1_mode", top1_mode, TOP1_MODES)
    spec, params = resolve(method, params, "ranks")
    return p_k, m, top1_mode, spec, params


def rank_weights(p_k: tuple[float, ...], top1_mode: str) -> tuple[float, ...]:
    """``w_r`` with ``sum_kappa p_kappa q_kappa(y) = sum_r w_r R[y, r]`` (without the softmax part)."""
    tail = [sum(p_k[r:]) for r in range(len(p_k))]
    if top1_mode != "sort":
        tail[0] = tail[1] if len(p_k) > 1 else 0.0
    return tuple(tail)


class _DefaultM(int):
    """The default ``m``, 16: unlike an explicit ``m`` it may reach the number of classes ``C``,
    where it relaxes every class (``min(16, C)``), and it grows to ``K + 1`` for ``K >= 16``."""


DEFAULT_M = _DefaultM(16)


def _effective_m(m: int | None, classes: int, k: int) -> int | None:
    """The ``m`` a call uses: ``None`` (every class) for the default when ``max(16, K + 1) >= C``."""
    if isinstance(m, _DefaultM):
        m = max(int(m), k + 1)
        return None if m >= classes else m
    return m


class _Head(Function):
    """Per-row loss from the selected scores ``(R, m)``, the label's relaxed ranks ``(R, K)``, its
    position ``(R,)`` and the rows whose label is ``-inf`` (loss ``inf``):
    ``-log(floor(w . ranks + p_1 softmax(scores)_y))`` (``'sm'``), with the softmax term left out
    for ``'sort'`` (``p_1 = 0``); ``'smce'`` adds ``p_1`` times the cross-entropy.
    Backward: ``d/d ranks = c w`` and ``d/d scores = c p_1 q_y (e_y - q)`` with
    ``c = -(1 - 2 floor) / floored mass`` (q the softmax), plus ``-p_1 (e_y - q)`` for ``'smce'``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(scores, label_ranks, position, masked, weights, p1, smce):
        position = position.unsqueeze(-1)
        mass = (label_ranks * constant(weights, scores)).sum(-1)  # float32 under autocast (no matmul)
        log_q = torch.log_softmax(scores, -1) if smce else None
        q = torch.softmax(scores, -1) if log_q is None else log_q.exp()
        q_y = q.gather(-1, position).squeeze(-1)
        if p1 and not smce:
            mass = mass.add_(q_y, alpha=p1)
        floored = mass.mul_(1 - 2 * _FLOOR).add_(_FLOOR)
        loss = floored.log().neg_()
        if log_q is not None:  # smce
            loss = loss.mul_(1 - p1).sub_(log_q.gather(-1, position).squeeze(-1), alpha=p1)
        return loss.masked_fill_(masked, math.inf), q, q_y, floored

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, q, q_y, floored = output
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, q_y, floored, inputs[1], inputs[2], inputs[3])
        ctx.weights, ctx.p1, ctx.smce = inputs[4:]

    @staticmethod
    @torch.autograd.function.once_differentiable  # q and the mass are saved without their graph
    def backward(ctx, grad, *_unused):
        if grad is None:
            return None, None, None, None, None, None, None
        q, q_y, floored, label_ranks, position, masked = ctx.saved_tensors
        p1, position = ctx.p1, position.unsqueeze(-1)
        grad = filled(grad, masked, 0.0)
        c = grad.mul(-(1 - 2 * _FLOOR)).div_(floored)
        if ctx.smce:
            c, d = c.mul_(1 - p1), grad.mul(-p1)  # d: the cross-entropy's weight of (e_y - q)
        else:
            d = torch.mul(c, q_y).mul_(p1) if p1 else None
        grad_ranks = c.unsqueeze(-1) * constant(ctx.weights, c)
        grad_scores = None
        if d is not None:
            grad_scores = q.mul(-d.unsqueeze(-1)).scatter_add_(-1, position, d.unsqueeze(-1))
        return grad_scores, grad_ranks, None, None, None, None, None


def topk_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    p_k: Sequence[float],
    *,
    method: str = "splitter_selection",
    m: int | None = DEFAULT_M,
    top1_mode: str = "sm",
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    **params: Any,
) -> torch.Tensor:
    """Top-k cross-entropy of Petersen et al. (ICML 2022). See :class:`TopKCrossEntropyLoss` for details.

    Example:
        >>> import torch, softtopk
        >>> logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
        >>> loss = softtopk.functional.topk_cross_entropy(
        ...     logits, torch.tensor([1]), [0.5, 0.5], method="softsort", tau=0.5)
        >>> round(loss.item(), 4)  # -log(.5 * softmax_1 + .5 * (R[1, 0] + R[1, 1]))
        0.7734
    """
    classes = check_class_input(input).shape[1]
    p_k, m, top1_mode, spec, params = _topk_ce_params(p_k, method, m, top1_mode, params, classes)
    check_scales(params, input.dtype)
    params = {key: on_device(key, v, input.device, "input") if torch.is_tensor(v) else v for key, v in params.items()}
    k = len(p_k)
    if m is None and classes > _MANY_CLASSES:
        warnings.warn(
            f"topk_cross_entropy relaxes all C = {classes} classes (m=None), which costs far more than "
            "relaxing a few (benchmarks/README.md); leave the default m=16 (difftopk's setting: only the 16 "
            "largest scores, the label always included) unless every class must enter the relaxation",
            UserWarning,
            stacklevel=3,
        )

    weights, p1 = rank_weights(p_k, top1_mode), p_k[0] if top1_mode != "sort" else 0.0
    mode = top1_mode if p1 else "sort"  # the head's
    m = _effective_m(m, classes, k)

    def per_row(logits: torch.Tensor, label: torch.Tensor, kept: torch.Tensor, reduction: str) -> torch.Tensor:
        n = classes if m is None else m
        fused = spec.label_stage is not None and topk_ce_triton.usable(logits, n)
        stage = spec.label_stage(logits, n, k, **params) if fused else None
        if stage is not None:  # the selection, the label's ranks and the head in one node
            # the kernels reduce the rows too, but for 'smce' (whose rows may still become inf below)
            own = reduce_triton.kernel_reduction(logits.shape[0], reduction) if mode != "smce" else "none"
            loss = topk_ce_triton.loss_rows(logits, label, kept, n, stage, weights, p1, mode, own)
        else:
            loss = chained(logits, label, kept, n)
        if top1_mode != "smce" or not p1:
            return loss
        # the cross-entropy term's limit with another class at +inf and the label below: inf, not
        # the stand-in's large finite value (gradient 0, as where the label is -inf)
        label_inf = logits.gather(-1, label.unsqueeze(-1)).squeeze(-1) == math.inf
        beaten = torch.isposinf(logits).any(-1) & ~label_inf & ~logits.isnan().any(-1)
        return torch.where(beaten & kept, math.inf, loss)

    def chained(logits: torch.Tensor, label: torch.Tensor, kept: torch.Tensor, n: int) -> torch.Tensor:
        scores, _, position, masked = LabelSelect.apply(logits, label, n)
        if spec.label_ranks is not None:
            label_ranks = spec.label_ranks(scores, position, k, **params)
        else:
            label_ranks = label_row(spec.ranks(scores, k, **params), position)
        if ce_head_triton.usable(scores):
            return ce_head_triton.head(scores, label_ranks, position, masked, kept, weights, p1, mode)
        head = _Head.apply(scores, label_ranks, position, masked, weights, p1, mode == "smce")[0]
        return zero_unless(kept, head)

    return class_loss(
        input, target, per_row, weight=weight, ignore_index=ignore_index, reduction=reduction, reduces=True
    )


class TopKCrossEntropyLoss(ClassLoss):
    r"""Top-k cross-entropy over relaxed ranks (Petersen et al., ICML 2022): a drop-in for
    ``nn.CrossEntropyLoss`` that rewards the label for being among the top κ, κ ~ ``P_K``.

    .. math::
        \ell(s, y) = -\log\Big(\big\lfloor p_1\, \mathrm{softmax}(s)_y
            + \textstyle\sum_{\kappa \ge 2} p_\kappa\, q_\kappa(y) \big\rfloor\Big),
        \qquad q_\kappa(y) = \sum_{r < \kappa} R[y, r]

    (``top1_mode='sm'``; ``'sort'`` uses :math:`q_1` for the first term, ``'smce'`` adds
    :math:`p_1` CE to :math:`(\sum_{\kappa\ge2} p_\kappa)(-\log\lfloor\sum_{\kappa\ge2}p_\kappa q_\kappa\rfloor)`).
    ``R`` are the relaxed top-K ranks of ``method`` (K = ``len(p_k)``); ``⌊p⌋ = p(1-2e-7)+1e-7``.
    The functional form is :func:`softtopk.functional.topk_cross_entropy`.

    Args:
        p_k: ``P_K``, the weights of top-1 ... top-K; non-negative, summing to 1.
        method: any ranks-capable method (see :func:`softtopk.methods`). Default
            ``'splitter_selection'``.
        m: relax only the ``m`` largest scores (``K < m < C``), the label always included.
            Default 16 (difftopk's setting), more precisely ``min(16, C)``: with ``C <= 16``
            classes (or ``K >= 16``: ``K + 1``) the default relaxes every class. ``None`` relaxes
            all ``C`` classes, which warns above 100 classes: its cost grows with ``C``, while
            ``m=16`` costs a fixed network of 16 wires. The selected scores enter in sorted
            (ascending) order, so the loss does not
            depend on class order (difftopk put the label on wire 0).
        top1_mode: ``'sm'`` (default), ``'smce'`` or ``'sort'``.
        weight: optional per-class weights ``(C,)`` (a buffer), as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.
        **params: the method's parameters, e.g. ``steepness=1.0, distribution='logistic_phi',
            art_lambda=0.5`` for networks or ``tau=2.0`` for NeuralSort/SoftSort.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating.
        - target: ``(N)`` or ``(N, d1, ...)``, integer class indices in ``[0, C)`` (values checked for
          CPU tensors outside ``torch.compile``/``vmap`` only: on an accelerator a check would synchronise).
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
        m: int | None = DEFAULT_M,
        top1_mode: str = "sm",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        **params: Any,
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.p_k, self.m, self.top1_mode, _, self.params = _topk_ce_params(p_k, method, m, top1_mode, params)
        self.method = method

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return topk_cross_entropy(
            input,
            target,
            self.p_k,
            method=self.method,
            m=self.m,
            top1_mode=self.top1_mode,
            **self._class_kwargs(),
            **self.params,
        )

    def extra_repr(self) -> str:
        return self._repr(p_k=list(self.p_k), method=self.method, m=self.m, top1_mode=self.top1_mode, **self.params)
