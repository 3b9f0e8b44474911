"""Straight-through estimator shared by the relaxations that offer ``hard=True``."""

from __future__ import annotations

import torch


def straight_through_ranks(x: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """Forward: the exact one-hot top-k ranks of ``x`` (from ``torch.topk``, so always a valid
    partial permutation, also with ties); backward: the gradient of the relaxed ``ranks`` (B, n, k)."""
    k = ranks.shape[-1]
    index = x.topk(k, dim=-1).indices.unsqueeze(-2)
    hard = torch.zeros_like(ranks).scatter(-2, index, 1.0)
    return ranks + (hard - ranks).detach()
