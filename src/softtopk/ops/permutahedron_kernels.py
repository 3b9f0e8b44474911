"""Triton kernels of the soft rank and soft sort, l2 and kl (see :mod:`softtopk.ops.permutahedron_triton`,
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
    r_ptr,  # (B, n) float64 out: the sorted ranks (RANK), or s = sign * sorted (NaN read as 0); KL's log weights first
    theta_ptr,  # (B, n) float64 out (RANK): θ, the relative s/ε (±inf kept)
    nan_ptr,  # (B,) bool out: the rows holding a NaN
    sums_ptr,  # (B, n) float64 scratch: PAV's blocks' sums; (B, 5, n) for KL (pav_kl_walk's planes)
    starts_ptr,  # (B, n) int64 scratch: their first points
    n,
    eps: tl.float64,
    sign: tl.float64,
    RANK: tl.constexpr,
    KL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """``s = sign * sorted`` (decreasing), ``w = (n, ..., 1)``, the fits over the finite entries.
    Rank: ``θ`` as ``permutahedron._relative``; l2: the fit ``v`` of ``θ - w``, ``r = w - (v - (θ -
    w))``; kl: the kl fit ``v`` of ``(θ, log w)``, ``r = exp((θ - log w) - v) w``; the ``p`` entries
    at ``+inf`` share the top ``p`` ranks and the ``q`` at ``-inf`` the bottom ``q``. Sort: l2 the
    fit ``v`` of ``w/ε - s``, kl the kl fit of ``(w/ε, s)``; ``h = sign (s - (v - (w/ε - s)))``,
    ``±inf`` entries kept. A row holding a NaN is NaN."""
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
        lw = tl.log(w) if KL else w  # the kl fit's log weights (l2: its shift)
        y = theta
    else:
        lw = s
        y = w / eps
    base = y - lw  # a point's value alone in its block, as the walk computes it
    tl.store(v_ptr + first + i, y if KL else base, mask=inside)
    if KL:
        tl.store(r_ptr + first + i, lw, mask=inside)
    tl.debug_barrier()  # stored by some threads, read one by one below
    fit, starts, m = v_ptr + first + p, starts_ptr + first, n - p - q  # the finite entries' fit, in place
    if KL:
        scratch = sums_ptr + row * 5 * n
        top = steps.pav_kl_walk(fit, r_ptr + first + p, scratch, starts, m, n)
        steps.write_blocks(fit, scratch + 4 * n, starts, top, m, 1, BLOCK)
    else:
        top = steps.pav_l2_walk(fit, sums_ptr + first, starts, m)
        steps.write_blocks(fit, sums_ptr + first, starts, top, m, 0, BLOCK)
    tl.debug_barrier()
    v = tl.load(v_ptr + first + i, mask=inside, other=0.0)
    if RANK:
        shared = tl.where(s > 0, n - (p - 1).to(tl.float64) / 2.0, (q + 1).to(tl.float64) / 2.0)
        value = tl.where(finite, tl.exp(base - v) * w if KL else w - (v - base), shared)
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
def _block_totals(x, starts, last, runs, i, inside):
    """Each point's (``i``) block total of ``x`` (blocks from ``starts``; ``last``: each point's
    block's last point), through the scratch row ``runs``."""
    running, _ = tl.associative_scan((x, starts), 0, _segment_add)
    tl.store(runs + i, running, mask=inside)
    tl.debug_barrier()  # each point reads its block's total, stored by another thread
    return tl.load(runs + last, mask=inside, other=0.0)


@triton.jit
def project_grad(
    grad_ptr,  # (B, n) the outputs' gradient: at the entries' positions (RANK) or sorted (sort)
    perm_ptr,  # (B, n) int64: the sorted entries' positions
    v_ptr,  # (B, n) float64: the fit
    finite_ptr,  # (B, n) float64: θ (RANK) or s, infinite where the entry is
    r_ptr,  # (B, n) float64 (RANK and KL): the sorted ranks
    nan_ptr,  # (B,) bool: the rows holding a NaN
    out_ptr,  # (B, n) out: the rows' gradient at the entries' positions, x's dtype
    runs_ptr,  # (B, n) float64 scratch: running sums within each block; (B, 2, n) for KL (the sort's two)
    n,
    scale: tl.float64,
    RANK: tl.constexpr,
    KL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """With ``g`` the gradient in sorted order and ``mean_B``, ``sum_B`` over each block of the fit:
    l2 rank ``(g - mean_B g) sign/ε``, l2 sort ``mean_B g``; kl rank ``(g r - r sum_B(g r) / sum_B
    w) sign/ε``, kl sort ``softmax_B(s) sum_B g``; 0 at infinite entries, NaN in a NaN row."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    inside = i < n
    first = row * n
    runs = runs_ptr + row * (2 if KL else 1) * n
    perm = tl.load(perm_ptr + first + i, mask=inside, other=0)
    at = perm if RANK else i
    g = tl.load(grad_ptr + first + at, mask=inside, other=0.0).to(tl.float64)
    kept = tl.load(finite_ptr + first + i, mask=inside, other=0.0)
    finite = tl.abs(kept) < float("inf")
    g = tl.where(finite, g, 0.0)
    v = tl.load(v_ptr + first + i, mask=inside, other=0.0)
    starts = (i == 0) | (v != tl.load(v_ptr + first + i - 1, mask=inside & (i > 0), other=0.0)) | ~inside
    ends = (i == n - 1) | (v != tl.load(v_ptr + first + i + 1, mask=i + 1 < n, other=0.0)) | ~inside
    last = tl.associative_scan(tl.where(ends, i, BLOCK), 0, _least, reverse=True)
    start = tl.associative_scan(tl.where(starts, i, 0), 0, _largest)
    if KL:
        if RANK:
            r = tl.load(r_ptr + first + i, mask=inside, other=0.0)
            gr = g * r
            size = (last - start + 1).to(tl.float64)
            weights = size * (n - start).to(tl.float64) - size * (size - 1.0) / 2.0  # sum_B w, w = n - i
            d = (gr - r * _block_totals(gr, starts, last, runs, i, inside) / weights) * scale
        else:
            e = tl.where(finite, tl.exp(kept - tl.load(finite_ptr + first + start, mask=inside, other=0.0)), 0.0)
            d = (
                e
                / _block_totals(e, starts, last, runs, i, inside)
                * _block_totals(g, starts, last, runs + n, i, inside)
            )
    else:
        mean = _block_totals(g, starts, last, runs, i, inside) / (last - start + 1).to(tl.float64)
        d = (g - mean) * scale if RANK else mean
    d = tl.where(finite, d, 0.0)
    d = tl.where(tl.load(nan_ptr + row), float("nan"), d)
    tl.store(out_ptr + first + perm, d.to(out_ptr.dtype.element_ty), mask=inside)
