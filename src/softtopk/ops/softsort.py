"""SoftSort (Prillo & Eisenschlos, ICML 2020): a softmax over distances to the sorted scores.

For scores :math:`s` with descending sort :math:`\\tilde s` and rank :math:`r` (0 = largest),

.. math::
    P[i, r] = \\operatorname{softmax}_i\\big(-|s_i - \\tilde s_r|^{p} / \\tau\\big).

Each rank column sums to 1; rows need not. Top-k ranks cost ``O(n k)`` (only the top ``k`` sorted
values are needed).

Reference: S. Prillo, J. Eisenschlos, "SoftSort: A Continuous Relaxation for the argsort Operator",
ICML 2020.
"""

from __future__ import annotations

import torch

from ._straight_through import straight_through_ranks


def softsort_ranks(x: torch.Tensor, k: int, *, tau: float, hard: bool, power: float) -> torch.Tensor:
    """SoftSort top-k ranks ``(B, n, k)`` of ``x`` (B, n)."""
    top = x.topk(k, dim=-1).values
    distance = (x.unsqueeze(-1) - top.unsqueeze(-2)).abs()
    if power != 1.0:
        distance = distance.pow(power)
    ranks = torch.softmax(-distance / tau, dim=-2)
    return straight_through_ranks(x, ranks) if hard else ranks
