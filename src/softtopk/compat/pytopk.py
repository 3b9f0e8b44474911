"""pytopk 0.1.0 names and signatures, computed by softtopk (Garcin et al., ICML 2022).

``from softtopk.compat.pytopk import NoisedTopK, BalNoisedTopK, ImbalNoisedTopK`` replaces
``from pytopk import ...``: same constructor signatures and defaults, same outputs (the smoothed
k-th largest value with ``dim`` removed; 0-d batch-mean losses), and the same noise: one
``torch.randn(x.shape + (n_sample,))`` float32 draw from the global RNG per call, in the same order,
so after the same ``torch.manual_seed`` the values and gradients equal pytopk's bit for bit (float32).

Intended differences from pytopk 0.1.0:

* a zero, negative or non-finite count in ``cls_num_list`` raises ``ValueError`` (pytopk gives that
  class a NaN margin and every other class margin 0); so does a ``cls_num_list`` whose length is
  not the number of classes (pytopk fails inside ``gather`` or silently uses the wrong margins);
* bad ``k``, ``epsilon``, ``n_sample``, ``dim``, ``max_m``, ``scale``, labels or shapes raise a
  ``ValueError``/``TypeError`` naming the argument (pytopk fails inside ``kthvalue``/``gather``);
* float64 inputs are computed in float64 (the noise is still drawn in float32, as pytopk draws it);
  float16/bfloat16 are computed in float32 and the output has the input's dtype (pytopk returns
  float32);
* ``epsilon = 0`` returns the exact k-th value (pytopk's mean of ``n_sample`` equal copies can be
  off in the last bit);
* the losses also accept ``(N, C, d1, ...)`` scores with ``(N, d1, ...)`` targets (mean over all);
* the noise is drawn with ``dtype=torch.float32`` explicitly (pytopk uses the default dtype).

For ``generator``, ``weight``, ``ignore_index`` and ``reduction`` use the native losses
(:class:`softtopk.BalNoisedTopK`, :class:`softtopk.ImbalNoisedTopK`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validation import (
    check_class_counts,
    check_class_input,
    check_count_length,
    check_dim,
    check_int,
    check_real,
    check_scores,
)
from ..functional import bal_noised_topk, imbal_noised_topk, noised_kth_value
from ..losses import ldam_margins

__all__ = ["BalNoisedTopK", "ImbalNoisedTopK", "NoisedTopK"]


def _pytopk_noise(s: torch.Tensor, samples: int) -> torch.Tensor:
    """pytopk's draw for scores ``s``: ``randn(s.shape + (samples,))`` from the global RNG, float32.
    The losses and ``noised_kth_value`` are given it: their own draw on CPU rows is a kernel's."""
    return torch.randn((*s.shape, samples), device=s.device, dtype=torch.float32)


class NoisedTopK(torch.nn.Module):
    """``pytopk.NoisedTopK``: smoothed (differentiable) k-th largest value along ``dim``.

    .. math::
        \\operatorname{top}_{k,\\epsilon}(x) = \\frac{1}{S} \\sum_{b=1}^{S} (x + \\epsilon Z_b)_{[k]}

    with ``S = n_sample`` and ``Z`` drawn as ``torch.randn(x.shape + (S,))`` from the global RNG; see
    :func:`softtopk.noised_kth_value` (which also takes a ``generator``).

    Args:
        k: which largest value, ``1 <= k <= x.shape[dim]``.
        epsilon: noise scale ``>= 0``. Default 1.0; 0 gives the exact k-th largest value.
        n_sample: number of noise draws. Default 5.
        dim: the axis to select along. Default -1.

    Shape:
        input ``(*)``; output ``(*)`` with ``dim`` removed.

    Example:
        >>> import torch
        >>> from softtopk.compat.pytopk import NoisedTopK
        >>> _ = torch.manual_seed(0)
        >>> x = torch.tensor([[-1.5, 2.0, 0.7, 3.8], [-1.1, -5.4, 0.1, 2.3]], requires_grad=True)
        >>> out = NoisedTopK(k=3, dim=-1)(x)
        >>> out.sum().backward()
        >>> x.grad
        tensor([[0.0000, 0.4000, 0.6000, 0.0000],
                [0.8000, 0.0000, 0.2000, 0.0000]])
    """

    def __init__(self, k: int, epsilon: float = 1.0, n_sample: int = 5, dim: int = -1) -> None:
        super().__init__()
        self.k = check_int("k", k, low=1)
        self.epsilon = check_real("epsilon", epsilon, low=0.0)
        self.n_sample = check_int("n_sample", n_sample, low=1)
        self.dim = check_int("dim", dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = check_scores("x", x)
        check_dim(x, self.dim)
        return noised_kth_value(x, self.k, epsilon=self.epsilon, noise=_pytopk_noise(x, self.n_sample), dim=self.dim)

    def extra_repr(self) -> str:
        return f"k={self.k}, epsilon={self.epsilon}, n_sample={self.n_sample}, dim={self.dim}"


class BalNoisedTopK(torch.nn.Module):
    """``pytopk.BalNoisedTopK``: balanced noised top-k hinge loss, batch mean of
    :math:`\\max(0, 1 + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)`; see
    :func:`softtopk.bal_noised_topk`.

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale ``>= 0`` (no default, as in pytopk).
        n_sample: number of noise draws per call. Default 5.

    Shape:
        s ``(B, C)`` (or ``(B, C, d1, ...)``), y ``(B)`` (or ``(B, d1, ...)``); output a 0-d tensor.

    Example:
        >>> import torch
        >>> from softtopk.compat.pytopk import BalNoisedTopK
        >>> _ = torch.manual_seed(0)
        >>> criteria = BalNoisedTopK(k=2, epsilon=1.0)
        >>> scores = torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]])
        >>> criteria(scores, torch.tensor([0, 2]))
        tensor(0.8380)
    """

    def __init__(self, k: int, epsilon: float, n_sample: int = 5) -> None:
        super().__init__()
        self.k = check_int("k", k, low=1)
        self.epsilon = check_real("epsilon", epsilon, low=0.0)
        self.n_sample = check_int("n_sample", n_sample, low=1)

    def forward(self, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = check_class_input(s)
        noise = _pytopk_noise(s, self.n_sample)
        per_sample = bal_noised_topk(s, y, k=self.k, epsilon=self.epsilon, noise=noise, reduction="none")
        return torch.mean(per_sample)  # pytopk's reduction, op for op

    def extra_repr(self) -> str:
        return f"k={self.k}, epsilon={self.epsilon}, n_sample={self.n_sample}"


class ImbalNoisedTopK(BalNoisedTopK):
    """``pytopk.ImbalNoisedTopK``: imbalanced noised top-k hinge loss with LDAM margins, batch mean of
    :math:`\\max(0, \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y))`; see
    :func:`softtopk.imbal_noised_topk`. The margins are the float32 buffer ``m_list``
    (pytopk's values).

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale ``>= 0``.
        max_m: margin of the rarest class, ``>= 0``.
        cls_num_list: per-class training counts, all positive (a zero count raises, unlike pytopk).
        scale: positive multiplier of the hinge. Default 50 (assumes a normalised last layer; use 1
            for raw logits).
        n_sample: number of noise draws per call. Default 5.

    Example:
        >>> import torch
        >>> from softtopk.compat.pytopk import ImbalNoisedTopK
        >>> _ = torch.manual_seed(0)
        >>> criteria = ImbalNoisedTopK(k=2, epsilon=0.1, max_m=0.3, cls_num_list=[5, 15, 10])
        >>> criteria.m_list
        tensor([0.3000, 0.2280, 0.2523])
        >>> criteria(torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]]), torch.tensor([0, 2]))
        tensor(7.9969)
    """

    m_list: torch.Tensor

    def __init__(
        self,
        k: int,
        epsilon: float,
        max_m: float,
        cls_num_list: Sequence[float],
        scale: float = 50,
        n_sample: int = 5,
    ) -> None:
        super().__init__(k, epsilon, n_sample)
        self.counts = check_class_counts("cls_num_list", cls_num_list)
        check_int("k", k, low=1, high=len(self.counts) - 1, why=" (k < C, the number of classes)")
        self.max_m = check_real("max_m", max_m, low=0.0)
        self.scale = scale
        check_real("scale", scale, positive=True)
        self.register_buffer("m_list", ldam_margins(self.counts, self.max_m).to(torch.float32))

    def forward(self, s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = check_class_input(s)
        check_count_length("cls_num_list", self.m_list.shape[0], s.shape[1])
        per_sample = imbal_noised_topk(
            s,
            y,
            k=self.k,
            epsilon=self.epsilon,
            max_m=self.max_m,
            cls_num_list=self.counts,
            scale=self.scale,
            noise=_pytopk_noise(s, self.n_sample),
            reduction="none",
        )
        return torch.mean(per_sample)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_m={self.max_m}, scale={self.scale}, classes={self.m_list.shape[0]}"
