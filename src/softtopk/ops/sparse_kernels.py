"""Triton kernel of the sparse mask's forward (see :mod:`softtopk.ops.sparse_triton`, which
launches it; importing this module imports triton). The backward is the Laplace mask's
``mask_backward``: both are ``d ⊙ (g - Σ d g / Σ d)``."""

import triton
import triton.language as tl


@triton.jit
def _tile_sums(v, a, R: tl.constexpr):
    """Per lane, ``clip(v - a, 0, 1)^R`` and ``R (v - a)^{R-1}`` inside ``(0, 1)`` (float64)."""
    z = v - a
    inside = (z > 0) & (z < 1)
    zc = tl.where(inside, z, 0.0)
    if R == 1:
        return tl.where(z >= 1, 1.0, zc), tl.where(inside, 1.0, 0.0).to(tl.float64)  # both branches float64
    return tl.where(z >= 1, 1.0, zc * zc * zc), 3.0 * zc * zc


@triton.jit
def _sums(cand_ptr, row, n, kept, sk, lam, a, R: tl.constexpr, BLOCK: tl.constexpr):
    """``F(a) = Σ clip(v - a, 0, 1)^R`` and ``D(a) = Σ_{0 < v - a < 1} R (v - a)^{R-1}`` over the
    row's ``kept`` candidates, ``v = (x - s_k)/λ`` (float64; ``-F'(a) = D``)."""
    total = tl.zeros([BLOCK], dtype=tl.float64)
    slope = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, kept, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        y = tl.load(cand_ptr + row * n + offs, mask=offs < kept, other=-float("inf")).to(tl.float64)
        f, df = _tile_sums((y - sk) / lam, a, R)
        total += f
        slope += df
    return tl.sum(total, 0), tl.sum(slope, 0)


@triton.jit
def mask_forward(
    x_ptr,
    vals_ptr,
    cand_ptr,  # scratch (B, n): each row's candidates, packed at its start
    mask_ptr,
    d_ptr,
    n,
    k,
    lam: tl.float64,  # a Python float would be passed as float32
    R: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_STEPS: tl.constexpr,
    ONE_TILE: tl.constexpr,  # n <= BLOCK
):
    row = tl.program_id(0).to(tl.int64)
    # s_k and the (k+1)-th largest from the top-k values; rows whose k largest saturate before the
    # (k+1)-th starts are the hard k-hot mask, any a in [gap, -1] exact: the midpoint (at most 2 away)
    sk = tl.load(vals_ptr + row * (k + 1) + k - 1).to(tl.float64)
    gap = (tl.load(vals_ptr + row * (k + 1) + k).to(tl.float64) - sk) / lam
    # one pass: the row's +inf, -inf and NaN counts (softtopk._extended's degenerate rows), and its
    # candidates packed into the scratch row, the entries with v > -1 (the others are 0 for every
    # a >= -1 the steps below try, so the steps pass over the candidates only)
    plus = tl.zeros([BLOCK], dtype=tl.int32)
    minus = tl.zeros([BLOCK], dtype=tl.int32)
    nans = tl.zeros([BLOCK], dtype=tl.int32)
    kept = tl.sum(plus, 0)  # the candidates packed so far: an int32 scalar 0
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inrow = offs < n
        y = tl.load(x_ptr + row * n + offs, mask=inrow, other=0.0)
        plus += (y == float("inf")).to(tl.int32)
        minus += (y == -float("inf")).to(tl.int32)
        nans += (y != y).to(tl.int32)
        if not ONE_TILE:  # a row held in one tile keeps its scores in registers instead
            keep = inrow & ((y.to(tl.float64) - sk) / lam > -1.0)
            slot = kept + tl.cumsum(keep.to(tl.int32), 0) - 1
            tl.store(cand_ptr + row * n + slot, y, mask=keep)
            kept += tl.sum(keep.to(tl.int32), 0)
    if ONE_TILE:  # v = (x - s_k)/λ of the whole row, -inf past its end: 0 in every sum
        lanes = tl.arange(0, BLOCK)
        v = (tl.load(x_ptr + row * n + lanes, mask=lanes < n, other=-float("inf")).to(tl.float64) - sk) / lam
    p = tl.sum(plus, 0)
    q = tl.sum(minus, 0)
    bad = tl.sum(nans, 0) > 0
    full = p >= k
    short = (n - q <= k) & (p < k)
    degenerate = bad | full | short
    hard = gap <= -1.0
    zero = tl.sum(tl.zeros([BLOCK], dtype=tl.float64), 0)  # float64 scalars start here (a constant is float32)
    a = tl.where(hard, tl.maximum(0.5 * (gap - 1.0), -2.0), zero - 0.5)
    # Σ clip(v - a, 0, 1)^R = k on a in [-1, 0) (F(-1) >= k > F(0)): Newton's steps, kept inside the
    # bracket and replaced by bisection where they leave it or do not halve the step before
    # (Numerical Recipes' rtsafe), until a step under 1e-15 (in units of λ) or F = k exactly
    kf = zero + k  # (an int argument may be a specialised constant)
    lo = zero - 1.0
    hi = zero
    step = zero + 1.0
    steps = p * 0
    go = ~(degenerate | hard)
    while go:
        if ONE_TILE:
            f, slope = _tile_sums(v, a, R)
            f, slope = tl.sum(f, 0), tl.sum(slope, 0)
        else:
            f, slope = _sums(cand_ptr, row, n, kept, sk, lam, a, R, BLOCK)
        excess = f - kf
        above = excess >= 0
        lo = tl.where(above, a, lo)
        hi = tl.where(above, hi, a)
        newton = a + excess / tl.where(slope > 0, slope, 1.0)
        keep = (slope > 0) & (newton > lo) & (newton < hi) & (tl.abs(2.0 * excess) <= tl.abs(step * slope))
        nxt = tl.where(keep, newton, 0.5 * (lo + hi))
        nxt = tl.where(excess == 0, a, nxt)
        step = nxt - a
        a = nxt
        steps += 1
        go = (tl.abs(step) > 1e-15) & (steps < MAX_STEPS)
    share = (kf - n + q) / tl.maximum(q, 1).to(tl.float64)
    part = kf / tl.maximum(p, 1).to(tl.float64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inrow = offs < n
        y = tl.load(x_ptr + row * n + offs, mask=inrow, other=0.0).to(tl.float64)
        z = (y - sk) / lam - a
        inside = (z > 0) & (z < 1)
        zc = tl.where(inside, z, 0.0)
        if R == 1:
            m = tl.where(z >= 1, 1.0, zc)
            d = tl.where(inside, zc * 0.0 + 1.0, 0.0) / lam  # 1.0 / lam is float32 in Triton's interpreter
        else:
            m = tl.where(z >= 1, 1.0, zc * zc * zc)
            d = 3.0 * zc * zc / lam
        m = tl.where(full, tl.where(y == float("inf"), part, 0.0), m)
        m = tl.where(short, tl.where(y == -float("inf"), share, 1.0), m)
        m = tl.where(bad, float("nan"), m)
        d = tl.where(degenerate, 0.0, d)
        if mask_ptr.dtype.element_ty != tl.float64:  # to half precision through float32
            m = m.to(tl.float32)
        tl.store(mask_ptr + row * n + offs, m.to(mask_ptr.dtype.element_ty), mask=inrow)
        tl.store(d_ptr + row * n + offs, d.to(d_ptr.dtype.element_ty), mask=inrow)
