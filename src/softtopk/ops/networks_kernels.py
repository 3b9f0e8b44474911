"""Triton kernels of the networks' label and mask sweeps (see :mod:`softtopk.ops.networks_triton`,
which launches them; importing this module imports triton). A program holds ``ROWS`` rows of ``W`` wires
(a power of 2 at least the row length ``n``; the spare wires idle) in registers and runs every
layer of the network on them: one launch forward, one backward."""

import triton
import triton.language as tl

# a rational approximation of atan on [0, 0.66] in the form of Cephes' atan (S. L. Moshier), after
# the reductions atan t = π/4 + atan((t - 1)/(t + 1)) and π/2 - atan(1/t): within an ulp of float64.
# Globals of a kernel are constexpr; a float literal alone would be a float32 constant in Triton.
_P0 = tl.constexpr(-8.750608600031904122785e-1)
_P1 = tl.constexpr(-1.615753718733365076637e1)
_P2 = tl.constexpr(-7.500855792314704667340e1)
_P3 = tl.constexpr(-1.228866684490136173410e2)
_P4 = tl.constexpr(-6.485021904942025371773e1)
_Q0 = tl.constexpr(2.485846490142306297962e1)
_Q1 = tl.constexpr(1.650270098316988542046e2)
_Q2 = tl.constexpr(4.328810604912902668951e2)
_Q3 = tl.constexpr(4.853903996359136964868e2)
_Q4 = tl.constexpr(1.945506571482613964425e2)
_TAN_3PI_8 = tl.constexpr(2.41421356237309504880)
_QUARTER_PI = tl.constexpr(0.78539816339744830962)
_HALF_PI_LOW = tl.constexpr(6.123233995736765886130e-17)  # π/2 minus its float64 rounding
_INV_PI = tl.constexpr(0.31830988618379067154)


@triton.jit
def _atan(v):
    """``atan(v)`` in float64 for a float64 ``v`` (Triton's interpreter has no libdevice atan)."""
    t = tl.abs(v)
    big = t > _TAN_3PI_8
    mid = (t > 0.66) & (t <= _TAN_3PI_8)
    quarters = tl.where(big, 2.0, tl.where(mid, 1.0, 0.0)).to(tl.float64)  # the reduction's π/4 multiples
    u = tl.where(big, -1.0 / tl.where(big, t, 1.0), tl.where(mid, (t - 1.0) / (t + 1.0), t))
    z = u * u
    num = (((_P0 * z + _P1) * z + _P2) * z + _P3) * z + _P4
    den = ((((z + _Q0) * z + _Q1) * z + _Q2) * z + _Q3) * z + _Q4
    r = quarters * _QUARTER_PI + (u * (z * num / den) + quarters * (0.5 * _HALF_PI_LOW)) + u
    return tl.where(v < 0, -r, r)


@triton.jit
def _swap(d, sign, far):
    """The Cauchy swap probability ``1/2 + sign atan(d)/π`` of differences ``d`` (in ``d``'s dtype,
    atan in float64); beyond ``F/2`` only an infinity's stand-in differs: the comparison is decided
    (0 or 1), as the torch path's saturates."""
    alpha = (0.5 + sign * (_atan(d.to(tl.float64)) * _INV_PI)).to(d.dtype)
    # (an idle wire is its own partner: d = 0, never decided)
    return tl.where(tl.abs(d) > 0.5 * far, tl.where(sign * d > 0, 1.0, 0.0), alpha).to(d.dtype)


@triton.jit
def _slope(d, sign, far):
    """``∂α/∂d = sign / (π (1 + d²))``, as ``(1/d²) / (1/d² + 1)`` beyond 1 (no overflow); 0 where
    an infinity decided the comparison."""
    size = tl.abs(d)
    short = tl.where(size > 1.0, 1.0 / tl.where(size > 1.0, size, 1.0), size)
    square = short * short
    fraction = tl.where(size > 1.0, square / (square + 1.0), 1.0 / (square + 1.0))
    return tl.where(size > 0.5 * far, 0.0, sign * _INV_PI * fraction).to(d.dtype)


@triton.jit
def _lerp(start, end, w):
    """``torch.lerp(start, end, w)``: exact at ``w`` 0 and 1."""
    return tl.where(w < 0.5, start + w * (end - start), end - (end - start) * (1.0 - w))


@triton.jit
def _stand_in(v, far):
    """``v`` clamped to ``[-F, F]``: ``±inf`` as ``±F``, NaN kept (as ``torch.clamp``)."""
    return tl.minimum(tl.maximum(v, -far, propagate_nan=tl.PropagateNan.ALL), far, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _in_dtype(value, x_ptr):
    """A float64 argument in the rows' dtype, as ``x * steepness`` rounds it (a compile-time branch:
    float64 rows keep it as it is)."""
    if x_ptr.dtype.element_ty != tl.float64:
        value = tl.cast(value, x_ptr.dtype.element_ty)
    return value


@triton.jit
def _tile(rows_total, n, ROWS: tl.constexpr, W: tl.constexpr):
    """This program's rows ``(ROWS, 1)``, the wires ``(1, W)`` and where both are in range."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    wires = tl.arange(0, W)[None, :]
    return rows, wires, (rows < rows_total) & (wires < n)


@triton.jit
def _values(x_ptr, rows, wires, n, inside, beta, far):
    """The wires' values ``β x`` with ``±inf`` as ``±F`` (every comparison with them saturates)."""
    return _stand_in(tl.load(x_ptr + rows * n + wires, mask=inside, other=0.0) * beta, far)


@triton.jit
def _store_input_grad(gx_ptr, x_ptr, rows, wires, n, inside, g, beta, far):
    """The scores' gradient ``β g`` from the wires' ``g``: none for the infinities' stand-ins."""
    z = _values(x_ptr, rows, wires, n, inside, beta, far)
    tl.store(gx_ptr + rows * n + wires, tl.where(tl.abs(z) < far, g, 0.0) * beta, mask=inside)


@triton.jit
def _planes(saved_ptr, entry, depth, plane):
    """Pointers to ``entry`` of layer 0 in each of the three saved ``(L, B, W)`` planes of
    ``saved_ptr``; layer ``l`` is ``l * plane`` further."""
    first = saved_ptr + entry
    return first, first + depth * plane, first + 2 * depth * plane


@triton.jit
def _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS: tl.constexpr, W: tl.constexpr):
    """Layer ``layer``'s partners ``(ROWS, W)`` (a spare wire is its own) and signs ``(1, W)``."""
    inside = wires < n
    partner = tl.load(partner_ptr + layer * n + wires, mask=inside, other=0)
    partner = tl.where(inside, partner, wires).to(tl.int32)
    sign = tl.load(sign_ptr + layer * n + wires, mask=inside, other=0.0)
    return tl.broadcast_to(partner, (ROWS, W)), sign


@triton.jit
def label_forward(
    x_ptr,  # (B, n) scores
    pos_ptr,  # (B,) the label's wire
    partner_ptr,  # (L, n) each layer's partner wires
    sign_ptr,  # (L, n) +1 on a comparator's max wire, -1 on its min wire, 0 idle
    outw_ptr,  # (k,) the wires of ranks 0..k-1
    out_ptr,  # (B, k) where the label lands
    saved_ptr,  # (3, L, B, W) saved: the differences z - z[p], swap probabilities, riding-row differences
    rows_total,
    n,
    k,
    depth,
    plane: tl.int64,  # rows_total * W: one layer's saved entries (int64: L B W may pass 2^31)
    beta: tl.float64,  # a Python float would be passed as float32 (then cast to the rows' dtype)
    far: tl.float64,
    ROWS: tl.constexpr,
    W: tl.constexpr,
    KW: tl.constexpr,
):
    rows, wires, inside = _tile(rows_total, n, ROWS, W)
    beta, far = _in_dtype(beta, x_ptr), _in_dtype(far, x_ptr)
    z = _values(x_ptr, rows, wires, n, inside, beta, far)
    pos = tl.load(pos_ptr + rows, mask=rows < rows_total, other=0)
    r = tl.where(wires == pos, 1.0, 0.0).to(z.dtype)  # the label's one-hot row rides along
    d_ptr, a_ptr, e_ptr = _planes(saved_ptr, rows * W + wires, depth, plane)
    for layer in range(depth):
        partner, sign = _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS, W)
        pulled = tl.gather(z, partner, 1)
        d = z - pulled
        alpha = _swap(d, sign, far)
        pulled_r = tl.gather(r, partner, 1)
        tl.store(d_ptr + layer * plane, d, mask=inside)
        tl.store(a_ptr + layer * plane, alpha, mask=inside)
        tl.store(e_ptr + layer * plane, r - pulled_r, mask=inside)
        z = _lerp(pulled, z, alpha)
        r = _lerp(pulled_r, r, alpha)
    # out[:, j] = r[:, outw[j]]: one term of each sum is the wire's (a where, so a NaN stays in its wire)
    ranks = tl.arange(0, KW)[None, None, :]
    outw = tl.load(outw_ptr + ranks, mask=ranks < k, other=-1)
    picked = tl.sum(tl.where(wires[:, :, None] == outw, r[:, :, None], 0.0), 1)
    ranks2 = tl.arange(0, KW)[None, :]
    tl.store(out_ptr + rows * k + ranks2, picked, mask=(rows < rows_total) & (ranks2 < k))


@triton.jit
def label_backward(
    grad_ptr,  # (B, k) the gradient of the output
    x_ptr,  # (B, n) scores
    partner_ptr,
    sign_ptr,
    outw_ptr,
    saved_ptr,
    gx_ptr,  # (B, n) the gradient of the scores
    rows_total,
    n,
    k,
    depth,
    plane: tl.int64,
    beta: tl.float64,  # a Python float would be passed as float32 (then cast to the rows' dtype)
    far: tl.float64,
    ROWS: tl.constexpr,
    W: tl.constexpr,
    KW: tl.constexpr,
):
    rows, wires, inside = _tile(rows_total, n, ROWS, W)
    beta, far = _in_dtype(beta, x_ptr), _in_dtype(far, x_ptr)
    # the riding row's gradient: the output's at the output wires
    ranks = tl.arange(0, KW)[None, None, :]
    outw = tl.load(outw_ptr + ranks, mask=ranks < k, other=-1)
    given = (rows[:, :, None] < rows_total) & (ranks < k)
    grad = tl.load(grad_ptr + rows[:, :, None] * k + ranks, mask=given, other=0.0)
    g1 = tl.sum(tl.where(wires[:, :, None] == outw, grad, 0.0), 2)
    g0 = tl.zeros_like(g1)
    d_ptr, a_ptr, e_ptr = _planes(saved_ptr, rows * W + wires, depth, plane)
    for step in range(depth):
        layer = depth - 1 - step
        partner, sign = _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS, W)
        d = tl.load(d_ptr + layer * plane, mask=inside, other=0.0)
        alpha = tl.load(a_ptr + layer * plane, mask=inside, other=0.5)
        e = tl.load(e_ptr + layer * plane, mask=inside, other=0.0)
        slope = _slope(d, sign, far)
        grad_d = g0 * (alpha + d * slope) + g1 * (e * slope)
        grad_e = g1 * alpha
        g0 = grad_d + tl.gather(g0 - grad_d, partner, 1)
        g1 = grad_e + tl.gather(g1 - grad_e, partner, 1)
    _store_input_grad(gx_ptr, x_ptr, rows, wires, n, inside, g0, beta, far)


@triton.jit
def mask_forward(
    x_ptr,  # (B, n) scores
    start_ptr,  # (n,) the indicator of the wires of ranks 0..k-1
    partner_ptr,  # (L, n)
    sign_ptr,  # (L, n)
    mask_ptr,  # (B, n) the mask
    saved_ptr,  # (3, L, B, W) saved: the differences, swap probabilities, column entering each layer
    rows_total,
    n,
    depth,
    plane: tl.int64,
    beta: tl.float64,  # a Python float would be passed as float32 (then cast to the rows' dtype)
    far: tl.float64,
    ROWS: tl.constexpr,
    W: tl.constexpr,
):
    rows, wires, inside = _tile(rows_total, n, ROWS, W)
    beta, far = _in_dtype(beta, x_ptr), _in_dtype(far, x_ptr)
    z = _values(x_ptr, rows, wires, n, inside, beta, far)
    d_ptr, a_ptr, c_ptr = _planes(saved_ptr, rows * W + wires, depth, plane)
    for layer in range(depth):  # the value sweep
        partner, sign = _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS, W)
        pulled = tl.gather(z, partner, 1)
        d = z - pulled
        alpha = _swap(d, sign, far)
        tl.store(d_ptr + layer * plane, d, mask=inside)
        tl.store(a_ptr + layer * plane, alpha, mask=inside)
        z = _lerp(pulled, z, alpha)
    # the column of the mask, c_(l-1) = M_l c_l from the output wires back to the inputs
    c = tl.broadcast_to(tl.load(start_ptr + wires, mask=wires < n, other=0.0), (ROWS, W)).to(z.dtype)
    for step in range(depth):
        layer = depth - 1 - step
        partner, _ = _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS, W)
        tl.store(c_ptr + layer * plane, c, mask=inside)
        alpha = tl.load(a_ptr + layer * plane, mask=inside, other=0.5)
        c = _lerp(tl.gather(c, partner, 1), c, alpha)
    tl.store(mask_ptr + rows * n + wires, c, mask=inside)


@triton.jit
def mask_backward(
    grad_ptr,  # (B, n) the gradient of the mask
    x_ptr,
    partner_ptr,
    sign_ptr,
    saved_ptr,
    ag_ptr,  # (L, B, W) scratch: ∂L/∂α of each layer
    gx_ptr,  # (B, n) the gradient of the scores
    rows_total,
    n,
    depth,
    plane: tl.int64,
    beta: tl.float64,  # a Python float would be passed as float32 (then cast to the rows' dtype)
    far: tl.float64,
    ROWS: tl.constexpr,
    W: tl.constexpr,
):
    rows, wires, inside = _tile(rows_total, n, ROWS, W)
    beta, far = _in_dtype(beta, x_ptr), _in_dtype(far, x_ptr)
    saved = rows * W + wires
    d_ptr, a_ptr, c_ptr = _planes(saved_ptr, saved, depth, plane)
    ag_ptr += saved
    # r_0 = ∂L/∂c_0, r_l = M_l r_(l-1); ∂L/∂α_l = r_l (c_l - c_l[p])
    r = tl.load(grad_ptr + rows * n + wires, mask=inside, other=0.0)
    for layer in range(depth):
        partner, _ = _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS, W)
        c = tl.load(c_ptr + layer * plane, mask=inside, other=0.0)
        alpha = tl.load(a_ptr + layer * plane, mask=inside, other=0.5)
        tl.store(ag_ptr + layer * plane, r * (c - tl.gather(c, partner, 1)), mask=inside)
        r = _lerp(tl.gather(r, partner, 1), r, alpha)
    # the value sweep backwards: g_d = ∂L/∂α_l α' + g (α + d α'), g_(l-1) = g_d + (g - g_d)[p]
    g = tl.zeros_like(r)
    for step in range(depth):
        layer = depth - 1 - step
        partner, sign = _layer(partner_ptr, sign_ptr, layer, n, wires, ROWS, W)
        d = tl.load(d_ptr + layer * plane, mask=inside, other=0.0)
        alpha = tl.load(a_ptr + layer * plane, mask=inside, other=0.5)
        slope = _slope(d, sign, far)
        bias = tl.load(ag_ptr + layer * plane, mask=inside, other=0.0) * slope
        grad_d = bias + g * (alpha + d * slope)
        g = grad_d + tl.gather(g - grad_d, partner, 1)
    _store_input_grad(gx_ptr, x_ptr, rows, wires, n, inside, g, beta, far)
