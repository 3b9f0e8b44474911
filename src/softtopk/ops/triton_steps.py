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
def _pav_violates(tsum, tstart, top, total, start, end):
    """Whether the l2 block on top of PAV's stack (``top``, none below 0; its sum ``tsum``, its
    points from ``tstart`` up to the new block's ``start``) has a mean at most the new block's
    (``total`` over the points ``start..end - 1``)."""
    new = (end - start).to(tl.float64)
    return (top >= 0) & (tsum * new <= total * (start - tstart).to(tl.float64))


@triton.jit
def pav_l2_walk(y, sums, starts, n):
    """Pool-Adjacent-Violators' pass over the ``n`` points at ``y`` for the decreasing l2 fit
    (:mod:`softtopk.ops.pav_kernels`, :mod:`softtopk.ops.permutahedron_kernels`): each point is
    pushed as a block and pooled with the blocks below while their mean is at most its own; the
    stack's sums (float64) and first points (int64) go to ``sums`` and ``starts``. Returns the index
    of the top block (-1 for none), for :func:`write_blocks`.

    The walk is sequential, so its speed is the latency of each step: the top block is also held
    in registers (a point that pools with it reads nothing), the points are read four ahead, and
    the stack is read back (after a barrier: another thread may have stored it) only where a pool
    reaches below the top. The program's warps run the walk apart between barriers, each storing
    the same stack in the same order; a block that every thread reads after a barrier is written
    over only after another one."""
    top = tl.full([], -1, tl.int32)
    tsum, tstart = tl.full([], 0.0, tl.float64), tl.full([], 0, tl.int64)
    a = tl.load(y + 0, mask=n > 0, other=0.0).to(tl.float64)
    b = tl.load(y + 1, mask=n > 1, other=0.0).to(tl.float64)
    c = tl.load(y + 2, mask=n > 2, other=0.0).to(tl.float64)
    d = tl.load(y + 3, mask=n > 3, other=0.0).to(tl.float64)
    for i in range(0, n):
        total, start = a, tl.zeros([], tl.int64) + i
        end = start + 1
        a, b, c = b, c, d
        d = tl.load(y + i + 4, mask=i + 4 < n, other=0.0).to(tl.float64)
        merging, read = _pav_violates(tsum, tstart, top, total, start, end), tl.full([], 0, tl.int1)
        while merging:
            total, start, top = total + tsum, tstart, top - 1
            if top >= 0:
                tl.debug_barrier()  # the stack below was stored by another thread
                tsum, tstart = tl.load(sums + top), tl.load(starts + top)
                read = tl.full([], 1, tl.int1)
            merging = _pav_violates(tsum, tstart, top, total, start, end)
        if read & (top < 0):
            tl.debug_barrier()  # every thread has read the bottom block before it is written over
        top += 1
        tl.store(sums + top, total)
        tl.store(starts + top, start)
        tsum, tstart = total, start
    return top


@triton.jit
def write_blocks(out_row, values, starts, top, m, VALUES: tl.constexpr, BLOCK: tl.constexpr):
    """Writes each block of PAV's stack (``0..top``, their first points in ``starts``) over its
    points (``0..m - 1``): its value (``VALUES``) or its sum over its size (the mean), ``BLOCK``
    points at a time. The blocks' starts are marked (1) in ``out_row`` first, so that a point's
    block is the running count of the marks up to it: three vector passes, none per block."""
    lanes = tl.arange(0, BLOCK)
    zero = tl.zeros([BLOCK], dtype=out_row.dtype.element_ty)
    tl.debug_barrier()  # the walk's stack is stored, and its points (out_row may hold them) read
    for first in range(0, m, BLOCK):
        tl.store(out_row + first + lanes, zero, mask=first + lanes < m)
    tl.debug_barrier()  # the zeros before the marks
    for first in range(0, top + 1, BLOCK):
        t = first + lanes
        at = tl.load(starts + t, mask=t <= top, other=0)
        tl.store(out_row + at, zero + 1, mask=t <= top)
    tl.debug_barrier()
    carry = tl.full([], -1, tl.int32)
    for first in range(0, m, BLOCK):
        offs = first + lanes
        inside = offs < m
        marks = tl.load(out_row + offs, mask=inside, other=0.0).to(tl.int32)
        block = tl.minimum(tl.maximum(tl.cumsum(marks, 0) + carry, 0), top)
        carry += tl.sum(marks, 0)
        if VALUES:
            value = tl.load(values + block, mask=inside, other=0.0)
        else:
            begin = tl.load(starts + block, mask=inside, other=0)
            end = tl.load(starts + block + 1, mask=inside & (block < top), other=m)
            value = tl.load(values + block, mask=inside, other=0.0) / (end - begin).to(tl.float64)
        tl.store(out_row + offs, value.to(out_row.dtype.element_ty), mask=inside)
