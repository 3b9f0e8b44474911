"""The Triton kernel behind :mod:`softtopk.ops.label_select` on CUDA (imported only from there, at
the first selection on a GPU: this module imports triton). One program holds a row of ``C``
scores in registers and takes its ``m - 1`` largest scores other than the label's one at a time,
in ``topk``'s order (NaN first, then by value, ties by place), then writes them and the label's
in ascending order: the numba kernel's selection (:mod:`softtopk.ops.label_select_kernels`), in
one launch where the torch path dispatches about fifteen ops."""

import triton
import triton.language as tl

from . import triton_steps as steps


@triton.jit
def label_select(
    x_ptr,  # (R, C) scores
    label_ptr,  # (R,) int64 labels in [0, C)
    scores_ptr,  # (R, M) out: the selected scores, ascending, the label last among scores equal to it
    index_ptr,  # (R, M) out: their classes
    position_ptr,  # (R,) out: the label's slot, the number of others <= its score
    masked_ptr,  # (R,) out: whether the label's score is -inf (it enters as 0)
    classes,
    cap: tl.float64,  # a +inf score's finite stand-in
    M: tl.constexpr,
    MP: tl.constexpr,  # a power of 2 above M - 1
    W: tl.constexpr,  # a power of 2 at least C
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, W)
    x = tl.load(x_ptr + row * classes + offs, mask=offs < classes, other=0.0)
    y = tl.load(label_ptr + row)
    s = tl.load(x_ptr + row * classes + y)
    nan = x != x
    left = (offs < classes) & (offs != y)  # the others not yet taken
    slots = tl.arange(0, MP)
    val = tl.zeros([MP], dtype=x.dtype)
    idx = tl.zeros([MP], dtype=tl.int64)
    for i in range(M - 1):
        top, pick = steps.next_largest(x, nan, left)
        val = tl.where(slots == i, top, val)
        idx = tl.where(slots == i, pick, idx)
        left = left & (offs != pick)
    masked = s == float("-inf")
    s = tl.where(masked, 0.0, s).to(x.dtype)
    taken = slots < M - 1
    below = tl.sum((taken & (val <= s)).to(tl.int64), 0)
    at = tl.where(s == s, below, M - 1)  # a NaN label goes last, after the NaN others
    rising = M - 2 - slots  # val[i]'s slot among the others, ascending
    out = row * M + rising + (rising >= at)
    tl.store(scores_ptr + out, tl.where(val > cap, cap, val), mask=taken)
    tl.store(index_ptr + out, idx, mask=taken)
    tl.store(scores_ptr + row * M + at, tl.where(s > cap, cap, s))
    tl.store(index_ptr + row * M + at, y)
    tl.store(position_ptr + row, below)
    tl.store(masked_ptr + row, masked)
