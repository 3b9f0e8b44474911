"""Triton kernels of the Laplace mask (see :mod:`softtopk.ops.lapsum_triton`, which launches
them; importing this module imports triton)."""

import triton
import triton.language as tl


@triton.jit
def _asinh(v):
    """``asinh`` in float64 without overflow of ``v²``."""
    av = tl.abs(v)
    big = av > 1e100
    safe = tl.where(big, 1.0, av)
    small = tl.log(safe + tl.sqrt(safe * safe + 1.0))
    out = tl.where(big, tl.log(2.0 * tl.where(big, av, 1.0)), small)
    return tl.where(v < 0, -out, out)


@triton.jit
def _clamp(y, lo, hi):
    """``y`` clamped to ``[lo, hi]``, NaN kept (``minimum``/``maximum`` would drop it)."""
    return tl.where(y != y, y, tl.minimum(tl.maximum(y, lo), hi))


@triton.jit
def _candidate(vals_ptr, row, j, big, sign, lo, hi, ref, tau, C: tl.constexpr):
    """``a_j`` (clamped scaled candidate, float64) and ``e^{a_j}`` for ``j < big``, 0 elsewhere."""
    inside = (j >= 0) & (j < big)
    y = sign * tl.load(vals_ptr + row * big + j, mask=inside, other=0.0).to(tl.float64)
    y = _clamp(y, lo, hi)
    a = _clamp((y - ref) / tau, -C, C)
    return a, tl.where(inside, tl.exp(a), 0.0), inside


@triton.jit
def mask_forward(
    x_ptr,
    vals_ptr,
    mask_ptr,
    d_ptr,
    n,
    big,
    k,
    tau: tl.float64,  # a Python float would be passed as float32
    lo: tl.float64,
    hi: tl.float64,
    NEGATE: tl.constexpr,
    KB: tl.constexpr,
    BLOCK: tl.constexpr,
    C: tl.constexpr,
    FLOOR: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    sign = -1.0 if NEGATE else 1.0
    j = tl.arange(0, KB)
    raw = sign * tl.load(vals_ptr + row * big + j, mask=j < big, other=0.0).to(tl.float64)
    kth = tl.sum(tl.where(j == k - 1, raw, 0.0), 0)
    after = tl.sum(tl.where(j == k, raw, 0.0), 0)
    short = after == -float("inf")  # at most k entries above -inf
    drop = (kth == float("inf")) | short  # a degenerate row: no gradient in x
    ref = _clamp(kth, lo, hi)
    last = _clamp(tl.sum(tl.where(j == big - 1, raw, 0.0), 0), lo, hi)
    a, e, inside = _candidate(vals_ptr, row, j, big, sign, lo, hi, ref, tau, C)
    a_prev, e_prev, prev_inside = _candidate(vals_ptr, row, j - 1, big, sign, lo, hi, ref, tau, C)
    # the rest of the row, Σ e^{a} over the entries that are not candidates (each candidate's term is 1)
    total = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        y = sign * tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float64)
        total += tl.where(offs < n, tl.exp(tl.minimum((y - last) / tau, 0.0)), 0.0)
    count = tl.maximum(tl.sum(total, 0) - big, 1e-30)
    count = tl.where(short, (n - big) * 1.0, count)
    e_last = tl.sum(tl.where(j == big - 1, e, 0.0), 0)
    rest = tl.where(big == n, FLOOR, count * e_last)  # K = n: no rest, as the torch path
    # P_j = FLOOR + Σ_{i<j} e^{-a_i}, Q_j = Σ_{i>=j} e^{a_i} + rest, for j = 0..K
    p = FLOOR + tl.cumsum(tl.where(prev_inside, 1.0 / tl.where(prev_inside, e_prev, 1.0), 0.0), 0)
    q = tl.cumsum(e, 0, reverse=True) + rest
    g = 1.0 / tl.sqrt(p * q)
    roots = tl.log(q * g) - _asinh((k - j).to(tl.float64) * g)
    segment = tl.sum(tl.where(inside & (roots < a), 1, 0), 0)
    threshold = tl.sum(tl.where(j == segment, roots, 0.0), 0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        inrow = offs < n
        y = sign * tl.load(x_ptr + row * n + offs, mask=inrow, other=0.0).to(tl.float64)
        z = (_clamp(y, lo, hi) - ref) / tau - threshold
        half = 0.5 * tl.exp(-tl.abs(z))
        m = tl.where(z >= 0, 1.0 - half, half)
        if NEGATE:
            m = 1.0 - m
        d = tl.where(drop, 0.0, half / tau)
        tl.store(mask_ptr + row * n + offs, m.to(mask_ptr.dtype.element_ty), mask=inrow)
        tl.store(d_ptr + row * n + offs, d.to(d_ptr.dtype.element_ty), mask=inrow)


@triton.jit
def mask_backward(d_ptr, g_ptr, out_ptr, n, tiny: tl.float64, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    dot = tl.zeros([BLOCK], dtype=tl.float64)
    mass = tl.zeros([BLOCK], dtype=tl.float64)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        d = tl.load(d_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float64)
        g = tl.load(g_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float64)
        dot += d * g
        mass += d
    gbar = tl.sum(dot, 0) / tl.maximum(tl.sum(mass, 0), tiny)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        d = tl.load(d_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float64)
        g = tl.load(g_ptr + row * n + offs, mask=offs < n, other=0.0).to(tl.float64)
        tl.store(out_ptr + row * n + offs, (d * (g - gbar)).to(out_ptr.dtype.element_ty), mask=offs < n)
