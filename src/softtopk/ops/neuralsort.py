"""NeuralSort (Grover et al., ICLR 2019): a unimodal row-stochastic relaxation of the sort.

For scores :math:`s \\in \\mathbb{R}^n` and rank :math:`r` (0-based, 0 = largest),

.. math::
    P[i, r] = \\operatorname{softmax}_i\\Big(\\big((n - 1 - 2r)\\, s_i - \\textstyle\\sum_l |s_i - s_l|\\big)/\\tau\\Big).

Each rank column sums to 1; an item's weights over ranks need not (so a mask ``P[:, :k].sum(-1)``
sums to ``k`` but may exceed 1 for an item). :math:`A_i = \\sum_l |s_i - s_l|` is computed after one
sort with prefix sums, so top-k ranks cost ``O(n log n + n k)`` time and ``O(n k)`` memory instead of
the original ``O(n^2)``.

Reference: A. Grover, E. Wang, A. Zweig, S. Ermon, "Stochastic Optimization of Sorting Networks via
Continuous Relaxations", ICLR 2019.
"""

from __future__ import annotations

import torch

from ._straight_through import straight_through_ranks


def neuralsort_ranks(x: torch.Tensor, k: int, *, tau: float, hard: bool) -> torch.Tensor:
    """NeuralSort top-k ranks ``(B, n, k)`` of ``x`` (B, n)."""
    n = x.shape[-1]
    values, order = x.sort(dim=-1)
    # The relaxation is shift invariant: centring helps precision, and the mean of the *sorted*
    # values rounds the same way for any input order (keeps the result exactly equivariant).
    shift = values.mean(-1, keepdim=True)
    s, values = x - shift, values - shift
    # A_i = sum_l |s_i - s_l| from prefix sums of the sorted values: at sorted position j,
    # A = (2j - n) v_j + sum(v) - 2 sum_{l<j} v_l.
    before = values.cumsum(-1) - values
    position = torch.arange(n, device=x.device, dtype=x.dtype)
    deviation_sorted = (2 * position - n) * values + values.sum(-1, keepdim=True) - 2 * before
    deviation = torch.empty_like(s).scatter(-1, order, deviation_sorted)
    coefficient = n - 1 - 2 * torch.arange(k, device=x.device, dtype=x.dtype)
    logits = s.unsqueeze(-1) * coefficient - deviation.unsqueeze(-1)
    ranks = torch.softmax(logits / tau, dim=-2)
    return straight_through_ranks(x, ranks) if hard else ranks
