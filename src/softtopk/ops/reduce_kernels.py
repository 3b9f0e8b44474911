"""The Triton kernel of a class loss's reduction (see :mod:`softtopk.ops.reduce_triton`, which
launches it; importing this module imports triton): the sum of the rows' losses, or their mean
over the rows that count, in one program, and the weight each such row has in the result, which
the losses' backward kernels read."""

import triton
import triton.language as tl


@triton.jit
def reduce_rows(
    loss_ptr,  # (R,) the rows' losses (0 at the rows not kept)
    kept_ptr,  # (R,) the rows that count
    out_ptr,  # () out: the sum, or (MEAN) the mean over the kept rows, 0 where none is
    weight_ptr,  # () out: what each kept row's loss is weighted by, 1 or 1 / max(kept, 1)
    rows,
    MEAN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    lanes = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], dtype=loss_ptr.dtype.element_ty)
    count = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, rows, BLOCK):
        row = start + lanes
        total += tl.load(loss_ptr + row, mask=row < rows, other=0.0)
        count += tl.load(kept_ptr + row, mask=row < rows, other=0).to(tl.int64)
    weight = tl.full([], 1.0, loss_ptr.dtype.element_ty)
    if MEAN:
        weight = weight / tl.maximum(tl.sum(count, 0), 1).to(loss_ptr.dtype.element_ty)
    tl.store(out_ptr, tl.sum(total, 0) * weight)
    tl.store(weight_ptr, weight)
