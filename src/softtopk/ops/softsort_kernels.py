"""Triton kernels of the SoftSort mask (see :mod:`softtopk.ops.softsort_triton`, which launches
them; importing this module imports triton). One program per row passes over the row in tiles of
``BLOCK`` entries against ``RB`` ranks at a time, in the rows' dtype (float32 or float64), as the
torch path of :mod:`softtopk.ops.softsort` computes."""

import triton
import triton.language as tl


@triton.jit
def _as(value, dt):
    """A float64 argument in ``dt``: through a float64 zero, as both compiled Triton (a float64
    scalar) and its interpreter (a Python float) hold it, then one rounding."""
    return (tl.sum(tl.zeros([2], dtype=tl.float64), 0) + value).to(dt)


@triton.jit
def _terms(xv, t, tau):
    """``exp(-|x_i - t_r| / τ)`` for ranks ``t`` (RB,) and entries ``xv`` (BLOCK,): (RB, BLOCK)."""
    return tl.exp(-tl.abs(xv[None, :] - t[:, None]) / tau)


@triton.jit
def _weights(xv, t, z, tau):
    """The terms over their rank's normaliser ``Z_r`` (RB,): the softmax weights ``P``."""
    return _terms(xv, t, tau) / z[:, None]


@triton.jit
def mask_forward(
    xs_ptr,  # (B, n) the rows, ±inf as the dtype's largest finite magnitude
    top_ptr,  # (B, k + 1) their k + 1 largest values, sorted
    z_ptr,  # (B, k) out: each rank's normaliser
    mask_ptr,  # (B, n) out
    n,
    k,
    tau: tl.float64,  # a Python float would be passed as float32
    low: tl.float64,  # the dtype's lowest finite value (-inf's stand-in)
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dt = xs_ptr.dtype.element_ty
    tau_c, low_c = _as(tau, dt), _as(low, dt)
    lanes, ranks = tl.arange(0, BLOCK), tl.arange(0, RB)
    # Z_r = Σ_i exp(-|x_i - t_r|/τ): t_r is an entry of the row, so the largest term is exp(0) = 1
    # (no maximum to subtract, as the softmax of the torch path finds) and Z_r >= 1
    for r0 in range(0, k, RB):
        rk = r0 + ranks
        t = tl.load(top_ptr + row * (k + 1) + rk, mask=rk < k, other=0.0)
        z = tl.zeros([RB], dtype=dt)
        for start in range(0, n, BLOCK):
            offs = start + lanes
            xv = tl.load(xs_ptr + row * n + offs, mask=offs < n, other=0.0)
            z += tl.sum(tl.where((offs < n)[None, :], _terms(xv, t, tau_c), 0.0), 1)
        tl.store(z_ptr + row * k + rk, z, mask=rk < k)
    tl.debug_barrier()  # the normalisers, written by some threads, are read by all
    # rows with at most k < n entries above -inf select them all
    short = tl.load(top_ptr + row * (k + 1) + k) == low_c
    for start in range(0, n, BLOCK):
        offs = start + lanes
        xv = tl.load(xs_ptr + row * n + offs, mask=offs < n, other=0.0)
        m = tl.zeros([BLOCK], dtype=dt)
        for r0 in range(0, k, RB):
            rk = r0 + ranks
            t = tl.load(top_ptr + row * (k + 1) + rk, mask=rk < k, other=0.0)
            z = tl.load(z_ptr + row * k + rk, mask=rk < k, other=1.0)
            m += tl.sum(tl.where((rk < k)[:, None], _weights(xv, t, z, tau_c), 0.0), 0)
        m = tl.where(short, tl.where(xv > low_c, 1.0, m), m)  # (a scalar & a block fails in the interpreter)
        tl.store(mask_ptr + row * n + offs, m, mask=offs < n)


@triton.jit
def _entries(xs_ptr, g_ptr, row, n, offs, short, low):
    """A tile's scores and mask gradient, the gradient 0 on the entries a short row selects."""
    xv = tl.load(xs_ptr + row * n + offs, mask=offs < n, other=0.0)
    g = tl.load(g_ptr + row * n + offs, mask=offs < n, other=0.0)
    return xv, tl.where(short, tl.where(xv > low, 0.0, g), g)


@triton.jit
def mask_backward(
    xs_ptr,
    top_ptr,
    index_ptr,  # (B, k) the positions of the k largest in their row
    z_ptr,
    g_ptr,  # (B, n) the mask's gradient
    gx_ptr,  # (B, n) out: the rows' gradient
    n,
    k,
    tau: tl.float64,
    low: tl.float64,
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    dt = xs_ptr.dtype.element_ty
    tau_c, low_c = _as(tau, dt), _as(low, dt)
    inv = _as(1.0 / tau, dt)  # the torch path scales by 1/τ, computed in float64
    lanes, ranks = tl.arange(0, BLOCK), tl.arange(0, RB)
    short = tl.load(top_ptr + row * (k + 1) + k) == low_c
    for r0 in range(0, k, RB):
        rk = r0 + ranks
        t = tl.load(top_ptr + row * (k + 1) + rk, mask=rk < k, other=0.0)
        z = tl.load(z_ptr + row * k + rk, mask=rk < k, other=1.0)
        # ḡ_r = Σ_i P_ri g_i, with g 0 on the entries a short row selects
        mean = tl.zeros([RB], dtype=dt)
        for start in range(0, n, BLOCK):
            offs = start + lanes
            xv, g = _entries(xs_ptr, g_ptr, row, n, offs, short, low_c)
            mean += tl.sum(tl.where((offs < n)[None, :], _weights(xv, t, z, tau_c) * g[None, :], 0.0), 1)
        # w = P (g - ḡ_r) sign(x_i - t_r) / τ: -Σ_r w on each entry, Σ_i w on the entry of t_r
        col = tl.zeros([RB], dtype=dt)
        for start in range(0, n, BLOCK):
            offs = start + lanes
            xv, g = _entries(xs_ptr, g_ptr, row, n, offs, short, low_c)
            diff = xv[None, :] - t[:, None]
            slope = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
            w = _weights(xv, t, z, tau_c) * (g[None, :] - mean[:, None]) * slope * inv
            w = tl.where((rk < k)[:, None] & (offs < n)[None, :], w, 0.0)
            col += tl.sum(w, 1)
            part = -tl.sum(w, 0)
            if r0 > 0:  # the earlier rank blocks' share, written by this program
                part += tl.load(gx_ptr + row * n + offs, mask=offs < n, other=0.0)
            tl.store(gx_ptr + row * n + offs, part, mask=offs < n)
        tl.debug_barrier()  # every entry's share is written before the ranks' entries add theirs
        index = tl.load(index_ptr + row * k + rk, mask=rk < k, other=0)
        at = tl.load(gx_ptr + row * n + index, mask=rk < k, other=0.0)
        tl.store(gx_ptr + row * n + index, at + col, mask=rk < k)
        tl.debug_barrier()
