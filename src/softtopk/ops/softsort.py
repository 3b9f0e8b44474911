"""SoftSort (Prillo & Eisenschlos, ICML 2020): a softmax over distances to the sorted scores.

For scores :math:`s` with descending sort :math:`\\tilde s` and rank :math:`r` (0 = largest),

.. math::
    P[i, r] = \\operatorname{softmax}_i\\big(-|s_i - \\tilde s_r|^{p} / \\tau\\big).

Each rank column sums to 1; rows need not. Top-k ranks cost ``O(n k)`` (only the top ``k`` sorted
values are needed), in one :class:`torch.autograd.Function` whose backward is the softmax's and
the distances' in a few fused steps: with :math:`\\delta = P \\odot (g - \\bar g_r)` (``g`` the
incoming gradient, :math:`\\bar g_r = \\sum_i P_{ir} g_i`) and :math:`w = \\delta\\, D'/\\tau`
(:math:`D'` the slope of the distance), :math:`\\partial s_i = -\\sum_r w_{ir}` directly and
:math:`\\partial \\tilde s_r = \\sum_i w_{ir}` through the sort;
:math:`\\partial\\tau = -\\frac1\\tau \\sum \\delta \\log P` (the column's log-normaliser drops out,
and ``0 log 0 = 0``, so entries of weight 0 add nothing however far they are).

Infinite scores (the semantics of :mod:`softtopk._extended`) are handled in the kernel: ``±inf``
become the dtype's largest finite magnitude, so that an infinite entry is at distance 0 from the
equal sorted values (the ``+inf`` entries share the first ranks, the ``-inf`` entries the ranks past
the finite ones, equally) and infinitely far, weight exactly 0, from every other; their gradient
is 0. In a row with at most ``k`` entries above ``-inf`` the mask is 1 on those entries (gradient
0). Both limits are exact while ``tau`` is below about ``1e36`` and finite scores below ``1e38``.

Reference: S. Prillo, J. Eisenschlos, "SoftSort: A Continuous Relaxation for the argsort Operator",
ICML 2020.
"""

from __future__ import annotations

import torch

from . import softsort_triton
from ._function import Function
from .compute import sort_rows, topk_rows


class _SoftSort(Function):
    """``(x (B, n), tau)`` → the mask ``Σ_r P`` (B, n) (``reduce``) or the ranks ``P`` laid out
    (B, k, n): each softmax runs along contiguous memory."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, tau, k, power, reduce):
        n = x.shape[-1]
        xs = x.nan_to_num(nan=float("nan"))  # ±inf → ±max, NaN stays
        # a full sort for k = n gives tied scores the original's gradient split (its sort's); topk
        # splits them by its own order (docs/compat.md lists the difference); one more sorted value
        # tells the rows with at most k entries above -inf
        if k == n:
            top, index = sort_rows(xs, descending=True)
        else:
            top, index = topk_rows(xs, k + 1)
        diff = xs.unsqueeze(-2) - top[..., :k].unsqueeze(-1)
        if power != 1.0:
            # capped where its power overflows but its slope does not (a zero weight's slope stays finite)
            cap = torch.finfo(x.dtype).max ** (1.0 / power) * 2.0
            slope = diff.clamp(-cap, cap)
            distance = slope.abs().pow(power)
            slope = slope.abs().pow(power - 1.0).mul_(slope.sign()).mul_(power)
        else:
            distance, slope = diff.abs(), diff.sign()
        if isinstance(tau, torch.Tensor):
            ranks = torch.softmax(distance.neg_() / tau.unsqueeze(-1), dim=-1)
        else:
            ranks = torch.softmax(distance / -tau, dim=-1)
        if not reduce:
            return ranks, None, slope, index[..., :k], None
        low = torch.finfo(x.dtype).min
        # rows with at most k < n entries above -inf select them all, with gradient 0
        chosen = (xs > low) & (top[..., k:] == low)
        return ranks.sum(-2).masked_fill_(chosen, 1.0), ranks, slope, index[..., :k], chosen

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, tau, _, _, ctx.reduce = inputs
        ctx.set_materialize_grads(False)
        out, ranks, slope, index, chosen = output
        if ctx.reduce:
            ctx.mark_non_differentiable(ranks, slope, index, chosen)
        else:
            ranks = out
            ctx.mark_non_differentiable(slope, index)
        ctx.tau_tensor = isinstance(tau, torch.Tensor)
        ctx.tau = None if ctx.tau_tensor else tau
        ctx.save_for_backward(ranks, slope, index, chosen, tau if ctx.tau_tensor else None)

    @staticmethod
    @torch.autograd.function.once_differentiable  # P is saved without its graph: a second derivative raises
    def backward(ctx, grad, *_):
        if grad is None:
            return None, None, None, None, None
        ranks, slope, index, chosen, tau_t = ctx.saved_tensors
        tau = tau_t.unsqueeze(-1) if ctx.tau_tensor else ctx.tau
        if ctx.reduce:
            grad = grad.masked_fill(chosen, 0.0).unsqueeze(-2)  # (B, 1, n)
            mean = torch.bmm(ranks, grad.transpose(-1, -2))  # (B, k, 1): Σ_i P g_i
        else:
            mean = (ranks * grad).sum(-1, keepdim=True)
        centred = grad - mean  # g - ḡ_r
        delta = ranks * centred
        w = delta * slope / tau if ctx.tau_tensor else delta.mul_(slope).mul_(1.0 / tau)
        grad_x = w.sum(-2).neg_().scatter_add_(-1, index, w.sum(-1))
        grad_tau = None
        if ctx.tau_tensor and ctx.needs_input_grad[1]:
            grad_tau = -(centred * torch.special.xlogy(ranks, ranks)).sum((-2, -1)).unsqueeze(-1) / tau_t
        return grad_x, grad_tau, None, None, None


def softsort_ranks(x: torch.Tensor, k: int, *, tau: float | torch.Tensor, power: float) -> torch.Tensor:
    """SoftSort top-k ranks ``(B, n, k)`` of ``x`` (B, n), which may hold ``±inf`` entries (module
    docstring); ``tau`` a float or a per-row (B, 1) tensor."""
    return _SoftSort.apply(x, tau, k, float(power), False)[0].transpose(-1, -2)


def softsort_mask(x: torch.Tensor, k: int, *, tau: float | torch.Tensor, power: float) -> torch.Tensor:
    """SoftSort mask ``Σ_r P`` (B, n) of ``x`` (B, n) for every row (``±inf`` included; a row with
    at most ``k`` entries above ``-inf`` selects them all, the ``-inf`` entries share the rest)."""
    if k == x.shape[-1]:  # every row selects all (NaN stays in its row)
        return torch.where(x == x, 1.0, x)
    if power == 1.0 and isinstance(tau, float) and softsort_triton.usable(x, k, tau):
        return softsort_triton.triton_mask(x, k, tau)
    return _SoftSort.apply(x, tau, k, float(power), True)[0]
