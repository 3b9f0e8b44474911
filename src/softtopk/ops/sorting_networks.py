"""Relaxed (differentiable) sorting and selection networks.

Each comparator of a network (:mod:`softtopk.ops.networks`) is replaced by a relaxed swap
(:mod:`softtopk.ops.swaps`). A layer is then a doubly stochastic matrix :math:`M_l` that mixes each
wire with its comparator partner, and the relaxed permutation is
:math:`P = M_1 M_2 \\cdots M_L` with ``P[i, r]`` = weight of input ``i`` at rank ``r``.

Nothing of size ``n x n`` per layer is ever built. One forward sweep computes the wire values and
the swap probabilities (``O(L n)`` per row). Then, because every :math:`M_l` is symmetric:

* top-k ranks ``P[:, :k]`` come from a reverse sweep of ``k`` columns (``O(L n k)``), as in
  difftopk's reverse sweep but with one gather per layer instead of sparse matrices;
* the mask ``P[:, :k].sum(-1)`` comes from a reverse sweep of a single column (``O(L n)``);
* one row ``P[y, :]`` (what a classification loss needs) rides along the forward sweep (``O(L n)``).

Reference: Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022.
"""

from __future__ import annotations

import torch

from .networks import Network, build_network, layer_tensors
from .swaps import swap_probability


def _forward_sweep(
    x: torch.Tensor, network: Network, params: dict, label_row: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Run the relaxed network on ``x`` (B, n); return per-layer swap probabilities (B, n) and, if
    ``label_row`` (B, n) is given, that row of ``P`` pushed through all layers."""
    partner, sign = layer_tensors(network, x.device)
    sign = sign.to(x.dtype)
    z = x if label_row is None else torch.stack([x, label_row], dim=-2)
    alphas = []
    for layer in range(partner.shape[0]):
        zp = z.index_select(-1, partner[layer])
        diff = z - zp
        values_diff = diff if label_row is None else diff[..., 0, :]
        alpha = swap_probability(sign[layer] * values_diff, **params)
        alphas.append(alpha)
        z = zp + (alpha if label_row is None else alpha.unsqueeze(-2)) * diff
    return alphas, (None if label_row is None else z[..., 1, :])


def _reverse_sweep(columns: torch.Tensor, alphas: list[torch.Tensor], network: Network) -> torch.Tensor:
    """Apply ``M_1 ... M_L`` to ``columns`` (B, c, n): each of the c rows is one column of P^T."""
    partner, _ = layer_tensors(network, columns.device)
    z = columns
    for layer in range(len(alphas) - 1, -1, -1):
        zp = z.index_select(-1, partner[layer])
        z = zp + alphas[layer].unsqueeze(-2) * (z - zp)
    return z


def _network(kind: str, n: int, k: int) -> Network:
    return build_network(kind, n, k if kind == "splitter_selection" else n)


def network_ranks(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k attribution ``(B, n, k)`` of a sorting/selection network for ``x`` (B, n)."""
    n = x.shape[-1]
    net = _network(network, n, k)
    alphas, _ = _forward_sweep(x, net, params)
    start = torch.zeros(k, n, dtype=x.dtype, device=x.device)
    start[torch.arange(k), torch.tensor(net.out_wires[:k])] = 1.0
    columns = _reverse_sweep(start.expand(x.shape[0], k, n), alphas, net)
    return columns.transpose(-1, -2)


def network_mask(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k mask ``(B, n)``: the row sums of the top-k ranks, from one reverse sweep."""
    n = x.shape[-1]
    net = _network(network, n, k)
    alphas, _ = _forward_sweep(x, net, params)
    start = torch.zeros(1, n, dtype=x.dtype, device=x.device)
    start[0, torch.tensor(net.out_wires[:k])] = 1.0
    return _reverse_sweep(start.expand(x.shape[0], 1, n), alphas, net)[..., 0, :]


def network_label_ranks(
    x: torch.Tensor, position: torch.Tensor, k: int, *, network: str, **params
) -> torch.Tensor:
    """``P[b, position[b], :k]`` ``(B, k)``: where the item at ``position`` lands, in one sweep."""
    n = x.shape[-1]
    net = _network(network, n, k)
    row = torch.nn.functional.one_hot(position, n).to(x.dtype)
    _, row = _forward_sweep(x, net, params, label_row=row)
    return row[..., list(net.out_wires[:k])]
