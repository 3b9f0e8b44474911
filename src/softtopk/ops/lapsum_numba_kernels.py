r"""The numba kernels behind :mod:`softtopk.ops.lapsum_numba` (imported only from there, at the
first CPU mask: this module imports numba): the Laplace mask's forward and backward, one call over
all rows each, in float64. The forward solves each row's threshold as ``lapsum._roots`` does (its
prefix and suffix sums in the same order), writes the row's mask and slope from the terms the
caller made with torch (a product each: the loop vectorises) and then the candidates' from their
exact scores (their exponentials one by one)."""

from __future__ import annotations

import math

import numpy as np

from .order_kernels import jit


@jit
def _clamp(y, lo, hi):
    """``y`` clamped to ``[lo, hi]``, NaN kept."""
    if y != y:
        return y
    return min(max(y, lo), hi)


@jit
def _threshold(a, e, rest, k, floor, p, q):
    """The scaled threshold ``t'`` from the clamped scaled candidates ``a`` (descending), ``e = e^a``
    and the rest's sum, as ``lapsum._roots``: the root ``½ log(Q_j/P_j) - asinh((k - j)/√(P_j Q_j))``
    of segment ``j``, the number of segments whose root lies below their lowest candidate (``p``
    and ``q`` are scratch rows of ``K + 1``)."""
    big = a.shape[0]
    p[0] = floor
    for j in range(big):
        p[j + 1] = p[j] + 1.0 / e[j]
    q[big] = rest
    for j in range(big - 1, -1, -1):
        q[j] = q[j + 1] + e[j]
    segment = 0
    for j in range(big):
        g = 1.0 / math.sqrt(p[j] * q[j])
        segment += math.log(q[j] * g) - math.asinh((k - j) * g) < a[j]
    g = 1.0 / math.sqrt(p[segment] * q[segment])
    return math.log(q[segment] * g) - math.asinh((k - segment) * g)


@jit
def mask_forward(vals, idx, terms, mask, d, k, tau, lo, hi, negate, cap, floor):
    """The ``K`` candidates of each row (``vals`` (B, K), of ``±x`` descending, at ``idx``) and the
    row's terms ``e^{(±x - s_K)/τ}`` clamped to ``[0, 1]`` (B, n; unused for ``K = n``) -> the
    mask and ``d = F'(z)/τ`` (B, n), written in place."""
    rows, n = mask.shape
    big = vals.shape[1]
    sign = -1.0 if negate else 1.0
    s, a, e = np.empty(big), np.empty(big), np.empty(big)
    p, q = np.empty(big + 1), np.empty(big + 1)
    for r in range(rows):
        kth = sign * np.float64(vals[r, k - 1])
        short = sign * np.float64(vals[r, k]) == -math.inf  # at most k entries above -inf
        drop = kth == math.inf or short  # a degenerate row: no gradient in x
        ref = _clamp(kth, lo, hi)
        for j in range(big):  # the candidates' scaled scores s, clamped to ±C in the solve (a)
            s[j] = (_clamp(sign * np.float64(vals[r, j]), lo, hi) - ref) / tau
            a[j] = _clamp(s[j], -cap, cap)
            e[j] = math.exp(a[j])
        rest = floor  # K = n: no rest
        if big < n:  # Σ e^{a} over the row: the candidates' terms are 1 each
            total = 0.0
            for i in range(n):
                total += np.float64(terms[r, i])
            rest = ((n - big) * 1.0 if short else max(total - big, 1e-30)) * e[big - 1]
        threshold = _threshold(a, e, rest, k, floor, p, q)
        if big < n:
            # below the last candidate F(z) = F'(z) is the entry's term times the last candidate's
            # F(z), and a short row's -inf entries share its rest (as the torch path's ``shift``)
            below = 0.5 * math.exp(s[big - 1] - threshold)
            shift = below if short else 0.0
            slope = 0.0 if drop else below / tau
            for i in range(n):  # no branch: it vectorises
                m = np.float64(terms[r, i]) * below + shift
                mask[r, i] = 1.0 - m if negate else m
                d[r, i] = np.float64(terms[r, i]) * slope
        for j in range(big):  # the candidates, exactly
            z = s[j] - threshold
            half = 0.5 * math.exp(-abs(z))
            m = 1.0 - half if z >= 0.0 else half
            mask[r, idx[r, j]] = 1.0 - m if negate else m
            d[r, idx[r, j]] = 0.0 if drop else half / tau


@jit
def mask_backward(d, g, out, tiny):
    """``d ⊙ (g - Σ d g / Σ d)`` row by row (B, n), written to ``out``."""
    rows, n = d.shape
    for r in range(rows):
        dot = 0.0
        mass = 0.0
        for i in range(n):
            dot += np.float64(d[r, i]) * np.float64(g[r, i])
            mass += np.float64(d[r, i])
        gbar = dot / max(mass, tiny)
        for i in range(n):
            out[r, i] = np.float64(d[r, i]) * (np.float64(g[r, i]) - gbar)
