"""The imbalanced noised top-k hinge loss with LDAM margins (Garcin et al., ICML 2022; pytopk).

.. math::
    \\ell = \\max\\big(0,\\ \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)\\big), \\qquad
    m_c = m_{\\max}\\, n_c^{-1/4} / \\max_{c'} n_{c'}^{-1/4},

the balanced loss of :mod:`softtopk.losses.noised` (its smoothing, noise and gradient) with
per-class margins from the training counts ``n_c`` (the rarest class gets ``max_m``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_class_counts, check_class_input, check_count_length, check_real
from ..ops.compute import compute_dtype, constant
from ._base import ClassLoss
from .noised import noised_hinge, noised_params

__all__ = ["ImbalNoisedTopK", "imbal_noised_topk", "ldam_margins"]


def _ldam_params(
    max_m: Any, cls_num_list: Any, scale: Any, classes: int | None = None
) -> tuple[float, tuple[float, ...], float]:
    """``max_m``, the class counts (``C`` of them when known) and ``scale`` of the imbalanced loss."""
    return (
        check_real("max_m", max_m, low=0.0),
        check_class_counts("cls_num_list", cls_num_list, classes),
        check_real("scale", scale, positive=True),
    )


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
    return torch.tensor(_margin_values(counts, max_m), dtype=torch.float64)


def _margin_values(counts: tuple[float, ...], max_m: float) -> tuple[float, ...]:
    """:func:`ldam_margins` of checked counts, as Python floats (double precision)."""
    inverse = [1.0 / n**0.25 for n in counts]
    factor = max_m / max(inverse)
    return tuple(v * factor for v in inverse)


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
        >>> noise = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))  # fixed: the same everywhere
        >>> softtopk.imbal_noised_topk(scores, labels, k=1, epsilon=0.1, max_m=0.3, cls_num_list=[5, 15, 10],
        ...                            noise=noise)
        tensor(142.4531)
    """
    classes = check_class_input(input).shape[1]
    params = noised_params(k, epsilon, n_samples, generator, classes)
    max_m, counts, scale = _ldam_params(max_m, cls_num_list, scale, classes)
    return noised_hinge(
        input,
        target,
        params,
        noise=noise,
        margins=constant(_margin_values(counts, max_m), input, compute_dtype(input.dtype)),
        scale=scale,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
    )


class ImbalNoisedTopK(ClassLoss):
    r"""Imbalanced noised top-k hinge loss with LDAM margins (Garcin et al., ICML 2022).

    .. math::
        \ell(s, y) = \max\big(0,\ \mathrm{scale}\,(m_y + \operatorname{top}_{k+1,\epsilon}(s) - s_y)\big),
        \qquad m_c = m_{\max} \frac{n_c^{-1/4}}{\max_{c'} n_{c'}^{-1/4}}

    with :math:`n_c` the training count of class ``c`` (the rarest class gets ``max_m``) and
    :math:`\operatorname{top}_{k+1,\epsilon}` as in :class:`BalNoisedTopK`. The margins are the
    float64 buffer ``margins`` ``(C,)``, computed once: move the loss to the scores' device
    (``loss_fn.to(device)``, as any module with a buffer); left on the CPU, the margins are copied
    to an accelerator at every call, a copy that waits for the host. The functional form
    :func:`softtopk.imbal_noised_topk` keeps them on the device, in the compute dtype, once per
    ``(cls_num_list, max_m)``, device and dtype (:func:`softtopk.ops.compute.constant`): only its
    first call with new counts copies them.

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
        >>> noise = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))  # else drawn from the generator
        >>> loss_fn(torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]]), torch.tensor([0, 2]), noise=noise)
        tensor(2.8491)

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022. K. Cao, C. Wei, A. Gaidon,
        N. Arechiga, T. Ma, "Learning Imbalanced Datasets with Label-Distribution-Aware Margin
        Loss", NeurIPS 2019.
    """

    margins: torch.Tensor

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
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.max_m, counts, self.scale = _ldam_params(max_m, cls_num_list, scale)
        self.k, self.epsilon, self.n_samples, self.generator = noised_params(
            k, epsilon, n_samples, generator, len(counts)
        )
        self.register_buffer("margins", ldam_margins(counts, self.max_m))

    def forward(self, input: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        classes = check_class_input(input).shape[1]
        check_count_length("cls_num_list", self.margins.shape[0], classes)
        params = noised_params(self.k, self.epsilon, self.n_samples, self.generator, classes)
        return noised_hinge(
            input, target, params, noise=noise, margins=self.margins, scale=self.scale, **self._class_kwargs()
        )

    def extra_repr(self) -> str:
        return self._repr(
            k=self.k,
            epsilon=self.epsilon,
            max_m=self.max_m,
            scale=self.scale,
            classes=self.margins.shape[0],
            n_samples=self.n_samples,
        )
