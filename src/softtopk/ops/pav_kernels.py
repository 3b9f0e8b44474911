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
    top = steps.pav_kl_walk(y_row, lw_row, scratch, starts, n, n)
    steps.write_blocks(out_row, scratch + 4 * n, starts, top, n, 1, BLOCK)
