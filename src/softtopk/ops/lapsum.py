"""Closed-form soft top-k: a Laplace-CDF mask whose threshold is solved exactly (LapSum-style).

.. math::
    m_i = F\\Big(\\frac{x_i - t}{\\tau}\\Big), \\quad
    F(z) = \\begin{cases} \\tfrac12 e^{z} & z < 0 \\\\ 1 - \\tfrac12 e^{-z} & z \\ge 0 \\end{cases},
    \\qquad \\textstyle\\sum_i m_i = k .

**Exact threshold without a full sort.** If ``j`` entries lie above ``t``, the sum is
``j - A u / 2 + B / (2u)`` with ``u = e^{t/τ}``, ``A = Σ_{above} e^{-x/τ}``, ``B = Σ_{below} e^{x/τ}``:
``A u² + 2(k-j) u - B = 0`` gives ``u`` in closed form. Every entry above ``t`` has ``m > 1/2``, so
``j < 2k`` and (for ``k <= n/2``) the threshold lies among the ``K = 2k`` largest entries: one
``topk(2k)`` gives every candidate segment; the rest of the row enters only through
``R = Σ_{rest} e^{x/τ}``, one masked exponential sum. All sums are taken in log space (no overflow
or underflow for any ``τ``). ``k > n/2`` uses ``m(x, k) = 1 - m(-x, n-k)``; a per-row tensor ``k``
sorts the whole row (``K = n``).

**Analytic backward, O(n).** With ``d_i = F'(z_i)`` and ``w = d / Σd`` (implicit function theorem on
``Σ m = k``): ``∂L/∂x = (d/τ) ⊙ (g - Σ w g)``, ``∂L/∂τ = -(1/τ) Σ g d (z - Σ w z)``,
``∂L/∂k = Σ w g``. Since ``F' = min(F, 1-F)``, ``d`` is read off the mask.

Reference: Struski et al., "LapSum - One Method to Differentiate Them All" (ICML 2025) for the
Laplace-CDF sum; the threshold search above is this library's.
"""

from __future__ import annotations

import math

import torch

from .compute import can_inspect

_NEG_INF = float("-inf")
_SATURATED = 2.0**20  # |(x - ref)/τ| beyond which F is 0 or 1 and F' is 0 in float64


def _solve_log_threshold(a: torch.Tensor, log_rest: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``t/τ`` (B, 1) from the ``K`` largest scaled scores ``a`` (B, K, descending) and the log of the
    rest's exponential sum ``log_rest`` (B, 1); ``k`` (B, 1) or a scalar tensor."""
    big = a.shape[-1]
    # log A_j (j entries above): A_0 = 0, A_j = Σ_{i<j} e^{-a_i}
    log_a = torch.cat([a.new_full((a.shape[0], 1), _NEG_INF), torch.logcumsumexp(-a[:, :-1], -1)], -1)
    # log B_j = log(Σ_{i>=j} e^{a_i} + R)
    log_b = torch.logaddexp(torch.logcumsumexp(a.flip(-1), -1).flip(-1), log_rest)
    c = k - torch.arange(big, device=a.device, dtype=a.dtype)
    log_c = c.abs().log()
    log_root = 0.5 * torch.logaddexp(2 * log_c, log_a + log_b)  # log sqrt(c² + AB)
    log_sum = torch.logaddexp(log_c, log_root)  # log(|c| + sqrt(c² + AB))
    log_u = torch.where(c >= 0, log_b - log_sum, log_sum - log_a)
    upper = torch.cat([a.new_full((a.shape[0], 1), float("inf")), a[:, :-1]], -1)
    violation = (a - log_u).clamp_min(0) + (log_u - upper).clamp_min(0)
    best, j = violation.min(-1, keepdim=True)
    # a row is solved when its best segment holds t up to rounding; otherwise t lies below a_K
    valid = best <= 1e-9 * (1 + a.gather(-1, j).abs())  # float64: rounding only
    return log_u.gather(-1, j).clamp(a.gather(-1, j), upper.gather(-1, j)), valid


class _LaplaceMask(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, tau: torch.Tensor, k: torch.Tensor, big: int) -> torch.Tensor:
        # x (B, n); tau, k broadcastable to (B, 1); big = number of candidates K
        n = x.shape[-1]
        inv_tau = tau.reciprocal()
        # scores are measured from ``ref``, the k-th largest, near which t lies, and the (B, K)
        # threshold search runs in float64: a row may span ~1e9 τ, far beyond float32's resolution
        if big == n:  # whole row sorted; a -inf sentinel adds the segment "all n above t"
            vals, idx = x.sort(-1, descending=True)
        else:
            vals, idx = x.topk(big, -1)
        wide = torch.float64
        kth = (k.expand(x.shape[0], 1).ceil().long() - 1).clamp(0, big - 1)
        ref = vals.gather(-1, kth)
        # clamped to ±C: an entry beyond C has mask exactly 0 or 1 and no weight in the threshold in
        # float64 either way, and log-space sums of size C keep ~1e-10 absolute precision (unclamped,
        # a spread of 1e20 τ rounds the threshold to the wrong segment); ±inf become ±C
        a = ((vals - ref).to(wide) * inv_tau.to(wide)).clamp_(-_SATURATED, _SATURATED)
        if big == n:
            a = torch.cat([a, a.new_full((x.shape[0], 1), _NEG_INF)], -1)
            log_rest = a.new_full((x.shape[0], 1), _NEG_INF)
            scaled = torch.zeros_like(x)
        else:
            # rest: Σ_{not among the K largest} e^{(x - s_K)/τ}, every term in (0, 1]
            # exp(max(z, floor)) - exp(floor): exactly 0 at -inf, within exp(floor) ~ 1e-35 of exp(z)
            # elsewhere, with no branch (exp of -inf or of subnormal results takes libm's slow path,
            # and a where on a random mask mispredicts: each costs as much as the exp on CPU); last
            # is made finite so that -inf - last is never NaN
            floor = math.log(torch.finfo(x.dtype).tiny) + 8.0
            last = vals[:, -1:].clamp_min(torch.finfo(x.dtype).min)
            scaled = ((x - last) * inv_tau).clamp_(floor, 0.0).exp_().sub_(math.exp(floor)).clamp_min_(0.0)
            scaled = scaled.scatter_(-1, idx, 0.0)
            log_rest = scaled.sum(-1, keepdim=True).to(wide).log_() + a[:, big - 1 : big]
        tt, valid = _solve_log_threshold(a, log_rest, k.to(wide))
        z_top = a[:, : vals.shape[-1]] - tt
        half_e = 0.5 * torch.exp(-z_top.abs())
        m_top = torch.where(z_top >= 0, 1 - half_e, half_e).to(x.dtype)
        # the rest lies below t, where m = F'(z) = e^z / 2; d = F'(z)/τ is what backward needs
        rest_scale = (0.5 * torch.exp(a[:, big - 1 : big] - tt)).to(x.dtype)
        mask = (scaled * rest_scale).scatter_(-1, idx, m_top)
        d = scaled.mul_(rest_scale * inv_tau).scatter_(-1, idx, half_e.to(x.dtype) * inv_tau)
        total = ((0.5 * torch.exp(log_rest - tt) + half_e.sum(-1, keepdim=True)).to(x.dtype)) * inv_tau  # Σ d
        tt = tt.to(x.dtype)
        return mask, d, total, tt, ref, valid

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, tau, k, _ = inputs
        _, d, total, tt, ref, _ = output
        ctx.save_for_backward(x, tau, d, total, tt, ref)
        ctx.k_shape = k.shape
        ctx.mark_non_differentiable(*output[1:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_):
        x, tau, d, total, tt, ref = ctx.saved_tensors
        # total == 0 only when every F'(z) underflows: the mask is hard there and its gradient 0
        safe = torch.where(total > 0, total, torch.ones_like(total))
        gbar = torch.linalg.vecdot(d, grad).unsqueeze(-1) / safe
        grad_x = grad_tau = grad_k = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad - gbar).mul_(d)
        if ctx.needs_input_grad[1]:
            z = torch.where(d > 0, (x - ref) / tau - tt, 0.0)  # d = 0 at ±inf, where z is infinite
            zbar = torch.linalg.vecdot(d, z).unsqueeze(-1) / safe
            grad_tau = _sum_to(-torch.linalg.vecdot(grad * d, z - zbar).unsqueeze(-1), tau.shape)
        if ctx.needs_input_grad[2]:
            grad_k = _sum_to(gbar, ctx.k_shape)
        return grad_x, grad_tau, grad_k, None


def _sum_to(value: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a (B, 1) gradient to a broadcast input's ``shape`` (scalar or (B, 1))."""
    return value.sum().reshape(shape) if value.shape != shape else value


def lapsum_mask(x: torch.Tensor, k: int | torch.Tensor, tau: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Laplace-CDF soft top-k mask of rows ``x`` (B, n); ``k`` an int or a (B, 1) tensor in (0, n];
    ``tau`` a positive float or a tensor broadcastable to (B, 1). Returns (B, n), summing to ``k``."""
    n = x.shape[-1]
    tau_t = tau if isinstance(tau, torch.Tensor) else torch.tensor(float(tau), dtype=x.dtype, device=x.device)
    tau_t = tau_t.to(x.dtype)
    if isinstance(k, torch.Tensor):
        k_t = k.to(x.dtype)
        full = k_t >= n  # mask 1 and gradient 0; the kernel gets a harmless k there (no NaN backward)
        mask = _LaplaceMask.apply(x, tau_t, torch.where(full, 0.5 * n, k_t), n)[0]
        return torch.where(full, torch.ones_like(mask), mask)
    if k >= n:
        return x * 0 + 1
    if 2 * k > n:
        return 1 - lapsum_mask(-x, n - k, tau_t)
    k_t = torch.tensor(float(k), dtype=x.dtype, device=x.device)
    # k + 3 + k/8 candidates hold the threshold in almost every row, and torch.topk on CPU is several
    # times cheaper for K <= n/64 than above: try them first when only they fit under that bound
    few = k + 3 + k // 8
    if 64 * few <= n < 128 * k and can_inspect(x):
        mask, *_, valid = _LaplaceMask.apply(x, tau_t, k_t, few)
        if bool(valid.all()):
            return mask
    return _LaplaceMask.apply(x, tau_t, k_t, 2 * k)[0]

