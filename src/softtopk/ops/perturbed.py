"""Monte-Carlo perturbed top-k: a perturbed-optimizer mask and pytopk's noised k-th largest value.

* :func:`softtopk.perturbed_topk` averages hard top-k masks of ``x + sigma * Z`` over ``S`` noise draws and
  differentiates the smoothed mask with the perturbed-optimizer estimator of Berthet et al. (2020)
  (a score-function estimator: it needs only the noise and the selected indices).
* :func:`softtopk.noised_kth_value` is the smoothed k-th largest value of Garcin et al. (2022) (pytopk's
  ``NoisedTopK``): the mean over ``S`` draws of the k-th largest entry of ``x + epsilon * Z``, with
  the exact gradient of that Monte-Carlo estimate (one-hot of the perturbed k-th position).

Both draw ``O(B S n)`` noise (``B`` rows of ``n`` items, ``S`` samples): that memory is inherent in
the Monte-Carlo estimate. For backward, :func:`softtopk.perturbed_topk` saves the noise and the ``O(B S k)``
selected indices and :func:`softtopk.noised_kth_value` only the ``O(B S)`` k-th positions, never a dense
``(B, S, n)`` mask. Randomness comes from ``generator`` (a :class:`torch.Generator` on the input's
device type) or, when ``None``, from torch's global RNG. Under :func:`torch.func.vmap` pass
``randomness="different"`` or ``"same"`` (the default ``"error"`` refuses random draws). Under
:func:`torch.compile` both trace in one graph with ``generator=None``; a Generator object is a graph
break (it still runs).
"""

from __future__ import annotations

import torch

from . import noised_numba
from ._function import Function
from .compute import overflow_free_mean

NOISE_KINDS = ("gaussian", "gumbel")


def draw_noise(
    shape: tuple[int, ...], kind: str, generator, like: torch.Tensor, *, negated: bool = False
) -> torch.Tensor:
    """Standard Gaussian or Gumbel noise of ``shape`` in ``like``'s dtype, on its device, from
    ``generator`` or (``None``) the global RNG; ``negated`` (Gumbel only) gives ``-G`` one op sooner."""
    if kind == "gaussian":
        return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)
    uniform = torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)
    # -log(-log U), in place on the fresh draws; finite: no U = 0
    negative = uniform.clamp_min_(torch.finfo(like.dtype).tiny).log_().neg_().log_()
    return negative if negated else negative.neg_()


class _PerturbedTopK(Function):
    """``(rows (B, n), noise (B, S, n))`` → mean hard top-k mask of ``rows + sigma * noise``, on the
    extended reals (:mod:`softtopk._extended`).

    Noise never moves an infinite entry, so ``topk`` picks among equal ``+inf`` (or ``-inf``)
    entries by its own order, the same in every draw: their mask is replaced by the mean over
    their class, which is the closed form (``k/p`` for ``p >= k`` entries at ``+inf``, the rest of
    ``k`` shared by the ``-inf`` entries of a row with at most ``k`` entries above ``-inf``) and
    leaves the 1 and 0 of every other row as they are. Those two kinds of rows have gradient 0."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows, noise, k, sigma, kind):
        samples = noise.shape[1]
        index = torch.add(rows.unsqueeze(1), noise, alpha=sigma).topk(k, dim=-1, sorted=False).indices
        flat = index.flatten(1)  # (B, S k)
        counts = torch.zeros_like(rows).scatter_add(1, flat, torch.ones_like(flat, dtype=rows.dtype))
        mask = counts / samples
        top, bottom = rows == float("inf"), rows == float("-inf")
        above, below = top.sum(-1, keepdim=True), bottom.sum(-1, keepdim=True)
        # the class means (0/0 only where the class is empty, then unused)
        mask = torch.where(top, (mask * top).sum(-1, keepdim=True) / above, mask)
        mask = torch.where(bottom, (mask * bottom).sum(-1, keepdim=True) / below, mask)
        frozen = rows.isinf() | ((above >= k) | (below >= rows.shape[-1] - k))
        return mask, index, frozen

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, noise, _, ctx.sigma, ctx.kind = inputs
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(noise, output[1], output[2])
        ctx.mark_non_differentiable(output[1], output[2])

    @staticmethod
    def backward(ctx, grad, _index, _frozen):
        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        noise, index, frozen = ctx.saved_tensors
        batch, samples, k = index.shape
        inner = grad.gather(1, index.flatten(1)).view(batch, samples, k).sum(-1)  # <g, y_s>  (B, S)
        # nabla nu(Z) for the noise density exp(-nu): z (Gaussian), 1 - exp(-z) (Gumbel)
        score = noise if ctx.kind == "gaussian" else -torch.expm1(-noise)
        grad_rows = torch.bmm(inner.unsqueeze(1), score).squeeze(1) / (ctx.sigma * samples)
        # an infinite entry's selection never changes under noise: its gradient is 0 (the estimator
        # would give it noise), as is every gradient of a row whose mask is a closed form
        return grad_rows.masked_fill_(frozen, 0.0), None, None, None, None


def perturbed_topk_rows(
    rows: torch.Tensor,
    k: int,
    *,
    sigma: float,
    n_samples: int,
    noise: str,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Perturbed top-k mask ``(B, n)`` of rows ``(B, n)`` (in the compute dtype); the registry passes
    every parameter (the defaults live there and in :func:`softtopk.perturbed_topk`)."""
    draws = draw_noise((rows.shape[0], n_samples, rows.shape[1]), noise, generator, rows)
    return _PerturbedTopK.apply(rows, draws, k, sigma, noise)[0]


# ------------------------------------------------------------------------- noised k-th largest value


class _NoisedKthValue(Function):
    """``(x, scaled noise x.shape + (S,))`` → mean over ``S`` of the k-th largest of ``x + noise`` along ``dim``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, noise, k, dim):
        values, index = (x.unsqueeze(-1) + noise).topk(k, dim=dim)
        kth = values.select(dim, k - 1)
        return overflow_free_mean(kth), index.select(dim, k - 1)  # pytopk's rounding, no overflow

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, _, _, ctx.dim = inputs
        ctx.x_shape = x.shape
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _unused):
        (index,) = ctx.saved_tensors  # x.shape without dim, + (S,)
        dim, samples = ctx.dim, index.shape[-1]
        grad_x = grad_noise = None
        if ctx.needs_input_grad[0]:  # the S one-hots are counted straight into x's shape
            moved = index.movedim(-1, dim)
            counts = grad.new_zeros(ctx.x_shape).scatter_add(dim, moved, torch.ones_like(moved, dtype=grad.dtype))
            grad_x = counts / samples * grad.unsqueeze(dim)
        if ctx.needs_input_grad[1]:
            share = (grad / samples).unsqueeze(-1).expand(index.shape)
            grad_noise = grad.new_zeros((*ctx.x_shape, samples))
            grad_noise = grad_noise.scatter(dim, index.unsqueeze(dim), share.unsqueeze(dim))
        return grad_x, grad_noise, None, None


def noised_kth_value_of(x: torch.Tensor, noise: torch.Tensor, k: int, dim: int) -> torch.Tensor:
    """Mean over the last axis of ``noise`` (``x.shape + (S,)``, already scaled) of the k-th largest
    entry of ``x + noise`` along ``dim`` (a non-negative axis of ``x``); the gradient is the mean of
    the ``S`` one-hots."""
    return _NoisedKthValue.apply(x, noise, k, dim)[0]


class _FreshKthValue(Function):
    """``(rows (R, n), noised_numba.FreshDraws, k)`` → the mean over the draws of the k-th largest of
    each row plus noise the numba kernel draws itself (R,); the gradient is the mean of the one-hots."""

    @staticmethod
    def forward(rows, draws, k):
        values, index = noised_numba.kth_of_fresh_draws(rows, draws, k)
        return overflow_free_mean(values), index

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.columns = inputs[0].shape[1]
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _unused):
        (index,) = ctx.saved_tensors
        share = (grad / index.shape[1]).unsqueeze(1).expand(index.shape)
        return grad.new_zeros(index.shape[0], ctx.columns).scatter_add_(1, index, share), None, None


def fresh_kth_value(rows: torch.Tensor, draws: noised_numba.FreshDraws, k: int) -> torch.Tensor:
    """:func:`noised_kth_value_of` of rows ``(R, n)`` along their last axis, the noise drawn by the
    numba kernel (:func:`softtopk.ops.noised_numba.kth_of_fresh_draws`): ``(R,)``."""
    return _FreshKthValue.apply(rows, draws, k)[0]
