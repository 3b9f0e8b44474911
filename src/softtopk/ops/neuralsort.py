"""NeuralSort (Grover et al., ICLR 2019): a unimodal row-stochastic relaxation of the sort.

For scores :math:`s \\in \\mathbb{R}^n` and rank :math:`r` (0-based, 0 = largest),

.. math::
    P[i, r] = \\operatorname{softmax}_i\\Big(\\big((n - 1 - 2r)\\, s_i - \\textstyle\\sum_l |s_i - s_l|\\big)/\\tau\\Big).

Each rank column sums to 1; an item's weights over ranks need not (so a mask ``P[:, :k].sum(-1)``
sums to ``k`` but may exceed 1 for an item). :math:`A_i = \\sum_l |s_i - s_l|` is computed after one
sort with prefix sums, so top-k ranks cost ``O(n log n + n k)`` time and ``O(n k)`` memory instead of
the original ``O(n^2)``. Its backward uses ``d|u|/du = sign(u)`` with ``sign(0) = 0``, as the
original's ``torch.abs``: tied scores get symmetric gradients.

Entries at ``-inf`` are left out: with ``f`` finite entries, the finite ones get the formula with
``f`` for ``n`` (the limit of entries at ``-M``, ``M → ∞``), the ``-inf`` ones weight 0 on the ranks
``r < f``. The logits are formed in float64 from ``n > 1024`` on, where float32 cancellation in
``(n - 1 - 2r) s_i - A_i`` would reach ``1e-3`` of the scores' spread.

Reference: A. Grover, E. Wang, A. Zweig, S. Ermon, "Stochastic Optimization of Sorting Networks via
Continuous Relaxations", ICLR 2019.
"""

from __future__ import annotations

import torch

_WIDE_FROM = 1024


class _Deviation(torch.autograd.Function):
    """``A_i = Σ_{l valid} |s_i - s_l|`` of rows ``s`` (B, n) over the ``valid`` entries (0 elsewhere)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        count = valid.sum(-1, keepdim=True)
        key = torch.where(valid, s, float("-inf"))
        values, order = key.sort(-1)
        invalid = s.shape[-1] - count  # the invalid entries sort first
        values = torch.where(values == float("-inf"), 0.0, values)
        # at sorted position j, the valid index j - invalid: A = (2 j' - f) v_j + Σ v - 2 Σ_{l<j} v_l
        before = values.cumsum(-1) - values
        position = torch.arange(s.shape[-1], device=s.device, dtype=s.dtype) - invalid
        sorted_a = (2 * position - count) * values + values.sum(-1, keepdim=True) - 2 * before
        return torch.empty_like(s).scatter_(-1, order, sorted_a) * valid

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # ∂A_i/∂s_j = sign(s_j - s_i) for i != j, and Σ_l sign(s_j - s_l) for i = j (sign(0) = 0)
        s, valid = ctx.saved_tensors
        g = torch.where(valid, grad, 0.0)
        key = torch.where(valid, s, float("-inf"))
        values, order = key.sort(-1)
        cumulative = torch.cat([g.new_zeros(g.shape[0], 1), g.gather(-1, order).cumsum(-1)], -1)
        lo = torch.searchsorted(values, key, right=False)  # entries strictly below
        hi = torch.searchsorted(values, key, right=True)  # entries at or below
        invalid = s.shape[-1] - valid.sum(-1, keepdim=True)
        below, above = (lo - invalid).to(g.dtype), (s.shape[-1] - hi).to(g.dtype)
        g_below = cumulative.gather(-1, lo)
        g_above = cumulative[:, -1:] - cumulative.gather(-1, hi)
        return torch.where(valid, g * (below - above) + g_below - g_above, 0.0), None


def neuralsort_ranks(x: torch.Tensor, k: int, *, tau: float | torch.Tensor) -> torch.Tensor:
    """NeuralSort top-k ranks ``(B, n, k)`` of ``x`` (B, n), which may hold ``-inf`` entries; ``tau``
    a float or a per-row (B, 1) tensor."""
    n = x.shape[-1]
    wide = torch.float64 if n > _WIDE_FROM else x.dtype
    valid = x != float("-inf")
    count = valid.sum(-1, keepdim=True)
    s = torch.where(valid, x, 0.0).to(wide)
    # shift invariant: centring helps precision; the mean of the sorted values rounds the same way
    # for any input order (keeps the result exactly equivariant)
    shift = s.detach().sort(-1).values.sum(-1, keepdim=True) / count.clamp_min(1)
    s = torch.where(valid, s - shift, 0.0)
    deviation = _Deviation.apply(s, valid)
    coefficient = (count - 1).to(wide).unsqueeze(-1) - 2 * torch.arange(k, device=x.device, dtype=wide)
    logits = s.unsqueeze(-1) * coefficient - deviation.unsqueeze(-1)
    # measured from each rank's maximum before dividing by τ: no inf - inf for a τ near the
    # smallest normal number (the softmax is shift invariant, so the gradient is unchanged)
    logits = logits - logits.amax(-2, keepdim=True).detach()
    if isinstance(tau, torch.Tensor):
        tau = tau.to(wide).unsqueeze(-1)
    logits = torch.where(valid.unsqueeze(-1), logits / tau, float("-inf"))
    return torch.softmax(logits, dim=-2).to(x.dtype)
