"""The smooth top-k SVM's row kernel for ``k <= SUBSET_K`` (Berrada, Zisserman & Kumar, ICLR 2018):
the loss and its gradient as one autograd Function over the ``2^k`` subsets of the top ``k`` scores
and the elementary symmetric polynomials of the others (:class:`_SmoothTopKRows`); larger ``k``
take the log-space polynomials of :mod:`softtopk.ops.esf`."""

from __future__ import annotations

import math

import torch

from ._function import Function
from .compute import LOG2E, horner_step, power_sums, put_rows, topk_rows
from .esf import largest_log_binomial

SUBSET_K = 8  # the top k's polynomials by brute force over their 2^k subsets up to here
# a scaled score this far above the k-th largest leaves the others' terms a weight e^-FAR: below
# float64's rounding for any practical number of classes, so it may stand for +inf (and for
# differences that overflow the dtype)
FAR = 200.0
SOFTPLUS_LINEAR = 50.0  # svm_softplus: the margin itself above this (softplus is m to e^-50)
_TABLES: dict = {}


def _subset_tables(k: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Constants of the top part, as matrices applied to the top's scaled scores ``t (R, k)``:
    ``t @ subsets = sum_S t - T_|S|`` over the ``2^k`` subsets ``S`` (``T_j`` the sum of the ``j``
    largest), ``t @ joins = T_a - T_j`` for ``(a, j)``; the subsets by size ``(2^k, k + 1)`` and
    without item ``i`` ``(2^k, k (k + 1))``; the mask ``a > j`` ``(k + 1, k + 1)``; and
    ``(2 (k + 1), k)``, the deflation coefficients of ``y^(m+1)`` from the ratios
    ``(c, j) -> ẽ_c exp(T_c - T_j) / ẽ_j``, ``j = k - 1, k``. Cached outside compile."""
    key, compiling = (k, dtype, device), torch.compiler.is_compiling()
    if not compiling and key in _TABLES:  # never read under compile: filling it would be a recompile
        return _TABLES[key]
    bits = ((torch.arange(2**k, device=device).unsqueeze(-1) >> torch.arange(k, device=device)) & 1).to(dtype)
    j = torch.arange(k + 1, device=device)
    prefix = (torch.arange(k, device=device).unsqueeze(-1) < j).to(dtype)  # t @ prefix = T
    size = bits.sum(-1).long()
    by_size = (size.unsqueeze(-1) == j).to(dtype)
    without = ((1 - bits).unsqueeze(-1) * by_size.unsqueeze(1)).reshape(2**k, k * (k + 1))
    joins = (prefix.unsqueeze(-1) - prefix.unsqueeze(-2)).reshape(k, (k + 1) ** 2)
    m = torch.arange(k, device=device)
    sign = 1.0 - 2.0 * (m % 2).to(dtype)
    deflation = torch.zeros(k + 1, 2, k, dtype=dtype, device=device)
    deflation[k - 1 - m, 1, m] = sign  # + (-1)^m ẽ_{k-1-m} exp(T_{k-1-m} - T_k) / ẽ_k
    deflation[(k - 2 - m[: k - 1]), 0, m[: k - 1]] = -sign[: k - 1]  # - the same for k - 1
    tables = (
        bits.T - prefix[:, size],
        joins,
        by_size,
        without,
        j.unsqueeze(-1) > j,
        deflation.reshape(2 * (k + 1), k),
    )
    if not compiling:
        _TABLES[key] = tables
    return tables


def svm_softplus(
    ratio: torch.Tensor, hinge: torch.Tensor, tau: float, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss ``tau softplus(m)`` and the margin ``m = ratio + (alpha + hinge)/tau`` of rows with
    ``ratio = log e_k - log e_{k-1}`` and ``hinge = (s_[k] - s_y)/k`` in the units of the scores.
    Above ``m = 50`` (where softplus is ``m`` to ``e^-50``; the default threshold 20 would cut at
    ``e^-20``) the loss is ``tau ratio + alpha + hinge``: finite whenever it is representable, even
    where ``m`` overflows (scores near the dtype's largest over a small ``tau``)."""
    shifted = hinge + alpha
    margin = torch.add(ratio, shifted, alpha=1.0 / tau)
    soft = torch.nn.functional.softplus(margin, threshold=SOFTPLUS_LINEAR) * tau  # m itself above: no NaN at inf
    return torch.where(margin > SOFTPLUS_LINEAR, torch.add(shifted, ratio, alpha=tau), soft), margin


def _newton_esf(y: torch.Tensor, degree: int) -> torch.Tensor:
    """``e_b(y)``, ``b = 0..degree``, of values ``y`` in ``[0, 1]`` from the power sums
    ``p_m = Σ y^m`` in float64: Newton's identities ``b e_b = Σ_{m=1}^{b} (-1)^{m-1} p_m e_{b-m}`` as
    one lower-triangular solve; a product and a sum per degree, no scan.

    The alternating sums cancel, so the error is absolute: about ``b p_1`` float64 roundings of the
    lower polynomials (``p_m <= p_1``). In :class:`_SmoothTopKRows` every ``e_c``, ``c < b``, enters
    ``ẽ_j >= 1`` with at least ``e_b``'s weight, so ``ẽ_j`` keeps a relative error of order
    ``k C eps64``, far below float32's rounding (for small degrees only: the error grows with them)."""
    sums = power_sums(y, degree)
    index, diagonal, sign = _newton_tables(degree, y.device)
    # with g_b = (-1)^(b+1) e_b the identities read b g_b + Σ_{m<b} p_m g_{b-m} = p_b
    matrix = torch.nn.functional.pad(sums, (1, 0))[..., index] + diagonal  # p_0 = 0 on and above the diagonal
    e = torch.linalg.solve_triangular(matrix, sums.unsqueeze(-1), upper=False).squeeze(-1).mul_(sign)
    return torch.nn.functional.pad(e, (1, 0), value=1.0).to(y.dtype)


def _toeplitz(e: torch.Tensor) -> torch.Tensor:
    """``T[:, a, j] = e[:, j - a]`` for ``j >= a`` and 0 below the diagonal, ``(R, K, K)`` from ``e``
    ``(R, K)``: windows of ``e`` padded with ``K - 1`` zeros, in reverse order (Inductor fails on the
    same values gathered with a ``(K, K)`` index tensor)."""
    size = e.shape[-1]
    return torch.nn.functional.pad(e, (size - 1, 0)).unfold(-1, size, 1).flip(-2)


def _newton_tables(degree: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Constants of :func:`_newton_esf` (float64): the Toeplitz index ``b - c`` (0 on and above the
    diagonal, where ``p_0 = 0``), the diagonal ``diag(1..K)`` and the signs ``(-1)^(m+1)``. Cached
    outside compile."""
    key, compiling = ("newton", degree, device), torch.compiler.is_compiling()
    if not compiling and key in _TABLES:
        return _TABLES[key]
    m = torch.arange(1, degree + 1, device=device)
    tables = (
        (m.unsqueeze(-1) - m).clamp_min(0),
        torch.diag(m.to(torch.float64)),
        2.0 * (m % 2).to(torch.float64) - 1.0,
    )
    if not compiling:
        _TABLES[key] = tables
    return tables


class _SmoothTopKRows(Function):
    """``(logits (R, C), label (R,), k, tau, alpha)`` -> the smooth top-k SVM loss of each row,
    ``tau softplus(alpha/tau + log e_k - log e_{k-1} - z_y)`` over the other classes (module doc of
    :mod:`softtopk.losses.smooth_svm`), forward and backward in a few fused steps.

    With the other scores relative to their k-th largest and ``T_j`` the prefix sums of the top
    ``k`` (decreasing), every polynomial is normalised, ``ẽ_j = e_j / exp(T_j)`` in ``[1, C(n, j)]``:
    the tail's ``e_b`` (values in ``[0, 1]``, :func:`_newton_esf`), the top's by brute force over its
    ``2^k`` subsets (every term ``exp(sum_S t - T_|S|) <= 1``), joined by
    ``ẽ_j = sum_a ẽtop_a exp(T_a - T_j) e_{j-a}(tail)``. Gradient
    ``d margin / d z_i = pi^(k)_i - pi^(k-1)_i`` (inclusion probabilities): for the tail a
    polynomial in ``y_i`` whose coefficients come from deflation (stable: tail values never exceed
    the top's), by Horner's rule; for the top ``1 - pi^(j)_i = e_j(x without i) / e_j``, from the
    subsets without ``i``. Rows with fewer than ``k`` other classes above ``-inf`` give 0 (the
    limit, gradient 0), a label at ``-inf`` gives ``inf`` (finite gradients). ``+inf`` scores take
    the limits of :func:`softtopk.ops.svm_rows.extended_svm_rows` in the same pass (as the largest
    finite score, gradient 0; ``k`` others there give ``inf`` unless the label is there too), and a
    NaN makes its row NaN."""

    generate_vmap_rule = True

    @staticmethod
    def forward(logits, label, k, tau, alpha):
        subsets, joins, by_size, _, upper, _ = _subset_tables(k, logits.dtype, logits.device)
        scale, label, largest = 1.0 / (k * tau), label.unsqueeze(-1), torch.finfo(logits.dtype).max
        label_score = logits.gather(-1, label)
        # +inf scores enter as the largest finite one (the limits of extended_svm_rows)
        others = put_rows(logits.clamp_max(largest), label, -math.inf)
        top, index = topk_rows(others, k)
        kth = top[:, -1:]
        # the top's entries at +inf (gradient 0); k of them: the loss is inf unless the label ties there
        infinite = logits.gather(-1, index) == math.inf
        label_inf = label_score == math.inf
        beaten = infinite[:, -1:] > label_inf  # (bool a > b: a and not b)
        # fewer than k others above -inf: a zero stand-in keeps the row finite (its top t >= 0), and
        # a kth at the most negative finite number makes its margin -inf (loss 0) and a label at
        # -inf's margin +inf (loss inf); neither needs a mask afterwards
        shift = kth.masked_fill(kth == -math.inf, 0.0)  # differences before scaling: exact for large scores
        y = put_rows(others, index, -math.inf).sub_(shift).mul_(scale * LOG2E).exp2_()  # e^z (compute.LOG2E)
        t = torch.sub(top, shift).mul_(scale).clamp(0.0, FAR)  # out of place: vmap has a rule
        W = (t @ subsets).exp_()
        G = (t @ joins).view(-1, k + 1, k + 1).exp_().masked_fill_(upper, 0.0)  # exp(T_a - T_j), a <= j
        GE = G * _toeplitz(_newton_esf(y, k))
        e = ((W @ by_size).unsqueeze(-2) @ GE).squeeze(-2)
        # (kth - label) halved first: finite for any finite scores, with the same rounding
        gap = torch.add(kth.clamp_min(-largest).mul_(0.5), label_score.clamp_max(largest), alpha=-0.5)
        loss, margin = svm_softplus(torch.log(e[:, k] / e[:, k - 1]), gap.squeeze(-1) * (2.0 / k), tau, alpha)
        loss = torch.where(beaten.squeeze(-1), loss + math.inf, loss)  # a NaN row stays NaN
        return loss, margin, y, index, G, W, GE, e, infinite, infinite[:, -1:] | label_inf

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(inputs[1], *output[1:])
        ctx.k, ctx.classes = inputs[2], inputs[0].shape[-1]

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative raises instead of being wrong
    def backward(ctx, grad, *_unused):
        if grad is None:  # only the non-differentiable outputs were used
            return None, None, None, None, None
        label, margin, y, index, G, W, GE, e, infinite, fixed = ctx.saved_tensors
        k = ctx.k
        _, _, _, without, _, deflation = _subset_tables(k, y.dtype, y.device)
        c = (grad * torch.sigmoid(margin)).div_(k).unsqueeze(-1)  # d loss / d z times d z / d s
        # tail: pi^(j)_i = sum_m (-1)^m y_i^(m+1) ẽ_{j-1-m} exp(T_{j-1-m} - T_j) / ẽ_j; none in a row
        # with k others at +inf (its finite scores have y = 0, its infinite ones gradient 0)
        ratio = e.unsqueeze(-1) * G[..., k - 1 :] / e[:, k - 1 :].unsqueeze(-2)
        d = (ratio.flatten(1) @ deflation).mul_(c.masked_fill(infinite[:, -1:], 0.0))
        acc = d[:, k - 1 :]  # the first step has two per-row operands: a product and a sum on the CPU
        for m in range(k - 2, -1, -1):
            acc = horner_step(d[:, m : m + 1], acc, y)
        # top: pi^(k)_i - pi^(k-1)_i = ẽ^(-i)_{k-1} / ẽ_{k-1} - ẽ^(-i)_k / ẽ_k
        rest = (W @ without).view(-1, k, k + 1) @ GE[..., k - 1 :] / e[:, k - 1 :].unsqueeze(-2)
        top = (rest[..., 0] - rest[..., 1]).mul_(c).masked_fill_(infinite, 0.0)
        # a label at +inf has gradient 0, and so has a row beaten by k classes at +inf (its tail and
        # top are cut above)
        grad_logits = put_rows(acc.mul_(y) if k > 1 else acc * y, index, top)
        label_grad = c.neg().masked_fill_(fixed, 0.0)
        return put_rows(grad_logits, label.unsqueeze(-1), label_grad), None, None, None, None


def smooth_topk_rows(logits: torch.Tensor, label: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """The smooth top-k SVM loss ``(R,)`` of rows ``logits (R, C)`` with labels ``(R,)``, for
    ``k <= SUBSET_K`` and ``C(C - 1, k)`` within the dtype (:class:`_SmoothTopKRows`)."""
    return _SmoothTopKRows.apply(logits, label, k, tau, alpha)[0]


def fits_subset_path(n: int, k: int, dtype: torch.dtype) -> bool:
    """Whether :func:`smooth_topk_rows` applies to ``n`` other classes in ``dtype``."""
    return k <= SUBSET_K and largest_log_binomial(n, k) < math.log(torch.finfo(dtype).max) - 1.0
