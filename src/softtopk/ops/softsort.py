"""SoftSort (Prillo & Eisenschlos, ICML 2020): a softmax over distances to the sorted scores.

For scores :math:`s` with descending sort :math:`\\tilde s` and rank :math:`r` (0 = largest),

.. math::
    P[i, r] = \\operatorname{softmax}_i\\big(-|s_i - \\tilde s_r|^{p} / \\tau\\big).

Each rank column sums to 1; rows need not. Top-k ranks cost ``O(n k)`` (only the top ``k`` sorted
values are needed). Entries at ``-inf`` are infinitely far from every finite sorted value: weight 0 on
the ranks ``r < f`` (``f`` finite entries), as if they were absent.

Reference: S. Prillo, J. Eisenschlos, "SoftSort: A Continuous Relaxation for the argsort Operator",
ICML 2020.
"""

from __future__ import annotations

import torch


def softsort_ranks(x: torch.Tensor, k: int, *, tau: float | torch.Tensor, power: float) -> torch.Tensor:
    """SoftSort top-k ranks ``(B, n, k)`` of ``x`` (B, n), which may hold ``-inf`` entries (the
    ranks ``r >= f`` of a row with ``f < k`` finite entries are then finite but arbitrary); ``tau`` a
    float or a per-row (B, 1) tensor."""
    if isinstance(tau, torch.Tensor):
        tau = tau.to(x.dtype).unsqueeze(-1)
    # a full sort for k = n gives tied scores the original's gradient split (its sort's); topk
    # splits them by its own order (docs/compat.md lists the difference)
    top = x.sort(dim=-1, descending=True).values if k == x.shape[-1] else x.topk(k, dim=-1).values
    top = torch.where(top == float("-inf"), 0.0, top)  # ranks past the finite entries: finite
    # a -inf entry is at distance inf (logit -inf, weight 0) without a branch over the (B, n, k)
    # tensor; powers are taken of distances capped where their power overflows but its slope does
    # not, so the backward of a zero weight stays 0 (not inf * 0)
    distance = (x.unsqueeze(-1) - top.unsqueeze(-2)).abs()
    if power != 1.0:
        distance = distance.clamp_max(torch.finfo(x.dtype).max ** (1.0 / power) * 2.0).pow(power)
    return torch.softmax(-distance / tau, dim=-2)
