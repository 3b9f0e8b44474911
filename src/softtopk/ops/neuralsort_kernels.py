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
    e = tl.exp(logits)
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
