"""The closed-form Laplace soft top-k mask in JAX (the torch default, :mod:`softtopk.ops.lapsum`).

``m_i = F((x_i - t)/τ)``, ``F(z) = e^z/2`` (z < 0), ``1 - e^{-z}/2`` (z >= 0), ``Σ m = k``. With
``j`` entries above ``t`` the sum is ``j - A u/2 + B/(2u)``, ``u = e^{t/τ}``: a quadratic per
segment. Every entry above ``t`` has ``m > 1/2``, so for ``k <= n/2`` the threshold lies among the
``2k`` largest entries (``lax.top_k``); the others enter through one exponential sum. Scaled scores
are clamped to ``±2^20`` (no overflow for any ``τ``, exact at ``±inf``); ``k > n/2`` uses
``m(x, k) = 1 - m(-x, n - k)``; a per-row array ``k`` sorts the whole row.

``±inf`` as in the torch API (:mod:`softtopk.jax._extended`); with an int ``k`` the degenerate rows (at least
``k`` entries at ``+inf``, or at most ``k`` above ``-inf``) are read off the candidates: no pass
over the row is spent on them unless one has ``2k`` entries at ``+inf``.

``custom_jvp`` (implicit function theorem on ``Σ m = k``), ``d = F'(z)/τ``, ``w = d/Σd``:
``ṁ = d (ẋ - Σ w ẋ) - d (z - Σ w z) τ̇ + w k̇``. ``Σ d = (A u + B/u)/(2τ)`` comes with the
threshold, and the tangent recomputes ``d`` from ``x`` under ``jax.checkpoint``: reverse mode keeps
no residual the size of ``x`` and makes one pass over it, for ``Σ d ẋ``.

Reference: Struski et al., "LapSum - One Method to Differentiate Them All", ICML 2025.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from .._extended import closed_form, extended_mask
from .sparse import sorted_desc, wide_dtype

SATURATED = 2.0**20


def _compose(first, then):
    """Affine maps ``P -> r P + s`` as pairs ``(r, s)``: ``first``, then ``then``."""
    return first[0] * then[0], then[0] * first[1] + then[1]


def _log_threshold(a, rest, k):
    """``t/τ`` and ``Σ_i F'(a_i - t/τ)`` (each (1, B)) from the scaled candidates ``a`` (K, B),
    descending down each column (the last may be a ``-inf`` sentinel), ``rest`` (1, B), the other
    entries' ``Σ e^a`` in units of ``e^{a_{K-1}}``, and ``k`` (a float or (1, B)).

    Segment ``j`` (``j`` candidates above ``t``) has ``A = Σ_{i<j} e^{-a_i} = e^{-a_{j-1}} P_j`` and
    ``B = Σ_{i>=j} e^{a_i} + rest = e^{a_j} Q_j`` with ``P_{j+1} = ρ_j P_j + 1``,
    ``Q_j = ρ_{j+1} Q_{j+1} + 1``, ``ρ_j = e^{a_j - a_{j-1}} <= 1``: two scans of affine maps whose
    values stay in ``[0, n + K]``. Its root ``u = B/(c + R)`` (``c = k - j >= 0``) or
    ``(|c| + R)/A`` (``c < 0``), ``R = √(c² + AB)``, is taken in logs; the segment that holds its
    root is the threshold's, and ``Σ F' = (A u + B/u)/2`` there. Columns, not rows: XLA on CPU
    vectorises the minor axis, here the batch (a row of 2k candidates is too short for it)."""
    edge = jnp.full_like(a[:1], -jnp.inf)
    step = jnp.concatenate([edge, a[1:] - a[:-1]])  # log ρ_j, -inf at j = 0 and at the sentinel
    rho = jnp.exp(step)
    one = jnp.ones_like(rho)
    nothing = jnp.zeros_like(edge)
    prefix = jnp.concatenate([nothing, lax.associative_scan(_compose, (rho[:-1], one[:-1]))[1]])
    suffix = lax.associative_scan(
        _compose, (jnp.concatenate([rho[1:], nothing]), jnp.concatenate([one[1:], 1 + rest])), reverse=True
    )[1]
    log_p, log_q = jnp.log(prefix), jnp.log(suffix)
    upper = jnp.concatenate([-edge, a[:-1]])  # a_{j-1}, +inf at j = 0
    c = k - jnp.arange(a.shape[0], dtype=a.dtype)[:, None]
    log_c = jnp.log(jnp.abs(c))
    log_root = 0.5 * jnp.logaddexp(2 * log_c, step + log_p + log_q)
    log_sum = jnp.logaddexp(log_c, log_root)
    log_u = jnp.where(c >= 0, a + log_q - log_sum, log_sum - log_p + upper)
    violation = jnp.maximum(a - log_u, 0) + jnp.maximum(log_u - upper, 0)
    pick = partial(jnp.take_along_axis, indices=jnp.argmin(violation, 0)[None], axis=0)
    tt = jnp.clip(pick(log_u), pick(a), pick(upper))
    slope = 0.5 * (jnp.exp(pick(log_p) - pick(upper) + tt) + jnp.exp(pick(a) + pick(log_q) - tt))
    return tt, slope


def _threshold(vals, rest, tau, k, ref):
    """``t/τ`` relative to ``ref`` and ``Σ d`` (each (B, 1)) from the descending candidates
    ``vals`` (B, K) and ``rest``, the other entries' ``Σ e^{(x - s_K)/τ}`` (``None``: ``vals`` is
    the whole row)."""
    wide = wide_dtype()
    a = jnp.clip(((vals - ref) / tau).astype(wide), -SATURATED, SATURATED)
    if rest is None:  # a -inf sentinel adds the segment "all n above t"
        a = jnp.concatenate([a, jnp.full_like(a[:, :1], -jnp.inf)], -1)
        rest = jnp.zeros_like(a[:, :1])
    k = jnp.asarray(k, wide)
    tt, slope = _log_threshold(a.T, jnp.maximum(rest, 0).astype(wide).T, k.T if k.ndim else k)
    return tt.T.astype(vals.dtype), (slope.T / tau).astype(vals.dtype)


def _mask_from(z):
    half = 0.5 * jnp.exp(-jnp.abs(z))
    return jnp.where(z >= 0, 1 - half, half)


def _int_forward(x, tau, k):
    """Mask and ``(ref, t/τ, Σ d, keep)`` of rows ``x`` (B, n) (``±inf`` allowed) for an int
    ``1 <= k <= n/2``; ``keep`` is False in the degenerate rows, whose mask is the closed form."""
    n, size = x.shape[-1], min(x.shape[-1], 2 * k)
    xs, ts = lax.stop_gradient(x), lax.stop_gradient(tau)
    raw = sorted_desc(xs, size)
    full = raw[:, k - 1 : k] == jnp.inf  # p >= k: k shared among the +inf entries
    short = raw[:, k : k + 1] == -jnp.inf  # p + f <= k: every entry above -inf selected
    keep = ~(full | short)
    vals = jnp.where(keep, raw, 0.0)  # a degenerate row solves as zeros
    rows = jnp.where(keep, xs, 0.0)
    if size == n:
        rest = None
    else:  # Σ of e^{(x - s_K)/τ} over the entries not among the K largest: every entry at or below
        # s_K, minus the candidates at s_K (each term exactly 1: exp(0) - exp(floor) rounds to 1);
        # exp(max(z, floor)) - exp(floor) is exactly 0 at -inf
        last = jnp.maximum(vals[:, -1:], jnp.finfo(x.dtype).min)
        floor = math.log(float(jnp.finfo(x.dtype).tiny)) + 8.0
        terms = jnp.exp(jnp.clip((rows - last) / ts, floor, 0.0)) - math.exp(floor)
        rest = jnp.sum(jnp.where(rows <= last, terms, 0.0), -1, keepdims=True)
        rest = rest - jnp.sum(vals == last, -1, keepdims=True)
    ref = vals[:, k - 1 : k]
    tt, total = _threshold(vals, rest, ts, k, ref)
    mask = _mask_from(jnp.clip((rows - ref) / ts, -SATURATED, SATURATED) - tt)
    # the closed form: +inf entries counted over the row only when the candidates are all +inf
    p = lax.cond(
        jnp.any(raw[:, -1] == jnp.inf),
        lambda: jnp.sum(xs == jnp.inf, -1, keepdims=True),
        lambda: jnp.sum(raw == jnp.inf, -1, keepdims=True),
    )
    above = jnp.sum(raw > -jnp.inf, -1, keepdims=True)  # p + f, all among the candidates in the short rows
    return jnp.where(keep, mask, closed_form(xs, k, full, p, above).astype(x.dtype)), (ref, tt, total, keep)


def _array_forward(x, tau, k):
    """Mask and ``(ref, t/τ, Σ d, keep)`` of finite rows ``x`` (B, n), ``k`` (B, 1) in (0, n):
    the whole row sorted."""
    n = x.shape[-1]
    xs, ts = lax.stop_gradient(x), lax.stop_gradient(tau)
    vals = sorted_desc(xs, n)
    kth = jnp.clip(jnp.ceil(k).astype(jnp.int32) - 1, 0, n - 1)
    ref = jnp.take_along_axis(vals, jnp.broadcast_to(kth, (x.shape[0], 1)), -1)
    tt, total = _threshold(vals, None, ts, lax.stop_gradient(k), ref)
    return _mask_from(jnp.clip((xs - ref) / ts, -SATURATED, SATURATED) - tt), (ref, tt, total, True)


@jax.checkpoint
def _tangent(x, tau, state, dx, dtau, dk):
    """``d (ẋ - Σ w ẋ) - d (z - Σ w z) τ̇ + w k̇``, ``d`` recomputed from ``x``; a ``None`` tangent
    adds nothing."""
    ref, tt, total, keep = state
    z = jnp.clip((jnp.where(keep, x, 0.0) - ref) / tau, -SATURATED, SATURATED) - tt
    d = jnp.where(keep, 0.5 * jnp.exp(-jnp.abs(z)) / tau, 0.0)
    safe = jnp.where(total > 0, total, 1.0)
    out = jnp.zeros_like(d)
    if dx is not None:
        out = d * (dx - jnp.sum(d * dx, -1, keepdims=True) / safe)
    if dtau is not None:
        zd = jnp.where(d > 0, z, 0.0)
        out = out - d * (zd - jnp.sum(d * zd, -1, keepdims=True) / safe) * dtau
    if dk is not None:
        out = out + d / safe * dk
    return out


def _nonzero(tangent):
    return None if isinstance(tangent, SymbolicZero) else tangent


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _mask_int_k(x, tau, k):
    return _int_forward(x, tau, k)[0]


@partial(_mask_int_k.defjvp, symbolic_zeros=True)
def _int_jvp(k, primals, tangents):
    (x, tau), (dx, dtau) = primals, tangents
    mask, state = _int_forward(x, tau, k)
    return mask, _tangent(x, tau, state, _nonzero(dx), _nonzero(dtau), None)


@jax.custom_jvp
def _mask_array_k(x, tau, k):
    return _array_forward(x, tau, k)[0]


@partial(_mask_array_k.defjvp, symbolic_zeros=True)
def _array_jvp(primals, tangents):
    (x, tau, k), (dx, dtau, dk) = primals, tangents
    mask, state = _array_forward(x, tau, k)
    return mask, _tangent(x, tau, state, _nonzero(dx), _nonzero(dtau), _nonzero(dk))


def laplace_mask(x, tau, k):
    """The Laplace mask of rows ``x`` (B, n) (``±inf`` as in the torch API), ``tau`` (B, 1); ``k``
    an int in [1, n] or a (B, 1) floating array in (0, n] (gradient in ``k`` too)."""
    n = x.shape[-1]
    if isinstance(k, int):
        if k >= n:
            return jnp.ones_like(x)
        if 2 * k > n:
            return 1 - _mask_int_k(-x, tau, n - k)
        return _mask_int_k(x, tau, k)
    k = k.astype(x.dtype)

    def kernel(rows):
        full = k >= n  # mask 1, gradient 0; the kernel gets a harmless k there
        return jnp.where(full, 1.0, _mask_array_k(rows, tau, jnp.where(full, 0.5 * n, k)))

    return extended_mask(x, k, kernel)
