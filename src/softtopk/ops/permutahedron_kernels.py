"""Triton kernels of the l2 soft rank and soft sort (see :mod:`softtopk.ops.permutahedron_triton`,
which launches them; importing this module imports triton): one program per row holds the sorted
row in its lanes, forward and backward, and the forward runs PAV's stack walk between its vector
steps (the formulas: :mod:`softtopk.ops.permutahedron`)."""

import triton
import triton.language as tl

from . import triton_steps as steps


@triton.jit
def _segment_add(a, a_start, b, b_start):
    """Running sums that restart at each block's first point (``start``)."""
    return tl.where(b_start, b, a + b), a_start | b_start


@triton.jit
def _least(a, b):
    return tl.minimum(a, b)


@triton.jit
def _largest(a, b):
    return tl.maximum(a, b)


@triton.jit
def project_rows(
    sorted_ptr,  # (B, n) the rows sorted by torch.sort: decreasing for sign 1, increasing for -1
    perm_ptr,  # (B, n) int64: the sorted entries' positions in their row
    out_ptr,  # (B, n) out, x's dtype: the ranks at the entries' positions (RANK), or the sort
    v_ptr,  # (B, n) float64 out: the isotonic fit (its blocks: runs of equal values; ±inf apart)
    r_ptr,  # (B, n) float64 out: the sorted ranks (RANK), or s = sign * sorted (NaN read as 0)
    theta_ptr,  # (B, n) float64 out (RANK): θ, the relative s/ε (±inf kept)
    nan_ptr,  # (B,) bool out: the rows holding a NaN
    sums_ptr,  # (B, n) float64 scratch: PAV's blocks' sums
    starts_ptr,  # (B, n) int64 scratch: their first points
    n,
    eps: tl.float64,
    sign: tl.float64,
    RANK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``s = sign * sorted`` (decreasing), ``w = (n, ..., 1)``. Rank: ``θ`` as
    ``permutahedron._relative``, the fit ``v`` of ``θ - w`` over the finite entries, ``r = w - (v -
    (θ - w))``, the ``p`` entries at ``+inf`` sharing the top ``p`` ranks and the ``q`` at ``-inf``
    the bottom ``q``. Sort: the fit ``v`` of ``w/ε - s`` over the finite entries, ``h = sign (s -
    (v - (w/ε - s)))``, ``±inf`` entries kept. A row holding a NaN is NaN."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    inside = i < n
    first = row * n
    raw = tl.load(sorted_ptr + first + i, mask=inside, other=0.0).to(tl.float64) * sign
    nan = tl.max((raw != raw).to(tl.int32), 0) > 0
    s = tl.where(raw != raw, 0.0, raw)
    finite = (tl.abs(s) < float("inf")) & inside
    p = tl.sum(((s == float("inf")) & inside).to(tl.int32), 0)
    q = tl.sum(((s == float("-inf")) & inside).to(tl.int32), 0)
    w = (n - i).to(tl.float64)
    if RANK:
        bound = 2.0 * n + 2.0  # n may come as a constexpr 1 (Triton specialises it); 2n + 2 is exact in float32
        before = tl.load(sorted_ptr + first + i - 1, mask=inside & (i > 0), other=0.0).to(tl.float64) * sign
        step = (s - tl.where(before != before, 0.0, before)) / eps
        step = tl.where(step != step, -bound, tl.maximum(step, -bound))  # inf - inf, and overflows
        theta = tl.cumsum(tl.where(i > 0, step, 0.0), 0)
        theta = tl.where(finite, theta, s)
        base = theta - w
    else:
        base = w / eps - s
    tl.store(v_ptr + first + i, base, mask=inside)
    tl.debug_barrier()  # stored by some threads, read one by one below
    fit, sums, starts = v_ptr + first + p, sums_ptr + first, starts_ptr + first  # the finite entries' fit, in place
    top = steps.pav_l2_walk(fit, sums, starts, n - p - q)
    steps.write_blocks(fit, sums, starts, top, n - p - q, 0, BLOCK)
    tl.debug_barrier()
    v = tl.load(v_ptr + first + i, mask=inside, other=0.0)
    if RANK:
        shared = tl.where(s > 0, n - (p - 1).to(tl.float64) / 2.0, (q + 1).to(tl.float64) / 2.0)
        value = tl.where(finite, w - (v - base), shared)
        tl.store(r_ptr + first + i, value, mask=inside)
        tl.store(theta_ptr + first + i, theta, mask=inside)
        perm = tl.load(perm_ptr + first + i, mask=inside, other=0)
        out = tl.where(nan, float("nan"), value).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + first + perm, out, mask=inside)
    else:
        value = tl.where(finite, s - (v - base), s) * sign
        tl.store(r_ptr + first + i, s, mask=inside)
        tl.store(out_ptr + first + i, tl.where(nan, float("nan"), value).to(out_ptr.dtype.element_ty), mask=inside)
    # the infinite entries' own values: never one run with a finite fit
    tl.store(v_ptr + first + i, tl.where(finite, v, tl.where(s > 0, float("inf"), float("-inf"))), mask=inside)
    tl.store(nan_ptr + row, nan)


@triton.jit
def project_grad(
    grad_ptr,  # (B, n) the outputs' gradient: at the entries' positions (RANK) or sorted (sort)
    perm_ptr,  # (B, n) int64: the sorted entries' positions
    v_ptr,  # (B, n) float64: the fit
    finite_ptr,  # (B, n) float64: θ (RANK) or s, infinite where the entry is
    nan_ptr,  # (B,) bool: the rows holding a NaN
    out_ptr,  # (B, n) out: the rows' gradient at the entries' positions, x's dtype
    runs_ptr,  # (B, n) float64 scratch: the gradient's running sums within each block
    n,
    scale: tl.float64,
    RANK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """With ``g`` the gradient in sorted order and ``mean_B`` over each block of the fit: rank
    ``(g - mean_B g) sign/ε``, sort ``mean_B g``; 0 at infinite entries, NaN in a NaN row."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    inside = i < n
    first = row * n
    perm = tl.load(perm_ptr + first + i, mask=inside, other=0)
    at = perm if RANK else i
    g = tl.load(grad_ptr + first + at, mask=inside, other=0.0).to(tl.float64)
    finite = tl.abs(tl.load(finite_ptr + first + i, mask=inside, other=0.0)) < float("inf")
    g = tl.where(finite, g, 0.0)
    v = tl.load(v_ptr + first + i, mask=inside, other=0.0)
    starts = (i == 0) | (v != tl.load(v_ptr + first + i - 1, mask=inside & (i > 0), other=0.0)) | ~inside
    ends = (i == n - 1) | (v != tl.load(v_ptr + first + i + 1, mask=i + 1 < n, other=0.0)) | ~inside
    runs, _ = tl.associative_scan((g, starts), 0, _segment_add)
    tl.store(runs_ptr + first + i, runs, mask=inside)
    tl.debug_barrier()  # each point reads its block's total below, stored by another thread
    last = tl.associative_scan(tl.where(ends, i, BLOCK), 0, _least, reverse=True)
    start = tl.associative_scan(tl.where(starts, i, 0), 0, _largest)
    mean = tl.load(runs_ptr + first + last, mask=inside, other=0.0) / (last - start + 1).to(tl.float64)
    d = (g - mean) * scale if RANK else mean
    d = tl.where(finite, d, 0.0)
    d = tl.where(tl.load(nan_ptr + row), float("nan"), d)
    tl.store(out_ptr + first + perm, d.to(out_ptr.dtype.element_ty), mask=inside)
