"""Closed-form soft top-k: a Laplace-CDF mask whose threshold is solved exactly (LapSum-style).

.. math::
    m_i = F\\Big(\\frac{x_i - t}{\\tau}\\Big), \\quad
    F(z) = \\begin{cases} \\tfrac12 e^{z} & z < 0 \\\\ 1 - \\tfrac12 e^{-z} & z \\ge 0 \\end{cases},
    \\qquad \\textstyle\\sum_i m_i = k .

**Exact threshold without a full sort.** With the scaled scores ``a`` (descending, relative to the
k-th largest) and ``j`` of them above ``t' = t/τ``, the sum is ``j - P u/2 + Q/(2u)``, ``u = e^{t'}``,
``P = Σ_{i<j} e^{-a_i}``, ``Q = Σ_{i>=j} e^{a_i} + rest``; its root is
``t'_j = ½ log(Q/P) - asinh((k - j)/√(PQ))`` (stable for either sign of ``k - j``). Every entry
above ``t`` has ``m > 1/2``, so ``j < 2k`` and (for ``k <= n/2``) ``t`` lies among the ``K = 2k``
largest entries: one ``topk(2k)`` gives every segment, and the rest of the row enters only through
``rest``, one exponential sum over the row. ``P`` and ``Q`` are two cumulative sums in float64 of
``e^{∓a}`` with ``a`` clamped to ``±C``: no overflow, and ``PQ <= K (K + n)`` since ``a`` is sorted.
The segment holding the root is the number of segments whose root lies below their lowest score
(``S`` decreases, so those segments come first). A score more than ``Cτ`` from the k-th largest
counts as ``Cτ`` away in the solve (``C = 300``): the masks, taken from the exact scores, move by
less than ``e^{-C/2}``. ``k > n/2`` uses ``m(x, k) = 1 - m(-x, n-k)``; a
per-row tensor ``k`` sorts the whole row (``K = n``, the last segment has every entry above ``t``).

**±inf in the same pass.** The candidates are clamped to the finite range: then the degenerate rows
of :mod:`softtopk._extended` come out of the same solve as ties at the end of the range: ``p >= k``
entries at ``+inf`` (the k-th candidate is ``+inf``) tie at the top and share ``k``; with at most
``k`` entries above ``-inf`` (the (k+1)-th candidate is ``-inf``) those are selected and the
``-inf`` entries tie and share the rest. Those rows get gradient 0; in the others a ``+inf`` entry
has mask 1 and a ``-inf`` entry mask 0, both with gradient 0 (``e^{∓inf} = 0``).

**Analytic backward, O(n).** With ``d_i = F'(z_i)/τ`` and ``w = d / Σd`` (implicit function theorem
on ``Σ m = k``): ``∂L/∂x = d ⊙ (g - Σ w g)``, ``∂L/∂k = Σ w g`` and, as the threshold cancels,
``∂L/∂τ = -(1/τ) Σ (x - r) ∂L/∂x`` for any per-row ``r``. The forward saves ``d`` (the rest of the
row has ``d = m/τ``, a scale of the exponential sum's terms).

Reference: Struski et al., "LapSum - One Method to Differentiate Them All" (ICML 2025) for the
Laplace-CDF sum; the threshold search above is this library's.
"""

from __future__ import annotations

import math

import torch

from . import lapsum_numba, lapsum_triton, triton_gate
from ._function import Function
from .compute import LOG2E, compute_dtype, constant, muladd_rows, put_rows, row_dot, scan_rows, sort_rows, topk_rows

_WIDE = torch.float64
_C = 300.0  # |a| clamp: e^{±C} and the products of the sums stay normal float64 numbers
_FLOOR = 1e-150  # stands for an empty sum in P (no entry above) and Q (no entry below)
_LN2 = math.log(2.0)


def _at(vals: torch.Tensor, k: int | torch.Tensor, offset: float) -> torch.Tensor:
    """``vals[:, ceil(k + offset) - 1]`` as (B, 1): the k-th (``offset = 0``) or (floor k + 1)-th
    (``offset = 1``, for a fractional ``k`` too) largest."""
    if isinstance(k, int):
        return vals[:, k - 1 + int(offset) : k + int(offset)]
    index = (k.floor() + offset if offset else k.ceil()).long() - 1
    return vals.gather(-1, index.clamp(0, vals.shape[-1] - 1).expand(vals.shape[0], 1))


def _roots(a: torch.Tensor, e: torch.Tensor, rest: torch.Tensor, k: int | torch.Tensor):
    """``t'`` (B, 1) from the clamped scaled candidates ``a`` (B, K, descending, float64),
    ``e = e^a`` and the rest's ``Σ e^a`` (B, 1), positive."""
    big = a.shape[-1]
    p = scan_rows(torch.nn.functional.pad(e.reciprocal(), (1, 0), value=_FLOOR))  # P_j, j = 0..K
    q = scan_rows(torch.cat([e, rest], -1).flip(-1)).flip(-1)  # Q_j, j = 0..K
    if isinstance(k, int):  # c = k - j
        c = constant(tuple(range(k, k - big - 1, -1)), a)
    else:
        c = k.to(_WIDE) - torch.arange(big + 1, device=a.device, dtype=_WIDE)
    g = (p * q).rsqrt_()
    roots = (q * g).log_().sub_(torch.asinh(c * g))  # ½ log(Q/P) - asinh(c/√PQ)
    j = (roots[:, :big] < a).sum(-1, keepdim=True)
    return roots.gather(-1, j)


def _solve(x: torch.Tensor, tau: float | torch.Tensor, k: int | torch.Tensor, big: int, negate: bool):
    """The soft mask's pieces for rows ``x`` (B, n) (the complement's, ``1 - m(-x)``, with
    ``negate``): candidate indices (B, K), their masks and ``d`` (B, K), the exponential terms of
    the row (B, n, or None when ``K = n``) with the affine map ``(scale, shift)`` giving the other
    entries' masks and their ``d`` scale, the per-row reference score (of ``±x``) and the rows without
    gradient in ``x``."""
    n = x.shape[-1]
    info = torch.finfo(x.dtype)
    if big == n:
        vals, idx = sort_rows(x, descending=not negate)
    else:
        vals, idx = topk_rows(x, big, largest=not negate)
    top = -math.inf if negate else math.inf  # +inf of the scores ±x
    # ±inf become the ends of the finite range: the degenerate rows solve as ties there
    clamped = vals.clamp(info.min, info.max)
    ref = _at(clamped, k, 0.0)
    short = _at(vals, k, 1.0) == -top  # at most k entries above -inf
    drop = (_at(vals, k, 0.0) == top) | short  # degenerate: no gradient in x
    # (±x - ref)/τ, descending, in float64
    scaled = (
        (torch.sub(ref, clamped) if negate else torch.sub(clamped, ref))
        .to(_WIDE)
        .div_(tau.to(_WIDE) if isinstance(tau, torch.Tensor) else tau)
    )
    a = scaled.clamp(-_C, _C)
    e = a.exp()
    if big == n:
        terms, rest = None, torch.full_like(scaled[:, :1], _FLOOR)
    else:
        # Σ_{not among the K largest} e^{(±x - s_K)/τ}, every term in [0, 1]: the candidates count 1
        # each, but a -inf one counts 0 (then the rest is all -inf, and the clamp gives 0); a short
        # row's rest is its -inf entries, tied with the last candidate
        last = clamped[:, -1:]
        terms = (torch.sub(last, x) if negate else torch.sub(x, last)).mul_(LOG2E / tau).clamp(max=0.0).exp2_()
        # (summed in the score dtype: a float64 sum of float32 terms casts the whole row first)
        count = terms.sum(-1, keepdim=True).to(_WIDE).sub_(big).clamp_min(1e-30)
        rest = count.masked_fill_(short, n - big).mul_(e[:, -1:])
    tt = _roots(a, e, rest, k)
    z = scaled - tt
    half = torch.rsub(z.abs(), -_LN2).exp_().to(x.dtype)  # F'(z) = e^{-|z|} / 2
    above = z >= 0
    m_top = torch.where(above, 1 - half, half)
    if negate:  # 1 - m(-x), as it rounds: exactly 0 where m(-x) rounds to 1
        m_top = 1 - m_top
    # a degenerate row has no gradient in x: cut here for an int k, in backward for a tensor k,
    # whose gradient the model's d gives (the tied entries' mean upstream gradient)
    d_top = half / tau
    if not isinstance(k, torch.Tensor):
        d_top = d_top.masked_fill_(drop, 0.0)
    # F'(z) = F(z) of the last candidate, below t: the other entries' scale (of m and of d)
    scale, d_scale = half[:, -1:], d_top[:, -1:]
    shift = scale * short  # a short row's -inf entries outside the candidates
    return idx, terms, (m_top, d_top, scale, shift, d_scale), ref, drop


def _assemble(base: torch.Tensor, terms, idx, top, scale, shift=None, negate=False) -> torch.Tensor:
    """A row quantity: ``terms * scale + shift`` (``1 - ...`` with ``negate``) with the candidates'
    values ``top`` in place."""
    if terms is None:  # the candidates are the whole row
        return torch.scatter(base, -1, idx, top)
    if shift is None:
        rest = terms * scale
    else:
        rest = muladd_rows(terms, scale, 1 - shift, value=-1.0) if negate else muladd_rows(terms, scale, shift)
    return put_rows(rest, idx, top)


class _LaplaceMask(Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, tau, k, big: int, negate: bool = False, hard: int = 0):
        # x (B, n); tau a float or broadcastable to (B, 1); k an int or (B, 1); big = K candidates;
        # hard > 0: the output is the k-hot mask of torch.topk(x, hard), the gradient the soft one's
        idx, terms, (m_top, d_top, scale, shift, d_scale), ref, drop = _solve(x, tau, k, big, negate)
        d = _assemble(x, terms, idx, d_top, d_scale)
        if hard:
            mask = put_rows(torch.zeros_like(x), x.topk(hard, -1).indices, 1.0)
        else:
            mask = _assemble(x, terms, idx, m_top, scale, shift, negate)
        return mask, d, ref, drop

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, tau, k = inputs[:3]
        negate = len(inputs) > 4 and inputs[4]
        _, d, ref, drop = output
        tau_t = tau if isinstance(tau, torch.Tensor) else None
        ctx.save_for_backward(x, d, ref, drop, tau_t)
        ctx.negate = negate
        ctx.k_shape = k.shape if isinstance(k, torch.Tensor) else None
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*output[1:])

    @staticmethod
    @torch.autograd.function.once_differentiable  # d is saved without its graph: a second derivative raises
    def backward(ctx, grad: torch.Tensor, *_):
        x, d, ref, drop, tau_t = ctx.saved_tensors
        none = (None,) * (len(ctx.needs_input_grad) - 3)
        if grad is None:
            return None, None, None, *none
        return (*_backward(ctx, x, d, ref, drop, tau_t, grad), *none)


class _LaplaceWeights(Function):
    """The mask at ``index`` (B, k), ``torch.topk(x, k)``'s (``2k <= n``): the first ``k``
    candidates' masks, the same values, without the row's mask; ones forward with ``hard``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, tau, k: int, index: torch.Tensor, hard: bool):
        idx, terms, (m_top, d_top, _, _, d_scale), ref, drop = _solve(x, tau, k, 2 * k, False)
        d = _assemble(x, terms, idx, d_top, d_scale)
        weights = torch.ones_like(m_top[:, :k]) if hard else m_top[:, :k]
        return weights, d, d_top[:, :k], ref, drop

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, tau, _, index, _ = inputs
        _, d, picked, ref, drop = output
        ctx.save_for_backward(x, index, d, picked, ref, drop, tau if isinstance(tau, torch.Tensor) else None)
        ctx.negate, ctx.k_shape = False, None
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*output[1:])

    @staticmethod
    @torch.autograd.function.once_differentiable  # d is saved without its graph: a second derivative raises
    def backward(ctx, grad: torch.Tensor, *_):
        x, index, d, picked, ref, drop, tau_t = ctx.saved_tensors
        if grad is None:
            return None, None, None, None, None
        picked = picked * grad  # d g at the k entries, 0 elsewhere
        gbar = picked.sum(-1, keepdim=True) / d.sum(-1, keepdim=True).clamp_min_(torch.finfo(d.dtype).tiny)
        grad_x = (d * -gbar).scatter_add_(-1, index, picked)
        return (
            (grad_x if ctx.needs_input_grad[0] else None),
            _tau_grad(ctx, x, d, ref, drop, tau_t, grad_x),
            None,
            None,
            None,
        )


def lapsum_topk(
    x: torch.Tensor, k: int, dim: int, largest: bool, *, tau: float | torch.Tensor = 1.0, hard: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.topk(x, k, dim, largest)`` with the Laplace mask at the chosen entries
    (differentiable; ones forward with ``hard``): ``(values, indices, weights)``; a tensor ``tau``
    is (B, 1), aligned with the rows of ``x`` along ``dim``."""
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).to(compute_dtype(x.dtype))
    rows = rows if largest else -rows
    tau = tau.to(rows.dtype) if isinstance(tau, torch.Tensor) else tau
    values, index = rows.topk(k, -1)
    if isinstance(tau, float) and k < rows.shape[-1] and (kernels := _kernels(rows, k, tau)) is not None:
        weights = lapsum_triton.kernel_mask(rows, k, tau, hard=hard, clamp=_C, floor=_FLOOR, fn=kernels)
        weights = weights.gather(-1, index)
    elif 2 * k <= rows.shape[-1]:
        weights = _LaplaceWeights.apply(rows, tau, k, index, hard)[0]
    else:
        weights = lapsum_mask(rows, k, tau, hard=hard).gather(-1, index)
    values = values if largest else -values

    def back(t: torch.Tensor) -> torch.Tensor:  # (B, k) -> x's layout along ``dim``
        return t.reshape(*moved.shape[:-1], k).movedim(-1, dim)

    return back(values.to(x.dtype)), back(index), back(weights.to(x.dtype))


def _kernels(x: torch.Tensor, k: int, tau: float):
    """The Function of the kernels that compute the mask of rows ``x`` here (Triton on a GPU,
    numba on a CPU), or None for the torch path."""
    if triton_gate.usable(x, k, tau):
        return lapsum_triton.TritonLaplaceMask
    return lapsum_numba.NumbaLaplaceMask if lapsum_numba.usable(x, k, tau) else None


def _backward(ctx, x, d, ref, drop, tau_t, grad):
    """``d ⊙ (g - ḡ)`` with ``ḡ = Σ d g / Σ d``, and the gradients of ``τ`` and ``k``."""
    dot = row_dot(d, grad)
    gbar = dot / d.sum(-1, keepdim=True).clamp_min_(torch.finfo(d.dtype).tiny)  # Σd = 0: a hard row
    grad_x = grad_k = None
    if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
        grad_x = (grad - gbar).mul_(d)
        if ctx.k_shape is not None:
            grad_x = grad_x.masked_fill_(drop, 0.0)
    if ctx.needs_input_grad[2]:
        grad_k = _sum_to(gbar, ctx.k_shape)
    return (grad_x if ctx.needs_input_grad[0] else None), _tau_grad(ctx, x, d, ref, drop, tau_t, grad_x), grad_k


def _tau_grad(ctx, x, d, ref, drop, tau_t, grad_x):
    """``∂L/∂τ = -(1/τ) Σ (x - ref) ∂L/∂x`` (None unless ``τ`` is a tensor that needs it)."""
    if not ctx.needs_input_grad[1]:
        return None
    # the ±inf entries (d = 0) and degenerate rows left out; -x's reference for the complement
    centred = (torch.sub(ref, x) if ctx.negate else torch.sub(x, ref)).masked_fill_((d == 0) | drop, 0.0)
    grad_tau = -torch.linalg.vecdot(centred, grad_x).unsqueeze(-1) / tau_t
    return _sum_to(-grad_tau if ctx.negate else grad_tau, tau_t.shape)


def _sum_to(value: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a (B, 1) gradient to a broadcast input's ``shape`` (scalar or (B, 1))."""
    return value.sum().reshape(shape) if value.shape != shape else value


def lapsum_mask(
    x: torch.Tensor, k: int | torch.Tensor, tau: float | torch.Tensor = 1.0, *, hard: bool = False
) -> torch.Tensor:
    """Laplace-CDF soft top-k mask of rows ``x`` (B, n) (``±inf`` as in :mod:`softtopk._extended`);
    ``k`` an int or a (B, 1) tensor in (0, n]; ``tau`` a positive float or a tensor broadcastable
    to (B, 1). Returns (B, n), summing to ``k``; ``hard``: the k-hot mask of ``torch.topk`` forward
    (int ``k``), this mask's gradient backward."""
    n = x.shape[-1]
    if isinstance(tau, torch.Tensor):
        tau = tau.to(x.dtype)
    if isinstance(k, torch.Tensor):
        k_t = k.to(x.dtype)
        # k = n: every entry above -inf is 1 and the q entries at -inf share k - (n - q) (their
        # gradient in k is 1/q); the kernel gets a harmless k there (no NaN backward)
        full = k_t >= n
        mask = _LaplaceMask.apply(x, tau, torch.where(full, 0.5 * n, k_t), n)[0]
        neg = x == -math.inf
        share = (k_t - n) / neg.sum(-1, keepdim=True).clamp_min(1)
        return torch.where(full, torch.where(neg, share + 1, 1.0), mask)
    if k >= n:
        return torch.where(x.isnan(), x, 1.0)
    if isinstance(tau, float) and (kernels := _kernels(x, k, tau)) is not None:
        return lapsum_triton.kernel_mask(x, k, tau, hard=hard, clamp=_C, floor=_FLOOR, fn=kernels)
    if 2 * k > n:
        return _LaplaceMask.apply(x, tau, n - k, min(2 * (n - k), n), True, k if hard else 0)[0]
    return _LaplaceMask.apply(x, tau, k, 2 * k, False, k if hard else 0)[0]
