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

Both sweeps are ``torch.autograd.Function`` objects with hand-written backward passes. Each layer
matrix is symmetric and its partner map is an involution, so the backward of a layer is the same
gather-and-mix as its forward; swap slopes are analytic (:func:`~softtopk.ops.swaps.swap_slope`) and
computed in backward. Only per-layer differences and swap probabilities are saved (no autograd graph
per layer).
Double backward is not supported.

Reference: Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
from torch.autograd.function import once_differentiable

from .compute import can_inspect
from .networks import Network, build_network, layer_tensors
from .swaps import ART_DELTA, swap_probability, swap_slope


def _layers(network: Network, like: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per layer: partner indices (n,) and signs (n, 1) in ``like``'s dtype, on its device."""
    return _per_layer(network, str(like.device), like.dtype)[:2]


def _comparator_slots(network: Network, like: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per layer: the max wires of the comparators (c,), and each wire's comparator slot (n,)
    (idle wires point at slot 0; their sign is 0)."""
    return _per_layer(network, str(like.device), like.dtype)[2:]


def _layer_rows(maxima: tuple[torch.Tensor, ...]) -> list[slice]:
    """Each layer's rows in the buffer that stacks the layers' max-wire rows."""
    ends = list(itertools.accumulate(len(m) for m in maxima))
    return [slice(end - len(m), end) for end, m in zip(ends, maxima)]


@functools.lru_cache(maxsize=256)
def _per_layer(network: Network, device: str, dtype: torch.dtype):
    partner, sign = layer_tensors(network, torch.device(device))
    maxima, slots = [], []
    for layer in network.layers:
        hi, lo = torch.tensor(layer, device=device).T
        slot = torch.zeros(network.n, dtype=torch.long, device=device)
        slot[hi] = slot[lo] = torch.arange(len(layer), device=device)
        maxima.append(hi), slots.append(slot)
    return partner.unbind(0), sign.to(dtype).unsqueeze(-1).unbind(0), tuple(maxima), tuple(slots)


def _far(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max / 8


def _infinities(values: torch.Tensor, params: dict) -> str:
    """How a sweep treats infinite values (n, B): ``'none'`` (there are none); ``'stand-in'``: each
    becomes ``±finfo.max/8``, so far out that every comparison with it is exact in the dtype (swap
    probability exactly 0 or 1 and slope exactly 0, checked at the smallest steepness); ``'exact'``:
    comparisons with an infinity are decided explicitly in every layer (always inside
    ``torch.compile``/``vmap``, and where no finite value saturates, e.g. ``logistic_phi``)."""
    if not can_inspect(values):
        return "exact"
    if bool(values.sum().isfinite()):
        return "none"
    far = _far(values.dtype)
    if not bool(values.nan_to_num(nan=math.nan, posinf=0.0, neginf=0.0).abs().amax() <= far / 4):
        return "exact"
    steepness = params["steepness"]
    probe = {**params, "steepness": steepness.amin() if isinstance(steepness, torch.Tensor) else steepness}
    d = values.new_tensor(far / 2)
    alpha = swap_probability(d, **probe)
    return "stand-in" if bool((alpha == 1) & (swap_slope(d, alpha, **probe) == 0)) else "exact"


def _value_sweep(wires: torch.Tensor, network: Network, params: dict):
    """Relaxed network on ``wires`` (n, r, B): the values are ``wires[:, 0]``; the other ``r - 1``
    rows ride along (mixed with the same swap probabilities). Returns the final wires and, per layer
    (preallocated), the differences ``z - z[partner]`` (L, n, r, B) and swap probabilities (L, n, B)."""
    partner, sign = _layers(network, wires)
    depth, (n, _, batch) = len(partner), wires.shape
    diffs = wires.new_empty((depth, *wires.shape))
    alphas = wires.new_empty((depth, n, batch))
    z = wires
    mode = _infinities(wires[:, 0], params)
    if mode == "stand-in":
        z = wires.clone()
        z[:, 0] = z[:, 0].clamp(-_far(z.dtype), _far(z.dtype))
    for layer in range(depth):
        pulled = z.index_select(0, partner[layer])
        diff = torch.sub(z, pulled, out=diffs[layer])
        if mode != "exact":
            alpha = swap_probability(sign[layer] * diff[:, 0], **params)
            alphas[layer] = alpha
            # lerp is exact at alpha 0 and 1: a stand-in never leaks into a finite value
            mix = torch.lerp if mode == "stand-in" else lambda start, end, weight: torch.addcmul(start, weight, diff)
            z = mix(pulled, z, alpha.unsqueeze(1))
            continue
        # a comparator with an infinite value swaps exactly (alpha 0 or 1, slope 0) and never mixes
        # the infinity into a finite value; two equal infinities stay in place
        value, other = z[:, 0], pulled[:, 0]
        exact = value.isinf() | other.isinf()
        d = sign[layer] * torch.where(exact, 0.0, diff[:, 0])
        order = torch.where(value == other, 1.0, (sign[layer] * (value - other) > 0).to(value.dtype))
        alpha = torch.where(exact, order, swap_probability(d, **params))
        alphas[layer] = alpha
        diff[:, 0] = torch.where(exact, 0.0, diff[:, 0])
        mixed = torch.addcmul(pulled, alpha.unsqueeze(1), diff)
        mixed[:, 0] = torch.where(exact, torch.where(alpha == 1, value, other), mixed[:, 0])
        z = mixed
    return z, diffs, alphas


def _value_sweep_backward(grad, diffs, alphas, network, params, grad_alphas=None, grad_beta=None):
    """Backward of :func:`_value_sweep`: ``grad`` (n, r, B) of its final wires → of its input wires.

    Swap slopes are computed here from the saved differences and probabilities (they are needed
    only in backward). ``grad_alphas`` (L tensors (n, B)) are gradients reaching the swap
    probabilities from elsewhere. ``grad_beta`` (B,), if given, accumulates the gradient of a
    per-row steepness β (in place)."""
    partner, sign = _layers(network, grad)
    for layer in range(len(partner) - 1, -1, -1):
        alpha = alphas[layer]
        slope = swap_slope(diffs[layer][:, 0], alpha, **params) * sign[layer]  # slopes are even in d
        # a swap decided by an infinite value has d = 0 saved and alpha 0 or 1 (a finite tie has 1/2)
        slope = torch.where((diffs[layer][:, 0] == 0) & (alpha != 0.5), 0.0, slope)
        grad_alpha = (grad * diffs[layer]).sum(1)
        if grad_alphas is not None:
            grad_alpha += grad_alphas[layer]
        grad_alpha = torch.where(slope == 0, 0.0, grad_alpha)  # a stand-in's huge difference: no inf * 0
        if grad_beta is not None:
            grad_beta += (grad_alpha * _alpha_by_beta(diffs[layer][:, 0] * sign[layer], alpha, slope, params)).sum(0)
        grad_diff = grad * alpha.unsqueeze(1)
        grad_diff[:, 0] += grad_alpha * slope
        grad = grad_diff + (grad - grad_diff).index_select(0, partner[layer])
    return grad


def _alpha_by_beta(d: torch.Tensor, alpha: torch.Tensor, slope: torch.Tensor, params: dict) -> torch.Tensor:
    """``∂α/∂β`` at signed differences ``d`` (n, B): ``α(1-α) h(d)`` for the ART form
    ``α = σ(β h(d))``, else ``d F'(β d) = d · (∂α/∂d) / β`` (``slope`` is ``∂α/∂d`` times the sign)."""
    if params["distribution"] == "logistic_phi":
        return alpha * (1 - alpha) * d * (d * d + ART_DELTA**2) ** (-0.5 * params["art_lambda"])
    return d * slope.abs() / params["steepness"]


def _vmap_by_folding(function, info, in_dims, tensors, others, place=None):
    """vmap rule of the sweeps: they act on a trailing batch axis ``B`` already, so the vmapped axis
    ``V`` is folded into it (``(..., B) -> (..., B * V)``) and unfolded from every output. The
    arguments are the folded ``tensors`` then ``others``, or ``place(*folded)``."""
    size = info.batch_size
    folded = []
    for tensor, dim in zip(tensors, in_dims):
        tensor = tensor.unsqueeze(-1).expand(*tensor.shape, size) if dim is None else tensor.movedim(dim, -1)
        folded.append(tensor.reshape(*tensor.shape[:-2], -1))
    outputs = function.apply(*((*folded, *others) if place is None else place(*folded)))
    return tuple(out.reshape(*out.shape[:-1], -1, size) for out in outputs), tuple(out.dim() for out in outputs)


def _save_sweep(ctx, network: Network, params: dict, saved: tuple[torch.Tensor, ...]) -> None:
    """``setup_context`` of the sweeps: keep the network, its parameters and the saved outputs."""
    ctx.network, ctx.params = network, params
    ctx.save_for_backward(*saved)
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)  # no zero gradients for the saved tensors


class _LabelRowSweep(torch.autograd.Function):
    """``wires (n, 2, B)`` = (values, one row of ``P^T``) → the row pushed through the network."""

    @staticmethod
    def forward(wires, network, params):
        z, diffs, alphas = _value_sweep(wires, network, params)
        return z[:, 1], diffs, alphas

    @staticmethod
    def setup_context(ctx, inputs, output):
        _save_sweep(ctx, inputs[1], inputs[2], output[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_row, *unused):
        if grad_row is None:  # only the saved (non-differentiable) outputs were used
            return None, None, None
        diffs, alphas = ctx.saved_tensors
        grad = torch.stack([torch.zeros_like(grad_row), grad_row], dim=1)
        return _value_sweep_backward(grad, diffs, alphas, ctx.network, ctx.params), None, None

    @staticmethod
    def vmap(info, in_dims, wires, network, params):
        return _vmap_by_folding(_LabelRowSweep, info, in_dims[:1], (wires,), (network, params))


class _ColumnSweep(torch.autograd.Function):
    """``(wires (n, B), columns (n, c, B))`` → ``M_1 ... M_L columns`` (columns of ``P``).

    Saves the value differences and swap probabilities of each layer and, of the column differences
    ``z - z[partner]``, only the rows of the comparators' max wires: a min wire's difference is the
    negative of its partner's and an idle wire's is zero."""

    @staticmethod
    def forward(wires, columns, network, params, beta):
        # beta: None (params' float steepness) or a per-row steepness (B,)
        params = params if beta is None else {**params, "steepness": beta}
        _, diffs, alphas = _value_sweep(wires.unsqueeze(1), network, params)
        partner, _ = _layers(network, wires)
        maxima, _ = _comparator_slots(network, wires)
        # one buffer for all layers (fewer, larger allocations: less heap fragmentation)
        max_wire_diffs = columns.new_empty((sum(len(m) for m in maxima), *columns.shape[1:]))
        max_wire_rows = _layer_rows(maxima)
        for layer in range(len(partner) - 1, -1, -1):
            pulled = columns.index_select(0, partner[layer])
            column_diff = columns - pulled
            torch.index_select(column_diff, 0, maxima[layer], out=max_wire_diffs[max_wire_rows[layer]])
            columns = torch.addcmul(pulled, alphas[layer].unsqueeze(1), column_diff)
        return columns, diffs, alphas, max_wire_diffs

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, network, params, beta = inputs
        _save_sweep(ctx, network, params if beta is None else {**params, "steepness": beta}, output[1:])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_columns, *unused):
        if grad_columns is None:  # only the saved (non-differentiable) outputs were used
            return None, None, None, None, None
        grad_columns = grad_columns.contiguous()  # often a permuted view of the caller's gradient
        diffs, alphas, max_wire_diffs = ctx.saved_tensors
        partner, sign = _layers(ctx.network, grad_columns)
        maxima, slots = _comparator_slots(ctx.network, grad_columns)
        max_wire_rows = _layer_rows(maxima)
        grad_alphas = []  # a list, not an out= buffer: the backward also runs under torch.func.vmap
        for layer in range(len(partner)):  # the columns went through the layers in reverse
            alpha = alphas[layer]
            column_diff = max_wire_diffs[max_wire_rows[layer]].index_select(0, slots[layer])  # up to the sign
            grad_alphas.append((grad_columns * column_diff).sum(1) * sign[layer])
            mixed = (1.0 - alpha).unsqueeze(1) * grad_columns
            grad_columns = grad_columns - mixed + mixed.index_select(0, partner[layer])
        grad_beta = grad_columns.new_zeros(grad_columns.shape[-1]) if ctx.needs_input_grad[4] else None
        grad_wires = _value_sweep_backward(
            torch.zeros_like(grad_columns[:, :1]), diffs, alphas, ctx.network, ctx.params, grad_alphas, grad_beta
        )[:, 0]
        return grad_wires, (grad_columns if ctx.needs_input_grad[1] else None), None, None, grad_beta

    @staticmethod
    def vmap(info, in_dims, wires, columns, network, params, beta):
        if beta is None:
            return _vmap_by_folding(_ColumnSweep, info, in_dims[:2], (wires, columns), (network, params, None))
        return _vmap_by_folding(_ColumnSweep, info, (*in_dims[:2], in_dims[4]), (wires, columns, beta), (),
                                lambda w, c, b: (w, c, network, params, b))


def _network(kind: str, n: int, k: int) -> Network:
    return build_network(kind, n, k if kind == "splitter_selection" else n)


def _rank_columns(network: Network, k: int, x: torch.Tensor) -> torch.Tensor:
    """``E`` (n, k, B): column ``r`` is the indicator of the wire that holds rank ``r``."""
    start = torch.zeros(network.n, k, 1, dtype=x.dtype, device=x.device)
    start[torch.tensor(network.out_wires[:k]), torch.arange(k)] = 1.0
    return start.expand(network.n, k, x.shape[0])


def _split_beta(params: dict, x: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
    """A per-row steepness tensor ((B, 1) or scalar) as ``beta`` (B,), apart from the other params."""
    steepness = params["steepness"]
    if not isinstance(steepness, torch.Tensor):
        return params, None
    return {**params, "steepness": 1.0}, steepness.to(x.dtype).expand(x.shape[0], 1).reshape(-1)


def network_ranks(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k attribution ``(B, n, k)`` of a sorting/selection network for ``x`` (B, n);
    ``steepness`` a float or a per-row (B, 1) tensor (with gradients)."""
    net = _network(network, x.shape[-1], k)
    params, beta = _split_beta(params, x)
    columns = _ColumnSweep.apply(x.T.contiguous(), _rank_columns(net, k, x), net, params, beta)[0]
    return columns.permute(2, 0, 1).contiguous()


def network_mask(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k mask ``(B, n)``: the row sums of the top-k ranks, from one reverse sweep."""
    net = _network(network, x.shape[-1], k)
    start = _rank_columns(net, k, x).sum(1, keepdim=True)
    params, beta = _split_beta(params, x)
    return _ColumnSweep.apply(x.T.contiguous(), start, net, params, beta)[0][:, 0].T


def network_label_ranks(
    x: torch.Tensor, position: torch.Tensor, k: int, *, network: str, **params
) -> torch.Tensor:
    """``P[b, position[b], :k]`` ``(B, k)``: where the item at ``position`` lands, in one sweep."""
    n = x.shape[-1]
    net = _network(network, n, k)
    row = torch.nn.functional.one_hot(position, n).to(x.dtype)
    row = _LabelRowSweep.apply(torch.stack([x, row], dim=1).permute(2, 1, 0).contiguous(), net, params)[0]
    return row.index_select(0, torch.tensor(net.out_wires[:k], device=x.device)).T
