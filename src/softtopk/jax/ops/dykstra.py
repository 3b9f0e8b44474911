"""Dykstra's alternating projections for the sparse soft top-k (p = 2) in JAX, on rows (B, n).

The decreasing isotonic regression ``argmin_{v_1 >= ... >= v_n} Σ u_i (s_i - v_i)²`` is
approximated by ``n_iter // 2`` trips, each a projection on C_odd (pairs (1,2),(3,4),...) then on
C_even (pairs (2,3),(4,5),...), with one correction vector per set; an even length gets a padding
entry ``min(row) - 1`` of weight 0. The original's iteration (the same pairing, order, padding and
count), vectorised over rows with ``lax.fori_loop`` (the original ran on one row). Its value is
returned; its derivative rule is the exact problem's (:mod:`.sparse`), so the truncation error
stays out of the gradient. Every iterate of the mask sums to ``k``; [0, 1] and exact zeros hold
at convergence only (roughly (block size)² projections).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from .sparse import exact_mask, extended_mag, mask_tangent
from .sparse import mag_rows as exact_mag_rows


def _project_pairs(z, u):
    """Project (B, 2m) rows onto {z_1 >= z_2, z_3 >= z_4, ...}: average each out-of-order pair."""
    pairs = z.reshape(z.shape[0], z.shape[1] // 2, 2)  # explicit sizes: a batch of 0 rows reshapes too
    first, second = pairs[..., 0], pairs[..., 1]
    if u is None:
        mean = (first + second) / 2.0
    else:
        w = u.reshape(u.shape[0], u.shape[1] // 2, 2)
        mean = (first * w[..., 0] + second * w[..., 1]) / (w[..., 0] + w[..., 1])
    keep = (second - first) < 0
    return jnp.where(keep[..., None], pairs, mean[..., None]).reshape(z.shape)


def isotonic(s, n_iter, weights=None):
    """Approximate (weighted) decreasing isotonic regression of each row of ``s`` (B, n)."""
    batch, n = s.shape
    u = None if weights is None else jnp.broadcast_to(weights, s.shape).astype(s.dtype)
    if n % 2 == 0:
        s = jnp.concatenate([s, jnp.min(s, -1, keepdims=True) - 1.0], -1)
        u = None if u is None else jnp.concatenate([u, jnp.zeros((batch, 1), s.dtype)], -1)
    head = None if u is None else u[:, :-1]
    tail = None if u is None else u[:, 1:]

    def trip(_, state):
        v, p, q = state
        a = v + p
        y = jnp.concatenate([_project_pairs(a[:, :-1], head), a[:, -1:]], -1)
        b = y + q
        v = jnp.concatenate([b[:, :1], _project_pairs(b[:, 1:], tail)], -1)
        return v, a - y, b - v

    zeros = jnp.zeros_like(s)
    return lax.fori_loop(0, n_iter // 2, trip, (s, zeros, zeros))[0][:, :n]


def _sorted(x, k):
    order = jnp.argsort(-x, axis=-1, stable=True)
    s = jnp.take_along_axis(x, order, -1)
    w = (jnp.arange(x.shape[-1]) < k).astype(x.dtype)
    return s, order, w


def _unsort(values, order):
    rows = jnp.arange(values.shape[0])[:, None]
    return jnp.zeros_like(values).at[rows, order].set(values)


def dykstra_mask(x, lam, k, n_iter):
    """Dykstra's mask of rows ``x`` (B, n) with ``lam`` (B, 1): ``(s - iso(s - λ w)) / λ``, un-sorted."""
    s, order, w = _sorted(_stand_ins(x, lam), k)
    return jnp.where(jnp.isinf(x), (x > 0).astype(x.dtype), _unsort((s - isotonic(s - lam * w, n_iter)) / lam, order))


def _stand_ins(x, lam):
    """``±inf`` entries as finite values beyond every finite one by more than the row's spread plus
    λ + 1 (at convergence exactly 0 or 1; their iterates are replaced by that value)."""
    finite = jnp.isfinite(x)
    low = jnp.min(jnp.where(finite, x, jnp.inf), -1, keepdims=True)
    high = jnp.max(jnp.where(finite, x, -jnp.inf), -1, keepdims=True)
    low, high = jnp.where(jnp.isfinite(low), low, 0.0), jnp.where(jnp.isfinite(high), high, 0.0)
    span = high - low + lam + 1.0
    return jnp.where(x == -jnp.inf, low - span, jnp.where(x == jnp.inf, high + span, x))


@partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def mask_rows(x, lam, k, n_iter, size):
    """Dykstra's value of the p = 2 mask; the exact problem's derivative (``k`` and ``size`` as in
    :func:`.sparse.mask_rows`)."""
    return dykstra_mask(lax.stop_gradient(x), lax.stop_gradient(lam), k, n_iter)


@partial(mask_rows.defjvp, symbolic_zeros=True)
def _mask_jvp(n_iter, size, primals, tangents):
    x, lam, k = primals
    y = exact_mask(x, lam, k, 1, size)
    dx, dlam, _ = tangents
    return mask_rows(x, lam, k, n_iter, size), mask_tangent(x, lam, y, dx, dlam, 1)


def dykstra_mag(x, lam, k, n_iter):
    """Dykstra's magnitude of rows ``x`` (B, n): ``sign(x) (s - iso_u(s/u)) / λ (1 + λ)``, ``u = 1 + λ w``."""
    infinite = jnp.isinf(x)
    # infinite magnitudes as a stand-in above (1 + λ) times every finite one: saturated at
    # convergence while fewer than k are infinite; their iterates are replaced by x
    high = jnp.max(jnp.where(infinite, 0.0, jnp.abs(x)), -1, keepdims=True)
    stand = jnp.minimum(high * (1 + lam) + 1.0, jnp.finfo(x.dtype).max)
    s, order, w = _sorted(jnp.where(infinite, stand, jnp.abs(x)), k)
    u = 1 + lam * w
    v = isotonic(s / u, n_iter, weights=u)
    return jnp.where(infinite, x, jnp.sign(x) * _unsort((s - v) / lam, order) * (1 + lam))


def mag_rows(x, lam, k, n_iter, size):
    """Dykstra's value of the p = 2 magnitude, on the extended reals as the exact one."""
    return extended_mag(x, k, lambda rows: _mag_kernel(rows, lam, k, n_iter, size))


@partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _mag_kernel(x, lam, k, n_iter, size):
    """Dykstra's value; the exact problem's derivative."""
    return dykstra_mag(lax.stop_gradient(x), lam, k, n_iter)


@_mag_kernel.defjvp
def _mag_jvp(n_iter, size, primals, tangents):
    (x, lam, k), (dx, _, _) = primals, tangents
    exact = jax.jvp(lambda v: exact_mag_rows(v, lam, k, 1, size), (x,), (dx,))[1]
    return _mag_kernel(x, lam, k, n_iter, size), exact
