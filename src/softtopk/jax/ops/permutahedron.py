r"""Soft ranks and soft sorts of rows in JAX: projections onto the permutahedron (Blondel et al.,
ICML 2020), as the torch kernel (:mod:`softtopk.ops.permutahedron`, whose docstring has the
formulas and the ``±inf`` rules).

With ``w = (n, n-1, ..., 1)``, ``ε`` the strength and ``s`` the row (times ``sign``) sorted in
decreasing order: rank ``r = s/ε - v`` (l2, ``v`` the isotonic fit of ``s/ε - w``) or
``exp(s/ε - v)`` (kl, ``v`` the kl solution of ``(s/ε, log w)``), put back in the row's order;
sort ``h = sign (w/ε - v)`` (``v`` the isotonic fit of ``w/ε - s``, or the kl solution of
``(w/ε, s)``). The isotonic problems are solved exactly by :mod:`softtopk.jax.ops.isotonic`.
As in torch, the outputs are written through ``v - base`` (``base`` a point's unpooled value), so
that an entry no block pools is returned exactly (``s``, or the rank ``w``).

**Derivatives** are ``custom_jvp`` rules (linear in the tangents, so reverse mode is their
transpose; O(n) beyond the forward's sort): the Jacobian of isotonic regression is block-wise,
``v̇ = mean_B(ẏ)`` (l2) or ``Σ_B softmax_B(y) ẏ`` (kl) over each pooled block ``B``. With
``θ̇ = sign ṡ/ε - θ ε̇/ε``: rank l2 ``ṙ = θ̇ - mean_B θ̇``, rank kl ``ṙ = r θ̇ - r Σ_B(r θ̇)/Σ_B w``;
with ``u̇ = -w ε̇/ε²``: sort l2 ``ḣ = sign (mean_B ṡ + u̇ - mean_B u̇)``, sort kl
``ḣ = sign (Σ_B softmax_B(s) ṡ + u̇ - Σ_B softmax_B(w/ε) u̇)``. Infinite entries have derivative 0;
a row holding a NaN has NaN values and derivatives.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from .compute import take_rows
from .isotonic import block_ids, block_starts, block_sum, isotonic_kl, isotonic_l2
from .sparse import wide_dtype


def _sorted(rows: jax.Array, sign: float) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``sign * rows`` sorted in decreasing order (NaN read as 0; ties in their order), the
    permutation, its inverse, and the rows holding a NaN (B, 1)."""
    nan = jnp.isnan(rows)
    y = jnp.where(nan, 0.0, rows * sign)
    perm = jnp.argsort(y, axis=-1, stable=True, descending=True)
    inverse = jnp.zeros_like(perm).at[jnp.arange(rows.shape[0])[:, None], perm].set(jnp.arange(rows.shape[-1]))
    return take_rows(y, perm), perm, inverse, jnp.any(nan, -1, keepdims=True)


def _separated(v0: jax.Array, finite: jax.Array, top: jax.Array) -> jax.Array:
    """``v0`` with its infinite positions replaced by ``±b``, ``b`` above every finite ``|v0|``
    (``+b`` at the ``top`` positions): they never pool with a finite one."""
    bound = 2 * jnp.max(jnp.where(finite, jnp.abs(v0), 0.0), -1, keepdims=True) + 1
    return jnp.where(finite, v0, jnp.where(top, bound, -bound))


def _solve(y: jax.Array, lw: jax.Array | None, finite: jax.Array, top: jax.Array) -> tuple[jax.Array, jax.Array]:
    """l2 (``lw`` None) or kl isotonic solution with the infinite positions kept apart, and each
    point's value unpooled as the solver computes it (``v - base`` is exactly 0 there)."""
    if lw is None:
        y = _separated(y, finite, top)
        return isotonic_l2(y), y
    lw = jnp.where(finite, lw, 0.0)
    y = _separated(y - lw, finite, top) + lw
    return isotonic_kl(y, lw), y - lw


def _relative(s: jax.Array, eps: jax.Array) -> jax.Array:
    """``s/ε`` of the decreasing rows ``s`` up to a constant on each run of gaps below ``2n + 2``:
    minus the cumulative sum of the gaps ``(s_i - s_{i+1})/ε``, each clamped there (``±inf`` stay).
    The ranks are those of ``s/ε`` (no block spans such a gap), without its loss of ``w`` far above
    ``2^53`` or its overflow (the torch kernel's ``_relative``)."""
    gaps = (s[:, :-1] - s[:, 1:]) / eps
    bound = 2.0 * s.shape[-1] + 2.0
    gaps = jnp.where(gaps < bound, gaps, bound)  # inf (overflow, ±inf entries) and NaN to the bound
    theta = jnp.pad(-jnp.cumsum(gaps, -1), ((0, 0), (1, 0)))
    return jnp.where(jnp.isfinite(s), theta, s / eps)


def _weights(n: int, dtype) -> jax.Array:
    return jnp.arange(n, 0, -1, dtype=dtype)


def _nan_factor(nan: jax.Array, dtype) -> jax.Array:
    """NaN in the rows that hold a NaN, 1 elsewhere: a factor that keeps a derivative linear."""
    return jnp.where(nan, jnp.nan, 1.0).astype(dtype)


def _softmax_blocks(z: jax.Array, ids: jax.Array, first: jax.Array) -> jax.Array:
    """``softmax`` of ``z`` (decreasing within each block) over each point's block; ``first``: each
    point's block start."""
    e = jnp.exp(z - take_rows(z, first))
    return e / block_sum(e, ids)


def _rank_parts(x: jax.Array, eps: jax.Array, sign: float, kl: bool):
    s, perm, inverse, nan = _sorted(x, sign)
    n = s.shape[-1]
    theta = _relative(s, eps)
    w = _weights(n, s.dtype)
    finite = jnp.isfinite(theta)
    top = theta > 0
    # the infinite entries share their ranks: the mean of w over the top p (bottom q) positions
    p = jnp.sum(theta == jnp.inf, -1, keepdims=True)
    q = jnp.sum(theta == -jnp.inf, -1, keepdims=True)
    shared = jnp.where(top, n - (p - 1) / 2, (q + 1) / 2).astype(s.dtype)
    if kl:
        v, base = _solve(theta, jnp.broadcast_to(jnp.log(w), theta.shape), finite, top)
        r = jnp.where(finite, jnp.exp(base - v) * w, shared)
    else:
        v, base = _solve(theta - w, None, finite, top)
        r = jnp.where(finite, w - (v - base), shared)
    return r, v, jnp.where(finite, theta, 0.0), finite, perm, inverse, nan


@partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _rank(x: jax.Array, eps: jax.Array, sign: float, kl: bool) -> jax.Array:
    r, *_, inverse, nan = _rank_parts(x, eps, sign, kl)
    return jnp.where(nan, jnp.nan, take_rows(r, inverse))


@partial(_rank.defjvp, symbolic_zeros=True)
def _rank_jvp(sign, kl, primals, tangents):
    x, eps = primals
    dx, deps = tangents
    r, v, theta, finite, perm, inverse, nan = _rank_parts(x, eps, sign, kl)
    d_theta = jnp.zeros_like(theta)
    if not isinstance(dx, SymbolicZero):
        d_theta = d_theta + take_rows(dx, perm) * (sign / eps)
    if not isinstance(deps, SymbolicZero):
        d_theta = d_theta - theta * deps / eps
    d_theta = jnp.where(finite, d_theta, 0.0)
    ids = block_ids(v)
    if kl:
        rd = r * d_theta
        dr = rd - r * block_sum(rd, ids) / block_sum(jnp.broadcast_to(_weights(v.shape[-1], v.dtype), v.shape), ids)
    else:
        dr = d_theta - block_sum(d_theta, ids) / block_sum(jnp.ones_like(v), ids)
    out = jnp.where(nan, jnp.nan, take_rows(r, inverse))
    return out, take_rows(dr, inverse) * _nan_factor(nan, dr.dtype)


def _sort_parts(x: jax.Array, eps: jax.Array, sign: float, kl: bool):
    s, perm, _, nan = _sorted(x, sign)
    ws = jnp.broadcast_to(_weights(s.shape[-1], s.dtype) / eps, s.shape)
    finite = jnp.isfinite(s)
    top = s > 0
    v, base = _solve(ws, s, finite, top) if kl else _solve(ws - s, None, finite, top)
    h = jnp.where(nan, jnp.nan, jnp.where(finite, s - (v - base), s) * sign)
    return h, v, jnp.where(finite, s, 0.0), finite, perm, nan


@partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _sort(x: jax.Array, eps: jax.Array, sign: float, kl: bool) -> jax.Array:
    return _sort_parts(x, eps, sign, kl)[0]


@partial(_sort.defjvp, symbolic_zeros=True)
def _sort_jvp(sign, kl, primals, tangents):
    x, eps = primals
    dx, deps = tangents
    h, v, s, finite, perm, nan = _sort_parts(x, eps, sign, kl)
    ids = block_ids(v)
    first = block_starts(v)
    count = block_sum(jnp.ones_like(v), ids)
    dh = jnp.zeros_like(v)
    if not isinstance(dx, SymbolicZero):
        ds = jnp.where(finite, take_rows(dx, perm) * sign, 0.0)
        dh = dh + (block_sum(_softmax_blocks(s, ids, first) * ds, ids) if kl else block_sum(ds, ids) / count)
    if not isinstance(deps, SymbolicZero):
        w = _weights(v.shape[-1], v.dtype)
        du = -w * deps / eps**2
        if kl:
            dh = dh + du - block_sum(_softmax_blocks(jnp.broadcast_to(w / eps, v.shape), ids, first) * du, ids)
        else:
            dh = dh + du - block_sum(du, ids) / count
    return h, jnp.where(finite, dh * sign, 0.0) * _nan_factor(nan, dh.dtype)


def _run(fn, x: jax.Array, eps: jax.Array, sign: float, kl: bool) -> jax.Array:
    """``fn`` on rows ``x`` (B, n) and ``eps`` (B, 1) in the wide dtype (float64 with
    ``jax_enable_x64``), returned in ``x``'s dtype."""
    if x.size == 0:
        return x
    wide = wide_dtype()
    return fn(x.astype(wide), eps.astype(wide), sign, kl).astype(x.dtype)


def soft_rank_rows(x: jax.Array, eps: jax.Array, *, kl: bool, descending: bool) -> jax.Array:
    """Soft ranks of rows ``x`` (B, n) with strengths ``eps`` (B, 1), ``1..n`` (rank ``n`` to the
    largest; rank 1 with ``descending``), in ``x``'s dtype."""
    return _run(_rank, x, eps, -1.0 if descending else 1.0, kl)


def soft_sort_rows(x: jax.Array, eps: jax.Array, *, kl: bool, descending: bool) -> jax.Array:
    """Soft sort of rows ``x`` (B, n) with strengths ``eps`` (B, 1), increasing (decreasing with
    ``descending``), in ``x``'s dtype."""
    return _run(_sort, x, eps, 1.0 if descending else -1.0, kl)
