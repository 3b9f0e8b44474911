r"""A differentiable Spearman-correlation loss from soft ranks (the use of torchsort's README).

.. math::
    \mathrm{loss} = 1 - \rho\big(r_\varepsilon(\hat y),\ \operatorname{rank}(y)\big), \qquad
    \rho(a, b) = \frac{\langle a - \bar a,\ b - \bar b\rangle}{\|a - \bar a\|\,\|b - \bar b\|},

where :math:`r_\varepsilon` are the soft ranks of :func:`softtopk.soft_rank` (Blondel et al., ICML
2020) and :math:`\operatorname{rank}(y)` the exact ranks of the targets, ties given their average
rank (as ``scipy.stats.spearmanr`` does). With hard ranks of the predictions it is ``1 - ρ_S``, one
minus Spearman's rank correlation: 0 for the targets' order, 2 for its reverse.
"""

from __future__ import annotations

import torch

from .._validation import check_reduction, check_scores
from ..ops.compute import compute_dtype
from ..sorting import soft_rank

__all__ = ["SpearmanLoss", "spearman_loss"]


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks ``1..n`` along the last dimension, ties given the mean of the ranks they span: one sort
    and two ``searchsorted`` (no value read)."""
    ordered = x.sort(-1).values.contiguous()
    x = x.contiguous()
    below = torch.searchsorted(ordered, x, right=False)
    upto = torch.searchsorted(ordered, x, right=True)
    return (below + upto + 1).to(x.dtype) / 2


def _centred_unit(v: torch.Tensor) -> torch.Tensor:
    """``(v - mean) / ||v - mean||`` along the last dimension; a constant row stays 0 (its norm is
    floored at the dtype's ``tiny``), so that ``ρ`` is 0, not NaN, when either side has no spread."""
    centred = v - v.mean(-1, keepdim=True)
    return centred / centred.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(v.dtype).tiny)


def spearman_loss(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    regularization: str = "l2",
    strength: float | torch.Tensor = 1.0,
    dim: int = -1,
    reduction: str = "mean",
) -> torch.Tensor:
    """``1 - ρ(soft_rank(input), rank(target))`` per list along ``dim``: 0 for the targets' order.

    Args:
        input: predicted scores, any floating tensor; the lists lie along ``dim``.
        target: the true values, the same shape (any real dtype; only their order matters, ties
            share their average rank).
        regularization: ``'l2'`` (default) or ``'kl'``, as :func:`softtopk.soft_rank`.
        strength: the soft ranks' ``ε`` (positive float or a tensor broadcastable to one value per
            list), as :func:`softtopk.soft_rank`: small is close to the hard ranks.
        dim: the list dimension. Default -1.
        reduction: ``'mean'`` (default; 0 for no list), ``'sum'`` or ``'none'`` (``input``'s shape
            without ``dim``).

    A list whose soft ranks or targets are all equal has ``ρ = 0`` (loss 1) rather than NaN. NaN
    in ``input`` or ``target`` gives its list a NaN loss.

    Example:
        >>> import torch, softtopk
        >>> pred = torch.tensor([[0.1, 0.9, 0.5, 0.3]])
        >>> truth = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
        >>> softtopk.spearman_loss(pred, truth, strength=1e-3).abs() < 1e-6  # hard ranks: the same order
        tensor(True)
        >>> softtopk.spearman_loss(pred, -truth, strength=1e-3)  # the reverse order
        tensor(2.)
        >>> softtopk.spearman_loss(pred, truth, strength=1.0)  # softer ranks: the order is blurred
        tensor(0.0173)

    Reference: M. Blondel, O. Teboul, Q. Berthet, J. Djolonga. Fast Differentiable Sorting and
    Ranking. ICML 2020 (soft ranks; the Spearman loss is the example of torchsort's README).
    """
    input = check_scores("input", input)
    reduction = check_reduction(reduction)
    if not isinstance(target, torch.Tensor) or target.shape != input.shape:
        shape = tuple(target.shape) if isinstance(target, torch.Tensor) else type(target).__name__
        raise ValueError(f"target must be a tensor of input's shape {tuple(input.shape)}, got {shape}")
    if target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"target must hold real numbers, got {target.dtype}")
    ranks = soft_rank(input, regularization=regularization, strength=strength, dim=dim).movedim(dim, -1)
    ranks = ranks.to(compute_dtype(ranks.dtype))
    target = target.movedim(dim, -1).to(ranks.dtype)
    loss = 1 - (_centred_unit(ranks) * _centred_unit(average_ranks(target))).sum(-1)
    loss = torch.where(target.isnan().any(-1), torch.nan, loss)
    if reduction == "none":
        return loss
    return loss.sum() / max(loss.numel(), 1) if reduction == "mean" else loss.sum()


class SpearmanLoss(torch.nn.Module):
    """Module twin of :func:`spearman_loss`: ``SpearmanLoss(regularization=..., strength=..., dim=...,
    reduction=...)(input, target)``.

    Example:
        >>> import torch, softtopk
        >>> loss_fn = softtopk.SpearmanLoss(strength=0.1)
        >>> pred = torch.randn(8, 20, requires_grad=True)
        >>> loss_fn(pred, torch.randn(8, 20)).backward()
    """

    def __init__(
        self, *, regularization: str = "l2", strength: float = 1.0, dim: int = -1, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.regularization, self.strength, self.dim = regularization, strength, dim
        self.reduction = check_reduction(reduction)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return spearman_loss(
            input,
            target,
            regularization=self.regularization,
            strength=self.strength,
            dim=self.dim,
            reduction=self.reduction,
        )

    def extra_repr(self) -> str:
        return (
            f"regularization={self.regularization!r}, strength={self.strength!r}, dim={self.dim}, "
            f"reduction={self.reduction!r}"
        )
