"""Triton kernels of the noised top-k hinge losses (see :mod:`softtopk.ops.noised_triton`, which
launches them; importing this module imports triton). One program holds a row's ``C`` scores and
its ``S`` standard draws, forms ``s + ε Z`` and takes each draw's ``(k+1)``-th largest score by
``k + 1`` maxima in turn (NaN first, as ``kthvalue`` ranks it, then by value), then the hinge of
their mean; backward, the row's gradient in registers. The formulas are the torch path's
(``softtopk.ops.noised_hinge.NoisedHinge``)."""

import triton
import triton.language as tl

from . import triton_steps as steps


@triton.jit
def hinge_forward(
    x_ptr,  # (R, C) scores
    noise_ptr,  # (R, C, S) standard draws, float32
    label_ptr,  # (R,) int64
    margin_ptr,  # the margins: (C,) per class (MARGIN_STRIDE 1) or one value (0)
    kept_ptr,  # (R,) the rows that count: the others have loss 0
    loss_ptr,  # (R,) out
    index_ptr,  # (R, S) out: each draw's (k+1)-th largest class
    classes,
    samples,  # S, the draws' stride
    used,  # the draws taken: S, or 1 for epsilon = 0
    epsilon: tl.float64,
    scale: tl.float64,  # 1 for the balanced loss
    inv: tl.float64,  # 1 / 2^c with 2^c >= S: the mean of the scaled draws cannot overflow
    MARGIN_STRIDE: tl.constexpr,
    KTH: tl.constexpr,  # k + 1
    W: tl.constexpr,  # a power of 2 at least C
    SP: tl.constexpr,  # a power of 2 at least S
):
    row = tl.program_id(0).to(tl.int64)
    cls = tl.arange(0, W)[:, None]
    draw = tl.arange(0, SP)[None, :]
    inside = (cls < classes) & (draw < used)
    x = tl.load(x_ptr + row * classes + cls, mask=cls < classes, other=0.0)
    z = tl.load(noise_ptr + (row * classes + cls) * samples + draw, mask=inside, other=0.0)
    eps = tl.cast(epsilon, tl.float32)  # the draw is scaled in float32, as the torch path's
    v = (z * eps).to(x.dtype) + x
    nan = v != v
    left = inside
    top = tl.zeros([SP], dtype=x.dtype)
    pick = tl.zeros([SP], dtype=tl.int32)
    for _ in range(KTH):
        top, pick = steps.next_largest(v, nan, left)
        left = left & (cls != pick[None, :])
    taken = tl.arange(0, SP) < used
    tl.store(index_ptr + row * used + tl.arange(0, SP), pick.to(tl.int64), mask=taken)
    inv_c = steps.in_dtype(inv, x)
    mean = tl.sum(tl.where(taken, top * inv_c, 0.0), 0) / used
    y = tl.load(label_ptr + row)
    margin = tl.load(margin_ptr + y * MARGIN_STRIDE).to(x.dtype)
    hinge = margin + mean * steps.in_dtype(1.0 / inv, x) - tl.load(x_ptr + row * classes + y)
    loss = tl.maximum(hinge * steps.in_dtype(scale, x), 0.0)
    kept = tl.load(kept_ptr + row) != 0
    tl.store(loss_ptr + row, tl.where(kept, tl.where(hinge != hinge, hinge, loss), 0.0))


@triton.jit
def hinge_backward(
    grad_ptr,  # (R,) the loss's gradient, or (SCALAR) the reduced loss's ()
    weight_ptr,  # () with SCALAR: the weight the reduction gave each kept row (reduce_kernels)
    loss_ptr,  # (R,) the loss
    label_ptr,
    index_ptr,  # (R, S') the draws' classes
    gx_ptr,  # (R, C) out: the scores' gradient
    classes,
    used,
    scale: tl.float64,
    SCALAR: tl.constexpr,
    W: tl.constexpr,
    SP: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cls = tl.arange(0, W)
    draws = tl.arange(0, SP)
    g = steps.row_grad(grad_ptr, weight_ptr, row, row >= 0, SCALAR)  # a row not kept has loss 0: share 0
    share = tl.where(tl.load(loss_ptr + row) > 0, g, 0.0) * steps.in_dtype(scale, g)  # relu's backward, then the scale
    index = tl.load(index_ptr + row * used + draws, mask=draws < used, other=-1)
    counts = tl.sum((cls[:, None] == index[None, :]).to(g.dtype), 1)
    out = counts / used * share
    out = tl.where(cls == tl.load(label_ptr + row), out - share, out)
    tl.store(gx_ptr + row * classes + cls, out, mask=cls < classes)
