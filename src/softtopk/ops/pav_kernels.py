"""Triton kernel of Pool-Adjacent-Violators for the l2 isotonic fit (see
:mod:`softtopk.ops.pav_triton`, which launches it; importing this module imports triton): one
program per row walks the row once, as the numba kernel of :mod:`softtopk.ops.isotonic_kernels`
does on the CPU, with its stack of blocks in a scratch row of the device's memory."""

import triton
import triton.language as tl


@triton.jit
def _violates(sums, counts, top, total, count):
    """Whether the block on top of the stack (at ``top``; none below 0) has a mean at most the
    new block's ``total / count``, and that block's sum and count (read at 0 when there is none)."""
    below = tl.maximum(top, 0)
    s, c = tl.load(sums + below), tl.load(counts + below)
    return (top >= 0) & (s * count.to(tl.float64) <= total * c.to(tl.float64)), s, c


@triton.jit
def pav_l2(
    y_ptr,  # (B, n) the rows
    out_ptr,  # (B, n) out: argmin_{v_1 >= ... >= v_n} ½ ||v - y||², in y's dtype
    sums_ptr,  # (B, n) float64 scratch: the blocks' sums
    counts_ptr,  # (B, n) int64 scratch: their sizes
    n,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y_row, out_row, sums, counts = y_ptr + row * n, out_ptr + row * n, sums_ptr + row * n, counts_ptr + row * n
    top = tl.full([], -1, tl.int32)
    for i in range(0, n):
        total, count = tl.load(y_row + i).to(tl.float64), tl.full([], 1, tl.int64)
        merging, s, c = _violates(sums, counts, top, total, count)
        while merging:  # pool the block below while its mean is at most the new one's
            total, count, top = total + s, count + c, top - 1
            merging, s, c = _violates(sums, counts, top, total, count)
        top += 1
        tl.store(sums + top, total)
        tl.store(counts + top, count)
        tl.debug_barrier()  # stored by some threads, read by all at the next point
    lanes, start = tl.arange(0, BLOCK), tl.full([], 0, tl.int64)
    for t in range(0, top + 1):  # each block's mean over its points
        c = tl.load(counts + t)
        value = (tl.load(sums + t) / c.to(tl.float64)).to(out_ptr.dtype.element_ty)
        for first in range(start, start + c, BLOCK):
            offs = first + lanes
            tl.store(out_row + offs, tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty) + value, mask=offs < start + c)
        start += c
