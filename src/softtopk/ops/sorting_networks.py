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
    wires: torch.Tensor, network: Network, params: dict, label_row: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Run the relaxed network on ``wires`` (n, B); return the per-layer swap probabilities (n, B)
    and, if ``label_row`` (n, B) is given, that row of ``P`` pushed through all layers.

    Wires come first so that each layer's partner gather moves contiguous rows of ``B`` values.
    """
    partner, sign = layer_tensors(network, wires.device)
    sign = sign.to(wires.dtype).unsqueeze(-1)
    z = wires if label_row is None else torch.stack([wires, label_row], dim=1)
    alphas = []
    for layer in range(partner.shape[0]):
        zp = z.index_select(0, partner[layer])
        diff = z - zp
        alpha = swap_probability(sign[layer] * (diff if label_row is None else diff[:, 0]), **params)
        alphas.append(alpha)
        z = zp + (alpha if label_row is None else alpha.unsqueeze(1)) * diff
    return alphas, (None if label_row is None else z[:, 1])


def _reverse_sweep(columns: torch.Tensor, alphas: list[torch.Tensor], network: Network) -> torch.Tensor:
    """Apply ``M_1 ... M_L`` to ``columns`` (n, c, B): column ``j`` of each row is one column of P."""
    partner, _ = layer_tensors(network, columns.device)
    z = columns
    for layer in range(len(alphas) - 1, -1, -1):
        zp = z.index_select(0, partner[layer])
        z = zp + alphas[layer].unsqueeze(1) * (z - zp)
    return z


def _network(kind: str, n: int, k: int) -> Network:
    return build_network(kind, n, k if kind == "splitter_selection" else n)


def _rank_columns(network: Network, k: int, x: torch.Tensor) -> torch.Tensor:
    """``E`` (n, k, B): column ``r`` is the indicator of the wire that holds rank ``r``."""
    start = torch.zeros(network.n, k, 1, dtype=x.dtype, device=x.device)
    start[torch.tensor(network.out_wires[:k]), torch.arange(k)] = 1.0
    return start.expand(network.n, k, x.shape[0])


def _in_graph(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A network without comparators (``n = 1``) gives constant outputs; tie them to ``x``'s graph
    (with zero gradient) so that backward works as for every other input size."""
    return out if out.requires_grad or not x.requires_grad else out + x[..., :0].sum()


def network_ranks(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k attribution ``(B, n, k)`` of a sorting/selection network for ``x`` (B, n)."""
    net = _network(network, x.shape[-1], k)
    alphas, _ = _forward_sweep(x.T.contiguous(), net, params)
    return _in_graph(_reverse_sweep(_rank_columns(net, k, x), alphas, net).permute(2, 0, 1), x)


def network_mask(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k mask ``(B, n)``: the row sums of the top-k ranks, from one reverse sweep."""
    net = _network(network, x.shape[-1], k)
    alphas, _ = _forward_sweep(x.T.contiguous(), net, params)
    start = _rank_columns(net, k, x).sum(1, keepdim=True)
    return _in_graph(_reverse_sweep(start, alphas, net)[:, 0].T, x)


def network_label_ranks(
    x: torch.Tensor, position: torch.Tensor, k: int, *, network: str, **params
) -> torch.Tensor:
    """``P[b, position[b], :k]`` ``(B, k)``: where the item at ``position`` lands, in one sweep."""
    n = x.shape[-1]
    net = _network(network, n, k)
    row = torch.nn.functional.one_hot(position, n).to(x.dtype).T.contiguous()
    _, row = _forward_sweep(x.T.contiguous(), net, params, label_row=row)
    return _in_graph(row.index_select(0, torch.tensor(net.out_wires[:k], device=x.device)).T, x)
