"""The real root of a depressed cubic with one real root, in closed form (Cardano) polished by two
Newton steps: the p = 4/3 threshold of the sparse soft top-k (:mod:`softtopk.ops.sparse`)."""

from __future__ import annotations

import torch


def _cbrt(v: torch.Tensor) -> torch.Tensor:
    return v.sign() * v.abs().pow(1.0 / 3.0)


def cubic_root(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The real root of ``y³ + p y + q = 0`` for ``p >= 0`` (one real root), float64."""
    half = 0.5 * q
    disc = (half * half + p * p * p / 27.0).sqrt()
    big = _cbrt(-half - torch.where(q >= 0, disc, -disc))
    y = torch.where(big == 0, torch.zeros_like(big), big - p / (3.0 * big).where(big != 0, torch.ones_like(big)))
    for _ in range(2):  # Newton polish: the closed form cancels when p dominates
        slope = 3.0 * y * y + p
        step = (y * y * y + p * y + q) / slope.where(slope > 0, torch.ones_like(slope))
        y = y - torch.where(slope > 0, step, torch.zeros_like(step))
    return y
