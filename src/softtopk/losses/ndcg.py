r"""A differentiable NDCG@k loss for ranking and retrieval, from soft top-k ranks.

.. math::
    \mathrm{DCG@k} = \sum_{r=0}^{k-1} \frac{\sum_i P_{ir}\, (2^{y_i} - 1)}{\log_2(r + 2)}, \qquad
    \mathrm{loss} = 1 - \frac{\mathrm{DCG@k}}{\mathrm{IDCG@k}},

where ``P[i, r]`` is the weight of item ``i`` at rank ``r`` (0 = highest score) from
:func:`softtopk.soft_topk_ranks` and ``IDCG@k`` the DCG of the ideal order of the relevances ``y``.
With hard ranks (``P`` a 0/1 assignment) it is exactly ``1 - NDCG@k``; with ``method="neuralsort"``
it is the NeuralNDCG surrogate of Pobrotyn & Białobrzeski (2021) truncated at ``k`` (their Sinkhorn
scaling of the NeuralSort matrix left out: each rank's weights already sum to 1).
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import check_int, check_reduction, check_relevance, check_scores
from ..operators import soft_topk_ranks

__all__ = ["NDCGLoss", "ndcg_loss"]


def ndcg_loss(
    scores: torch.Tensor,
    relevance: torch.Tensor,
    k: int,
    *,
    method: str = "neuralsort",
    mask: torch.Tensor | None = None,
    reduction: str = "mean",
    **params: Any,
) -> torch.Tensor:
    """``1 - NDCG@k`` of each list (0 is a perfect ranking), differentiable in ``scores``.

    Args:
        scores: ``(*, n)`` model scores, one list per row of the last axis.
        relevance: ``(*, n)`` graded relevance ``y >= 0`` (gain ``2^y - 1``), finite; checked on CPU
            tensors outside ``torch.compile``/``vmap`` only (ValueError naming ``relevance``; one host
            read), unchecked on accelerators (a check there would synchronise). A NaN relevance
            gives its list a NaN loss.
        k: cut-off, ``1 <= k <= n``.
        method: any ranks method of :func:`softtopk.methods` (default ``"neuralsort"``: NeuralNDCG).
        mask: optional bool ``(*, n)``, ``False`` for padding in lists shorter than ``n``: their
            scores become ``-inf`` (ranked last) and their relevance 0. Lists with no relevant item
            (``IDCG = 0``) have loss 0.
        reduction: ``'mean'`` (default; 0 for an empty batch), ``'sum'`` or ``'none'`` (shape ``*``).
        **params: the method's parameters (``tau`` for NeuralSort/SoftSort, ...).

    Example:
        >>> import torch
        >>> scores = torch.tensor([[3.0, 1.0, 2.0]])
        >>> ndcg_loss(scores, torch.tensor([[2.0, 0.0, 1.0]]), 2, tau=1e-3)  # the ideal order
        tensor(0.)

    References:
        Pobrotyn, Białobrzeski. "NeuralNDCG: Direct Optimisation of a Ranking Metric via Differentiable
        Relaxation of Sorting", arXiv:2102.07831 (2021). Järvelin, Kekäläinen. "Cumulated gain-based
        evaluation of IR techniques", TOIS 2002.
    """
    scores = check_scores("scores", scores)
    k = check_int("k", k, low=1, high=scores.shape[-1], why=" (the list length n)")
    reduction = check_reduction(reduction)
    if mask is not None and (
        not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != scores.shape
    ):
        raise ValueError(
            f"mask must be a bool tensor of shape {tuple(scores.shape)}, got "
            f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}"
        )
    relevance = check_relevance(relevance, scores, mask)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
        relevance = relevance.masked_fill(~mask, 0.0)
    gains = torch.exp2(relevance) - 1
    discounts = 1.0 / torch.log2(torch.arange(k, device=scores.device, dtype=gains.dtype) + 2.0)
    ranks = soft_topk_ranks(scores, k, method=method, **params)  # (*, n, k)
    dcg = torch.einsum("...nk,...n,k->...", ranks, gains, discounts)
    ideal = (gains.topk(k, dim=-1).values * discounts).sum(-1)
    # a list without relevant items (IDCG = 0) has loss 0; a NaN relevance stays NaN in its list
    loss = 1 - dcg / ideal.masked_fill(ideal == 0, 1.0)
    loss = loss.masked_fill(ideal == 0, 0.0)
    if reduction == "none":
        return loss
    return loss.sum() / max(loss.numel(), 1) if reduction == "mean" else loss.sum()


class NDCGLoss(torch.nn.Module):
    """Module twin of :func:`ndcg_loss`: ``NDCGLoss(k, method=..., reduction=..., **params)(scores,
    relevance, mask=None)``.

    Example:
        >>> import torch
        >>> NDCGLoss(2, tau=1e-3)(torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([[2.0, 0.0, 1.0]])).round(decimals=4)
        tensor(0.8262)
    """

    def __init__(self, k: int, *, method: str = "neuralsort", reduction: str = "mean", **params: Any) -> None:
        super().__init__()
        self.k = check_int("k", k, low=1)
        self.method, self.reduction, self.params = method, check_reduction(reduction), params

    def forward(self, scores: torch.Tensor, relevance: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return ndcg_loss(
            scores, relevance, self.k, method=self.method, mask=mask, reduction=self.reduction, **self.params
        )

    def extra_repr(self) -> str:
        params = "".join(f", {name}={value!r}" for name, value in self.params.items())
        return f"k={self.k}, method={self.method!r}, reduction={self.reduction!r}{params}"
