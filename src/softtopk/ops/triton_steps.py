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
