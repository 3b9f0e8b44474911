"""What the NeuralSort mask's torch path and its tiled Triton kernels share: the sorted row's pieces
of every rank's logits, and the scores' gradient from the backward's sums over the ranks (the
formulas of :mod:`softtopk.ops.neuralsort`, in its notation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .compute import scan_rows

_WIDE = torch.float64


def logit_pieces(ordered: torch.Tensor, big: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(s', ℓ, C)`` of rows sorted ascending (B, n): ``s'`` the scores with ``+inf`` as ``M = big``
    and ``-inf`` as ``-M/2`` (so that ``searchsorted`` counts the ``-inf`` entries), ``ℓ`` the entries
    below each, ``C`` their sum (float64, the infinite ones left out)."""
    far = ordered.nan_to_num(nan=float("nan"), posinf=big, neginf=-big / 2)
    below = torch.searchsorted(ordered, far)  # ℓ_i (+inf: the entries below +inf)
    cleaned = ordered.nan_to_num(nan=float("nan"), posinf=0.0, neginf=0.0)
    return far, below, scan_rows(F.pad(cleaned, (1, 0)), dtype=_WIDE).gather(-1, below)


def scores_grad(
    ordered: torch.Tensor, far: torch.Tensor, below: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """``-τ ∂s`` of the sorted scores (float64, B × n) from ``α = Σ_r γ`` and ``β = Σ_r (ρ + 1/2) γ``:
    ``Σ_{s_l < s_i} α_l + Σ_{s_l <= s_i} α_l + (ℓ_i + h_i) α_i - 2 β_i`` (the caller divides by
    ``-τ`` and zeroes the infinite entries)."""
    cumulative = scan_rows(F.pad(alpha, (1, 0)))  # Σ_{l < j}
    at_most = torch.searchsorted(ordered, far, right=True)
    signs = cumulative.gather(-1, below).add_(cumulative.gather(-1, at_most))
    return torch.addcmul(signs, below + at_most, alpha).sub_(beta, alpha=2.0)
