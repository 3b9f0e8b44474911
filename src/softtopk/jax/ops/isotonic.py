r"""Exact decreasing isotonic regression of rows in JAX, with static shapes: the fixed-shape level
merges of the torch kernel (:mod:`softtopk.ops.isotonic`, whose docstring has the derivation).

Two problems, both solved by Pool-Adjacent-Violators in Blondel et al. (2020):

* l2: ``v = argmin_{v_1 >= ... >= v_n} ½ ||v - y||²``; a pooled block ``B`` takes ``mean(y_B)``;
* kl: ``v = argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(l), v>``; a block takes
  ``logsumexp(y_B) - logsumexp(l_B)``.

Segments of size ``m = 1, 2, 4, ...`` are solved exactly and merged in pairs at each of the
``⌈log2 n⌉`` levels: merging two decreasing solutions ``L`` and ``R`` pools a suffix of ``L``
(``p`` points) with a prefix of ``R`` (``q`` points) into one block of value ``V``, the root of
the increasing function

.. math:: G(t) = \sum_{i \in P(t)} g_i(t), \qquad P(t) = \{i \in L: v_i < t\} \cup \{i \in R: v_i > t\},

``g_i(t) = t - v_i`` (l2) or ``exp(l_i) (1 - exp(v_i - t))`` (kl). ``p`` counts the points of
``L`` with ``G(v_i) < 0``, ``q`` those of ``R`` with ``G(v_i) > 0``; ``G`` at every point comes
from cumulative sums (log-sum-exps for kl) within each segment and the counts across the junction
from comparisons (short segments) or ``searchsorted``. Every level is a fixed sequence of array
operations on the row padded to a power of two: jit-able, vmap-able, on any backend,
``O(n log² n)`` work and ``O(n)`` memory; each level is compiled on its own, so the compile time
grows with ``log n``. The CPU shortcut of the torch kernel (rounds of pooling that read values)
has no place under ``jit``.

Reference: M. Blondel, O. Teboul, Q. Berthet, J. Djolonga, "Fast Differentiable Sorting and
Ranking", ICML 2020, arXiv:2002.08871.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .compute import search_rows, take_rows


def _pad(v: jax.Array) -> jax.Array:
    """``v`` padded to a power of two with points that never pool with a real one: values below
    every real block value (a pooled value lies within its points' range)."""
    n = v.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()
    if size == n:
        return v
    low = jnp.min(v, -1, keepdims=True)
    low = low - 1.0 - jnp.abs(low)  # strictly below, whatever the magnitude
    return jnp.concatenate([v, jnp.broadcast_to(low, (*v.shape[:-1], size - n))], -1)


# halves up to this size are compared pair by pair (O(m²) work per pair), a few operations to
# compile where ``searchsorted`` compiles to a loop
SHORT = 32


def _cross_counts(vl: jax.Array, vr: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``c_i = #{j: vr_j > vl_i}`` and ``d_j = #{i: vl_i < vr_j}`` for decreasing rows ``vl, vr``
    (R, m): from all pairs for short halves, else by ``searchsorted``."""
    if vl.shape[-1] <= SHORT:
        return jnp.sum(vr[:, None, :] > vl[:, :, None], -1), jnp.sum(vl[:, None, :] < vr[:, :, None], -1)
    return search_rows(-vr, -vl, "left"), vl.shape[-1] - search_rows(-vl, -vr, "right")


def _merge_l2(v: jax.Array, m: int) -> jax.Array:
    """One level of l2 merges: the solved segments of size ``m`` of ``v`` (B, N) merged in pairs."""
    v3 = v.reshape(-1, 2, m)
    vl, vr = v3[:, 0], v3[:, 1]
    # values relative to L's last and R's first value: exactly 0 on those blocks, so that G is
    # exactly 0 there when nothing is pooled (G vanishes on a whole interval in that case)
    ul, ur = vl - vl[:, -1:], vr - vr[:, :1]
    cl, cr = jnp.cumsum(ul, -1), jnp.cumsum(ur, -1)
    total = cl[:, -1:]
    zero = jnp.zeros_like(total)
    clx, crx = jnp.concatenate([zero, cl], -1), jnp.concatenate([zero, cr], -1)  # sums of the first k
    pos = jnp.arange(m)
    c, d = _cross_counts(vl, vr)
    # G at each point of L (t = vl_i): the points after it in L, the first c_i points of R; at
    # each point of R (t = vr_j): the last d_j points of L, the points before it in R
    shift = vr[:, :1] - vl[:, -1:]
    g_left = (m - 1 - pos) * ul - (total - cl) + c * (ul - shift) - take_rows(crx, c)
    g_right = d * (ur + shift) - (total - take_rows(clx, m - d)) + pos * ur - (cr - ur)
    p = jnp.sum(g_left < 0, -1, keepdims=True)
    q = jnp.sum(g_right > 0, -1, keepdims=True)
    sum_l = total - take_rows(clx, m - p) + p * vl[:, -1:]
    sum_r = take_rows(crx, q) + q * vr[:, :1]
    pooled = (sum_l + sum_r) / jnp.maximum(p + q, 1)
    new_l = jnp.where(pos >= m - p, pooled, vl)
    new_r = jnp.where(pos < q, pooled, vr)
    return jnp.stack([new_l, new_r], 1).reshape(v.shape)


def _log_part(a1: jax.Array, a2: jax.Array, t: jax.Array, below: bool) -> jax.Array:
    """``log |Σ exp(l_i) (1 - exp(v_i - t))|`` over a set with ``a1 = logsumexp(l)``,
    ``a2 = logsumexp(l + v)`` whose values lie all below (``below``) or all above ``t``; ``-inf``
    for an empty set."""
    empty = a1 == -jnp.inf
    gap = jnp.where(empty, 0.0, a2 - a1 - t)
    if below:
        body = jnp.log(-jnp.expm1(jnp.minimum(gap, 0)))
    else:  # log(e^g - 1) as g + log(1 - e^-g): e^g overflows (from g = 89 in float32, 710 in float64)
        gap = jnp.maximum(gap, 0)
        body = gap + jnp.log(-jnp.expm1(-gap))
    return jnp.where(empty, -jnp.inf, a1 + body)


def _cum_lse(x: jax.Array) -> jax.Array:
    """Cumulative ``logsumexp`` along the last axis of ``x`` (..., m): over all pairs for short rows,
    else by ``⌈log2 m⌉`` doublings in a loop (``acc_i ⊕= acc_{i-d}``, ``d = 1, 2, 4, ...``; one step
    to compile). ``lax.cumlogsumexp`` lowers to a window over the whole row on CPU and GPU,
    quadratic in its length."""
    m = x.shape[-1]
    if m > SHORT:

        def double(k, acc):
            d = jnp.left_shift(1, k)
            return jnp.where(jnp.arange(m) >= d, jnp.logaddexp(acc, jnp.roll(acc, d, axis=-1)), acc)

        return lax.fori_loop(0, (m - 1).bit_length(), double, x)
    upto = jnp.arange(m)[None, :] <= jnp.arange(m)[:, None]  # [i, k]: k <= i
    return jax.nn.logsumexp(jnp.where(upto, x[..., None, :], -jnp.inf), -1)


def _end_sums(l3: jax.Array, v3: jax.Array) -> tuple[jax.Array, ...]:
    """``logsumexp`` of ``l`` and of ``l + v`` over ``L`` from point ``k`` on (``s1``, ``s2``) and
    over the first ``k`` points of ``R`` (``p1``, ``p2``), ``k = 0..m``, each (R, m + 1); one scan,
    ``L`` reversed (its suffixes are then prefixes)."""
    left = jnp.stack([l3[:, 0], l3[:, 0] + v3[:, 0]])[..., ::-1]
    right = jnp.stack([l3[:, 1], l3[:, 1] + v3[:, 1]])
    cum = _cum_lse(jnp.concatenate([left, right]))
    first = jnp.concatenate([jnp.full_like(cum[..., :1], -jnp.inf), cum], -1)  # the first k, k = 0..m
    return first[0, :, ::-1], first[1, :, ::-1], first[2], first[3]


def _merge_kl(v: jax.Array, lw: jax.Array, m: int) -> jax.Array:
    """One level of kl merges (``lw`` the log weights ``l``, fixed); the sums of ``exp(l)`` and
    ``exp(l + v)`` over suffixes of ``L`` and prefixes of ``R`` are taken as log-sum-exps."""
    v3, l3 = v.reshape(-1, 2, m), lw.reshape(-1, 2, m)
    vl, vr = v3[:, 0], v3[:, 1]
    s1, s2, p1, p2 = _end_sums(l3, v3)  # L from point k on, R before point k
    pos = jnp.arange(m)
    c, d = _cross_counts(vl, vr)
    # G < 0 at t = vl_i: the part below t (after i in L) is smaller than the part above (R's
    # first c_i points); G > 0 at t = vr_j: the part below (L's last d_j points) is larger than
    # the part above (before j in R). Where nothing is pooled one side is empty: -inf, exactly
    start = m - d
    g_left = _log_part(s1[:, 1:], s2[:, 1:], vl, True) < _log_part(take_rows(p1, c), take_rows(p2, c), vl, False)
    g_right = _log_part(take_rows(s1, start), take_rows(s2, start), vr, True) > _log_part(
        p1[:, :-1], p2[:, :-1], vr, False
    )
    p = jnp.sum(g_left, -1, keepdims=True)
    q = jnp.sum(g_right, -1, keepdims=True)
    top = jnp.logaddexp(take_rows(s2, m - p), take_rows(p2, q))
    bottom = jnp.logaddexp(take_rows(s1, m - p), take_rows(p1, q))
    pooled = jnp.where(p + q > 0, top - bottom, 0.0)
    new_l = jnp.where(pos >= m - p, pooled, vl)
    new_r = jnp.where(pos < q, pooled, vr)
    return jnp.stack([new_l, new_r], 1).reshape(v.shape)


def isotonic_l2(y: jax.Array) -> jax.Array:
    """The decreasing isotonic fit ``argmin_{v_1 >= ... >= v_n} ½ ||v - y||²`` of rows ``y`` (B, n)."""
    v = _pad(y)
    m = 1
    while m < v.shape[-1]:
        v = _merge_l2(v, m)
        m *= 2
    return v[:, : y.shape[-1]]


def isotonic_kl(y: jax.Array, lw: jax.Array) -> jax.Array:
    """``argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(lw), v>`` of rows ``y``, ``lw`` (B, n);
    a block's value is ``logsumexp(y_B) - logsumexp(lw_B)``."""
    v = _pad(y - lw)
    lw = jnp.pad(lw, ((0, 0), (0, v.shape[-1] - y.shape[-1])))  # the padding's weights: any finite value
    m = 1
    while m < v.shape[-1]:
        v = _merge_kl(v, lw, m)
        m *= 2
    return v[:, : y.shape[-1]]


def block_ids(v: jax.Array) -> jax.Array:
    """The pooled block of every point of a solution ``v`` (B, n): its index (a block is a run of
    equal values)."""
    new = jnp.concatenate([jnp.ones_like(v[..., :1], dtype=bool), v[..., 1:] != v[..., :-1]], -1)
    return jnp.cumsum(new, -1) - 1


def block_starts(v: jax.Array) -> jax.Array:
    """The index of the first point of every point's block (B, n)."""
    new = jnp.concatenate([jnp.ones_like(v[..., :1], dtype=bool), v[..., 1:] != v[..., :-1]], -1)
    return lax.cummax(jnp.where(new, jnp.arange(v.shape[-1]), 0), axis=v.ndim - 1)


def block_sum(values: jax.Array, ids: jax.Array) -> jax.Array:
    """The sum over each point's block (B, n), from block indices ``ids`` (linear in ``values``)."""
    rows = jnp.arange(values.shape[0])[:, None]
    return jnp.take_along_axis(jnp.zeros_like(values).at[rows, ids].add(values), ids, -1)
