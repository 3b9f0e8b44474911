"""subsets (ermongroup/subsets, Xie & Ermon, IJCAI 2019) ``SubsetOperator``, computed by softtopk.

``from softtopk.compat.subsets import SubsetOperator`` replaces the ``SubsetOperator`` of the
original's ``subsets/knn/sorting_operator.py``: same constructor ``SubsetOperator(k, tau=1.0,
hard=False)``, same ``forward(scores) -> khot`` along dim 1, same noise and same relaxation:

* the keys are ``scores + G`` with ``G`` drawn exactly as the original draws it,
  ``torch.distributions.Gumbel(zeros_like(scores), ones_like(scores)).sample()`` from torch's global
  RNG, so after the same ``torch.manual_seed`` both use the same noise;
* ``khot`` is the sum of ``k`` successive softmaxes of the keys, each damping the previous soft pick,
  i.e. :func:`softtopk.gumbel_topk` with ``relaxation="subsets"`` (rows sum to ``k``;
  entries may exceed 1, structurally, as in the original);
* ``hard=True`` keeps the original's semantics: the forward value is the k-hot of the top-k of the
  **relaxed** ``khot`` and the backward is ``khot``'s gradient (straight-through). That k-hot is not
  always the Gumbel-top-k sample: at small ``tau`` the relaxed ``khot`` can order items differently
  from the keys. For the true sample (the k-hot of the top-k of the keys) use
  ``softtopk.gumbel_topk(scores, k, tau=tau, hard=True, relaxation="subsets", dim=1)``.

Intended differences from the original:

* runs on any device (the original hard-codes CUDA tensors and fails on CPU);
* ``log(1 - a)`` is computed exactly in log space where the original takes
  ``log(max(1 - a, tiny))``; the two agree wherever that clamp is inactive;
* float64 scores are computed in float64 and float16/bfloat16 in float32, the output in the
  scores' dtype;
* the hard forward value is exactly 0/1 (the original's ``khot_hard - khot.detach() + khot`` can be
  off by rounding);
* ``k``, ``tau`` and ``hard`` are validated (``k`` an int ``>= 1`` and at most the size of dim 1,
  ``tau`` positive and finite, ``hard`` a bool); ``forward`` takes an optional keyword ``noise``: a
  tensor of standard Gumbel draws of the scores' shape used instead of drawing (for tests and
  common random numbers), or ``False`` for no noise.

``SubsetsDKNN(k, tau=1.0, hard=False, num_samples=-1)`` is the kNN experiment's layer: scores
``-||q - c||^2`` of every query against every candidate neighbour, then ``SubsetOperator`` along the
candidates. As in the original, ``num_samples`` and ``forward``'s ``tau`` are accepted and unused
(one Gumbel sample per call; the constructor's ``tau`` applies). The distances are formed as the
original forms them (``(M, N, p)`` differences), so the memory is ``M N p``; for large neighbour
sets use :class:`softtopk.nn.DifferentiableKNN`, which also computes the kNN loss.
"""

from __future__ import annotations

import torch

from .._validation import check_bool, check_int, check_neighbors, check_real, check_scores
from ..functional import gumbel_topk

__all__ = ["SubsetOperator", "SubsetsDKNN"]


def seed_gumbel_noise(scores: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel draws of ``scores``' shape, dtype and device, drawn as the original draws them
    (``torch.distributions.Gumbel(0, 1).sample()`` from the global RNG)."""
    zeros = torch.zeros_like(scores, dtype=scores.dtype if scores.is_floating_point() else torch.float32)
    return torch.distributions.Gumbel(zeros, torch.ones_like(zeros)).sample()


class SubsetOperator(torch.nn.Module):
    """``SubsetOperator``: relaxed (or straight-through hard) Gumbel subset of ``k`` items along dim 1.

    Args:
        k: subset size, ``1 <= k <= scores.shape[1]``.
        tau: temperature, positive and finite. Default 1.0.
        hard: ``True``: forward the k-hot of the top-k of the relaxed ``khot`` (the original's
            semantics), backward ``khot``'s gradient. Default ``False``.

    Shape:
        scores ``(B, n)`` (or ``(B, n, ...)``: selection along dim 1); output of the same shape, each
        slice along dim 1 summing to ``k``.

    Example:
        >>> import torch
        >>> from softtopk.compat.subsets import SubsetOperator
        >>> op = SubsetOperator(k=2, tau=1.0)
        >>> x = torch.tensor([[2.0, 0.0, 1.0, -1.0]])
        >>> op(x, noise=False).round(decimals=4)
        tensor([[1.0843, 0.2399, 0.5841, 0.0917]])
        >>> SubsetOperator(k=2, hard=True)(x, noise=False)
        tensor([[1., 0., 1., 0.]])
    """

    def __init__(self, k: int, tau: float = 1.0, hard: bool = False) -> None:
        super().__init__()
        self.k = check_int("k", k, low=1)
        self.tau = check_real("tau", tau, positive=True)
        self.hard = check_bool("hard", hard)

    def forward(self, scores: torch.Tensor, *, noise: bool | torch.Tensor | None = None) -> torch.Tensor:
        scores = check_scores("scores", scores)
        if scores.dim() < 2:
            raise ValueError(f"scores must have shape (B, n) or (B, n, ...), got {tuple(scores.shape)}")
        if noise is None or noise is True:
            noise = seed_gumbel_noise(scores)
        khot = gumbel_topk(scores, self.k, tau=self.tau, hard=False, relaxation="subsets", noise=noise, dim=1)
        if not self.hard:
            return khot
        index = khot.detach().topk(self.k, dim=1).indices
        khot_hard = torch.zeros_like(khot).scatter_(1, index, 1.0)
        # exactly the k-hot forward, khot's gradient backward
        return khot_hard + (khot - khot.detach())

    def extra_repr(self) -> str:
        return f"k={self.k}, tau={self.tau}, hard={self.hard}"


class SubsetsDKNN(torch.nn.Module):
    """``SubsetsDKNN``: relaxed top-k neighbours of each query by Gumbel subset sampling.

    .. math::
        s_{ij} = -\\lVert q_i - c_j \\rVert_2^2, \\qquad
        \\mathrm{out}_{i\\cdot} = \\mathrm{SubsetOperator}(k, \\tau, \\mathrm{hard})(s_{i\\cdot})

    Args:
        k: neighbours per query, ``1 <= k <= N``.
        tau: temperature of the subset relaxation, positive and finite. Default 1.0.
        hard: straight-through k-hot, with ``SubsetOperator``'s semantics. Default ``False``.
        num_samples: accepted for the original's signature, unused (an int). Default -1.

    Shape:
        query ``(M, p)``, neighbors ``(N, p)``; output ``(M, N)``, each row summing to ``k``.

    Example:
        >>> import torch
        >>> from softtopk.compat.subsets import SubsetsDKNN
        >>> query, neighbors = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, 1.0], [3.0, 0.0], [0.5, 0.5]])
        >>> SubsetsDKNN(k=2, hard=True)(query, neighbors, noise=False)
        tensor([[1., 0., 1.]])

    Reference:
        S. M. Xie, S. Ermon, "Reparameterizable Subset Sampling via Continuous Relaxations",
        IJCAI 2019 (Sec. 5.2, differentiable kNN).
    """

    def __init__(self, k: int, tau: float = 1.0, hard: bool = False, num_samples: int = -1) -> None:
        super().__init__()
        self.subset_sample = SubsetOperator(k=k, tau=tau, hard=hard)  # validates k, tau, hard
        self.k = self.subset_sample.k
        self.num_samples = check_int("num_samples", num_samples)

    def forward(
        self,
        query: torch.Tensor,
        neighbors: torch.Tensor,
        tau: float = 1.0,
        *,
        noise: bool | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Relaxed k-hot ``(M, N)`` over the neighbours of each query; ``tau`` is unused (as in the
        original); ``noise`` as in :meth:`SubsetOperator.forward`, of shape ``(M, N)``."""
        query, neighbors = check_neighbors(query, neighbors, self.k)
        scores = -((query.unsqueeze(1) - neighbors.unsqueeze(0)) ** 2).sum(2)
        return self.subset_sample(scores, noise=noise)

    def extra_repr(self) -> str:
        return f"k={self.k}, num_samples={self.num_samples}"
