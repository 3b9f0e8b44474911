"""Triton kernels of Pool-Adjacent-Violators for the l2 and kl isotonic fits (see
:mod:`softtopk.ops.pav_triton`, which launches them; importing this module imports triton): one
program per row walks the row once, as the numba kernels of :mod:`softtopk.ops.isotonic_kernels`
do on the CPU, with its stack of blocks in scratch rows of the device's memory."""

import triton
import triton.language as tl

from . import triton_steps as steps


@triton.jit
def pav_l2(
    y_ptr,  # (B, n) the rows
    out_ptr,  # (B, n) out: argmin_{v_1 >= ... >= v_n} ½ ||v - y||², in y's dtype
    sums_ptr,  # (B, 1, n) float64 scratch: the blocks' sums
    starts_ptr,  # (B, n) int64 scratch: their first points
    n,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y_row, out_row, sums, starts = y_ptr + row * n, out_ptr + row * n, sums_ptr + row * n, starts_ptr + row * n
    top = steps.pav_l2_walk(y_row, sums, starts, n)
    steps.write_blocks(out_row, sums, starts, top, n, 0, BLOCK)


@triton.jit
def _kl_top(scratch, starts, n, top):
    """The block on top of the stack (read at 0 when there is none): the maxima and sums relative
    to them of ``exp(y)`` and ``exp(lw)`` over it, its value and its first point."""
    below = tl.maximum(top, 0)
    ymax, ysum = tl.load(scratch + below), tl.load(scratch + n + below)
    lmax, lsum = tl.load(scratch + 2 * n + below), tl.load(scratch + 3 * n + below)
    return ymax, ysum, lmax, lsum, tl.load(scratch + 4 * n + below), tl.load(starts + below)


@triton.jit
def _log_add(m, s, m2, s2):
    """``log(s e^m + s2 e^m2)`` as a maximum and a sum relative to it."""
    top = tl.maximum(m, m2)
    return top, s * tl.exp(m - top) + s2 * tl.exp(m2 - top)


@triton.jit
def pav_kl(
    y_ptr,  # (B, n) the rows
    lw_ptr,  # (B, n) the log weights
    out_ptr,  # (B, n) out: argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(lw), v>, in y's dtype
    scratch_ptr,  # (B, 5, n) float64 scratch: the blocks' maxima and relative sums of exp(y) and exp(lw), values
    starts_ptr,  # (B, n) int64 scratch: their first points
    n,
    BLOCK: tl.constexpr,
):
    """PAV for the kl fit, a block's value ``logsumexp(y_B) - logsumexp(lw_B)`` (a point alone:
    ``y_i - lw_i``, in float64), as the numba kernel's log-sum-exp blocks."""
    row = tl.program_id(0).to(tl.int64)
    y_row, lw_row, out_row = y_ptr + row * n, lw_ptr + row * n, out_ptr + row * n
    scratch, starts = scratch_ptr + row * 5 * n, starts_ptr + row * n
    top = tl.full([], -1, tl.int32)
    for i in range(0, n):
        ym, lm = tl.load(y_row + i).to(tl.float64), tl.load(lw_row + i).to(tl.float64)
        ys, ls, start, value = (
            tl.full([], 1.0, tl.float64),
            tl.full([], 1.0, tl.float64),
            tl.zeros([], tl.int64) + i,
            ym - lm,
        )
        tym, tys, tlm, tls, tvalue, tstart = _kl_top(scratch, starts, n, top)
        merging = (top >= 0) & (tvalue <= value)
        while merging:  # pool the block below while its value is at most the new one's
            ym, ys = _log_add(ym, ys, tym, tys)
            lm, ls = _log_add(lm, ls, tlm, tls)
            start, top = tstart, top - 1
            value = (ym + tl.log(ys)) - (lm + tl.log(ls))
            tym, tys, tlm, tls, tvalue, tstart = _kl_top(scratch, starts, n, top)
            merging = (top >= 0) & (tvalue <= value)
        top += 1
        tl.store(scratch + top, ym)
        tl.store(scratch + n + top, ys)
        tl.store(scratch + 2 * n + top, lm)
        tl.store(scratch + 3 * n + top, ls)
        tl.store(scratch + 4 * n + top, value)
        tl.store(starts + top, start)
        tl.debug_barrier()  # stored by some threads, read by all at the next point
    steps.write_blocks(out_row, scratch + 4 * n, starts, top, n, 1, BLOCK)
