"""Functional API: soft top-k operators and losses (validate, reshape, dispatch).

Shapes: the operators act along ``dim`` of ``x`` with ``n = x.shape[dim]``; ``*`` below is every
other axis in place. ``soft_topk`` returns ``x``'s shape; ``soft_topk_ranks`` and
``soft_permutation`` return ``x.shape + (k,)`` (``x.shape + (n,)``), i.e. ``(*, n, k)`` for
``dim=-1``. float16/bfloat16 inputs are computed in float32 and returned in their own dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from ._methods import methods, resolve
from ._rows import along_rows
from ._validation import check_dim, check_k, check_scores
from .losses.topk_ce import topk_cross_entropy

__all__ = ["soft_topk", "soft_topk_ranks", "soft_permutation", "methods", "topk_cross_entropy"]


def soft_topk_ranks(x: torch.Tensor, k: int, *, method: str, dim: int = -1, **params: Any) -> torch.Tensor:
    """Relaxed top-k attribution: where each item lands among the ``k`` largest.

    .. math::
        R[\\ldots, i, r] \\approx \\mathbb{1}[x_i \\text{ is the } (r{+}1)\\text{-th largest along dim}]

    Columns (fixed ``r``) sum to 1; ``R.sum(-1)`` is :func:`soft_topk`'s mask.

    Args:
        x: scores, floating tensor of any shape.
        k: number of ranks, ``1 <= k <= x.shape[dim]``.
        method: a ranks-capable method of :func:`softtopk.methods` (``bitonic``, ``odd_even``,
            ``splitter_selection``, ``neuralsort``, ``softsort``).
        dim: the axis to rank along.
        **params: the method's parameters (``steepness``, ``distribution``, ``art_lambda`` for
            networks; ``tau``, ``hard`` (and ``power`` for softsort) for NeuralSort/SoftSort).

    Returns:
        ``x.shape + (k,)``: ``[..., i, r]`` = weight of item ``i`` at rank ``r`` (``r = 0`` largest).

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
        >>> softtopk.soft_topk_ranks(x, 2, method="bitonic", distribution="logistic", steepness=20.0).round(decimals=2)
        tensor([[[0., 0.],
                 [1., 0.],
                 [0., 0.],
                 [0., 1.]]])

    References:
        Petersen et al., ICML 2021 / ICLR 2022 / ICML 2022; Grover et al., ICLR 2019; Prillo &
        Eisenschlos, ICML 2020.
    """
    spec, params = resolve(method, params, "ranks")
    x = check_scores(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim], dim)
    return along_rows(x, dim, lambda rows: spec.ranks(rows, k, **params), k)


def soft_topk(x: torch.Tensor, k: int, *, method: str, dim: int = -1, **params: Any) -> torch.Tensor:
    """Relaxed top-k mask: a soft indicator of the ``k`` largest entries along ``dim``.

    .. math::
        m_i = \\sum_{r < k} R[i, r] \\in [0, 1]\\ \\text{(networks)}, \\qquad \\sum_i m_i = k .

    Same arguments as :func:`soft_topk_ranks`; returns ``x``'s shape. Sorting networks compute the
    mask with a single reverse sweep (``O(L n)`` per row, no ``(n, k)`` tensor).

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([0.0, 3.0, 1.0, 2.0])
        >>> softtopk.soft_topk(x, 2, method="neuralsort", tau=0.01).round(decimals=2)
        tensor([0., 1., 0., 1.])
    """
    spec, params = resolve(method, params, "mask")
    x = check_scores(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim], dim)
    if spec.mask is not None:
        return along_rows(x, dim, lambda rows: spec.mask(rows, k, **params), None)
    return along_rows(x, dim, lambda rows: spec.ranks(rows, k, **params).sum(-1), None)


def soft_permutation(x: torch.Tensor, *, method: str, dim: int = -1, **params: Any) -> torch.Tensor:
    """Relaxed sorting permutation (descending): ``[..., i, r]`` = weight of item ``i`` at rank ``r``.

    Equals :func:`soft_topk_ranks` with ``k = n``; returns ``x.shape + (n,)``. For the relaxed
    sorted values use ``(x.unsqueeze(-1) * P).sum(-2)`` (``dim=-1``).

    Example:
        >>> import torch, softtopk
        >>> P = softtopk.soft_permutation(torch.tensor([1.0, 3.0, 2.0]), method="odd_even",
        ...                               distribution="logistic", steepness=20.0)
        >>> (torch.tensor([1.0, 3.0, 2.0]) @ P).round(decimals=3)
        tensor([3., 2., 1.])
    """
    spec, params = resolve(method, params, "permutation")
    x = check_scores(x)
    dim = check_dim(x, dim)
    n = x.shape[dim]
    return along_rows(x, dim, lambda rows: spec.ranks(rows, n, **params), n)
