"""Relaxed (differentiable) sorting and selection networks.

Each comparator of a network (:mod:`softtopk.ops.networks`) is replaced by a relaxed swap
(:mod:`softtopk.ops.swaps`). A layer is then a doubly stochastic matrix :math:`M_l` that mixes each
wire with its comparator partner, and the relaxed permutation is
:math:`P = M_1 M_2 \\cdots M_L` with ``P[i, r]`` = weight of input ``i`` at rank ``r``.

The sweeps hold the rows' wires as ``(n, ..., B)`` (a gather of partner wires copies whole
contiguous rows); a whole layer is one gather of the partner wires and one lerp
(``z' = z[p] + α (z - z[p])``, exact at ``α`` 0 and 1), nothing of size ``n x n`` is built:

* the value sweep (``z_l = M_l z_{l-1}`` with ``α_l = f(sign · (z - z[p]))``) saves each layer's
  differences and swap probabilities; rows of ``P^T`` may ride along (one row ``P[y, :]``, what a
  classification loss needs);
* top-k ranks ``P[:, :k]`` and the mask ``P[:, :k].sum(-1)`` come from a reverse sweep of ``k``
  columns or of their sum, ``c_{l-1} = M_l c_l`` (every :math:`M_l` is symmetric).

Backward (hand-written, one ``torch.autograd.Function`` per output): with ``r_0 = ∂L/∂c_0`` and
``r_l = M_l r_{l-1}`` (a forward sweep of the gradient), the swap probabilities get
``∂L/∂α_l = r_{l-1} (c_l - c_l[p])`` from the columns, computed for all layers at once; the value
sweep is then run backwards: with ``g`` the gradient of ``z_l``, ``s = ∂α/∂d`` (analytic,
:func:`~softtopk.ops.swaps.swap_slope`) and ``g_d = g (α + d s) + s ∂L/∂α_l``, the gradient of
``z_{l-1}`` is ``g_d + (g - g_d)[p]`` (the partner map is an involution). The per-layer
coefficients are computed for all layers at once, so each layer of each sweep costs a gather and
one or two fused elementwise ops. Double backward is not supported.

All distributions but ``logistic_phi`` are functions of ``β d``: the values are scaled by the
steepness ``β`` first (its gradient, for a per-row tensor, comes from that product) and every
sweep runs at unit steepness. ``±inf`` entries become ``±F`` (``F = finfo.max / 8``), so far out
that a comparison with a finite value gives ``α`` exactly 0 or 1 and slope exactly 0 (checked once
per distribution and dtype on fixed CPU numbers, see :func:`_infinities`); ``logistic_phi`` never
saturates and decides those comparisons explicitly. Finite ``|β x| ≤ F/4`` are exact. Nothing reads
tensor values; the index tensors of a network are built once per ``(network, n, k, device, dtype)``
and are constants under ``torch.compile``.

Reference: Petersen et al., "Differentiable Top-k Classification Learning", ICML 2022.
"""

from __future__ import annotations

import functools
import math
import operator

import torch
from torch.autograd.function import once_differentiable

from . import networks_numba, networks_triton
from ._function import Function
from .compute import add_product_, constant_result
from .networks import network_plan as _plan
from .swaps import ART_DELTA, signed_swap_probability, swap_slope


def _far(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).max / 8


def _infinities(values: torch.Tensor, params: dict) -> str:
    """How the sweeps treat infinite values, decided from the dtype and distribution alone:
    ``'stand-in'``: each is ``±F`` and every comparison with it saturates exactly; ``'exact'``:
    comparisons with a difference beyond ``F/2`` are decided explicitly in every layer
    (``logistic_phi``, and any distribution that does not saturate in the dtype)."""
    if params["distribution"] == "logistic_phi":
        return "exact"
    return "stand-in" if _saturates(params["distribution"], str(values.dtype)) else "exact"


@constant_result
def _saturates(distribution: str, dtype: str) -> bool:
    return _probe(distribution, dtype)


@functools.cache
def _probe(distribution: str, dtype: str) -> bool:
    """Whether ``f(±F/2)`` is exactly 1 and 0 with slope exactly 0 at unit steepness (CPU)."""
    real = getattr(torch, dtype.removeprefix("torch."))
    d = torch.tensor([_far(real) / 2, -_far(real) / 2], dtype=real)
    alpha = signed_swap_probability(d, torch.ones(2, dtype=real), distribution, 1.0, 0.0, d.new_full((1,), 0.5))
    slope = swap_slope(d, alpha, distribution, 1.0, 0.0)
    return alpha.tolist() == [1.0, 0.0] and slope.tolist() == [0.0, 0.0]


def _unit(params: dict) -> dict:
    """The sweeps' parameters: unit steepness where the values were scaled by it."""
    return params if params["distribution"] == "logistic_phi" else {**params, "steepness": 1.0}


def _wires(x: torch.Tensor, params: dict, rows: int) -> torch.Tensor:
    """The sweeps' wires ``(n, rows, B)``: row 0 ``β x`` (``x`` alone for ``logistic_phi``) with the
    infinities replaced by ``±F`` (NaN kept), the other rows zero."""
    far = _far(x.dtype)
    values = x.new_empty((x.shape[-1], x.shape[0]))  # contiguous along the wires
    if params["distribution"] == "logistic_phi":
        torch.clamp(x.T, -far, far, out=values)
    else:
        torch.mul(x.T, params["steepness"], out=values).clamp_(-far, far)
    if rows == 1:
        return values.unsqueeze(1)
    wires = x.new_zeros((x.shape[-1], rows, x.shape[0]))
    wires[:, 0] = values
    return wires


def _value_sweep(z: torch.Tensor, plan: tuple, params: dict, mode: str):
    """Relaxed network on the wires ``z`` (n, r, B): row 0 the (scaled) values, the other rows ride
    along. Returns the final wires, the differences ``z - z[p]`` (L, n, r, B) (row 0 zero where an
    infinity decided the comparator, in mode ``'exact'``) and the swap probabilities (L, n, B)."""
    depth, partner, sign, _, half = plan[:5]
    unit, far = _unit(params), _far(z.dtype)
    diffs, alphas = z.new_empty((depth, *z.shape)), z.new_empty((depth, z.shape[0], z.shape[-1]))
    for layer in range(depth):
        pulled = z.index_select(0, partner[layer])
        value_diff = torch.sub(z, pulled, out=diffs[layer])[:, 0]
        if mode == "exact":
            big = value_diff.abs() > far / 2
            order = (value_diff * sign[layer] > 0).to(z.dtype)
            value_diff.masked_fill_(big, 0.0)
            soft = signed_swap_probability(value_diff, sign[layer], **unit, half=half)
            alpha = torch.where(big, order, soft, out=alphas[layer])
        else:
            alpha = signed_swap_probability(value_diff, sign[layer], **unit, half=half, out=alphas[layer])
        z = torch.lerp(pulled, z, alpha.unsqueeze(1))
    return z, diffs, alphas


def _slopes(diffs: torch.Tensor, alphas: torch.Tensor, sign: torch.Tensor, params: dict, mode: str):
    """``∂α/∂d`` per layer and wire (L, n, B), from the saved differences of the values (slopes are
    even in ``d``); Cauchy's ``sign / (π (1 + d²))`` in place on one buffer."""
    if params["distribution"] == "cauchy":
        slope = (diffs * diffs).add_(1.0).reciprocal_().mul_(sign).mul_(1.0 / math.pi)
    else:
        slope = swap_slope(diffs, alphas, **_unit(params)) * sign
    if mode == "exact":  # a comparison decided by an infinity has d = 0 saved and α 0 or 1 (a tie 1/2)
        slope = torch.where((diffs == 0) & (alphas != 0.5), 0.0, slope)
    return slope


def _value_backward(grad, saved, plan, params, mode, alpha_grads=None):
    """Backward of :func:`_value_sweep`: ``grad`` (n, r, B) of its final wires (None: zero) and
    ``alpha_grads`` (L, n, B) reaching the swap probabilities from elsewhere → the gradient of
    its input values (n, B) and, for ``logistic_phi`` with a per-row steepness, of that (B, 1)."""
    z, diffs, alphas = saved
    depth, partner, sign = plan[:3]
    slope = _slopes(diffs[:, :, 0], alphas, sign, params, mode)
    coef = torch.addcmul(alphas, diffs[:, :, 0], slope).unsqueeze(2)  # ∂(α d)/∂d
    beta = params["steepness"]
    by_beta = params["distribution"] == "logistic_phi" and isinstance(beta, torch.Tensor)
    if alpha_grads is not None:  # a temporary of the caller's, kept only for a steepness gradient
        bias = (alpha_grads * slope if by_beta else alpha_grads.mul_(slope)).unsqueeze(2)
    else:
        bias = None
    cross = None if diffs.shape[2] == 1 else diffs[:, :, 1] * slope  # a riding row's share
    rows = z.shape[1]
    weights = coef if rows == 1 else torch.cat([coef, alphas.unsqueeze(2).expand(-1, -1, rows - 1, -1)], 2)
    outputs = []  # the gradient of each layer's output, last layer first (for a steepness gradient)
    for layer in range(depth - 1, -1, -1):
        outputs.append(grad)
        if grad is None:  # the values' final wires do not reach the output
            grad = torch.index_add(bias[layer], 0, partner[layer], bias[layer], alpha=-1.0)
            continue
        grad_d = grad * weights[layer] if bias is None else torch.addcmul(bias[layer], grad, weights[layer])
        if cross is not None:
            add_product_(grad_d[:, 0], grad[:, 1], cross[layer])
        grad = grad_d.index_add_(0, partner[layer], grad - grad_d)
    grad_z = torch.where(z[:, 0].abs() < _far(z.dtype), grad[:, 0], 0.0)  # none for the infinities
    if not by_beta:
        return grad_z, None
    # ∂α/∂β = α (1 - α) h(sign d), h(d) = d (d² + δ²)^(-λ/2) odd; ∂L/∂α from the values and columns
    outer = torch.stack([torch.zeros_like(grad) if g is None else g for g in outputs[::-1]])
    total = (outer * diffs).sum(2) + (0.0 if alpha_grads is None else alpha_grads)
    d = diffs[:, :, 0]
    by_beta = alphas * (1 - alphas) * d * (d * d + ART_DELTA**2) ** (-0.5 * params["art_lambda"])
    return grad_z, (total * by_beta * sign).sum((0, 1)).unsqueeze(-1)


def _input_grads(grad_z: torch.Tensor, z: torch.Tensor, params: dict):
    """Gradients of ``x`` (B, n) and of a per-row steepness (B, 1) from that of the wires
    ``z = β x`` (n, B)."""
    beta = params["steepness"]  # a float or (1, B)
    if params["distribution"] == "logistic_phi":
        return grad_z.T, None
    if not isinstance(beta, torch.Tensor):
        return (grad_z * beta).T, None
    return (grad_z * beta).T, ((grad_z * z).sum(0, keepdim=True) / beta).T


def _sweep_grads(grad_z, grad_art, z, params: dict):
    """A sweep's backward result, in its inputs' order ``(x, scale, key, params, mode, ...)``: the
    gradient of ``x``, and of the per-row steepness (else ``grad_art``, that of the ART lambda)."""
    grad_x, grad_scale = _input_grads(grad_z, z, params)
    return grad_x, (grad_art if grad_scale is None else grad_scale), None, None, None, None


def _fold(tensor, dim, size):
    """The vmapped axis ``dim`` (size ``size``) of ``tensor`` folded into its rows (axis 0)."""
    if tensor is None:
        return None
    tensor = tensor.expand(size, *tensor.shape) if dim is None else tensor.movedim(dim, 0)
    return tensor.reshape(-1, *tensor.shape[2:])


def _vmapped(sweep, size, in_dims, inputs):
    """``sweep`` under ``vmap``: its tensor inputs with the vmapped axis folded into their rows, one
    call, the outputs (whose rows are their last axis) unfolded."""
    folded = [_fold(a, dim, size) if isinstance(a, torch.Tensor) else a for a, dim in zip(inputs, in_dims, strict=True)]
    outputs = tuple(o.unflatten(-1, (size, -1)) for o in sweep.apply(*folded))
    return outputs, tuple(o.dim() - 2 for o in outputs)


def _with_scale(params: dict, scale):
    """The sweeps' parameters: a per-row steepness ``scale`` (B, 1) as (1, B), along the wires."""
    return params if scale is None else {**params, "steepness": scale.T}


class _Sweep(Function):
    """What both sweeps share: the inputs ``(x (B, n), scale, key, params, mode, ...)``, with ``scale``
    a per-row steepness (B, 1) or None (``params``' float), and the saving of every output but the
    first (non-differentiable) for the backward."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, scale, key, params, mode, _ = inputs
        ctx.plan_key = (*key, str(x.device), str(x.dtype))
        ctx.params, ctx.mode = _with_scale(params, scale), mode
        ctx.save_for_backward(*output[1:])
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)  # no zero gradients for the saved tensors


class _ColumnSweep(_Sweep):
    """``(x (B, n), scale, ..., ranks)`` → columns ``(n, c, B)`` of ``P``: the top-k ranks' (``c = k``)
    or their sum, the mask (``c = 1``)."""

    @staticmethod
    def forward(x, scale, key, params, mode, ranks):
        params = _with_scale(params, scale)
        plan = _plan(key[0], key[1], key[2], str(x.device), str(x.dtype))
        depth, partner, _, _, _, starts = plan[:6]
        z = _wires(x, params, 1)
        _, diffs, alphas = _value_sweep(z, plan, params, mode)
        start = (starts[:-1] if ranks else starts[-1:]).T.unsqueeze(-1)  # (n, c, 1)
        columns = x.new_empty((depth, x.shape[-1], start.shape[1], x.shape[0]))  # [l] enters layer l
        columns[depth - 1] = start
        for layer in range(depth - 1, 0, -1):
            c = columns[layer]
            torch.lerp(c.index_select(0, partner[layer]), c, alphas[layer].unsqueeze(1), out=columns[layer - 1])
        c = columns[0]
        return torch.lerp(c.index_select(0, partner[0]), c, alphas[0].unsqueeze(1)), z, diffs, alphas, columns

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, *unused):
        if grad is None:  # only the saved (non-differentiable) outputs were used
            return None, None, None, None, None, None
        z, diffs, alphas, columns = ctx.saved_tensors
        plan = _plan(*ctx.plan_key)
        depth, partner, flat = plan[0], plan[1], plan[6]
        # r_0 = ∂L/∂c_0, r_l = M_l r_(l-1): what each layer's output gets; a list and out-of-place
        # products, not out= buffers: the backward also runs under torch.func.vmap
        sweep = [grad]
        for layer in range(depth - 1):
            r = sweep[-1]
            sweep.append(torch.lerp(r.index_select(0, partner[layer]), r, alphas[layer].unsqueeze(1)))
        # ∂L/∂α_l = r_(l-1) (c_l - c_l[p]) for all layers at once
        stacked = columns.flatten(0, 1)
        alpha_grads = torch.sub(stacked, stacked.index_select(0, flat)).view_as(columns) * torch.stack(sweep)
        alpha_grads = alpha_grads[:, :, 0] if alpha_grads.shape[2] == 1 else alpha_grads.sum(2)
        grad_z, grad_art = _value_backward(None, (z, diffs, alphas), plan, ctx.params, ctx.mode, alpha_grads)
        return _sweep_grads(grad_z, grad_art, z[:, 0], ctx.params)

    @staticmethod
    def vmap(info, in_dims, *inputs):
        return _vmapped(_ColumnSweep, info.batch_size, in_dims, inputs)


class _LabelSweep(_Sweep):
    """``(x (B, n), scale, ..., position (B,))`` → ``P[b, position[b], :]`` at the output wires
    (k, B): the one-hot row of ``position`` rides along the value sweep (numba kernels on CPU rows)."""

    @staticmethod
    def forward(x, scale, key, params, mode, position):
        params = _with_scale(params, scale)
        plan = _plan(key[0], key[1], key[2], str(x.device), str(x.dtype))
        wires = _wires(x, params, 2)
        wires[:, 1].scatter_(0, position.unsqueeze(0), 1.0)
        if networks_numba.usable(wires, params, mode):
            return networks_numba.label_forward(wires, plan, _far(x.dtype))
        final, diffs, alphas = _value_sweep(wires, plan, params, mode)
        return final[:, 1].index_select(0, plan[3]), wires, diffs, alphas

    @staticmethod
    def setup_context(ctx, inputs, output):
        _Sweep.setup_context(ctx, inputs, output)
        ctx.kernel = networks_numba.usable(output[1], ctx.params, ctx.mode)  # as the forward's (CPU)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, *unused):
        if grad is None:
            return None, None, None, None, None, None
        wires, diffs, alphas = ctx.saved_tensors
        plan = _plan(*ctx.plan_key)
        if ctx.kernel and not torch._C._functorch.is_functorch_wrapped_tensor(grad):
            return networks_numba.label_backward(grad, plan, ctx, _far(wires.dtype)), None, None, None, None, None
        row = torch.zeros_like(wires[:, 1]).index_copy(0, plan[3], grad)
        start = torch.stack([torch.zeros_like(row), row], 1)
        grad_z, grad_art = _value_backward(start, (wires, diffs, alphas), plan, ctx.params, ctx.mode)
        return _sweep_grads(grad_z, grad_art, wires[:, 0], ctx.params)

    @staticmethod
    def vmap(info, in_dims, *inputs):
        return _vmapped(_LabelSweep, info.batch_size, in_dims, inputs)


def _split_scale(params: dict, x: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
    """A per-row steepness tensor ((B, 1) or scalar) as ``scale`` (B, 1), apart from the params."""
    steepness = params["steepness"]
    if not isinstance(steepness, torch.Tensor):
        return params, None
    return {**params, "steepness": 1.0}, steepness.to(x.dtype).expand(x.shape[0], 1)


def _key(network: str, x: torch.Tensor, k: int) -> tuple[str, int, int]:
    """The network's cache key; ``operator.index`` makes a dynamic row length static (a guard)
    under ``torch.compile``, since the layout depends on it."""
    return network, operator.index(x.shape[-1]), k


def _columns(x: torch.Tensor, k: int, network: str, params: dict, ranks: bool) -> torch.Tensor:
    params, scale = _split_scale(params, x)
    mode = _infinities(x, params)
    return _ColumnSweep.apply(x, scale, _key(network, x, k), params, mode, ranks)[0]


def _kernel_plan(x: torch.Tensor, k: int, network: str, params: dict, wires: int) -> tuple | None:
    """The network's plan where its sweep of ``x`` runs on the Triton kernels (:mod:`.networks_triton`)."""
    usable = networks_triton.usable(x, k, params, _infinities(x, params), wires)
    return _plan(*_key(network, x, k), str(x.device), str(x.dtype)) if usable else None


def network_ranks(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k attribution ``(B, n, k)`` of a sorting/selection network for ``x`` (B, n);
    ``steepness`` a float or a per-row (B, 1) tensor (with gradients)."""
    return _columns(x, k, network, params, ranks=True).permute(2, 0, 1)


def network_mask(x: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """Relaxed top-k mask ``(B, n)``: the row sums of the top-k ranks, from one reverse sweep, on
    every row of the extended reals (:mod:`softtopk._extended`'s semantics): the sweep is exact on
    rows with ``p`` entries at ``+inf`` and ``q`` at ``-inf`` when ``p < k < n - q``; where ``p >= k``
    the ``+inf`` entries share ``k`` equally, and where ``n - q <= k`` every entry above ``-inf``
    has mask 1 and the ``-inf`` entries share the rest, all with gradient 0."""
    plan = _kernel_plan(x, k, network, params, networks_triton.MAX_MASK_WIRES)
    if plan is None:
        mask = _columns(x, k, network, params, ranks=False)[:, 0].T
    else:
        mask = networks_triton.mask_sweep(x, k, plan, params["steepness"], _far(x.dtype))
    n = x.shape[-1]
    positive, negative = x == float("inf"), x == float("-inf")
    p = positive.sum(-1, keepdim=True, dtype=x.dtype)
    q = negative.sum(-1, keepdim=True, dtype=x.dtype)
    full, short = p >= k, q >= n - k
    closed = torch.where(full, torch.where(positive, k / p, 0.0), torch.where(negative, (q + (k - n)) / q, 1.0))
    return torch.where(full | short, closed, mask)


def network_label_stage(x: torch.Tensor, n: int, k: int, *, network: str, hard: bool = False, **params):
    """The label sweep's Triton kernels for rows of ``n`` entries like ``x`` (None where they do not run)."""
    mode = _infinities(x, params)
    if hard or not networks_triton.usable(x, k, params, mode, networks_triton.MAX_WIRES, n):
        return None
    return _label_stage((network, n, k, str(x.device), str(x.dtype)), float(params["steepness"]), _far(x.dtype))


@functools.lru_cache(maxsize=256)
def _label_stage(key: tuple, steepness: float, far: float) -> networks_triton.LabelStage:
    """The label sweep's kernels through the network of ``key`` (:func:`network_plan`'s), made once
    per key and steepness (the stage slices the plan's signs: a view a call need not make again)."""
    return networks_triton.label_stage(_plan(*key), steepness, far)


def network_label_ranks(x: torch.Tensor, position: torch.Tensor, k: int, *, network: str, **params) -> torch.Tensor:
    """``P[b, position[b], :k]`` ``(B, k)``: where the item at ``position`` lands, in one sweep."""
    stage = network_label_stage(x, x.shape[-1], k, network=network, **params)
    if stage is not None:
        return networks_triton.label_sweep(x, position, stage)
    params, scale = _split_scale(params, x)
    mode = _infinities(x, params)
    return _LabelSweep.apply(x, scale, _key(network, x, k), params, mode, position)[0].T
