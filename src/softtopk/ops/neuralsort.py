"""NeuralSort (Grover et al., ICLR 2019): a unimodal row-stochastic relaxation of the sort.

For scores :math:`s \\in \\mathbb{R}^n` and rank :math:`r` (0-based, 0 = largest),

.. math::
    P[i, r] = \\operatorname{softmax}_i\\Big(
        \\big((n - 1 - 2r)\\, s_i - \\textstyle\\sum_l |s_i - s_l|\\big)/\\tau\\Big).

Each rank column sums to 1; an item's weights over ranks need not (so a mask ``P[:, :k].sum(-1)``
sums to ``k`` but may exceed 1 for an item). With :math:`\\ell_i` the number of scores below
:math:`s_i`, :math:`C_i` their sum and :math:`\\rho = n - 1 - r`, the logit is, up to a constant
of the column, :math:`2\\,(C_i - (\\ell_i - \\tfrac12 - \\rho)\\, s_i)`: one sort, a prefix sum and a
``searchsorted`` give it for every item (tied scores get the same ``ℓ`` and so bitwise equal
logits), so top-k ranks cost ``O(n log n + n k)`` time and ``O(n k)`` memory instead of ``O(n^2)``.
The logits and the softmax are computed in float64 (float32 cancellation in ``(n - 1 - 2r) s_i -
A_i`` reaches ``1e-3`` of the scores' spread from ``n ≈ 1000`` on, and scores near ``1e38`` would
overflow).

Its backward is hand-written: with :math:`\\gamma = P \\odot (g - \\bar g_r)/\\tau` (``g`` the
incoming gradient, :math:`\\bar g_r = \\sum_i P_{ir} g_i`), :math:`\\alpha_i = \\sum_r \\gamma_{ir}`,
:math:`\\beta_i = \\sum_r (\\rho_r + \\frac12) \\gamma_{ir}`, and :math:`h_i` the number of scores
at or below :math:`s_i`,

.. math::
    \\partial s_i = 2\\beta_i - (\\ell_i + h_i)\\,\\alpha_i - \\textstyle\\sum_{s_l < s_i} \\alpha_l
    - \\sum_{s_l \\le s_i} \\alpha_l ,

which is ``d|u|/du = sign(u)`` with ``sign(0) = 0``, as the original's ``torch.abs``: tied scores
get symmetric gradients. :math:`\\partial\\tau = -\\frac1\\tau \\sum \\gamma\\tau \\log P`
(``0 log 0 = 0``).

Infinite scores (the semantics of :mod:`softtopk._extended`) are handled in the kernel: the prefix
sums skip them, and in the ``s_i`` factor ``+inf`` becomes ``M`` and ``-inf`` ``-M/2`` with ``ℓ``
counted as for a score just above the finite ones (``+inf``) or just below them (``-inf``), which
is the limit of entries at ``±M``: the ``+inf`` entries share the first ranks equally, the ``-inf``
entries the ranks past the finite ones, and every other weight of theirs is exactly 0, as are
their gradients; the finite entries get the formula of the finite entries alone. A row with at
most ``k`` entries above ``-inf`` has mask 1 on those entries (gradient 0).

Reference: A. Grover, E. Wang, A. Zweig, S. Ermon, "Stochastic Optimization of Sorting Networks via
Continuous Relaxations", ICML 2019.
"""

from __future__ import annotations

import torch

from . import neuralsort_triton
from ._function import Function
from .compute import label_row, sort_rows, unsort
from .neuralsort_rows import logit_pieces, scores_grad

_WIDE = torch.float64
_FAR = 2.0**600  # M for float64 scores (float32 ones take their largest finite value): M n / tau stays finite


def _far(dtype: torch.dtype) -> float:
    """``M``, the logits' stand-in for ``+inf`` scores in ``dtype`` (the kernels' too)."""
    return min(_FAR, torch.finfo(dtype).max)


class _NeuralSort(Function):
    """``(x (B, n), tau)`` → the mask ``Σ_r P`` (B, n) (``reduce``) or the ranks ``P`` laid out (B, k, n).

    Computed on the sorted row (the items in increasing order; a permutation of the softmax axis
    changes nothing) and put back in the row's order once, forward and backward: ``ℓ`` and ``h``
    are then ``searchsorted`` of sorted queries, and the prefix sums of ``α`` need no gather."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, tau, k, reduce):
        n = x.shape[-1]
        ordered, order = sort_rows(x)
        ordered = ordered.contiguous()  # for searchsorted (rows of a vmapped input may be strided)
        far, below, sums = logit_pieces(ordered, _far(x.dtype))  # s'_i, ℓ_i, C_i
        shift = torch.arange(n - 0.5, n - 0.5 - k, -1.0, dtype=_WIDE, device=x.device)  # ρ + 1/2
        # C_i - (ℓ_i - 1/2 - ρ) s_i, in float64
        # laid out (B, k, n): each softmax runs along contiguous memory
        logits = torch.addcmul(
            torch.addcmul(sums, below, far, value=-1).unsqueeze(-2), shift.unsqueeze(-1), far.unsqueeze(-2)
        )
        if x.dtype == _WIDE:  # no exponent range to spare: from each rank's maximum before dividing by τ
            logits = logits.sub_(logits.amax(-1, keepdim=True))
        tensor_tau = isinstance(tau, torch.Tensor)
        logits = logits.mul_(2.0).div_(tau.unsqueeze(-1)) if tensor_tau else logits.mul_(2.0 / tau)
        ranks = torch.softmax(logits, dim=-1)  # the sorted items' columns
        if not reduce:
            out = ranks.to(x.dtype)
            out = unsort(out, order.unsqueeze(-2).expand(-1, k, -1))  # the row's order
            return out, ranks, ordered, order, below, far, shift, None
        # rows with at most k < n entries above -inf select them all, with gradient 0
        short = ordered[..., n - 1 - k : n - k] == float("-inf")
        mask = ranks.sum(-2, dtype=x.dtype).masked_fill_((ordered > float("-inf")) & short, 1.0)
        return unsort(mask, order), ranks, ordered, order, below, far, shift, short

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, tau, _, ctx.reduce = inputs
        ctx.dtype = inputs[0].dtype
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(t for t in output[1:] if t is not None))
        ctx.tau_tensor = isinstance(tau, torch.Tensor)
        ctx.tau = None if ctx.tau_tensor else tau
        ctx.save_for_backward(*output[1:], tau if ctx.tau_tensor else None)

    @staticmethod
    @torch.autograd.function.once_differentiable  # P is saved without its graph: a second derivative raises
    def backward(ctx, grad, *_):
        if grad is None:
            return None, None, None, None
        ranks, ordered, order, below, far, shift, short, tau_t = ctx.saved_tensors
        if ctx.reduce:
            grad = grad.gather(-1, order).masked_fill_(short, 0.0).to(_WIDE).unsqueeze(-2)  # (B, 1, n)
            mean = torch.bmm(ranks, grad.transpose(-1, -2))  # (B, k, 1): Σ_i P g_i
        else:
            grad = grad.gather(-1, order.unsqueeze(-2).expand_as(grad)).to(_WIDE)
            mean = (ranks * grad).sum(-1, keepdim=True)
        centred = grad - mean
        gamma = ranks * centred  # γ τ, (B, k, n)
        grad_x = scores_grad(ordered, far, below, gamma.sum(-2), shift @ gamma)  # -τ ∂s
        scale = -tau_t if ctx.tau_tensor else -ctx.tau
        grad_x = grad_x.div_(scale).masked_fill_(ordered.isinf(), 0.0).to(ctx.dtype)
        grad_tau = None
        if ctx.tau_tensor and ctx.needs_input_grad[1]:
            grad_tau = -(centred * torch.special.xlogy(ranks, ranks)).sum((-2, -1)).unsqueeze(-1) / tau_t
            grad_tau = grad_tau.to(tau_t.dtype)
        return unsort(grad_x, order), grad_tau, None, None


def neuralsort_ranks(x: torch.Tensor, k: int, *, tau: float | torch.Tensor) -> torch.Tensor:
    """NeuralSort top-k ranks ``(B, n, k)`` of ``x`` (B, n), which may hold ``±inf`` entries (module
    docstring); ``tau`` a float or a per-row (B, 1) tensor."""
    return _NeuralSort.apply(x, tau, k, False)[0].transpose(-1, -2)


def neuralsort_label_ranks(
    x: torch.Tensor, position: torch.Tensor, k: int, *, tau: float | torch.Tensor
) -> torch.Tensor:
    """``P[b, position[b], :k]`` ``(B, k)``: where the item at ``position`` (B,) lands among the top-k
    ranks of ``x`` (B, n) (top-k cross-entropy's label), the rows of :func:`neuralsort_ranks`."""
    stage = neuralsort_label_stage(x, x.shape[-1], k, tau=tau)
    if stage is not None:
        return neuralsort_triton.triton_label_ranks(x, position, stage)
    return label_row(neuralsort_ranks(x, k, tau=tau), position)


def neuralsort_label_stage(
    x: torch.Tensor, n: int, k: int, *, tau: float | torch.Tensor, hard: bool = False
) -> neuralsort_triton.Stage | None:
    """The label's NeuralSort kernels for rows of ``n`` entries like ``x`` (None where they do not run)."""
    if hard or not isinstance(tau, float) or not neuralsort_triton.label_usable(x, k, tau, n):
        return None
    return neuralsort_triton.Stage(k, tau, _far(x.dtype))


def neuralsort_mask(x: torch.Tensor, k: int, *, tau: float | torch.Tensor) -> torch.Tensor:
    """NeuralSort mask ``Σ_r P`` (B, n) of ``x`` (B, n) for every row (``±inf`` included; a row
    with at most ``k`` entries above ``-inf`` selects them all, the ``-inf`` entries share the rest)."""
    if k == x.shape[-1]:  # every row selects all (NaN stays in its row)
        return torch.where(x == x, 1.0, x)
    if isinstance(tau, float) and neuralsort_triton.usable(x, k, tau):
        return neuralsort_triton.triton_mask(x, k, tau, _far(x.dtype))
    return _NeuralSort.apply(x, tau, k, True)[0]
