"""The row kernel of the noised top-k hinge losses (:mod:`softtopk.losses.noised`; Garcin et al.,
ICML 2022): the hinge of the Monte-Carlo (k+1)-th largest score, with the exact gradient of the
estimate."""

from __future__ import annotations

import torch

from . import noised_numba
from ._function import Function
from .compute import constant, kth_largest, overflow_free_mean, owns_rows, zero_unless


class NoisedHinge(Function):
    """``(logits (R, C), label (R,), scaled noise (R, C, S) or the kernel's own draws
    (:class:`~softtopk.ops.noised_numba.FreshDraws`), margin (R,) or float, scale or None, k,
    kept (R,) bool)`` -> ``relu(scale * (margin + top_{k+1,eps}(s) - s_y))`` per row, in pytopk's
    operation order, and 0 at the rows not ``kept`` (ignored targets). Backward: where the hinge
    is active, ``scale / S`` on each draw's (k+1)-th position and ``-scale`` on the label (no dense
    ``(R, C, S)`` tensor is saved, only the ``(R, S)`` positions); relu's own backward also gives
    the rows not kept their gradient 0."""

    generate_vmap_rule = True

    @staticmethod
    def forward(logits, label, noise, margin, scale, k, kept):
        if isinstance(noise, noised_numba.FreshDraws):  # CPU rows: the kernel draws its own noise
            draws, index = noised_numba.kth_of_fresh_draws(logits, noise, k + 1)
        elif noised_numba.usable(logits, noise):  # CPU rows: one pass of a numba kernel
            draws, index = noised_numba.kth_of_draws(logits, noise, k + 1)
        else:  # the noise is the caller's fresh tensor: the scores are added into it where allowed
            plus = noise.add_ if owns_rows(noise) else noise.add
            draws, index = kth_largest(plus(logits.unsqueeze(-1)), k + 1, dim=1)  # s + eps Z: the sum commutes
        hinge = overflow_free_mean(draws, plus=margin) - logits.gather(1, label.unsqueeze(1)).squeeze(1)
        loss = zero_unless(kept, torch.relu(hinge if scale is None else scale * hinge))
        return loss, index

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        logits, label, _, _, ctx.scale, _, _ = inputs
        loss, index = output
        ctx.mark_non_differentiable(index)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(label, index, loss)
        ctx.classes = logits.shape[1]

    @staticmethod
    def backward(ctx, grad, _unused):
        if grad is None:
            return None, None, None, None, None, None, None
        label, index, loss = ctx.saved_tensors
        share = torch.ops.aten.threshold_backward(grad, loss, 0.0)  # relu's own backward: 0 where loss <= 0
        if ctx.scale is not None:
            share = share.mul_(ctx.scale)
        ones = constant((1.0,), share).expand(index.shape)  # one per draw, made once per device
        counts = share.new_zeros(share.shape[0], ctx.classes).scatter_add_(1, index, ones)
        grad_logits = counts.div_(index.shape[1]).mul_(share.unsqueeze(1))  # pytopk's rounding
        grad_logits = grad_logits.scatter_add_(1, label.unsqueeze(1), share.neg().unsqueeze(1))
        return grad_logits, None, None, None, None, None, None
