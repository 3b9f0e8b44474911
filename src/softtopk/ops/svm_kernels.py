"""Triton kernels of the smooth top-k SVM's rows (see :mod:`softtopk.ops.svm_triton`, which launches
them; importing this module imports triton). One program per row holds the row in ``W`` lanes and
computes in float64 what :class:`softtopk.ops.svm_subsets._SmoothTopKRows` computes: the top ``K``
other scores (``K`` maxima in turn), the tail's polynomials by Newton's identities from its power
sums, the top's normalised polynomials by their recursion in decreasing order, and their join; the
backward recomputes the row and applies the same gradient (deflation for the tail, the polynomials
without each top entry for the top)."""

import triton
import triton.language as tl


@triton.jit
def _wide(value):
    """A float64 argument as a float64 scalar: Triton's interpreter hands a Python float that float32
    holds exactly over as float32, and arithmetic on it alone would round there."""
    return value + tl.zeros([], tl.float64)


@triton.jit
def _pick(vector, j, lanes):
    """The scalar ``vector[j]``."""
    return tl.sum(tl.where(lanes == j, vector, 0.0), 0)


@triton.jit
def _log1p(u):
    """``log(1 + u)`` for ``u >= 0``, accurate for small ``u`` (the rounding of ``1 + u`` corrected)."""
    w = 1.0 + u
    return tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))


@triton.jit
def _join(N, T, tail, j, degrees):
    """``ẽ_j = Σ_{a <= j} N_a exp(T_a - T_j) e_{j-a}(tail)`` (every exponent ``<= 0``)."""
    spread = tl.gather(tail, tl.maximum(j - degrees, 0), 0)
    T_j = _pick(T, j, degrees)
    terms = N * tl.exp(tl.minimum(T - T_j, 0.0)) * spread
    return tl.sum(tl.where(degrees <= j, terms, 0.0), 0)


@triton.jit
def _top_polynomials(t, degrees, SKIP: tl.constexpr, K: tl.constexpr):
    """``N_j = e_j(e^t) / exp(T_j)`` of the top entries (``t`` decreasing) but entry ``SKIP`` (``-1``:
    none), ``T_j`` the sum of the ``j`` largest: each entry ``l`` adds ``exp(t_l - t_{j-1}) N_{j-1}``,
    at most 1 times a bounded term."""
    N = tl.where(degrees == 0, 1.0, 0.0).to(tl.float64)
    before = tl.gather(t, tl.maximum(degrees - 1, 0), 0)  # t_{j-1}
    for l in tl.static_range(K):
        if l != SKIP:
            t_l = _pick(t, l, degrees)
            lower = tl.gather(N, tl.maximum(degrees - 1, 0), 0)
            N = N + tl.where(degrees >= 1, tl.exp(tl.minimum(t_l - before, 0.0)) * lower, 0.0)
    return N


@triton.jit
def _row(x_ptr, label_ptr, row, n, tau, largest, K: tl.constexpr, KP: tl.constexpr, W: tl.constexpr, FAR: tl.constexpr):
    """Everything the loss and its gradient share, for one row (module doc)."""
    lanes = tl.arange(0, W)
    degrees = tl.arange(0, KP)
    inside = lanes < n
    raw = tl.load(x_ptr + row * n + lanes, mask=inside, other=0.0).to(tl.float64)
    nan = tl.sum(tl.where(raw != raw, 1, 0), 0) > 0
    label = tl.load(label_ptr + row)
    is_label = lanes == label
    s_y = tl.sum(tl.where(is_label, raw, 0.0), 0)
    others = tl.where(inside & ~is_label, tl.minimum(tl.where(raw != raw, 0.0, raw), largest), float("-inf"))
    # the top K others by maxima in turn (the first lane of a tie), and which slot each lane took
    free = inside & ~is_label
    slot = tl.full([W], -1, tl.int32)
    top = tl.full([KP], float("-inf"), tl.float64)
    infinite = tl.zeros([KP], tl.int32)
    for j in tl.static_range(K):
        m = tl.max(tl.where(free, others, float("-inf")), 0)
        at = tl.min(tl.where(free & (others == m), lanes, W), 0)
        free = free & (lanes != at)
        slot = tl.where(lanes == at, j, slot)
        top = tl.where(degrees == j, m, top)
        infinite = tl.where(degrees == j, tl.max(tl.where((lanes == at) & (raw == float("inf")), 1, 0), 0), infinite)
    kth = _pick(top, K - 1, degrees)
    shift = tl.where(kth == float("-inf"), 0.0, kth)
    scale = 1.0 / (K * tau)
    y = tl.where(free, tl.exp(tl.minimum((others - shift) * scale, 0.0)), 0.0)  # the tail, in [0, 1]
    t = tl.where(degrees < K, tl.minimum(tl.maximum((top - shift) * scale, 0.0), FAR), 0.0)
    T = tl.cumsum(t, 0) - t  # T_j = t_0 + ... + t_{j-1}
    # the tail's e_b by Newton's identities, b e_b = Σ_{m=1}^{b} (-1)^(m-1) p_m e_{b-m}
    sums = tl.zeros([KP], tl.float64)
    power = y
    for m in tl.static_range(1, K + 1):
        sums = tl.where(degrees == m, tl.sum(power, 0), sums)
        power = power * y
    signs = tl.where(degrees % 2 == 1, 1.0, -1.0)
    tail = tl.where(degrees == 0, 1.0, 0.0).to(tl.float64)
    for b in tl.static_range(1, K + 1):
        lower = tl.gather(tail, tl.maximum(b - degrees, 0), 0)
        e_b = tl.sum(tl.where((degrees >= 1) & (degrees <= b), signs * sums * lower, 0.0), 0) / b
        tail = tl.where(degrees == b, e_b, tail)
    N = _top_polynomials(t, degrees, -1, K)
    e_last, e_k = _join(N, T, tail, K - 1, degrees), _join(N, T, tail, K, degrees)
    # the hinge in the units of the scores, (k-th - label)/k halved first (finite for finite scores)
    hinge = (tl.maximum(kth, -largest) * 0.5 - tl.minimum(s_y, largest) * 0.5) / (K * 0.5)  # no float32 constant 2/K
    ratio = tl.log(e_k / e_last)
    return lanes, degrees, inside, nan, is_label, s_y, slot, infinite, y, t, T, tail, N, e_last, e_k, ratio, hinge


@triton.jit
def forward(
    x_ptr,  # (R, C) the rows
    label_ptr,  # (R,) the labels
    loss_ptr,  # (R,) the loss of each row
    n,
    tau: tl.float64,  # a Python float would be passed as float32
    alpha: tl.float64,
    largest: tl.float64,  # the rows' dtype's largest finite value: +inf scores enter as it
    K: tl.constexpr,
    KP: tl.constexpr,  # a power of 2 > K
    W: tl.constexpr,  # a power of 2 >= C
    FAR: tl.constexpr,  # svm_subsets.FAR: a scaled score this far above the k-th counts as +inf
    LINEAR: tl.constexpr,  # svm_subsets.SOFTPLUS_LINEAR: softplus(m) is m above it
):
    row = tl.program_id(0).to(tl.int64)
    tau, alpha, largest = _wide(tau), _wide(alpha), _wide(largest)
    _, degrees, _, nan, _, s_y, _, infinite, _, _, _, _, _, _, _, ratio, hinge = _row(
        x_ptr, label_ptr, row, n, tau, largest, K, KP, W, FAR
    )
    shifted = hinge + alpha
    margin = ratio + shifted * (1.0 / tau)
    soft = _log1p(tl.exp(tl.minimum(margin, LINEAR))) * tau
    loss = tl.where(margin > LINEAR, shifted + tau * ratio, soft)
    # K others at +inf beat a finite label for good
    beaten = (_pick(infinite, K - 1, degrees) > 0) & (s_y != float("inf"))
    loss = tl.where(beaten, float("inf"), loss)
    tl.store(loss_ptr + row, tl.where(nan, float("nan"), loss).to(loss_ptr.dtype.element_ty))


@triton.jit
def backward(
    x_ptr,
    label_ptr,
    grad_ptr,  # (R,) the loss's gradient
    gx_ptr,  # (R, C) the rows' gradient
    n,
    tau: tl.float64,
    alpha: tl.float64,
    largest: tl.float64,
    K: tl.constexpr,
    KP: tl.constexpr,
    W: tl.constexpr,
    FAR: tl.constexpr,
    LINEAR: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    tau, alpha, largest = _wide(tau), _wide(alpha), _wide(largest)
    lanes, degrees, inside, nan, is_label, s_y, slot, infinite, y, t, T, tail, N, e_last, e_k, ratio, hinge = _row(
        x_ptr, label_ptr, row, n, tau, largest, K, KP, W, FAR
    )
    margin = ratio + (hinge + alpha) * (1.0 / tau)
    small = tl.exp(-tl.abs(margin))  # sigmoid(margin) without overflow
    sigmoid = tl.where(margin >= 0, 1.0 / (1.0 + small), small / (1.0 + small))
    c = tl.load(grad_ptr + row).to(tl.float64) * sigmoid / K  # d loss / d z, d z / d s
    fixed = _pick(infinite, K - 1, degrees) > 0  # K others at +inf: no gradient but the top's (0 there)
    # tail: pi^(j)_i = Σ_m (-1)^m y_i^(m+1) ẽ_{j-1-m} exp(T_{j-1-m} - T_j) / ẽ_j, j = K, K - 1
    T_k, T_last = _pick(T, K, degrees), _pick(T, K - 1, degrees)
    first = tl.zeros([KP], tl.float64)
    for m in tl.static_range(K):
        one = _join(N, T, tail, K - 1 - m, degrees) / e_k * tl.exp(_pick(T, K - 1 - m, degrees) - T_k)
        if m <= K - 2:
            one -= _join(N, T, tail, K - 2 - m, degrees) / e_last * tl.exp(_pick(T, K - 2 - m, degrees) - T_last)
        first = tl.where(degrees == m, one * (1 - 2 * (m % 2)), first)
    acc = tl.zeros([W], tl.float64)
    for m in tl.static_range(K):
        acc = acc * y + _pick(first, K - 1 - m, degrees)
    grad = acc * y * tl.where(fixed, 0.0, c)
    # top: pi^(K)_i - pi^(K-1)_i = ẽ^(-i)_{K-1} / ẽ_{K-1} - ẽ^(-i)_K / ẽ_K, 0 at +inf
    top = tl.zeros([KP], tl.float64)
    for i in tl.static_range(K):
        without = _top_polynomials(t, degrees, i, K)
        share = _join(without, T, tail, K - 1, degrees) / e_last - _join(without, T, tail, K, degrees) / e_k
        top = tl.where(degrees == i, tl.where(infinite > 0, 0.0, share * c), top)
    grad = tl.where(slot >= 0, tl.gather(top, tl.maximum(slot, 0), 0), grad)
    grad = tl.where(is_label, tl.where(fixed | (s_y == float("inf")), 0.0, -c), grad)
    grad = tl.where(nan, float("nan"), grad)
    tl.store(gx_ptr + row * n + lanes, grad.to(gx_ptr.dtype.element_ty), mask=inside)
