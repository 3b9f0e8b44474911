r"""Soft ranks and soft sorts of rows: projections onto the permutahedron (Blondel et al., ICML 2020).

With ``w = (n, n-1, ..., 1)``, ``ε`` the regularisation strength and ``s`` the row sorted in
decreasing order (``σ`` its permutation):

* rank, l2: ``r = P(x/ε)``, the Euclidean projection onto the permutahedron of ``w``:
  ``r_σ = s/ε - v`` with ``v`` the decreasing isotonic fit of ``s/ε - w``;
* rank, kl: ``r_σ = exp(s/ε - v)``, ``v`` the kl isotonic solution of ``(s/ε, log w)``;
* sort, l2: ``h = w/ε - v``, ``v`` the decreasing isotonic fit of ``w/ε - s``;
* sort, kl: ``h = w/ε - v``, ``v`` the kl isotonic solution of ``(w/ε, s)``.

Ascending ranks (the largest entry gets rank ``n``) and the ascending sort are those of the
negated row (``sign = -1`` for the sort, as in the reference implementation). The isotonic
problems are solved exactly by :mod:`softtopk.ops.isotonic`, in float64.

**Backward** (the Jacobian of isotonic regression is block-wise; O(n)). With ``g`` the incoming
gradient in sorted order and ``mean_B``/``sum_B`` over each pooled block: rank l2
``∂s = (g - mean_B g)/ε``; rank kl ``∂s = (g r - r sum_B(g r)/sum_B w)/ε``; sort l2 ``∂s = mean_B g``;
sort kl ``∂s = softmax_B(s) sum_B g``. A per-row ``ε`` gets ``∂ε = -<∂θ, θ>/ε`` for ranks
(``r`` depends on ``x/ε`` only) and ``-<g - mean_B g, w>/ε²`` (l2) or ``-<g, w - Σ_B softmax_B(w/ε) w>/ε²``
(kl) for sorts.

**±inf** (``softtopk._extended``): ranks are the exact limits: the ``p`` entries at ``+inf`` share
the top ``p`` ranks equally, the ``q`` at ``-inf`` the bottom ``q``, and the finite entries are
projected onto the permutahedron of the ranks in between. Sorts put the ``+inf`` and ``-inf``
entries at their ends and soft-sort the finite entries as though the infinite ones were absent
(the l2 and kl sorts are invariant to the shift of ``w`` that this is). Infinite entries have
gradient 0. A row holding a NaN is NaN.
"""

from __future__ import annotations

import math

import torch

from . import isotonic_numba, permutahedron_triton
from ._function import Function
from .compute import can_inspect, sort_rows, unsort
from .isotonic import block_ids, block_starts, block_sum, isotonic_kl, isotonic_l2


def _plain(rows: torch.Tensor) -> bool:
    """Whether ``rows`` are known to be finite: checked (one read) only where values may be read
    (a CPU tensor outside compile and vmap); the ``±inf``/NaN handling is then skipped. A finite
    sum has finite terms (an infinite or NaN term makes it infinite or NaN); only a sum that is not
    finite, an overflow or a non-finite entry, needs the entries' own check."""
    if not can_inspect(rows):
        return False
    return math.isfinite(rows.detach().sum()) or bool(rows.isfinite().all())


def _fused(grad: torch.Tensor) -> bool:
    """Whether the backward may run as one numba pass: ``grad``'s values may be read and the
    backward records no graph of its own (``create_graph`` enables grad mode in it)."""
    return can_inspect(grad) and not torch.is_grad_enabled() and isotonic_numba.available()


def _kernel_grad(ctx, grad: torch.Tensor) -> bool:
    """Whether the backward runs on :mod:`softtopk.ops.permutahedron_triton`'s kernel: no strength
    gradient asked for, no graph recorded (``create_graph``), rows the kernels take."""
    plain_backward = not ctx.needs_input_grad[1] and not torch.is_grad_enabled()
    return plain_backward and permutahedron_triton.usable(grad, ctx.eps)


def _again(x, sign: float, perm, saved):
    """The sorted row ``sign * x`` (float64) recomputed from ``x`` with autograd, where the saved
    one (``saved``) is finite, for a backward that records its graph (``create_graph``): the
    second derivative then sees what the saved, non-differentiable outputs hide."""
    s = (x * sign).gather(-1, perm).to(torch.float64)
    return torch.where(saved.isfinite(), s, saved)


def _ranks_again(x, eps, sign: float, perm, v, r, theta, plain: bool, kl: bool):
    """``r`` (kl) and ``θ`` of a soft rank recomputed with autograd (:func:`_again`): within a kl
    block ``r = exp(θ - v_B) = softmax_B(θ) Σ_B w``; ``θ`` enters the strength's gradient."""
    finite = theta.isfinite()
    th = torch.where(finite, _relative(_again(x, sign, perm, theta), eps, plain), theta)
    if kl:
        ids, first = block_ids(v), block_starts(v)
        soft = _softmax_blocks(torch.where(finite, th, 0.0), ids, first) * block_sum(_weights(v).expand_as(v), ids)
        r = torch.where(finite, soft, r)
    return r, th


def _sorted(rows: torch.Tensor, sign: float, plain: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sign * rows`` sorted in decreasing order (float64; NaN read as 0), its permutation, the
    rows holding a NaN (B, 1): by the radix sort where it pays (faster than ``torch.sort``), else
    by :func:`~softtopk.ops.compute.sort_rows`."""
    nan = None if plain else rows.isnan()
    clean = rows if nan is None else torch.where(nan, 0.0, rows)
    if isotonic_numba.radix_pays(rows):
        s, perm = isotonic_numba.sorted_rows(clean, sign)
    else:
        s, perm = sort_rows(clean if sign == 1 else clean * sign, descending=True, finite=plain)
    flags = torch.zeros_like(s[:, :1], dtype=torch.bool) if nan is None else nan.any(-1, keepdim=True)
    return s.to(torch.float64), perm, flags


def _prepared(x: torch.Tensor, eps: float | torch.Tensor, sign: float, plain: bool):
    """:func:`_sorted`'s ``(s, perm, nan)`` and the strength in float64."""
    return *_sorted(x, sign, plain), eps.to(torch.float64) if isinstance(eps, torch.Tensor) else eps


def _separated(v0: torch.Tensor, finite: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """``v0`` with its infinite positions replaced by constants that never pool with a finite
    one: above every finite value at the ``top`` positions, below at the others."""
    hi = torch.where(finite, v0, -torch.inf).amax(-1, keepdim=True)
    lo = torch.where(finite, v0, torch.inf).amin(-1, keepdim=True)
    # strictly outside the finite values, whatever their magnitude
    hi = torch.where(hi.isfinite(), hi + 1 + hi.abs(), 0.0)
    lo = torch.where(lo.isfinite(), lo - 1 - lo.abs(), 0.0)
    return torch.where(finite, v0, torch.where(top, hi, lo))


def _solve(
    y: torch.Tensor, lw: torch.Tensor | None, finite: torch.Tensor, top: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """l2 (``lw`` None) or kl isotonic solution with the infinite positions kept apart, and the
    value each point has unpooled as the solver computes it (``y``; ``y - lw`` for kl): a
    singleton block's value, bitwise, so that ``v - base`` is exactly 0 there."""
    if lw is None:
        y = _separated(y, finite, top)
        return isotonic_l2(y), y
    lw = torch.where(finite, lw, 0.0)
    y = _separated(torch.where(finite, y, 0.0) - lw, finite, top) + lw
    return isotonic_kl(y, lw), y - lw


def _relative(s: torch.Tensor, eps: float | torch.Tensor, plain: bool) -> torch.Tensor:
    """``θ = s/ε`` of the decreasing rows ``s`` up to a constant on each run of entries whose gaps
    ``(s_i - s_{i+1})/ε`` stay below ``2n + 2``: minus the cumulative sum of the gaps, each clamped
    there (``±inf`` entries stay ``±inf``). A block of the isotonic solution never spans a gap above
    ``n - 1`` (l2) or ``3 log n`` (kl), and the ranks are invariant to a constant added to a run of
    whole blocks, so they are those of ``s/ε``; but ``s/ε`` itself loses ``w`` once it is far above
    ``2^53`` (ties then get distinct ranks, a row's ranks no longer sum to ``n(n+1)/2``) and
    overflows for ``|s| > 1.8e308 ε`` (NaN), while the clamped sums stay below ``n(2n + 2)``.
    ``plain``: the rows are finite (no ``inf - inf`` gap, no infinite entry to keep)."""
    bound = 2.0 * s.shape[-1] + 2.0
    steps = torch.diff(s, dim=-1).div_(eps)  # -gaps, <= 0; -inf where a difference overflows
    if not plain:  # inf - inf between two +inf (or -inf) entries
        steps = steps.nan_to_num_(nan=-bound)
    theta = torch.nn.functional.pad(steps.clamp_min(-bound), (1, 0)).cumsum(-1)  # vmap: no rule for clamp_
    return theta if plain else torch.where(s.isfinite(), theta, s)


def _weights(rows: torch.Tensor) -> torch.Tensor:
    """``w = (n, n-1, ..., 1)`` in float64 for rows ``(B, n)``, on their device."""
    return torch.arange(rows.shape[-1], 0, -1, device=rows.device, dtype=torch.float64)


def _nan_rows(grad: torch.Tensor, nan: torch.Tensor, plain: bool) -> torch.Tensor:
    """NaN gradients in the rows that hold a NaN (their values are NaN); none if ``plain``."""
    return grad if plain else torch.where(nan, torch.nan, grad)


def _softmax_blocks(z: torch.Tensor, ids: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """``softmax`` of ``z`` (decreasing within each block) over each point's block; ``first``: each
    point's block start."""
    e = (z - z.gather(-1, first)).exp()
    return e / block_sum(e, ids)


class SoftRankFn(Function):
    """Soft ranks of rows ``x`` (B, n) with strength ``eps`` (a float or (B, 1)); ``sign = 1``
    gives rank ``n`` to the largest entry. Returns float64 ranks (in ``x``'s dtype from the numba
    kernels where it is float32)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, eps: float | torch.Tensor, sign: float, kl: bool, plain: bool):
        if permutahedron_triton.usable(x, eps):  # CUDA: one kernel after the sort
            return permutahedron_triton.forward(x, eps, sign, rank=True, kl=kl)
        s, perm, nan, eps64 = _prepared(x, eps, sign, plain)
        if plain and isotonic_numba.available():  # the whole forward in one pass
            out, r, v, theta = isotonic_numba.rank(s, perm, eps64, kl, x.dtype)  # out: x's dtype
            return out, v, r, theta, perm, nan
        theta = _relative(s, eps64, plain)
        w = _weights(s)
        # r = θ - v (l2) or exp(θ - v) (kl), written through v - base, exactly 0 on unpooled
        # points (their ranks are then w exactly, whatever the magnitude of θ)
        if plain:
            if kl:
                lw = w.log().expand_as(theta)
                v, base = isotonic_kl(theta, lw), theta - lw
            else:
                base = theta - w
                v = isotonic_l2(base)
            r = (base - v).exp_().mul_(w) if kl else w - (v - base)
            return unsort(r, perm), v, r, theta, perm, nan
        finite = theta.isfinite()
        top = theta > 0
        # the infinite entries share their ranks: the mean of w over the top p (bottom q) positions
        p = (theta == torch.inf).sum(-1, keepdim=True)
        q = (theta == -torch.inf).sum(-1, keepdim=True)
        shared = torch.where(top, s.shape[-1] - (p - 1) / 2, (q + 1) / 2).to(torch.float64)
        if kl:
            v, base = _solve(theta, w.log().expand_as(theta), finite, top)
            r = torch.where(finite, (base - v).exp() * w, shared)
        else:
            v, base = _solve(theta - w, None, finite, top)
            r = torch.where(finite, w - (v - base), shared)
        out = unsort(r, perm)
        return torch.where(nan, torch.nan, out), v, r, theta, perm, nan

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, eps, sign, kl, ctx.plain = inputs
        _, v, r, theta, perm, nan = output
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)  # no zero gradients for the auxiliary outputs
        ctx.tensor_eps = isinstance(eps, torch.Tensor)
        ctx.save_for_backward(v, r, theta, perm, nan, x, *([eps] if ctx.tensor_eps else []))
        ctx.eps, ctx.sign, ctx.kl, ctx.dtype = (None if ctx.tensor_eps else eps), sign, kl, x.dtype

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:  # the values' gradient is undefined (gradients are not materialised)
            return None, None, None, None, None
        v, r, theta, perm, nan, x, *eps = ctx.saved_tensors
        eps = eps[0].to(torch.float64) if eps else ctx.eps
        if ctx.plain and not ctx.needs_input_grad[1] and _fused(grad):
            return isotonic_numba.rank_grad(grad, perm, v, r, ctx.kl, ctx.sign / eps, ctx.dtype), None, None, None, None
        if _kernel_grad(ctx, grad):
            grad_x = permutahedron_triton.backward(grad, perm, v, theta, r, nan, ctx.sign / eps, True, ctx.kl)
            return grad_x, None, None, None, None
        if torch.is_grad_enabled():  # create_graph
            r, theta = _ranks_again(x, eps, ctx.sign, perm, v, r, theta, ctx.plain, ctx.kl)
        ids = block_ids(v)
        g = grad.to(torch.float64).gather(-1, perm)
        if ctx.kl:
            gr = g * r
            d_theta = gr - r * block_sum(gr, ids) / block_sum(_weights(v).expand_as(v), ids)
        else:
            d_theta = g - block_sum(g, ids) / block_sum(torch.ones_like(g), ids)
        if not ctx.plain:
            finite = theta.isfinite()
            d_theta, theta = torch.where(finite, d_theta, 0.0), torch.where(finite, theta, 0.0)
        grad_x = unsort(d_theta, perm) * (ctx.sign / eps)
        grad_eps = None
        if ctx.needs_input_grad[1]:
            inner = torch.linalg.vecdot(d_theta, theta).unsqueeze(-1)
            grad_eps = _nan_rows(-inner / eps, nan, ctx.plain).to(ctx.saved_tensors[-1].dtype)
        return _nan_rows(grad_x, nan, ctx.plain).to(ctx.dtype), grad_eps, None, None, None


class SoftSortFn(Function):
    """Soft sort of rows ``x`` (B, n) with strength ``eps``; ``sign = -1`` sorts in increasing
    order. Returns the float64 sorted values (as :class:`SoftRankFn`, ``x``'s float32 from numba)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, eps: float | torch.Tensor, sign: float, kl: bool, plain: bool):
        if permutahedron_triton.usable(x, eps):  # CUDA: one kernel after the sort
            return permutahedron_triton.forward(x, eps, sign, rank=False, kl=kl)
        s, perm, nan, eps64 = _prepared(x, eps, sign, plain)
        if plain and isotonic_numba.available():  # the whole forward in one pass
            h, v = isotonic_numba.sort(s, eps64, kl, sign, x.dtype)
            return h, v, s, perm, nan
        ws = (_weights(s) / eps64).expand_as(s)
        # h = w/ε - v, written s - (v - base): exactly s on unpooled points (the hard sort as
        # ε -> 0), not the difference of two numbers of the size of w/ε
        if plain:
            base = ws - s
            v = isotonic_kl(ws, s) if kl else isotonic_l2(base)
            return (s - (v - base)) * sign, v, s, perm, nan
        finite = s.isfinite()
        top = s > 0
        v, base = _solve(ws, s, finite, top) if kl else _solve(ws - s, None, finite, top)
        h = torch.where(finite, s - (v - base), s) * sign
        return torch.where(nan, torch.nan, h), v, s, perm, nan

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, eps, sign, kl, ctx.plain = inputs
        _, v, s, perm, nan = output
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)  # no zero gradients for the auxiliary outputs
        ctx.tensor_eps = isinstance(eps, torch.Tensor)
        ctx.save_for_backward(v, s, perm, nan, x, *([eps] if ctx.tensor_eps else []))
        ctx.eps, ctx.sign, ctx.kl, ctx.dtype = (None if ctx.tensor_eps else eps), sign, kl, x.dtype

    @staticmethod
    def backward(ctx, grad, *_):
        if grad is None:  # the values' gradient is undefined (gradients are not materialised)
            return None, None, None, None, None
        v, s, perm, nan, x, *eps = ctx.saved_tensors
        eps = eps[0].to(torch.float64) if eps else ctx.eps
        if ctx.plain and not ctx.needs_input_grad[1] and _fused(grad):
            return isotonic_numba.sort_grad(grad, perm, v, s, ctx.kl, ctx.dtype), None, None, None, None
        if _kernel_grad(ctx, grad):
            return permutahedron_triton.backward(grad, perm, v, s, s, nan, 1.0, False, ctx.kl), None, None, None, None
        if torch.is_grad_enabled():  # create_graph: the kl block softmax of s depends on x
            s = _again(x, ctx.sign, perm, s)
        ids = block_ids(v)
        g = grad.to(torch.float64)
        if not ctx.plain:
            finite = s.isfinite()
            g, s = torch.where(finite, g, 0.0), torch.where(finite, s, 0.0)
        total = block_sum(g, ids)
        if ctx.kl:
            first = block_starts(v)
            d_s = _softmax_blocks(s, ids, first) * total
        else:
            d_s = total / block_sum(torch.ones_like(g), ids)
        if not ctx.plain:
            d_s = torch.where(finite, d_s, 0.0)
        grad_x = unsort(d_s, perm)
        grad_eps = None
        if ctx.needs_input_grad[1]:
            w = _weights(v).expand_as(v)
            if ctx.kl:
                centred = w - block_sum(_softmax_blocks(w / eps, ids, first) * w, ids)
                inner = torch.linalg.vecdot(g, centred if ctx.plain else torch.where(finite, centred, 0.0))
            else:
                inner = torch.linalg.vecdot(g - d_s, w)
            grad_eps = _nan_rows(-ctx.sign * inner.unsqueeze(-1) / eps**2, nan, ctx.plain)
            grad_eps = grad_eps.to(ctx.saved_tensors[-1].dtype)
        return _nan_rows(grad_x, nan, ctx.plain).to(ctx.dtype), grad_eps, None, None, None


def soft_rank_rows(x: torch.Tensor, eps: float | torch.Tensor, *, kl: bool, descending: bool) -> torch.Tensor:
    """Soft ranks of rows ``x`` (B, n), ``1..n`` (rank ``n`` to the largest; rank 1 with
    ``descending``), in ``x``'s dtype."""
    if x.numel() == 0:
        return x * 1
    return SoftRankFn.apply(x, eps, -1.0 if descending else 1.0, kl, _plain(x))[0].to(x.dtype)


def soft_sort_rows(x: torch.Tensor, eps: float | torch.Tensor, *, kl: bool, descending: bool) -> torch.Tensor:
    """Soft sort of rows ``x`` (B, n), increasing (decreasing with ``descending``), in ``x``'s dtype."""
    if x.numel() == 0:
        return x * 1
    return SoftSortFn.apply(x, eps, 1.0 if descending else -1.0, kl, _plain(x))[0].to(x.dtype)
