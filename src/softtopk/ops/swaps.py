"""Relaxed conditional swaps: the probability that a comparator's pair is already in order.

For a comparator whose max wire holds ``a`` and min wire holds ``b``, with ``d = a - b`` and
``v = steepness * d``, the relaxed swap keeps ``alpha = f(d)`` of each value in place:

.. math::
    \\max{}' = \\alpha a + (1-\\alpha) b, \\qquad \\min{}' = (1-\\alpha) a + \\alpha b .

=================  =====================================================================
``logistic``       :math:`\\sigma(v)`
``logistic_phi``   :math:`\\sigma(\\beta d / (d^2 + \\delta^2)^{\\lambda/2})` (ART, ``art_lambda`` = λ)
``gaussian``       :math:`\\Phi(v)`
``reciprocal``     :math:`\\tfrac12 (v / (2 + |v|) + 1)`
``cauchy``         :math:`\\arctan(v)/\\pi + \\tfrac12`
``optimal``        :math:`v + \\tfrac12` for :math:`|v| \\le \\tfrac14`, else
                   :math:`1 - 1/(16 v)` (v > 0) or :math:`-1/(16 v)` (v < 0)
=================  =====================================================================

Every ``f`` satisfies ``f(-d) = 1 - f(d)``, so the two wires of a comparator share one ``alpha``.

``logistic_phi`` differs from difftopk in one place on purpose: difftopk divides by
``(|d| + 1e-10)**λ``, whose slope at ``d = 0`` is ``1e-10**-λ`` (1e5 for λ = 0.5), so tied scores
(e.g. a zero-initialised classifier) get gradients thousands of times larger than with any other
distribution. softtopk uses ``(d**2 + δ**2)**(λ/2)`` with ``δ = ART_DELTA = 1e-3``: the ART
argument changes by a factor of about ``1 - λδ²/(2d²)`` (2.5e-5 relative at ``|d| = 0.1``,
λ = 0.5; the swap probability stays within 1e-4 relative for ``|d| >= 0.1``), and the slope at a
tie is ``β·δ**-λ`` (31.6 β for λ = 0.5) instead of 1e5 β. Max |grad| of a top-5 mass at all-zero
inputs (16-wire odd-even, β = 1, λ = 0.5), measured by ``tests/test_numerics.py``: 8.7e-2, vs
2.7e-3 for ``logistic`` and 274 with difftopk's formula.

References: Petersen et al., "Differentiable Sorting Networks for Scalable Sorting and Ranking
Supervision", ICML 2021 (ART); "Monotonic Differentiable Sorting Networks", ICLR 2022.
"""

from __future__ import annotations

import math

import torch

DISTRIBUTIONS = ("cauchy", "logistic", "logistic_phi", "reciprocal", "optimal", "gaussian")
ART_DELTA = 1e-3


def swap_probability(d: torch.Tensor, distribution: str, steepness: float, art_lambda: float) -> torch.Tensor:
    """``alpha = f(d)`` for max-wire minus min-wire differences ``d`` (any shape)."""
    if distribution == "logistic_phi":  # (d² + δ²)^(1/2) as hypot: no overflow of d² for |d| ~ 1e20
        return torch.sigmoid(steepness * d * torch.hypot(d, d.new_full((), ART_DELTA)) ** (-art_lambda))
    v = steepness * d
    if distribution == "cauchy":
        return torch.atan(v) * (1.0 / math.pi) + 0.5
    if distribution == "logistic":
        return torch.sigmoid(v)
    if distribution == "gaussian":
        return torch.special.ndtr(v)
    if distribution == "reciprocal":
        return 0.5 * (v / (2.0 + v.abs()) + 1.0)
    if distribution == "optimal":
        tail = 1.0 / (16.0 * v.abs().clamp(min=0.25))
        return torch.where(v.abs() <= 0.25, v + 0.5, torch.where(v > 0, 1.0 - tail, tail))
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")


def signed_swap_probability(
    d: torch.Tensor,
    sign: torch.Tensor,
    distribution: str,
    steepness: float,
    art_lambda: float,
    half: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``f(sign * d)`` for ``sign`` in ``{-1, 0, 1}`` (one per wire; ``half`` a tensor holding 1/2),
    written to ``out`` if given.

    Cauchy takes its odd part ``atan(v)/π`` and adds ``sign`` times it to 1/2 (``f(-v) = 1 - f(v)``),
    one launch fewer than :func:`swap_probability`; the product ``atan(v) · (1/π)`` is rounded before
    the sum, so a saturated comparison gives exactly 0 or 1 as there.
    """
    if distribution == "cauchy":
        unit = isinstance(steepness, float) and steepness == 1.0
        odd = torch.atan(d if unit else d * steepness).mul_(1.0 / math.pi)
        return torch.addcmul(half, sign, odd, out=out)
    alpha = swap_probability(sign * d, distribution, steepness, art_lambda)
    return alpha if out is None else out.copy_(alpha)


def swap_slope(
    d: torch.Tensor, alpha: torch.Tensor, distribution: str, steepness: float, art_lambda: float
) -> torch.Tensor:
    """The exact derivative ``df/dd`` at ``d``, given ``alpha = f(d)`` (used by the logistic forms).

    The slopes feed the hand-written backward of :mod:`softtopk.ops.sorting_networks`.
    """
    if distribution == "logistic_phi":
        # d/dd [d r^(-λ)] = r^(-λ) ((1 - λ) (d/r)² + (δ/r)²) with r = (d² + δ²)^(1/2): finite for any d
        r = torch.hypot(d, d.new_full((), ART_DELTA))
        inner = r ** (-art_lambda) * ((1.0 - art_lambda) * (d / r).square() + (ART_DELTA / r).square())
        return steepness * alpha * (1.0 - alpha) * inner
    if distribution == "logistic":
        return steepness * alpha * (1.0 - alpha)
    v = steepness * d
    if distribution == "cauchy":
        return steepness / (math.pi * (1.0 + v * v))
    if distribution == "gaussian":
        return torch.exp(-0.5 * v * v) * (steepness / math.sqrt(2.0 * math.pi))
    if distribution == "reciprocal":
        denominator = 2.0 + v.abs()
        return steepness / (denominator * denominator)
    if distribution == "optimal":
        magnitude = v.abs().clamp(min=0.25)
        return torch.where(v.abs() <= 0.25, steepness, steepness / (16.0 * magnitude * magnitude))
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
