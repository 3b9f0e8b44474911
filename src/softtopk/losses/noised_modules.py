"""Module forms of the noised top-k hinge losses (Garcin et al., ICML 2022; pytopk).

:class:`BalNoisedTopK` and :class:`ImbalNoisedTopK` hold ``k``, ``epsilon``, ``n_samples``, a noise
``generator``, the LDAM margins (a buffer), ``weight``, ``ignore_index`` and ``reduction``, and call the
functions of :mod:`softtopk.losses.noised` (the math is documented there).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .._validation import check_class_input, check_class_weight, check_real, check_reduction
from ..ops.perturbed import check_generator, check_n_samples
from .noised import _check_epsilon, _check_k, _check_max_m, _noised_hinge, ldam_margins

__all__ = ["BalNoisedTopK", "ImbalNoisedTopK"]


class BalNoisedTopK(torch.nn.Module):
    """Balanced noised top-k hinge loss (Garcin et al., ICML 2022): module form of
    :func:`bal_noised_topk`, a drop-in for ``nn.CrossEntropyLoss`` that optimises top-k accuracy.

    .. math::
        \\ell(s, y) = \\max\\big(0,\\ 1 + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y\\big), \\qquad
        \\operatorname{top}_{k+1,\\epsilon}(s) = \\frac{1}{S}\\sum_{b=1}^{S} (s + \\epsilon Z_b)_{[k+1]}

    Fresh noise ``Z`` is drawn at every call from ``generator`` (or the global RNG).

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale, a finite number ``>= 0`` (the paper uses 1 on Pl@ntNet-300K, 0.2 on CIFAR-100).
        n_samples: number of noise draws ``S`` per call. Default 5.
        generator: a :class:`torch.Generator`, or ``None`` (global RNG).
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.
        weight: optional per-class weights ``(C,)`` (a buffer), as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing (default -100).

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating.
        - target: ``(N)`` or ``(N, d1, ...)``, integer class indices in ``[0, C)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch
        >>> from softtopk.losses.noised_modules import BalNoisedTopK
        >>> loss_fn = BalNoisedTopK(2, epsilon=1.0, generator=torch.Generator().manual_seed(0))
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

    def __init__(
        self,
        k: int,
        *,
        epsilon: float,
        n_samples: int = 5,
        generator: torch.Generator | None = None,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        super().__init__()
        self.k = _check_k(k)
        self.epsilon = _check_epsilon(epsilon)
        self.n_samples = check_n_samples("n_samples", n_samples)
        self.generator = check_generator("generator", generator)
        self.reduction = check_reduction(reduction)
        self.ignore_index = ignore_index
        self.register_buffer("weight", check_class_weight(weight, None))

    def _margins(self) -> tuple[torch.Tensor | float, float | None]:
        return 1.0, None

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        margins, scale = self._margins()
        check_generator("generator", self.generator, getattr(input, "device", None))
        return _noised_hinge(
            input, target, k=self.k, epsilon=self.epsilon, n_samples=self.n_samples, generator=self.generator,
            noise=None, margins=margins, scale=scale, weight=self.weight, ignore_index=self.ignore_index,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"k={self.k}, epsilon={self.epsilon}, n_samples={self.n_samples}, reduction={self.reduction!r}, "
            f"ignore_index={self.ignore_index}"
        )


class ImbalNoisedTopK(BalNoisedTopK):
    """Imbalanced noised top-k hinge loss with LDAM margins (Garcin et al., ICML 2022): module form
    of :func:`imbal_noised_topk`.

    .. math::
        \\ell(s, y) = \\max\\big(0,\\ \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)\\big),
        \\qquad m_c = m_{\\max} \\frac{n_c^{-1/4}}{\\max_{c'} n_{c'}^{-1/4}}

    The margins are the float64 buffer ``margins`` ``(C,)``, computed once from ``cls_num_list``.

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale, a finite number ``>= 0`` (the paper uses 0.01 on Pl@ntNet-300K).
        max_m: the largest margin (given to the rarest class), a finite number ``>= 0``.
        cls_num_list: per-class training counts, ``C`` positive numbers (a zero count is an error).
        scale: positive multiplier of the hinge. Default 50, which assumes normalised features and
            last layer (cosine logits); use 1 for raw logits.
        n_samples, generator, reduction, weight, ignore_index: as in :class:`BalNoisedTopK`.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating.
        - target: ``(N)`` or ``(N, d1, ...)``, integer class indices in ``[0, C)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch
        >>> from softtopk.losses.noised_modules import ImbalNoisedTopK
        >>> loss_fn = ImbalNoisedTopK(1, epsilon=0.1, max_m=0.3, cls_num_list=[5, 15, 10], scale=1.0,
        ...                           generator=torch.Generator().manual_seed(0))
        >>> loss_fn
        ImbalNoisedTopK(k=1, epsilon=0.1, n_samples=5, reduction='mean', ignore_index=-100,
          max_m=0.3, scale=1.0, classes=3)
        >>> loss_fn.margins
        tensor([0.3000, 0.2280, 0.2523], dtype=torch.float64)
        >>> loss_fn(torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]]), torch.tensor([0, 2]))
        tensor(2.8491)

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022. K. Cao et al., "Learning
        Imbalanced Datasets with Label-Distribution-Aware Margin Loss", NeurIPS 2019.
    """

    def __init__(
        self,
        k: int,
        *,
        epsilon: float,
        max_m: float,
        cls_num_list: Sequence[float],
        scale: float = 50.0,
        n_samples: int = 5,
        generator: torch.Generator | None = None,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
    ) -> None:
        super().__init__(
            k, epsilon=epsilon, n_samples=n_samples, generator=generator, reduction=reduction, weight=weight,
            ignore_index=ignore_index,
        )
        self.max_m = _check_max_m(max_m)
        self.scale = check_real("scale", scale, positive=True)
        self.register_buffer("margins", ldam_margins(cls_num_list, self.max_m))
        if self.k >= self.margins.shape[0]:
            _check_k(self.k, self.margins.shape[0])

    def _margins(self) -> tuple[torch.Tensor | float, float | None]:
        return self.margins, self.scale

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        input = check_class_input(input)
        if input.shape[1] != self.margins.shape[0]:
            raise ValueError(
                f"cls_num_list must have one count per class: the loss has {self.margins.shape[0]} margins, "
                f"input has C = {input.shape[1]} classes"
            )
        return super().forward(input, target)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_m={self.max_m}, scale={self.scale}, classes={self.margins.shape[0]}"
