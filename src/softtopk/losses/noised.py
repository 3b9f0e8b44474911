"""Noised (stochastically smoothed) top-k hinge losses (Garcin et al., ICML 2022; pytopk).

The top-k calibrated hinge loss :math:`\\max(0, 1 + s_{[k+1]} - s_y)` is zero exactly when the
label's score beats the (k+1)-th largest score of the **full** score vector by the margin 1. Its
smoothed version replaces :math:`s_{[k+1]}` by the Monte-Carlo Gaussian smoothing of
:func:`softtopk.noised_kth_value`,

.. math::
    \\operatorname{top}_{k+1,\\epsilon}(s) = \\frac{1}{S} \\sum_{b=1}^{S} (s + \\epsilon Z_b)_{[k+1]},
    \\qquad Z_b \\sim \\mathcal N(0, I),

whose gradient is the exact gradient of the estimate (a mean of ``S`` one-hots): at most ``S + 1``
non-zero entries per row of the loss gradient. The hinge is applied to the Monte-Carlo average.

* balanced: :math:`\\ell = \\max(0, 1 + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)`;
* imbalanced: LDAM margins :math:`m_c = m_{\\max}\\, n_c^{-1/4} / \\max_{c'} n_{c'}^{-1/4}` (the rarest
  class gets ``max_m``) and
  :math:`\\ell = \\max(0, \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y))`.

Noise: ``Z`` has shape ``input.shape + (S,)`` and, unless given, is drawn by one call
``torch.randn(input.shape + (S,), generator=generator)`` in float32 (cast to float64 for float64
inputs). For ``(N, C)`` input and the global RNG this is the draw pytopk 0.1.0 makes, so a seeded
run gives pytopk's values (see :mod:`softtopk.compat.pytopk`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._validation import (
    check_class_counts,
    check_class_input,
    check_generator,
    check_int,
    check_noise,
    check_real,
    check_scale,
)
from ..ops.compute import compute_dtype
from ._base import ClassLoss, class_loss

__all__ = ["BalNoisedTopK", "ImbalNoisedTopK", "bal_noised_topk", "imbal_noised_topk", "ldam_margins"]


def _noised_params(k: Any, epsilon: Any, n_samples: Any, generator: Any,
                   classes: int | None = None) -> tuple[int, float, int, torch.Generator | None]:
    """The family's parameters, checked once for the functions and their Modules (``k < C`` when known)."""
    if classes is None:
        k = check_int("k", k, low=1)
    else:
        k = check_int("k", k, low=1, high=classes - 1,
                      why=" (k < C, the number of classes: the loss uses the (k+1)-th largest score)")
    return (k, check_real("epsilon", epsilon, low=0.0), check_int("n_samples", n_samples, low=1),
            check_generator("generator", generator))


def _ldam_params(max_m: Any, cls_num_list: Any, scale: Any, classes: int | None = None
                 ) -> tuple[float, tuple[float, ...], float]:
    """``max_m``, the class counts (``C`` of them when known) and ``scale`` of the imbalanced loss."""
    return (check_real("max_m", max_m, low=0.0), check_class_counts("cls_num_list", cls_num_list, classes),
            check_real("scale", scale, positive=True))


def ldam_margins(cls_num_list: Sequence[float], max_m: float) -> torch.Tensor:
    """LDAM margins :math:`m_c = m_{\\max} n_c^{-1/4} / \\max_{c'} n_{c'}^{-1/4}` as a float64 tensor ``(C,)``.

    Computed in double precision in the same order as pytopk (``n**-1/4`` as ``1 / n**0.25``, then
    times ``max_m / max``), so casting to float32 gives pytopk's ``m_list``.

    Example:
        >>> import softtopk
        >>> softtopk.losses.ldam_margins([5, 15, 10], 0.3)
        tensor([0.3000, 0.2280, 0.2523], dtype=torch.float64)
    """
    max_m, counts, _ = _ldam_params(max_m, cls_num_list, 1.0)
    inverse = [1.0 / n**0.25 for n in counts]
    factor = max_m / max(inverse)
    return torch.tensor([v * factor for v in inverse], dtype=torch.float64)


class _NoisedHinge(torch.autograd.Function):
    """``(logits (R, C), label (R,), scaled noise (R, C, S), margin (R,) or float, scale or None, k)``
    -> ``relu(scale * (margin + top_{k+1,eps}(s) - s_y))`` per row, in pytopk's operation order.
    Backward: where the hinge is active, ``scale / S`` on each draw's (k+1)-th position and
    ``-scale`` on the label (no dense ``(R, C, S)`` tensor is saved, only the ``(R, S)`` positions)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(logits, label, noise, margin, scale, k):
        index = (logits.unsqueeze(-1) + noise).topk(k + 1, dim=1)
        top = index.values.select(1, k).mean(-1)
        hinge = (margin + top) - logits.gather(1, label.unsqueeze(1)).squeeze(1)
        loss = torch.relu(hinge if scale is None else scale * hinge)
        return loss, index.indices.select(1, k)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        logits, label, _, _, ctx.scale, _ = inputs
        loss, index = output
        ctx.mark_non_differentiable(index)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(label, index, loss <= 0)
        ctx.classes = logits.shape[1]

    @staticmethod
    def backward(ctx, grad, _unused):
        if grad is None:
            return None, None, None, None, None, None
        label, index, inactive = ctx.saved_tensors
        share = grad.masked_fill(inactive, 0.0)
        if ctx.scale is not None:
            share = share.mul_(ctx.scale)
        counts = share.new_zeros(share.shape[0], ctx.classes).scatter_add_(1, index, torch.ones_like(index, dtype=share.dtype))
        grad_logits = counts.div_(index.shape[1]).mul_(share.unsqueeze(1))  # pytopk's rounding
        return grad_logits.scatter_add_(1, label.unsqueeze(1), share.neg().unsqueeze(1)), None, None, None, None, None


def _noised_hinge(
    input: torch.Tensor, target: torch.Tensor, *, k: int, epsilon: float, n_samples: int,
    generator: torch.Generator | None, noise: torch.Tensor | None, margins: torch.Tensor | float,
    scale: float | None, weight: torch.Tensor | None, ignore_index: int, reduction: str,
) -> torch.Tensor:
    """``max(0, scale * (margin_y + top_{k+1,eps}(s) - s_y))``, reduced; pytopk's operation order (so a
    seeded call equals pytopk's bit for bit). The noise is drawn after every other check."""
    check_scale("epsilon", epsilon, input.dtype, zero=True)
    if scale is not None:
        check_scale("scale", scale, input.dtype)

    def per_row(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        given = noise
        if given is None:
            given = torch.randn((*input.shape, n_samples), generator=generator, device=input.device,
                                dtype=torch.float32)
        else:
            check_noise("noise", given, input.shape, samples=0)
        rows = given.movedim(1, -2).reshape(-1, input.shape[1], given.shape[-1])
        if epsilon == 0:  # exact (k+1)-th value; the RNG still advanced
            rows = rows[..., :1]
        margin = margins.to(logits)[label] if isinstance(margins, torch.Tensor) else margins
        scaled = (epsilon * rows).to(compute_dtype(input.dtype))
        return _NoisedHinge.apply(logits, label, scaled, margin, scale, k)[0]

    return class_loss(input, target, per_row, weight=weight, ignore_index=ignore_index, reduction=reduction)


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
    """Balanced noised top-k hinge loss. See :class:`BalNoisedTopK` for details.

    ``noise``: optional fixed standard noise ``input.shape + (S,)`` (then ``n_samples`` is ignored);
    by default drawn as ``torch.randn(input.shape + (S,), generator=generator)`` in float32.

    Example:
        >>> import torch, softtopk
        >>> scores = torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]])
        >>> labels = torch.tensor([0, 2])
        >>> softtopk.bal_noised_topk(scores, labels, k=1, epsilon=0.0, reduction="none")  # 1 + s_[2] - s_y
        tensor([0.5000, 6.5000])
        >>> softtopk.bal_noised_topk(scores, labels, k=1, epsilon=1.0, generator=torch.Generator().manual_seed(0))
        tensor(2.9793)
    """
    k, epsilon, n_samples, generator = _noised_params(k, epsilon, n_samples, generator,
                                                      check_class_input(input).shape[1])
    check_generator("generator", generator, input.device)
    return _noised_hinge(input, target, k=k, epsilon=epsilon, n_samples=n_samples, generator=generator,
                         noise=noise, margins=1.0, scale=None, weight=weight, ignore_index=ignore_index,
                         reduction=reduction)


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
    """Imbalanced noised top-k hinge loss with LDAM margins. See :class:`ImbalNoisedTopK` for details.

    ``noise`` as in :func:`bal_noised_topk`.

    Example:
        >>> import torch, softtopk
        >>> scores = torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]])
        >>> labels = torch.tensor([0, 2])
        >>> softtopk.imbal_noised_topk(scores, labels, k=1, epsilon=0.0, max_m=0.3, cls_num_list=[5, 15, 10],
        ...                            scale=1.0, reduction="none")  # m_y + s_[2] - s_y
        tensor([0.0000, 5.7523])
        >>> softtopk.imbal_noised_topk(scores, labels, k=1, epsilon=0.1, max_m=0.3, cls_num_list=[5, 15, 10],
        ...                            generator=torch.Generator().manual_seed(0))
        tensor(142.4531)
    """
    classes = check_class_input(input).shape[1]
    k, epsilon, n_samples, generator = _noised_params(k, epsilon, n_samples, generator, classes)
    max_m, counts, scale = _ldam_params(max_m, cls_num_list, scale, classes)
    check_generator("generator", generator, input.device)
    return _noised_hinge(input, target, k=k, epsilon=epsilon, n_samples=n_samples, generator=generator,
                         noise=noise, margins=ldam_margins(counts, max_m), scale=scale, weight=weight,
                         ignore_index=ignore_index, reduction=reduction)


class BalNoisedTopK(ClassLoss):
    r"""Balanced noised top-k hinge loss (Garcin et al., ICML 2022): a drop-in for
    ``nn.CrossEntropyLoss`` that optimises top-k accuracy.

    .. math::
        \ell(s, y) = \max\big(0,\ 1 + \operatorname{top}_{k+1,\epsilon}(s) - s_y\big), \qquad
        \operatorname{top}_{k+1,\epsilon}(s) = \frac{1}{S}\sum_{b=1}^{S} (s + \epsilon Z_b)_{[k+1]}

    with :math:`v_{[j]}` the j-th largest entry of the full score vector (label included) and
    :math:`Z_b` iid standard Gaussian, drawn afresh at every call from ``generator`` (or the global
    RNG). ``epsilon = 0`` is the exact top-k hinge :math:`\max(0, 1 + s_{[k+1]} - s_y)`. The
    functional form is :func:`softtopk.bal_noised_topk` (which also takes fixed ``noise``).

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale, a finite number ``>= 0`` (the paper: 1 on Pl@ntNet-300K, 0.2 on CIFAR-100).
        n_samples: number of noise draws ``S`` per call. Default 5.
        generator: a :class:`torch.Generator` on the input's device type, or ``None`` (global RNG).
        weight: optional per-class weights ``(C,)`` (a buffer), as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing. Default -100.
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating (float16/bfloat16 computed in float32).
        - target: ``(N)`` or ``(N, d1, ...)``, integer class indices in ``[0, C)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch, softtopk
        >>> loss_fn = softtopk.BalNoisedTopK(2, epsilon=1.0, generator=torch.Generator().manual_seed(0))
        >>> logits = torch.tensor([[2.0, 1.5, -3.0, 0.5], [7.5, 4.0, -1.5, 0.0]], requires_grad=True)
        >>> loss = loss_fn(logits, torch.tensor([0, 2]))
        >>> loss
        tensor(1.1972, grad_fn=<DivBackward0>)
        >>> loss.backward()
        >>> logits.grad
        tensor([[ 0.0000,  0.0000,  0.0000,  0.0000],
                [ 0.0000,  0.0000, -0.3000,  0.3000]])

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022.
    """

    def __init__(self, k: int, *, epsilon: float, n_samples: int = 5, generator: torch.Generator | None = None,
                 weight: torch.Tensor | None = None, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.k, self.epsilon, self.n_samples, self.generator = _noised_params(k, epsilon, n_samples, generator)

    def forward(self, input: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        return bal_noised_topk(input, target, k=self.k, epsilon=self.epsilon, n_samples=self.n_samples,
                               generator=self.generator, noise=noise, **self._class_kwargs())

    def extra_repr(self) -> str:
        return self._repr(k=self.k, epsilon=self.epsilon, n_samples=self.n_samples)


class ImbalNoisedTopK(ClassLoss):
    r"""Imbalanced noised top-k hinge loss with LDAM margins (Garcin et al., ICML 2022).

    .. math::
        \ell(s, y) = \max\big(0,\ \mathrm{scale}\,(m_y + \operatorname{top}_{k+1,\epsilon}(s) - s_y)\big),
        \qquad m_c = m_{\max} \frac{n_c^{-1/4}}{\max_{c'} n_{c'}^{-1/4}}

    with :math:`n_c` the training count of class ``c`` (the rarest class gets ``max_m``) and
    :math:`\operatorname{top}_{k+1,\epsilon}` as in :class:`BalNoisedTopK`. The margins are the
    float64 buffer ``margins`` ``(C,)``, computed once. The functional form is
    :func:`softtopk.imbal_noised_topk`.

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale, a finite number ``>= 0`` (the paper uses 0.01 on Pl@ntNet-300K).
        max_m: the largest margin (given to the rarest class), a finite number ``>= 0``.
        cls_num_list: per-class training counts, ``C`` positive numbers (a zero count is an error).
        scale: positive multiplier of the hinge. Default 50, which assumes normalised features and
            last layer (cosine logits); use 1 for raw logits.
        n_samples: as in :class:`BalNoisedTopK`.
        generator: as in :class:`BalNoisedTopK`.
        weight: as in :class:`BalNoisedTopK`.
        ignore_index: as in :class:`BalNoisedTopK`.
        reduction: as in :class:`BalNoisedTopK`.

    Shape:
        As :class:`BalNoisedTopK`.

    Example:
        >>> import torch, softtopk
        >>> loss_fn = softtopk.ImbalNoisedTopK(1, epsilon=0.1, max_m=0.3, cls_num_list=[5, 15, 10], scale=1.0,
        ...                                    generator=torch.Generator().manual_seed(0))
        >>> loss_fn
        ImbalNoisedTopK(k=1, epsilon=0.1, max_m=0.3, scale=1.0, classes=3, n_samples=5, reduction='mean')
        >>> loss_fn.margins
        tensor([0.3000, 0.2280, 0.2523], dtype=torch.float64)
        >>> loss_fn(torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]]), torch.tensor([0, 2]))
        tensor(2.8491)

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022. K. Cao, C. Wei, A. Gaidon,
        N. Arechiga, T. Ma, "Learning Imbalanced Datasets with Label-Distribution-Aware Margin
        Loss", NeurIPS 2019.
    """

    margins: torch.Tensor

    def __init__(self, k: int, *, epsilon: float, max_m: float, cls_num_list: Sequence[float], scale: float = 50.0,
                 n_samples: int = 5, generator: torch.Generator | None = None, weight: torch.Tensor | None = None,
                 ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.max_m, counts, self.scale = _ldam_params(max_m, cls_num_list, scale)
        self.k, self.epsilon, self.n_samples, self.generator = _noised_params(
            k, epsilon, n_samples, generator, len(counts))
        self.register_buffer("margins", ldam_margins(counts, self.max_m))

    def forward(self, input: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        classes = check_class_input(input).shape[1]
        if classes != self.margins.shape[0]:
            raise ValueError(f"cls_num_list must have one count per class: the loss has {self.margins.shape[0]} "
                             f"margins, input has C = {classes} classes")
        k, epsilon, n_samples, generator = _noised_params(self.k, self.epsilon, self.n_samples, self.generator,
                                                          classes)
        check_generator("generator", generator, input.device)
        return _noised_hinge(input, target, k=k, epsilon=epsilon, n_samples=n_samples, generator=generator,
                             noise=noise, margins=self.margins, scale=self.scale, **self._class_kwargs())

    def extra_repr(self) -> str:
        return self._repr(k=self.k, epsilon=self.epsilon, max_m=self.max_m, scale=self.scale,
                          classes=self.margins.shape[0], n_samples=self.n_samples)
