"""The closed-form Laplace soft top-k mask in JAX (the torch default, :mod:`softtopk.ops.lapsum`).

``m_i = F((x_i - t)/τ)``, ``F(z) = e^z/2`` (z < 0), ``1 - e^{-z}/2`` (z >= 0), ``Σ m = k``. With
``j`` entries above ``t`` the sum is ``j - A u/2 + B/(2u)``, ``u = e^{t/τ}``: a quadratic per
segment. Every entry above ``t`` has ``m > 1/2``, so for ``k <= n/2`` the threshold lies among the
``2k`` largest entries (``lax.top_k``); the others enter through one exponential sum. Sums in log
space, scaled scores clamped to ``±2^20`` (no overflow for any ``τ``, exact at ``±inf``);
``k > n/2`` uses ``m(x, k) = 1 - m(-x, n - k)``; a per-row array ``k`` sorts the whole row.

``custom_jvp`` (implicit function theorem on ``Σ m = k``), ``d = F'(z)/τ``, ``w = d/Σd``:
``ṁ = d (ẋ - Σ w ẋ) - d (z - Σ w z) τ̇ + w k̇``.

Reference: Struski et al., "LapSum - One Method to Differentiate Them All", ICML 2025.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ._sparse import sorted_desc, wide_dtype

SATURATED = 2.0**20


def _log_threshold(a, log_rest, k):
    """``t/τ`` (B, 1) from the descending scaled candidates ``a`` (B, K) and ``log Σ_rest e^a``."""
    big = a.shape[-1]
    ninf = jnp.full_like(a[:, :1], -jnp.inf)
    # prefix log-sum-exps by a parallel scan: lax.cumlogsumexp is ~30x slower on CPU
    log_a = jnp.concatenate([ninf, lax.associative_scan(jnp.logaddexp, -a[:, :-1], axis=1)], -1)
    log_b = jnp.logaddexp(lax.associative_scan(jnp.logaddexp, a, axis=1, reverse=True), log_rest)
    c = k - jnp.arange(big, dtype=a.dtype)
    log_c = jnp.log(jnp.abs(c))
    log_root = 0.5 * jnp.logaddexp(2 * log_c, log_a + log_b)
    log_sum = jnp.logaddexp(log_c, log_root)
    log_u = jnp.where(c >= 0, log_b - log_sum, log_sum - log_a)
    upper = jnp.concatenate([jnp.full_like(ninf, jnp.inf), a[:, :-1]], -1)
    violation = jnp.maximum(a - log_u, 0) + jnp.maximum(log_u - upper, 0)
    j = jnp.argmin(violation, -1)[:, None]
    pick = partial(jnp.take_along_axis, indices=j, axis=-1)
    return jnp.clip(pick(log_u), pick(a), pick(upper))


def _parts(x, tau, k, full):
    """Mask, ``d = F'(z)/τ`` and ``z`` of rows ``x`` (B, n); ``tau`` (B, 1); ``k`` an int (K = 2k
    candidates) or a (B, 1) array (``full``: the whole row sorted)."""
    n = x.shape[-1]
    wide = wide_dtype()
    xs, ts = lax.stop_gradient(x), lax.stop_gradient(tau)
    big = n if full else min(n, 2 * k)
    vals = sorted_desc(xs, big)
    kth = jnp.clip(jnp.ceil(k).astype(jnp.int32) - 1, 0, big - 1) if full else jnp.full((x.shape[0], 1), k - 1)
    ref = jnp.take_along_axis(vals, jnp.broadcast_to(kth, (x.shape[0], 1)), -1)
    a = jnp.clip(((vals - ref) / ts).astype(wide), -SATURATED, SATURATED)
    if big == n:  # a -inf sentinel adds the segment "all n above t"
        a = jnp.concatenate([a, jnp.full_like(a[:, :1], -jnp.inf)], -1)
        log_rest = jnp.full_like(a[:, :1], -jnp.inf)
    else:  # Σ of e^{(x - s_K)/τ} over the entries not among the K largest, in one pass: every entry
        # at or below s_K, minus the candidates at s_K (each term exactly 1: exp(0) - exp(floor) rounds
        # to 1); exp(max(z, floor)) - exp(floor) is exactly 0 at -inf
        last = jnp.maximum(vals[:, -1:], jnp.finfo(x.dtype).min)
        floor = math.log(float(jnp.finfo(x.dtype).tiny)) + 8.0
        terms = jnp.exp(jnp.clip((xs - last) / ts, floor, 0.0)) - math.exp(floor)
        rest = jnp.sum(jnp.where(xs <= last, terms, 0.0), -1, keepdims=True) - jnp.sum(vals == last, -1, keepdims=True)
        log_rest = jnp.log(jnp.maximum(rest, 0.0).astype(wide)) + a[:, big - 1 : big]
    tt = _log_threshold(a, log_rest, jnp.asarray(k, wide)).astype(x.dtype)
    z = jnp.clip((x - ref) / tau, -SATURATED, SATURATED) - tt
    half = 0.5 * jnp.exp(-jnp.abs(z))
    return jnp.where(z >= 0, 1 - half, half), half / tau, z


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _mask_int_k(x, tau, k):
    return _parts(x, tau, k, False)[0]


@partial(_mask_int_k.defjvp, symbolic_zeros=True)
def _int_jvp(k, primals, tangents):
    (x, tau), (dx, dtau) = primals, tangents
    m, d, z = _parts(x, tau, k, False)
    return m, _tangent(d, z, dx, dtau, None)


@jax.custom_jvp
def _mask_array_k(x, tau, k):
    return _parts(x, tau, k, True)[0]


@partial(_mask_array_k.defjvp, symbolic_zeros=True)
def _array_jvp(primals, tangents):
    (x, tau, k), (dx, dtau, dk) = primals, tangents
    m, d, z = _parts(x, tau, k, True)
    return m, _tangent(d, z, dx, dtau, dk)


def _tangent(d, z, dx, dtau, dk):
    """``d (ẋ - Σ w ẋ) - d (z - Σ w z) τ̇ + w k̇``; a symbolic-zero (or None) tangent adds nothing."""
    total = jnp.sum(d, -1, keepdims=True)
    safe = jnp.where(total > 0, total, 1.0)
    out = jnp.zeros_like(d)
    if not _zero(dx):
        out = d * (dx - jnp.sum(d * dx, -1, keepdims=True) / safe)
    if not _zero(dtau):
        zd = jnp.where(d > 0, z, 0.0)
        out = out - d * (zd - jnp.sum(d * zd, -1, keepdims=True) / safe) * dtau
    if not _zero(dk):
        out = out + d / safe * dk
    return out


def _zero(tangent) -> bool:
    return tangent is None or isinstance(tangent, SymbolicZero)


def laplace_mask(x, tau, k):
    """The Laplace mask of rows ``x`` (B, n), ``tau`` (B, 1); ``k`` an int in [1, n] or a (B, 1)
    floating array in (0, n] (gradient in ``k`` too)."""
    n = x.shape[-1]
    if isinstance(k, int):
        if k >= n:
            return jnp.ones_like(x) + 0 * x
        if 2 * k > n:
            return 1 - _mask_int_k(-x, tau, n - k)
        return _mask_int_k(x, tau, k)
    k = k.astype(x.dtype)
    full = k >= n  # mask 1, gradient 0; the kernel gets a harmless k there
    mask = _mask_array_k(x, tau, jnp.where(full, 0.5 * n, k))
    return jnp.where(full, 1.0, mask)
