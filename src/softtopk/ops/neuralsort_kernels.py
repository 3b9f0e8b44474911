"""Triton kernels of the NeuralSort mask (see :mod:`softtopk.ops.neuralsort_triton`, which launches
them; importing this module imports triton). One program per row holds the sorted row in ``W``
lanes (``n`` rounded up to a power of 2) and computes, in float64, what the torch path of
:mod:`softtopk.ops.neuralsort` computes with a sort, prefix sums, ``searchsorted`` and a softmax
per rank; each kernel reads and writes the row's own order through the sort's permutation."""

import triton
import triton.language as tl


@triton.jit
def _count_below(row_ptr, n, q, STEPS: tl.constexpr, RIGHT: tl.constexpr):
    """Per lane, the entries of the sorted row ``< q`` (``<= q`` with ``RIGHT``): ``searchsorted``
    by ``STEPS`` bisections (``2^STEPS > n``)."""
    lo = tl.zeros(q.shape, tl.int32)
    hi = lo + n
    for _ in range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(row_ptr + mid, mask=active, other=0.0).to(tl.float64)
        go = v <= q if RIGHT else v < q
        lo = tl.where(active & go, mid + 1, lo)
        hi = tl.where(active, tl.where(go, hi, mid), hi)
    return lo


@triton.jit
def _prefix(values, count):
    """``Σ_{j < count_i} values_j`` per lane (``values`` in lane order)."""
    total = tl.cumsum(values, 0)
    return tl.where(count > 0, tl.gather(total, tl.maximum(count - 1, 0), 0), 0.0)


@triton.jit
def _row(s_ptr, row, n, k, big, STEPS: tl.constexpr, W: tl.constexpr):
    """The sorted row ``s`` (float64) and what every rank's logits share: ``C_i - ℓ_i s'_i``
    (``s'`` the row with ``+inf`` as ``M`` and ``-inf`` as ``-M/2``), ``s'``, ``ℓ``, the lanes in
    the row, and whether at most ``k`` entries are above ``-inf``."""
    lanes = tl.arange(0, W)
    inside = lanes < n
    s = tl.load(s_ptr + row * n + lanes, mask=inside, other=0.0).to(tl.float64)
    infinite = (s == float("inf")) | (s == float("-inf"))
    far = tl.where(s == float("inf"), big, tl.where(s == float("-inf"), -0.5 * big, s))
    below = _count_below(s_ptr + row * n, n, far, STEPS, False)
    base = _prefix(tl.where(infinite | (lanes >= n), 0.0, s), below) - below.to(tl.float64) * far
    short = tl.load(s_ptr + row * n + (n - 1 - k)).to(tl.float64) == float("-inf")
    return s, base, far, below, inside, short


@triton.jit
def _exp(d, WIDE: tl.constexpr):
    """``exp(d)`` (float64) of logits ``d <= 0`` from their maximum: in float64 for float64 scores,
    else in float32. The logits and the subtraction, where the cancellation is, stay float64;
    float32 scores need no more than float32's precision of each weight, and a float64 ``exp`` is
    a long instruction sequence on a GPU (a float32 one, one instruction)."""
    if WIDE:
        return tl.exp(d)
    return tl.exp(d.to(tl.float32)).to(tl.float64)


@triton.jit
def _ranks(base, far, inside, rank, n, tau, WIDE: tl.constexpr):
    """Column ``rank`` of ``P`` over the sorted row, ``softmax_i(2 (base_i + (ρ + 1/2) s'_i)/τ)``
    with ``ρ = n - 1 - rank``, from the rank's maximum (for float64 scores subtracted before
    dividing by τ, as the torch path does: no exponent range to spare)."""
    shift = (n - rank).to(tl.float64) - 0.5
    logits = tl.where(inside, base + shift * far, float("-inf"))
    if WIDE:
        logits = (logits - tl.max(logits, 0)) * (2.0 / tau)
    else:
        logits = logits * (2.0 / tau)
        logits = logits - tl.max(logits, 0)
    e = _exp(logits, WIDE)
    return e / tl.sum(e, 0), shift


@triton.jit
def mask_forward(
    s_ptr,  # (B, n) the rows sorted ascending
    order_ptr,  # (B, n) the sort's permutation
    mask_ptr,  # (B, n) the mask, in the row's order
    n,
    k,
    tau: tl.float64,  # a Python float would be passed as float32
    big: tl.float64,  # M (2^600 for float64 rows)
    STEPS: tl.constexpr,
    W: tl.constexpr,
    WIDE: tl.constexpr,  # float64 scores
):
    row = tl.program_id(0).to(tl.int64)
    s, base, far, below, inside, short = _row(s_ptr, row, n, k, big, STEPS, W)
    mask = tl.zeros([W], dtype=tl.float64)
    for rank in range(k):
        p, shift = _ranks(base, far, inside, rank, n, tau, WIDE)
        mask += p
    # rows with at most k < n entries above -inf select them all, with gradient 0
    mask = tl.where(short, tl.where(s > float("-inf"), 1.0, mask), mask)
    lanes = tl.arange(0, W)
    order = tl.load(order_ptr + row * n + lanes, mask=inside, other=0)
    tl.store(mask_ptr + row * n + order, mask.to(mask_ptr.dtype.element_ty), mask=inside)


@triton.jit
def backward(
    s_ptr,
    order_ptr,
    pos_ptr,  # (B,) the label's index in its row (LABEL; the mask's launch passes any tensor)
    grad_ptr,  # (B, n) the mask's gradient in the row's order, or (B, k) that of the label's ranks
    gx_ptr,  # (B, n) the gradient of the scores, in the row's order
    n,
    k,
    tau: tl.float64,
    big: tl.float64,
    STEPS: tl.constexpr,
    W: tl.constexpr,
    WIDE: tl.constexpr,
    LABEL: tl.constexpr,  # the label's ranks, else the mask
):
    row = tl.program_id(0).to(tl.int64)
    s, base, far, below, inside, short = _row(s_ptr, row, n, k, big, STEPS, W)
    lanes = tl.arange(0, W)
    order = tl.load(order_ptr + row * n + lanes, mask=inside, other=-1)
    if LABEL:
        label = order == tl.load(pos_ptr + row)
        g = tl.zeros([W], dtype=tl.float64)
    else:  # every rank's column gets the mask's gradient; none where the row selects its entries
        label = lanes < 0
        g = tl.where(short, 0.0, tl.load(grad_ptr + row * n + order, mask=inside, other=0.0).to(tl.float64))
    # γ = P (g - ḡ_r) per rank; α = Σ_r γ, β = Σ_r (ρ + 1/2) γ
    alpha = tl.zeros([W], dtype=tl.float64)
    beta = tl.zeros([W], dtype=tl.float64)
    for rank in range(k):
        p, shift = _ranks(base, far, inside, rank, n, tau, WIDE)
        if LABEL:  # the column's gradient: the label's entry only
            g = tl.where(label, tl.load(grad_ptr + row * k + rank).to(tl.float64), 0.0)
        gamma = p * (g - tl.sum(p * g, 0))
        alpha += gamma
        beta += shift * gamma
    grad = _scores_grad(s_ptr, row, n, s, far, below, alpha, beta, tau, STEPS)
    tl.store(gx_ptr + row * n + order, grad.to(gx_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _scores_grad(s_ptr, row, n, s, far, below, alpha, beta, tau, STEPS: tl.constexpr):
    """The sorted scores' gradient from ``α = Σ_r γ`` and ``β = Σ_r (ρ + 1/2) γ``:
    ``-τ ∂s_i = Σ_{s_l < s_i} α_l + Σ_{s_l <= s_i} α_l + (ℓ_i + h_i) α_i - 2 β_i``, 0 at ``±inf``."""
    at_most = _count_below(s_ptr + row * n, n, far, STEPS, True)
    signs = _prefix(alpha, below) + _prefix(alpha, at_most)
    grad = (signs + (below + at_most).to(tl.float64) * alpha - 2.0 * beta) / (-tau)
    return tl.where((s == float("inf")) | (s == float("-inf")), 0.0, grad)


@triton.jit
def label_forward(
    s_ptr,  # (B, n) the rows sorted ascending
    order_ptr,  # (B, n) the sort's permutation
    pos_ptr,  # (B,) the label's index in its row
    out_ptr,  # (B, k) P[label, :k]
    n,
    k,
    tau: tl.float64,
    big: tl.float64,
    STEPS: tl.constexpr,
    W: tl.constexpr,
    WIDE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    s, base, far, below, inside, short = _row(s_ptr, row, n, k, big, STEPS, W)
    lanes = tl.arange(0, W)
    order = tl.load(order_ptr + row * n + lanes, mask=inside, other=-1)
    label = order == tl.load(pos_ptr + row)  # the label's lane in the sorted row
    for rank in range(k):
        p, shift = _ranks(base, far, inside, rank, n, tau, WIDE)
        picked = tl.sum(tl.where(label, p, 0.0), 0)
        tl.store(out_ptr + row * k + rank, picked.to(out_ptr.dtype.element_ty))


# The tiled kernels: programs of RB ranks over a chunk of the sorted row (the ranks' sums), and of
# BLOCK entries over every rank (the entries' sums), from the logits' pieces computed by torch ops.


@triton.jit
def _pre_logits(base_ptr, far_ptr, row, n, offs, rk, hi):
    """``y_ri = base_i + (ρ_r + 1/2) s'_i`` (float64, RB × BLOCK; ``-inf`` from ``hi`` on), where the
    logits are ``2 y/τ`` up to a constant of the rank; and ``ρ_r + 1/2``."""
    inside = offs < hi
    base = tl.load(base_ptr + row * n + offs, mask=inside, other=0.0)
    far = tl.load(far_ptr + row * n + offs, mask=inside, other=0.0).to(tl.float64)
    shift = (n - rk).to(tl.float64) - 0.5
    return tl.where(inside[None, :], base[None, :] + shift[:, None] * far[None, :], float("-inf")), shift


@triton.jit
def _sorted_grad(s_ptr, order_ptr, grad_ptr, row, n, k, offs):
    """The mask's gradient at sorted entries ``offs`` (float64), 0 in a row with at most ``k``
    entries above ``-inf`` (it selects them, with gradient 0)."""
    inside = offs < n
    order = tl.load(order_ptr + row * n + offs, mask=inside, other=0)
    short = tl.load(s_ptr + row * n + (n - 1 - k)).to(tl.float64) == float("-inf")
    g = tl.load(grad_ptr + row * n + order, mask=inside, other=0.0).to(tl.float64)
    return tl.where(short, 0.0, g)


@triton.jit
def rank_parts(
    s_ptr,  # (B, n) the rows sorted ascending
    order_ptr,  # (B, n) the sort's permutation
    base_ptr,  # (B, n) float64: C_i - ℓ_i s'_i
    far_ptr,  # (B, n) s'
    top_ptr,  # (B, k) float64: each rank's largest y (GRAD; unread otherwise)
    norm_ptr,  # (B, k) float64: each rank's Σ_i exp(2 (y_ri - top_r)/τ) (GRAD)
    grad_ptr,  # (B, n) the mask's gradient (GRAD)
    max_ptr,  # (B, chunks, k) out: each chunk's largest y (not GRAD)
    sum_ptr,  # (B, chunks, k) out: each chunk's Σ exp(2 (y - its max)/τ), or (GRAD) Σ P g
    n,
    k,
    tau: tl.float64,
    GRAD: tl.constexpr,
    WIDE: tl.constexpr,  # float64 scores
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Programs (rows, rank blocks, chunks): the softmax's running maximum and sum of ``RB`` ranks
    over ``CHUNK`` entries, or (``GRAD``) their share of ``ḡ_r = Σ_i P_ri g_i``."""
    row, chunk, chunks = tl.program_id(0).to(tl.int64), tl.program_id(2), tl.num_programs(2)
    rk = tl.program_id(1) * RB + tl.arange(0, RB)
    lo, lanes, scale = chunk * CHUNK, tl.arange(0, BLOCK), 2.0 / tau
    hi = tl.minimum(n, lo + CHUNK)
    total = tl.zeros([RB], dtype=tl.float64)
    if GRAD:
        top = tl.load(top_ptr + row * k + rk, mask=rk < k, other=float("inf"))  # weight 0 past k
        norm = tl.load(norm_ptr + row * k + rk, mask=rk < k, other=1.0)
        for start in range(lo, hi, BLOCK):
            y, _ = _pre_logits(base_ptr, far_ptr, row, n, start + lanes, rk, hi)
            g = _sorted_grad(s_ptr, order_ptr, grad_ptr, row, n, k, start + lanes)
            total += tl.sum(_exp((y - top[:, None]) * scale, WIDE) / norm[:, None] * g[None, :], 1)
    else:
        top = tl.full([RB], float("-inf"), dtype=tl.float64)
        for start in range(lo, hi, BLOCK):
            y, _ = _pre_logits(base_ptr, far_ptr, row, n, start + lanes, rk, hi)
            higher = tl.maximum(top, tl.max(y, 1))  # finite from the first tile on
            total = total * _exp((top - higher) * scale, WIDE) + tl.sum(_exp((y - higher[:, None]) * scale, WIDE), 1)
            top = higher
        tl.store(max_ptr + (row * chunks + chunk) * k + rk, top, mask=rk < k)
    tl.store(sum_ptr + (row * chunks + chunk) * k + rk, total, mask=rk < k)


@triton.jit
def entry_sums(
    s_ptr,
    order_ptr,
    base_ptr,
    far_ptr,
    top_ptr,
    norm_ptr,
    mean_ptr,  # (B, k) float64: ḡ_r (GRAD; unread otherwise)
    grad_ptr,  # (B, n) the mask's gradient (GRAD)
    out_ptr,  # (B, n) out: the mask in the row's order; or (GRAD) α in sorted order
    beta_ptr,  # (B, n) out: β in sorted order (GRAD)
    n,
    k,
    tau: tl.float64,
    GRAD: tl.constexpr,
    WIDE: tl.constexpr,
    RB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Programs (rows, blocks): the mask ``Σ_r P_ri`` of ``BLOCK`` sorted entries (1 on the entries
    above ``-inf`` of a row with at most ``k`` of them), or (``GRAD``) ``α_i = Σ_r γ_ri`` and
    ``β_i = Σ_r (ρ_r + 1/2) γ_ri`` with ``γ = P (g - ḡ_r)``."""
    row = tl.program_id(0).to(tl.int64)
    offs, ranks, scale = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK), tl.arange(0, RB), 2.0 / tau
    inside = offs < n
    alpha = tl.zeros([BLOCK], dtype=tl.float64)
    beta = tl.zeros([BLOCK], dtype=tl.float64)
    if GRAD:
        g = _sorted_grad(s_ptr, order_ptr, grad_ptr, row, n, k, offs)
    for r0 in range(0, k, RB):
        rk = r0 + ranks
        top = tl.load(top_ptr + row * k + rk, mask=rk < k, other=float("inf"))  # weight 0 past k
        norm = tl.load(norm_ptr + row * k + rk, mask=rk < k, other=1.0)
        y, shift = _pre_logits(base_ptr, far_ptr, row, n, offs, rk, n)
        p = tl.where((rk < k)[:, None], _exp((y - top[:, None]) * scale, WIDE) / norm[:, None], 0.0)
        if GRAD:
            mean = tl.load(mean_ptr + row * k + rk, mask=rk < k, other=0.0)
            gamma = p * (g[None, :] - mean[:, None])
            alpha += tl.sum(gamma, 0)
            beta += tl.sum(shift[:, None] * gamma, 0)
        else:
            alpha += tl.sum(p, 0)
    if GRAD:
        tl.store(out_ptr + row * n + offs, alpha, mask=inside)
        tl.store(beta_ptr + row * n + offs, beta, mask=inside)
    else:
        s = tl.load(s_ptr + row * n + offs, mask=inside, other=0.0).to(tl.float64)
        short = tl.load(s_ptr + row * n + (n - 1 - k)).to(tl.float64) == float("-inf")
        mask = tl.where(short, tl.where(s > float("-inf"), 1.0, alpha), alpha)
        order = tl.load(order_ptr + row * n + offs, mask=inside, other=0)
        tl.store(out_ptr + row * n + order, mask.to(out_ptr.dtype.element_ty), mask=inside)
