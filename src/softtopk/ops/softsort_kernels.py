"""Triton kernels of the SoftSort mask (see :mod:`softtopk.ops.softsort_triton`, which launches
them; importing this module imports triton), in the rows' dtype (float32 or float64), as the torch
path of :mod:`softtopk.ops.softsort` computes, in tiles of ``RB`` ranks by ``BLOCK`` entries.

Two layouts. Row kernels (``mask_forward``, ``mask_backward``): one program per row passes over
it. Tiled kernels, for long rows and many ranks: the rank sums (each rank's normaliser ``Z_r``,
then ``ḡ_r``) by programs of ``RB`` ranks over one chunk of ``CHUNK`` entries, written as partial
sums that the launcher adds; the entries' sums (the mask, then the gradient) by programs of
``BLOCK`` entries over every rank, the backward's sums over the entries (``Σ_i w_ri``, the ranks'
own gradient) written per block, added and scattered by the launcher."""

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
def _ranks(top_ptr, z_ptr, row, k, rk):
    """The ranks ``rk``'s values ``t_r`` and normalisers ``Z_r`` (0 and 1 past ``k``)."""
    t = tl.load(top_ptr + row * (k + 1) + rk, mask=rk < k, other=0.0)
    return t, tl.load(z_ptr + row * k + rk, mask=rk < k, other=1.0)


@triton.jit
def _mask_tile(xs_ptr, top_ptr, z_ptr, mask_ptr, row, n, k, offs, tau, low, RB: tl.constexpr, BLOCK: tl.constexpr):
    """Writes the mask ``Σ_r P_ri`` of the entries ``offs``, 1 on the entries above ``-inf`` of a
    row with at most ``k`` of them."""
    dt = xs_ptr.dtype.element_ty
    ranks = tl.arange(0, RB)
    short = tl.load(top_ptr + row * (k + 1) + k) == low
    xv = tl.load(xs_ptr + row * n + offs, mask=offs < n, other=0.0)
    m = tl.zeros([BLOCK], dtype=dt)
    for r0 in range(0, k, RB):
        rk = r0 + ranks
        t, z = _ranks(top_ptr, z_ptr, row, k, rk)
        m += tl.sum(tl.where((rk < k)[:, None], _weights(xv, t, z, tau), 0.0), 0)
    m = tl.where(short, tl.where(xv > low, 1.0, m), m)  # (a scalar & a block fails in the interpreter)
    tl.store(mask_ptr + row * n + offs, m, mask=offs < n)


@triton.jit
def _w(xv, g, t, z, mean, tau, inv, valid):
    """``w = P (g - ḡ_r) sign(x_i - t_r) / τ`` of a tile, 0 off the ``valid`` (RB, BLOCK) ones."""
    diff = xv[None, :] - t[:, None]
    slope = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
    w = _weights(xv, t, z, tau) * (g[None, :] - mean[:, None]) * slope * inv
    return tl.where(valid, w, 0.0)


@triton.jit
def _rank_sums(
    xs_ptr, g_ptr, row, n, lo, hi, t, z, tau, short, low, GRAD: tl.constexpr, RB: tl.constexpr, BLOCK: tl.constexpr
):
    """Sums over the entries ``lo <= i < hi`` of the terms ``exp(-|x_i - t_r|/τ)`` (``Z_r``'s share)
    or, ``GRAD``, of ``P_ri g_i`` (``ḡ_r``'s, ``g`` 0 on the entries a short row selects): (RB,)."""
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros([RB], dtype=xs_ptr.dtype.element_ty)
    for start in range(lo, hi, BLOCK):
        offs = start + lanes
        if GRAD:
            xv, g = _entries(xs_ptr, g_ptr, row, n, offs, short, low)
            term = _weights(xv, t, z, tau) * g[None, :]
        else:
            xv = tl.load(xs_ptr + row * n + offs, mask=offs < n, other=0.0)
            term = _terms(xv, t, tau)
        acc += tl.sum(tl.where((offs < hi)[None, :], term, 0.0), 1)
    return acc


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
        z = _rank_sums(xs_ptr, xs_ptr, row, n, 0, n, t, t, tau_c, False, low_c, False, RB, BLOCK)
        tl.store(z_ptr + row * k + rk, z, mask=rk < k)
    tl.debug_barrier()  # the normalisers, written by some threads, are read by all
    for start in range(0, n, BLOCK):
        _mask_tile(xs_ptr, top_ptr, z_ptr, mask_ptr, row, n, k, start + lanes, tau_c, low_c, RB, BLOCK)


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
        t, z = _ranks(top_ptr, z_ptr, row, k, rk)
        # ḡ_r = Σ_i P_ri g_i, with g 0 on the entries a short row selects
        mean = _rank_sums(xs_ptr, g_ptr, row, n, 0, n, t, z, tau_c, short, low_c, True, RB, BLOCK)
        # w = P (g - ḡ_r) sign(x_i - t_r) / τ: -Σ_r w on each entry, Σ_i w on the entry of t_r
        col = tl.zeros([RB], dtype=dt)
        for start in range(0, n, BLOCK):
            offs = start + lanes
            xv, g = _entries(xs_ptr, g_ptr, row, n, offs, short, low_c)
            w = _w(xv, g, t, z, mean, tau_c, inv, (rk < k)[:, None] & (offs < n)[None, :])
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


@triton.jit
def rank_parts(
    xs_ptr,
    top_ptr,
    z_ptr,  # (B, k) the normalisers (GRAD; unread otherwise)
    g_ptr,  # (B, n) the mask's gradient (GRAD; unread otherwise)
    part_ptr,  # (B, chunks, k) out: each chunk's share of Z_r, or (GRAD) of ḡ_r
    n,
    k,
    tau: tl.float64,
    low: tl.float64,
    GRAD: tl.constexpr,
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Programs (rows, rank blocks, chunks): ``RB`` ranks' sums over ``CHUNK`` entries."""
    row, chunk, chunks = tl.program_id(0).to(tl.int64), tl.program_id(2), tl.num_programs(2)
    dt = xs_ptr.dtype.element_ty
    tau_c, low_c = _as(tau, dt), _as(low, dt)
    rk = tl.program_id(1) * RB + tl.arange(0, RB)
    t, z = _ranks(top_ptr, z_ptr, row, k, rk)
    short = tl.load(top_ptr + row * (k + 1) + k) == low_c
    lo = chunk * CHUNK
    sums = _rank_sums(xs_ptr, g_ptr, row, n, lo, tl.minimum(n, lo + CHUNK), t, z, tau_c, short, low_c, GRAD, RB, BLOCK)
    tl.store(part_ptr + (row * chunks + chunk) * k + rk, sums, mask=rk < k)


@triton.jit
def mask_entries(
    xs_ptr, top_ptr, z_ptr, mask_ptr, n, k, tau: tl.float64, low: tl.float64, RB: tl.constexpr, BLOCK: tl.constexpr
):
    """Programs (rows, blocks): the mask of ``BLOCK`` entries, from the normalisers."""
    dt = xs_ptr.dtype.element_ty
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _mask_tile(
        xs_ptr,
        top_ptr,
        z_ptr,
        mask_ptr,
        tl.program_id(0).to(tl.int64),
        n,
        k,
        offs,
        _as(tau, dt),
        _as(low, dt),
        RB,
        BLOCK,
    )


@triton.jit
def grad_entries(
    xs_ptr,
    top_ptr,
    z_ptr,
    mean_ptr,  # (B, k) ḡ_r
    g_ptr,
    gx_ptr,  # (B, n) out: -Σ_r w_ri
    col_ptr,  # (B, blocks, k) out: each block's share of Σ_i w_ri (the gradient of t_r)
    n,
    k,
    tau: tl.float64,
    low: tl.float64,
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Programs (rows, blocks): the gradient of ``BLOCK`` entries over every rank."""
    row, block, blocks = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(1)
    dt = xs_ptr.dtype.element_ty
    tau_c, low_c = _as(tau, dt), _as(low, dt)
    inv = _as(1.0 / tau, dt)  # the torch path scales by 1/τ, computed in float64
    offs, ranks = block * BLOCK + tl.arange(0, BLOCK), tl.arange(0, RB)
    short = tl.load(top_ptr + row * (k + 1) + k) == low_c
    xv, g = _entries(xs_ptr, g_ptr, row, n, offs, short, low_c)
    acc = tl.zeros([BLOCK], dtype=dt)
    for r0 in range(0, k, RB):
        rk = r0 + ranks
        t, z = _ranks(top_ptr, z_ptr, row, k, rk)
        mean = tl.load(mean_ptr + row * k + rk, mask=rk < k, other=0.0)
        w = _w(xv, g, t, z, mean, tau_c, inv, (rk < k)[:, None] & (offs < n)[None, :])
        acc -= tl.sum(w, 0)
        tl.store(col_ptr + (row * blocks + block) * k + rk, tl.sum(w, 1), mask=rk < k)
    tl.store(gx_ptr + row * n + offs, acc, mask=offs < n)
