"""Steps that several Triton kernel modules share (imported only by them: this module imports
triton). Its functions are ``triton.jit`` helpers, called inside kernels, never launched."""

import triton
import triton.language as tl


@triton.jit
def in_dtype(value, like):
    """A float64 argument in ``like``'s dtype, as torch rounds a Python scalar against a tensor (a
    compile-time branch: float64 rows keep it as it is)."""
    if like.dtype != tl.float64:
        value = tl.cast(value, like.dtype)
    return value


@triton.jit
def next_largest(v, nan, left):
    """Along axis 0 of ``v``: the largest entry still ``left``, in ``topk``'s order (the first NaN
    left, else the first largest; where only ``-inf`` is left, the first one left), as ``(value,
    index)``; ``nan`` marks the NaN entries of ``v``."""
    nan_left = (left & nan).to(tl.int32)
    value = tl.where(left & ~nan, v, float("-inf"))
    top = tl.max(value, 0)
    has_nan = tl.max(nan_left, 0) > 0
    first = tl.argmax(left.to(tl.int32), 0, tie_break_left=True)
    pick = tl.where(top == float("-inf"), first, tl.argmax(value, 0, tie_break_left=True))
    pick = tl.where(has_nan, tl.argmax(nan_left, 0, tie_break_left=True), pick)
    return tl.where(has_nan, float("nan"), top), pick


@triton.jit
def row_grad(grad_ptr, weight_ptr, row, inside, SCALAR: tl.constexpr):
    """The gradient that reaches a loss's row(s) ``row`` (``inside`` the rows): its entry of the
    rows' gradient ``grad`` (R,), or with ``SCALAR`` the reduced loss's gradient ``grad`` () times
    the weight the reduction gave each kept row (:mod:`softtopk.ops.reduce_kernels`)."""
    return tl.load(grad_ptr) * tl.load(weight_ptr) if SCALAR else tl.load(grad_ptr + row, mask=inside, other=0.0)


@triton.jit
def _pav_violates(sums, counts, top, total, count):
    """Whether the l2 block on top of PAV's stack (at ``top``; none below 0) has a mean at most the
    new block's ``total / count``, and that block's sum and count (read at 0 when there is none)."""
    below = tl.maximum(top, 0)
    s, c = tl.load(sums + below), tl.load(counts + below)
    return (top >= 0) & (s * count.to(tl.float64) <= total * c.to(tl.float64)), s, c


@triton.jit
def pav_l2_walk(y, sums, counts, n):
    """Pool-Adjacent-Violators' pass over the ``n`` points at ``y`` for the decreasing l2 fit
    (:mod:`softtopk.ops.pav_kernels`, :mod:`softtopk.ops.permutahedron_kernels`): each point is
    pushed as a block and pooled with the blocks below while their mean is at most its own, the
    stack's sums (float64) and sizes (int64) in ``sums`` and ``counts``; returns the index of the
    top block (-1 for none), for :func:`write_blocks`."""
    top = tl.full([], -1, tl.int32)
    for i in range(0, n):
        total, count = tl.load(y + i).to(tl.float64), tl.full([], 1, tl.int64)
        merging, s, c = _pav_violates(sums, counts, top, total, count)
        while merging:
            total, count, top = total + s, count + c, top - 1
            merging, s, c = _pav_violates(sums, counts, top, total, count)
        top += 1
        tl.store(sums + top, total)
        tl.store(counts + top, count)
        tl.debug_barrier()  # stored by some threads, read by all at the next point
    return top


@triton.jit
def write_blocks(out_row, values, counts, top, VALUES: tl.constexpr, BLOCK: tl.constexpr):
    """Writes each block of PAV's stack (``0..top``) over its points: its value (``VALUES``) or
    its sum over its size (the mean)."""
    lanes, start = tl.arange(0, BLOCK), tl.full([], 0, tl.int64)
    for t in range(0, top + 1):
        c = tl.load(counts + t)
        if VALUES:
            value = tl.load(values + t).to(out_row.dtype.element_ty)
        else:
            value = (tl.load(values + t) / c.to(tl.float64)).to(out_row.dtype.element_ty)
        for first in range(start, start + c, BLOCK):
            offs = first + lanes
            tl.store(out_row + offs, tl.zeros([BLOCK], dtype=out_row.dtype.element_ty) + value, mask=offs < start + c)
        start += c
