"""Straight-through estimators shared by the relaxations that offer ``hard=True``: the forward is
exactly the hard top-k of ``x`` (``torch.topk``'s choice among ties), the backward the relaxation's."""

from __future__ import annotations

import torch

from .compute import put_rows


def straight_through_ranks(x: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """Forward: the exact one-hot top-k ranks of ``x`` (from ``torch.topk``, so always a valid
    partial permutation, also with ties); backward: the gradient of the relaxed ``ranks`` (B, n, k)."""
    k = ranks.shape[-1]
    index = x.topk(k, dim=-1).indices.unsqueeze(-2)
    hard = put_rows(torch.zeros_like(ranks), index, 1.0, dim=-2)
    return ranks + (hard - ranks).detach()


def straight_through_mask(x: torch.Tensor, k: int, soft: torch.Tensor) -> torch.Tensor:
    """Forward: the exact k-hot mask of the ``k`` largest entries of rows ``x`` (B, n) (``hard + 0``,
    so exactly 0 and 1); backward: the gradient of the relaxed mask ``soft`` (B, n)."""
    hard = put_rows(torch.zeros_like(soft), x.topk(k, dim=-1).indices, 1.0)
    return hard + (soft - soft.detach())
