"""Sparse soft top-k in JAX (Sander et al., ICML 2023): the exact threshold solver of the torch
kernel (:mod:`softtopk.ops.sparse`, whose docstring has the derivation), with static shapes.

Mask ``y = clip(((x - t)_+ / λ)^r, 0, 1)``, ``r = 1/(p-1)``, ``Σ y = k``; magnitude
``o = sign(x)(θ u + (|x| - θ)_+)``, ``u = clip(((|x| - θ)_+ / (λ θ^{1/r}))^r, 0, 1)``, ``Σ u = k``.
The threshold is solved on the ``2k + 8`` largest scores (``lax.top_k``), from float64 prefix
moments (float32 without ``jax_enable_x64``, then polished by Newton steps on the candidates);
when a row's threshold lies below its last candidate, a ``lax.cond`` solves every row again on the
fully sorted scores: exact, no host round trip. O(n) memory.

The derivatives are ``custom_jvp`` rules written from the implicit function theorem (linear in the
tangents, so reverse mode is their transpose): mask
``ẏ = d (ẋ - Σ d ẋ / Σ d) - d (x - x̄)/λ · λ̇``, ``d = r u^{r-1}/λ`` on ``0 < y < 1``,
``x̄ = Σ d x / Σ d``; magnitude ``ṁ = w ṡ - w_I (Σ e ṡ) / Σ e β`` (``ṡ = sign(x) ẋ``; ``w``, ``e``,
``β`` as in the torch backward). O(n), finite everywhere.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ..._window import window_power, window_root
from .compute import search_rows, take_rows


def exponent(p: float) -> int:
    """``r = 1/(p-1)``: 1 for p = 2, 3 for p = 4/3."""
    return 1 if abs(p - 2.0) < 1e-9 else 3


def wide_dtype():
    """The threshold's dtype: float64 when ``jax_enable_x64`` is on, else float32."""
    return jnp.float64 if jax.config.read("jax_enable_x64") else jnp.float32


def _nonnegative(v):
    return jnp.maximum(v, 0)


def _cubic_root(p, q):
    """The real root of ``y³ + p y + q = 0`` for ``p >= 0`` (Cardano, two Newton steps), solved for
    ``w = y/σ``, ``σ = max(√p, ∛|q|)``: coefficients of size 1, no overflow of ``p³`` or ``q²``.
    The coefficients are the powers of the ratios ``√p/σ`` and ``∛|q|/σ`` (at most 1): ``σ³`` itself
    leaves float32 for ``σ`` below 2e-13 (0/0 at ``q = 0``: NaN) or above 7e12, and XLA rewrites
    ``q/σ/σ/σ`` as ``q/σ³``."""
    root_p, root_q = jnp.sqrt(p), jnp.cbrt(q)
    sigma = jnp.maximum(root_p, jnp.abs(root_q))
    sigma = jnp.where(sigma > 0, sigma, 1.0)
    p, q = (root_p / sigma) ** 2, (root_q / sigma) ** 3
    half = 0.5 * q
    disc = jnp.sqrt(half * half + p * p * p / 27.0)
    big = jnp.cbrt(-half - jnp.where(q >= 0, disc, -disc))
    y = jnp.where(big == 0, 0.0, big - p / jnp.where(big != 0, 3.0 * big, 1.0))
    for _ in range(2):
        slope = 3.0 * y * y + p
        step = (y * y * y + p * y + q) / jnp.where(slope > 0, slope, 1.0)
        y = y - jnp.where(slope > 0, step, 0.0)
    return sigma * y


def _saturation_knot(s, lam, r):
    """Magnitude: the θ at which an entry of size ``s`` saturates, ``θ + λ θ^{1/r} = s``."""
    return s / (1.0 + lam) if r == 1 else _cubic_root(jnp.broadcast_to(lam, s.shape), -s) ** 3


def _divide(a, b):
    """``a / b``, ``b`` broadcast along rows, correctly rounded (as the torch kernel divides): XLA
    would multiply by the reciprocal of a broadcast divisor and fuse the product with the next
    subtraction, which moves a mask entry at a kink off 0 or 1, where the derivative jumps. The
    barrier hides the broadcast."""
    return a / lax.optimization_barrier(jnp.broadcast_to(b, jnp.broadcast_shapes(a.shape, b.shape)))


def candidates(n, k):
    """How many of a row's largest scores the threshold is solved on: ``2k + 8``, at most ``n``.
    The kernels take this count as a static argument and ``k`` itself traced, so that a new ``k``
    with the same count (every ``k`` of a short row) compiles nothing."""
    return min(n, 2 * k + 8)


def _column(rows, index):
    """Column ``index`` (an int or a traced int) of ``rows`` (B, K), as (B, 1)."""
    return lax.dynamic_slice_in_dim(rows, index, 1, axis=1)


def _power_sums(u, r):
    """Prefix sums ``(r, B, K+1)`` of ``u^m`` for m = 1..r, stacked: one scan and one gather per
    bound for every power, a smaller program than one per power (the torch kernel's layout)."""
    powers = u[None] if r == 1 else jnp.stack([u, u * u, u * u * u])
    return jnp.pad(jnp.cumsum(powers, -1), ((0, 0), (0, 0), (1, 0)))


def _window_sums(prefix, lo, hi):
    """``Σ_{lo < i <= hi} u_i^m`` for m = 1..r (each (B, M)) from the stacked prefix sums."""
    size = (prefix.shape[0], *hi.shape)
    sums = jnp.take_along_axis(prefix, jnp.broadcast_to(hi, size), -1)
    return list(sums - jnp.take_along_axis(prefix, jnp.broadcast_to(lo, size), -1))


def _window_power(prefix, lo, hi, at, r):
    """``Σ_{lo < i <= hi} (u_i - at)^r`` from the stacked prefix sums."""
    return window_power(_window_sums(prefix, lo, hi), (hi - lo).astype(at.dtype), at, r)


def _solve_sorted(s, k, lam, r, magnitude):
    """The threshold from the descending candidates ``s`` (B, K) (K > k or K = n), ``lam`` (B, 1):
    ``θ`` (B, 1) for the magnitude, ``(s_k, (t - s_k)/λ)`` for the mask, which is solved in units of
    λ (moments of size 1: no ``λ⁶`` over- or underflow)."""
    big = s.shape[-1]
    sk = _column(s, k - 1)
    if magnitude:
        lower, upper = _saturation_knot(sk, lam, r), sk + lam * sk ** (1.0 / r)
        lam_u = lam
    else:
        lower, upper = sk - lam, sk + lam
        lam_u = jnp.ones_like(lam)
    # clamped to the bracket (statuses unchanged for every threshold in it); the mask's after scaling
    # by λ, where the bracket cannot round away
    u = jnp.clip(s, lower, upper) - sk if magnitude else jnp.clip((s - sk) / lam, -1.0, 1.0)
    neg = -u
    prefix = _power_sums(u, r)
    lam_r = lam_u**r

    def total(at):  # Σ_i h(.) at centred thresholds ``at`` (B, M); entries before ``sat`` saturate
        if magnitude:
            theta = at + sk
            sat = search_rows(neg, -lam * jnp.maximum(theta, 0) ** (1.0 / r) - at, "right")
            scale = lam_r * theta
        else:
            sat, scale = search_rows(neg, -at - 1.0, "right"), jnp.ones_like(at)
        above = jnp.maximum(search_rows(neg, -at, "left"), sat)
        window = _window_power(prefix, sat, above, at, r)
        return sat.astype(at.dtype) + window / jnp.where(scale > 0, scale, 1.0)

    sat_knots = (_saturation_knot(u + sk, lam_u, r) - sk) if magnitude else u - 1.0
    kf = k if isinstance(k, int) else k.astype(s.dtype)  # a traced k: the count in the scores' dtype
    slack = 1e-9 * kf if s.dtype == jnp.float64 else 1e-5 * kf
    # both breakpoint sets in one evaluation: one program for the searches and windows, not two
    at_u, at_sat = jnp.split(total(jnp.concatenate([u, sat_knots], -1)), 2, axis=-1)
    n_above = jnp.sum(at_u < kf - slack, -1, keepdims=True)
    n_sat = jnp.minimum(jnp.sum(at_sat <= kf + slack, -1, keepdims=True), n_above)
    deficit = kf - n_sat.astype(s.dtype)
    window_prefix = _window_sums(prefix, n_sat, n_above)
    count = (n_above - n_sat).astype(s.dtype)
    safe = jnp.maximum(count, 1)
    at = window_root(
        window_prefix, count, safe, deficit, sk, lam_u, r, magnitude, nonnegative=_nonnegative, cubic_root=_cubic_root
    )
    if s.dtype != jnp.float64:  # float32 moments cancel: Newton on the candidates themselves
        at = _polish(u, at, kf, lam_u, r, magnitude, sk)
    solved = (count > 0) & (deficit > 0)
    # otherwise the sum is flat at k: any threshold between the groups is exact (their middle); and
    # when the k largest saturate before the (k+1)-th starts, the mask is the hard k-hot one
    if magnitude:
        nxt, last = take_rows(s, jnp.minimum(n_sat, big - 1)), take_rows(s, jnp.clip(n_sat - 1, 0, big - 1))
        flat = jnp.where(n_sat < big, 0.5 * (nxt + jnp.maximum(_saturation_knot(last, lam, r), nxt)), s[:, -1:])
        following = _column(s, k)
        return jnp.where(lower >= following, 0.5 * (lower + following), jnp.where(solved, at + sk, flat))
    # the mask's threshold as (s_k, a = (t - s_k)/λ), all in units of λ: the mask is then
    # clip((x - s_k)/λ - a, 0, 1)^r, exact where t itself would round to s_k (ties with a tiny λ)
    limit = float(jnp.finfo(s.dtype).max) ** 0.5
    v = jnp.clip((s - sk) / lam, -limit, limit)
    nxt, last = take_rows(v, jnp.minimum(n_sat, big - 1)), take_rows(v, jnp.clip(n_sat - 1, 0, big - 1))
    flat = jnp.where(n_sat < big, 0.5 * (nxt + jnp.maximum(last - 1.0, nxt)), v[:, -1:] - 1.0)
    following = _column(v, k)
    if s.dtype != jnp.float64:  # within the float32 slack, a segment can pass for flat when it is not
        # (a saturation knot where the sum exceeds k by less than the slack): keep the closer threshold
        solved = solved | (_mask_residual(v, at, kf, r) < _mask_residual(v, flat, kf, r))
    hard = jnp.maximum(0.5 * (following - 1.0), -2.0)  # exact in [following, -1]; finite in x's dtype
    return sk, jnp.where(following <= -1.0, hard, jnp.where(solved, at, flat))


def _mask_residual(v, at, k, r):
    """``|Σ clip(v - at, 0, 1)^r - k|`` over the candidates ``v`` (units of λ, centred on ``s_k``)."""
    return jnp.abs(jnp.sum(jnp.clip(v - at, 0, 1) ** r, -1, keepdims=True) - k)


def _polish(u, at, k, lam, r, magnitude, sk):
    """Three Newton steps on ``Σ h(u - at) = k`` over the candidates (float32 without x64), as a
    loop: one step to trace and lower."""

    def step(_, at):
        if magnitude:
            theta = jnp.maximum(at + sk, 1e-30)
            scale = lam * theta ** (1.0 / r)
            z = (u - at) / scale
            inside = (z > 0) & (z < 1)
            value = jnp.sum(jnp.where(z >= 1, 1.0, jnp.clip(z, 0, 1) ** r), -1, keepdims=True)
            slope = jnp.sum(
                jnp.where(inside, r * z ** (r - 1) * (1 + z * scale / (r * theta)) / scale, 0), -1, keepdims=True
            )
        else:
            z = (u - at) / lam
            inside = (z > 0) & (z < 1)
            value = jnp.sum(jnp.clip(z, 0, 1) ** r, -1, keepdims=True)
            slope = jnp.sum(jnp.where(inside, r * z ** (r - 1), 0), -1, keepdims=True) / lam
        return at + jnp.where(slope > 0, (value - k) / jnp.where(slope > 0, slope, 1.0), 0.0)

    return lax.fori_loop(0, 3, step, at)


def sorted_desc(scores, size):
    """The ``size`` largest entries per row, descending. Behind an optimisation barrier: XLA (CPU)
    rewrites a sliced ``top_k`` into a full sort, far slower for long rows."""
    n = scores.shape[-1]
    return lax.optimization_barrier(lax.top_k(scores, size)[0] if size < n else -jnp.sort(-scores, axis=-1))


def _solve(vals, k, lam, r, magnitude):
    """:func:`_solve_sorted`; in float32, the magnitude in units of the top of its bracket,
    ``c = s_k + λ s_k^{1/r}`` (``θ(c s, c^{1-1/r} λ) = c θ(s, λ)``), so that the clamped candidates
    and the cubic's coefficients stay of size at most 1 at any scale (in units of ``s_k`` alone, a
    ``λ`` far above ``s_k^{1 - 1/r}`` put the bracket's top, cubed, past float32's range)."""
    if not magnitude or vals.dtype == jnp.float64:  # float64: the torch kernel's arithmetic
        return _solve_sorted(vals, k, lam, r, magnitude)
    sk = _column(vals, k - 1)
    top = sk + lam * jnp.maximum(sk, 0) ** (1.0 / r)
    c = jnp.where((top > 0) & jnp.isfinite(top), top, 1.0)
    # correctly rounded: XLA's vals * (1/c) flushes 1/c to 0 for c above 1/tiny (8.5e37)
    theta = c * _solve_sorted(_divide(vals, c), k, lam * c ** (1.0 / r - 1.0), r, True)
    # a λ so large that λ³ leaves float32: θ underflows to its limit 0 (every entry kept)
    return jnp.where(jnp.isfinite(theta), theta, 0.0)


def threshold(scores, k, lam, r, magnitude, size):
    """The exact threshold per row of ``scores`` (B, n) (``|x|`` for the magnitude) in the wide
    dtype, as :func:`_solve_sorted` returns it, solved on the ``size`` largest scores
    (:func:`candidates`; all of them when the threshold lies below the last)."""
    n = scores.shape[-1]
    wide = wide_dtype()
    lam = lam.astype(wide)
    vals = sorted_desc(scores, size).astype(wide)
    found = _solve(vals, k, lam, r, magnitude)
    if size == n:
        return found
    t = found if magnitude else found[0] + found[1] * lam
    fits = jnp.all(vals[:, -1:] <= t)  # every non-candidate lies at or below the threshold

    def full():
        return _solve(sorted_desc(scores, n).astype(wide), k, lam, r, magnitude)

    return lax.cond(fits, lambda: found, full)


def exact_mask(x, lam, k, r, size):
    """The exact mask of rows ``x`` (B, n) with per-row ``lam`` (B, 1) (no derivative rule)."""
    xs, ls = lax.stop_gradient(x), lax.stop_gradient(lam)
    sk, a = (v.astype(x.dtype) for v in threshold(xs, k, ls, r, False, size))
    return jnp.clip(_divide(xs - sk, ls) - a, 0, 1) ** r


def mask_tangent(x, lam, y, dx, dlam, r):
    """``ẏ`` of the exact mask ``y`` at ``(x, lam)`` for tangents ``(dx, dlam)`` (either may be a
    symbolic zero)."""
    inside = (y > 0) & (y < 1)
    d = jnp.where(inside, 1.0 / lam if r == 1 else 3.0 * y ** (2.0 / 3.0) / lam, 0.0)
    total = jnp.sum(d, -1, keepdims=True)
    safe = jnp.where(total > 0, total, 1.0)
    out = jnp.zeros_like(y)
    if not isinstance(dx, SymbolicZero):
        out = d * (dx - jnp.sum(d * dx, -1, keepdims=True) / safe)
    if not isinstance(dlam, SymbolicZero):
        xi = jnp.where(inside, x, 0.0)
        out = out - d * (xi - jnp.sum(d * xi, -1, keepdims=True) / safe) / lam * dlam
    return out


@partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def mask_rows(x, lam, k, r, size):
    """Exact sparse mask of rows ``x`` (B, n), ``lam`` (B, 1), ``k < n`` (an int, or a traced int
    scalar), ``r`` in {1, 3}, ``size = candidates(n, k)``."""
    return exact_mask(x, lam, k, r, size)


@partial(mask_rows.defjvp, symbolic_zeros=True)
def _mask_jvp(r, size, primals, tangents):
    x, lam, k = primals
    y = exact_mask(x, lam, k, r, size)
    dx, dlam, _ = tangents
    return y, mask_tangent(x, lam, y, dx, dlam, r)


def _mag_parts(x, lam, k, r, size):
    s = jnp.abs(x)
    theta = threshold(lax.stop_gradient(s), k, jnp.full((x.shape[0], 1), lam), r, True, size).astype(x.dtype)
    positive = theta > 0
    scale = lam * jnp.maximum(theta, 0) ** (1.0 / r)
    z = jnp.where(positive, _divide(s - theta, jnp.where(positive, scale, 1.0)), jnp.inf)
    kept = theta * jnp.clip(z, 0, 1) ** r + jnp.maximum(s - theta, 0)
    return jnp.sign(x) * jnp.where(z >= 1, s, kept), theta, z


def extended_mag(x, k, kernel):
    """``kernel(rows)`` on the extended reals (the torch kernel's rule): rows with ``P >= k``
    infinite magnitudes are ``x ⊙ m``, ``m = k/P`` on the infinite entries and 0 elsewhere, held
    fixed (derivative ``m``); the kernel sees zeros there and is exact on the other rows."""
    infinite = jnp.isinf(x)
    count = jnp.sum(infinite, -1, keepdims=True).astype(x.dtype)
    full = count >= k
    body = kernel(jnp.where(full, 0.0, x))
    return jnp.where(full, x * jnp.where(infinite, k / jnp.maximum(count, 1), 0.0), body)


def mag_rows(x, lam, k, r, size):
    """Exact sparse top-k in magnitude of rows ``x`` (B, n), float ``lam``, ``k < n`` (an int or a
    traced int scalar), ``size = candidates(n, k)``."""
    return extended_mag(x, k, lambda rows: _exact_mag_rows(rows, lam, k, r, size))


@partial(jax.custom_jvp, nondiff_argnums=(3, 4))
def _exact_mag_rows(x, lam, k, r, size):
    return _mag_parts(x, lam, k, r, size)[0]


@_exact_mag_rows.defjvp
def _mag_jvp(r, size, primals, tangents):
    (x, lam, k), (dx, _, _) = primals, tangents
    out, theta, z = _mag_parts(x, lam, k, r, size)
    sign = jnp.sign(x)
    ds = sign * dx
    inside = (z > 0) & (z < 1)
    safe_theta = jnp.where(theta > 0, theta, 1.0)
    scale = lam * safe_theta ** (1.0 / r)
    zc = jnp.where(inside, z, 0.0)
    # e and eb of the torch backward times the scale λ θ^{1/r}: 1/scale is subnormal (0 in XLA)
    # for a scale above 8.5e37, where θ e = (θ/scale) ê is not
    e = jnp.where(inside, 1.0 if r == 1 else r * zc * zc, 0.0)
    eb = jnp.sum(e, -1, keepdims=True) + scale / (r * safe_theta) * jnp.sum(e * zc, -1, keepdims=True)
    weight = (z > 0).astype(x.dtype) + jnp.where(inside, _divide(theta, scale) * e, 0.0)
    shared = jnp.sum(e * ds, -1, keepdims=True) / jnp.where(eb > 0, eb, 1.0)
    return out, sign * (weight * ds - jnp.where(inside, weight, 0.0) * shared)
