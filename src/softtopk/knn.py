"""Differentiable k-nearest-neighbours: relaxed top-k neighbour weights and the kNN loss of the
NeuralSort / Gumbel subset-sampling experiments, plus the hard kNN vote used to evaluate them."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ._registry import register_tensor_params, resolve
from ._validation import check_int, check_labels, check_neighbors, check_scores
from .operators import soft_topk
from .ops.compute import compute_dtype

__all__ = ["DifferentiableKNN", "KNNOutput"]


class KNNOutput(NamedTuple):
    """What :meth:`DifferentiableKNN.forward` returns.

    Attributes:
        weights: ``(Q, N)`` relaxed top-k neighbour weights, each row summing to ``k``.
        loss: scalar kNN loss in ``[-1, 0]`` when ``query_labels`` were given, else ``None``.
    """

    weights: torch.Tensor
    loss: torch.Tensor | None


def _neg_sq_distances(query: torch.Tensor, neighbors: torch.Tensor) -> torch.Tensor:
    r"""``-||q_i - c_j||^2`` as ``(Q, N)``, via the expansion ``|q|^2 + |c|^2 - 2 q.c``, without overflow.

    Both sides are first centred on the (detached) neighbour mean: distances are translation
    invariant, so this is exact, and it removes most of the cancellation of the expansion for
    embeddings far from the origin. They are then divided by :math:`s`, the power of two at or above
    their largest absolute entry (detached): exact in floating point, and the expansion of entries
    in ``[-1, 1]`` is at most :math:`4d` and cannot overflow. The squared distance is
    :math:`s^2 d'` with :math:`d'` the scaled one (clamped at 0, as rounding can make it negative),
    the same number as without the scaling; only where that would come near the dtype's largest
    value :math:`M` (embeddings beyond about :math:`\sqrt{M / (d N)}`) is the factor :math:`s^2`
    capped at :math:`M / (64 d N)`, so that no score exceeds :math:`M / (16 N)` in size and the
    operators' sums over a row stay finite: the scores keep their order, and a relaxed top-k of
    scores that far apart is the hard one. With a NaN or infinite entry the scale is 1 (the
    unscaled expansion): the non-finite distances stay in that query's row or neighbour's column."""
    centre = neighbors.detach().mean(0, keepdim=True)
    q, c = query - centre, neighbors - centre
    largest = torch.linalg.vector_norm(c.detach(), float("inf"))
    if q.shape[0]:
        largest = torch.maximum(largest, torch.linalg.vector_norm(q.detach(), float("inf")))
    info = torch.finfo(c.dtype)
    scale = largest.clamp_min(info.tiny).log2_().ceil_().exp2_()  # a power of two: dividing by it is exact
    scale = scale.nan_to_num_(nan=1.0, posinf=1.0)  # a non-finite entry: unscaled, its row or column alone NaN/inf
    q, c = q / scale, c / scale
    sq = q.pow(2).sum(-1, keepdim=True) + c.pow(2).sum(-1) - 2.0 * (q @ c.transpose(0, 1))
    factor = (scale * scale).clamp_max_(info.max / (64.0 * c.shape[1] * c.shape[0]))
    return sq.clamp_min(0.0).mul_(factor).neg_()


class DifferentiableKNN(torch.nn.Module):
    r"""Differentiable k-nearest-neighbour selection and loss (Grover et al. 2019; Xie & Ermon 2019).

    Each query scores every candidate neighbour by its negative squared Euclidean distance and takes
    a relaxed top-k mask of the scores (:func:`softtopk.soft_topk` with ``method``):

    .. math::
        s_{qj} = -\lVert h_q - h_j \rVert^2, \qquad w_{q\cdot} = \mathrm{softtopk}_k(s_{q\cdot}),
        \qquad \sum_j w_{qj} = k,

    and, given query labels, the loss is the negative expected fraction of correct neighbours among
    the relaxed top k, averaged over the ``Q`` queries:

    .. math::
        \mathcal{L} = -\frac{1}{Q\,k} \sum_q \sum_j \mathbb{1}[y_j = y_q]\, w_{qj} \in [-1, 0].

    Normalisation: the reference code (Xie & Ermon's ``subsets``, following NeuralSort) minimises the
    unnormalised sum :math:`-\sum_j \mathbb{1}[y_j = y_q] w_{qj}` (the expected *number* of correct
    neighbours, in ``[-k, 0]``). Here it is divided by ``k`` (and averaged over queries), so the loss
    reads as a negative precision and its scale, hence a good learning rate, does not depend on ``k``
    or the batch size; gradients are the reference ones times ``1/(Q k)``.

    :meth:`predict` is the hard kNN classifier used for evaluation: a majority vote over the ``k``
    nearest neighbours.

    Args:
        k: number of neighbours, ``1 <= k <= N``.
        method: any mask-capable method of :func:`softtopk.methods` (default ``'gumbel'``, the
            relaxed subset sampling of Xie & Ermon; ``'neuralsort'`` is Grover et al.'s).
        **params: the method's parameters, checked here, e.g. ``tau=1.0`` or
            ``generator=torch.Generator()`` for the stochastic methods.

    Shape:
        - query: ``(Q, d)``, floating.
        - neighbors: ``(N, d)``, floating.
        - neighbor_labels: ``(N,)``, integer.
        - query_labels: ``(Q,)``, integer (optional).
        - output: ``weights`` ``(Q, N)``; ``loss`` a scalar or ``None``; :meth:`predict` ``(Q,)`` int64.

    Example:
        >>> import torch
        >>> from softtopk import DifferentiableKNN
        >>> knn = DifferentiableKNN(2, method="gumbel", tau=0.5, generator=torch.Generator().manual_seed(0))
        >>> query = torch.tensor([[0.0, 0.0], [5.0, 5.0]], requires_grad=True)
        >>> neighbors = torch.tensor([[0.1, 0.0], [0.0, 0.2], [5.0, 4.9], [4.8, 5.0], [2.5, 2.5]])
        >>> labels = torch.tensor([0, 0, 1, 1, 2])
        >>> out = knn(query, neighbors, labels, query_labels=torch.tensor([0, 1]))
        >>> out.weights.shape, out.weights.detach().sum(-1).round(decimals=4)
        (torch.Size([2, 5]), tensor([2., 2.]))
        >>> out.loss.backward()
        >>> query.grad.shape
        torch.Size([2, 2])
        >>> knn.predict(query, neighbors, labels)
        tensor([0, 1])

    References:
        A. Grover, E. Wang, A. Zweig, S. Ermon, "Stochastic Optimization of Sorting Networks via
        Continuous Relaxations", ICLR 2019 (NeuralSort; the differentiable kNN experiment).

        S. M. Xie, S. Ermon, "Reparameterizable Subset Sampling via Continuous Relaxations",
        IJCAI 2019 (Gumbel top-k relaxation; the same kNN protocol).

        F. Petersen, H. Kuehne, C. Borgelt, O. Deussen, "Differentiable Top-k Classification
        Learning", ICML 2022 (sorting-network masks, e.g. ``method='bitonic'``).
    """

    def __init__(self, k: int, *, method: str = "gumbel", **params: Any) -> None:
        super().__init__()
        self.k = check_int("k", k, low=1)
        _, params = resolve(method, params, "mask")
        self.params, self._tensors = register_tensor_params(self, params)  # e.g. a learnable tau
        self.method = method

    def _scores(self, query: Any, neighbors: Any, neighbor_labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        query, neighbors = check_neighbors(query, neighbors, self.k)
        neighbor_labels = check_labels("neighbor_labels", neighbor_labels, neighbors.shape[0], "neighbors")
        # distances in the compute dtype: squared float16 distances overflow above 256
        dtype = compute_dtype(torch.promote_types(query.dtype, neighbors.dtype))
        return _neg_sq_distances(query.to(dtype), neighbors.to(dtype)), neighbor_labels

    def forward(
        self,
        query: torch.Tensor,
        neighbors: torch.Tensor,
        neighbor_labels: torch.Tensor,
        query_labels: torch.Tensor | None = None,
    ) -> KNNOutput:
        """Relaxed top-k neighbour weights ``(Q, N)`` and, with ``query_labels``, the kNN loss (0 for
        no query). Computed in float32 for float16/bfloat16 embeddings; the weights and the loss
        are returned in the embeddings' (promoted) dtype."""
        dtype = torch.promote_types(check_scores("query", query).dtype, check_scores("neighbors", neighbors).dtype)
        scores, neighbor_labels = self._scores(query, neighbors, neighbor_labels)
        tensors = {name: getattr(self, name) for name in self._tensors}
        weights = soft_topk(scores, self.k, method=self.method, dim=-1, **self.params, **tensors)
        if query_labels is None:
            return KNNOutput(weights.to(dtype), None)
        query_labels = check_labels("query_labels", query_labels, scores.shape[0], "query")
        same = (query_labels.unsqueeze(1) == neighbor_labels.unsqueeze(0)).to(weights.dtype)
        loss = 0.0 - (same * weights).sum() / (max(scores.shape[0], 1) * self.k)  # 0, not -0, for Q = 0
        return KNNOutput(weights.to(dtype), loss.to(dtype))

    @torch.no_grad()
    def predict(
        self,
        query: torch.Tensor,
        neighbors: torch.Tensor,
        neighbor_labels: torch.Tensor,
        num_classes: int | None = None,
    ) -> torch.Tensor:
        """Hard kNN classification: the majority label among the ``k`` nearest neighbours.

        The ``k`` nearest are ``torch.topk`` of the negative squared distances (exactly equidistant
        neighbours at the k-th place are chosen by ``torch.topk``). A tie in the vote goes to the
        smallest class index. Labels must lie in ``[0, num_classes)``; ``num_classes`` defaults to
        ``neighbor_labels.max() + 1``. No gradient. Returns ``(Q,)`` int64 labels.
        """
        scores, neighbor_labels = self._scores(query, neighbors, neighbor_labels)
        if neighbor_labels.numel() and int(neighbor_labels.min()) < 0:
            raise ValueError(f"neighbor_labels must be >= 0, got {int(neighbor_labels.min())}")
        top = int(neighbor_labels.max()) + 1
        if num_classes is None:
            num_classes = top
        else:
            num_classes = check_int("num_classes", num_classes, low=top, why=" (it must exceed every label)")
        index = scores.topk(self.k, dim=-1).indices
        votes = torch.nn.functional.one_hot(neighbor_labels.long()[index], int(num_classes)).sum(1)
        return votes.argmax(-1)  # argmax returns the first maximum: ties go to the smallest class

    def extra_repr(self) -> str:
        params = "".join(f", {key}={value!r}" for key, value in self.params.items())
        params += "".join(f", {name}=<{type(getattr(self, name)).__name__}>" for name in self._tensors)
        return f"k={self.k}, method={self.method!r}{params}"
