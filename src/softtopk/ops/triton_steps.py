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
def _pav_point(y, i, n):
    """Point ``i`` of the ``n`` at ``y`` in float64 (0 past the end)."""
    return tl.load(y + i, mask=i < n, other=0.0).to(tl.float64)


@triton.jit
def _pav_push(value, i, n, top, tsum, tcount, tstart, sums, starts):
    """One step of PAV's l2 walk: point ``i`` (``value``; none from ``n`` on) pushed on the stack
    whose top block (``top``; none below 0) has sum ``tsum``, size ``tcount`` (float64) and first
    point ``tstart``, and pooled with the blocks below while their mean is at most its own.
    Returns the new top and its block."""
    valid = i < n
    total, count, start = value, tl.full([], 1.0, tl.float64), tl.zeros([], tl.int64) + i
    merging, read = valid & (top >= 0) & (tsum * count <= total * tcount), tl.full([], 0, tl.int1)
    while merging:
        total, count, start, top = total + tsum, count + tcount, tstart, top - 1
        if top >= 0:
            tl.debug_barrier()  # the stack below was stored by another thread
            tsum, tstart = tl.load(sums + top), tl.load(starts + top)
            tcount, read = (start - tstart).to(tl.float64), tl.full([], 1, tl.int1)
        merging = (top >= 0) & (tsum * count <= total * tcount)
    if read & (top < 0):
        tl.debug_barrier()  # every thread has read the bottom block before it is written over
    top = tl.where(valid, top + 1, top)
    tl.store(sums + top, total, mask=valid)
    tl.store(starts + top, start, mask=valid)
    return top, tl.where(valid, total, tsum), tl.where(valid, count, tcount), tl.where(valid, start, tstart)


@triton.jit
def pav_l2_walk(y, sums, starts, n):
    """Pool-Adjacent-Violators' pass over the ``n`` points at ``y`` for the decreasing l2 fit
    (:mod:`softtopk.ops.pav_kernels`, :mod:`softtopk.ops.permutahedron_kernels`): each point is
    pushed as a block and pooled with the blocks below while their mean is at most its own; the
    stack's sums (float64) and first points (int64) go to ``sums`` and ``starts``. Returns the index
    of the top block (-1 for none), for :func:`write_blocks`.

    The walk is sequential, so its speed is the latency of each step. The top block is also held
    in registers (a point that pools with it reads nothing); the points come eight at a time, read
    while the eight before are walked; the stack is read back (after a barrier: another thread may
    have stored it) only where a pool reaches below the top. The program's warps run the walk apart
    between barriers, each storing the same stack in the same order; a block that every thread
    reads after a barrier is written over only after another one."""
    top = tl.full([], -1, tl.int32)
    tsum, tcount, tstart = tl.full([], 0.0, tl.float64), tl.full([], 0.0, tl.float64), tl.full([], 0, tl.int64)
    p0, p1, p2, p3 = _pav_point(y, 0, n), _pav_point(y, 1, n), _pav_point(y, 2, n), _pav_point(y, 3, n)
    p4, p5, p6, p7 = _pav_point(y, 4, n), _pav_point(y, 5, n), _pav_point(y, 6, n), _pav_point(y, 7, n)
    for i in range(0, n, 8):
        q0, q1, q2, q3 = (
            _pav_point(y, i + 8, n),
            _pav_point(y, i + 9, n),
            _pav_point(y, i + 10, n),
            _pav_point(y, i + 11, n),
        )
        q4, q5, q6, q7 = (
            _pav_point(y, i + 12, n),
            _pav_point(y, i + 13, n),
            _pav_point(y, i + 14, n),
            _pav_point(y, i + 15, n),
        )
        top, tsum, tcount, tstart = _pav_push(p0, i, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p1, i + 1, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p2, i + 2, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p3, i + 3, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p4, i + 4, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p5, i + 5, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p6, i + 6, n, top, tsum, tcount, tstart, sums, starts)
        top, tsum, tcount, tstart = _pav_push(p7, i + 7, n, top, tsum, tcount, tstart, sums, starts)
        p0, p1, p2, p3, p4, p5, p6, p7 = q0, q1, q2, q3, q4, q5, q6, q7
    return top


@triton.jit
def _kl_top(scratch, starts, stride, top):
    """The kl block on top of the stack (read at 0 when there is none): the maxima and sums relative
    to them of ``exp(y)`` and ``exp(lw)`` over it, its value and its first point (planes ``stride``
    apart in ``scratch``)."""
    below = tl.maximum(top, 0)
    ymax, ysum = tl.load(scratch + below), tl.load(scratch + stride + below)
    lmax, lsum = tl.load(scratch + 2 * stride + below), tl.load(scratch + 3 * stride + below)
    return ymax, ysum, lmax, lsum, tl.load(scratch + 4 * stride + below), tl.load(starts + below)


@triton.jit
def _log_add(m, s, m2, s2):
    """``log(s e^m + s2 e^m2)`` as a maximum and a sum relative to it."""
    top = tl.maximum(m, m2)
    return top, s * tl.exp(m - top) + s2 * tl.exp(m2 - top)


@triton.jit
def pav_kl_walk(y, lw, scratch, starts, n, stride):
    """Pool-Adjacent-Violators' pass over the ``n`` points at ``y`` (log weights at ``lw``) for the
    decreasing kl fit, a block's value ``logsumexp(y_B) - logsumexp(lw_B)`` (a point alone: ``y_i -
    lw_i``, in float64), as the numba kernel's log-sum-exp blocks: each point is pushed and pooled
    with the blocks below while their value is at most its own. The stack's maxima and relative
    sums of ``exp(y)`` and ``exp(lw)`` and its values go to five planes ``stride`` apart in
    ``scratch`` (the values, for :func:`write_blocks`, in the fifth), its first points to
    ``starts``; returns the index of the top block (-1 for none). The program's threads meet at a
    barrier after every point, so they walk in step."""
    top = tl.full([], -1, tl.int32)
    for i in range(0, n):
        ym, lm = tl.load(y + i).to(tl.float64), tl.load(lw + i).to(tl.float64)
        ys, ls, start, value = (
            tl.full([], 1.0, tl.float64),
            tl.full([], 1.0, tl.float64),
            tl.zeros([], tl.int64) + i,
            ym - lm,
        )
        tym, tys, tlm, tls, tvalue, tstart = _kl_top(scratch, starts, stride, top)
        merging = (top >= 0) & (tvalue <= value)
        while merging:  # pool the block below while its value is at most the new one's
            ym, ys = _log_add(ym, ys, tym, tys)
            lm, ls = _log_add(lm, ls, tlm, tls)
            start, top = tstart, top - 1
            value = (ym + tl.log(ys)) - (lm + tl.log(ls))
            tym, tys, tlm, tls, tvalue, tstart = _kl_top(scratch, starts, stride, top)
            merging = (top >= 0) & (tvalue <= value)
        top += 1
        tl.store(scratch + top, ym)
        tl.store(scratch + stride + top, ys)
        tl.store(scratch + 2 * stride + top, lm)
        tl.store(scratch + 3 * stride + top, ls)
        tl.store(scratch + 4 * stride + top, value)
        tl.store(starts + top, start)
        tl.debug_barrier()  # stored by some threads, read by all at the next point
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
