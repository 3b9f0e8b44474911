r"""Soft sort and soft rank (Blondel et al., ICML 2020): exact projections onto the permutahedron.

Both act along ``dim`` of ``x`` (``n = x.shape[dim]``) and return ``x``'s shape and dtype
(float16/bfloat16 computed in float32; the isotonic problems in float64). With
``w = (n, n-1, ..., 1)`` and ``ε`` the ``strength``:

.. math::
    r(x) = \arg\min_{\mu \in \mathcal{P}(w)} \tfrac12 \|\mu - x/\varepsilon\|^2 \quad (\text{l2}),
    \qquad
    r(x) = \exp\Big(\arg\min_{\mu \in \mathcal{P}(\log w)} \mathrm{KL}(\mu, x/\varepsilon)\Big) \quad (\text{kl}),

the soft ranks, and the soft sort ``s(x)``, the projection of ``w/ε`` onto the permutahedron
``P(x)`` of the values (l2; kl with the log-sum-exp geometry), where ``P(z)`` is the convex hull
of the permutations of ``z``. Both are solved exactly, by isotonic regression on the sorted row
(:mod:`softtopk.ops.isotonic`: O(n log² n) work in fixed shapes with no value read on the host on
accelerators, under ``torch.compile`` and in ``vmap``; on CPU tensors, where a read costs no
synchronisation, rounds of pooling that read values first).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _checks as msg
from ._layout import along_rows, per_row
from ._registry import register_tensor_params
from ._validation import (
    check_bool,
    check_choice,
    check_dim,
    check_positive_or_tensor,
    check_scale,
    check_scores,
)
from .ops.permutahedron import soft_rank_rows, soft_sort_rows

__all__ = ["SoftRank", "SoftSort", "soft_rank", "soft_sort"]


def _apply(rows_fn, x: Any, regularization: Any, strength: Any, dim: Any, descending: Any) -> torch.Tensor:
    """Check the arguments, then ``rows_fn`` on the rows of ``x`` along ``dim``."""
    x = check_scores("x", x)
    dim = check_dim(x, dim)
    kl = check_choice("regularization", regularization, msg.REGULARIZATIONS) == "kl"
    descending = check_bool("descending", descending)
    strength = check_scale("strength", check_positive_or_tensor("strength", strength), x.dtype)
    if isinstance(strength, torch.Tensor):
        strength = per_row("strength", strength, x.shape[:dim] + x.shape[dim + 1 :], x.device)
    return along_rows(x, dim, lambda rows: rows_fn(rows, strength, kl=kl, descending=descending), None)


def soft_rank(
    x: torch.Tensor,
    *,
    regularization: str = "l2",
    strength: float | torch.Tensor = 1.0,
    dim: int = -1,
    descending: bool = False,
) -> torch.Tensor:
    r"""Soft ranks of ``x`` along ``dim``: ``1..n``, rank ``n`` to the largest entry (torchsort's
    convention; ``descending=True``: rank 1 to the largest).

    .. math::
        r = \mathrm{P}_{\mathcal{P}(w)}(x/\varepsilon), \qquad w = (n, n-1, \dots, 1)

    the Euclidean projection (``'l2'``) onto the permutahedron (the convex hull of the
    permutations of ``w``), or its KL version (``'kl'``: ``exp`` of the projection of ``x/ε`` onto
    ``P(log w)`` in the KL geometry; positive ranks). Every row's ranks sum to ``n(n+1)/2``;
    ``ε → 0`` gives the hard ranks (ties share the mean rank), ``ε → ∞`` gives ``(n+1)/2``
    everywhere. The ranks depend on ``x/ε`` only.

    Args:
        x: floating tensor of any shape (float16/bfloat16 computed in float32).
        regularization: ``'l2'`` (default) or ``'kl'``.
        strength: the regularisation strength ``ε > 0``: a float, or a tensor of one value per
            row (the shape of ``x`` without ``dim``, or broadcastable to it), with gradients.
            Default 1.
        dim: the axis to rank along. Default -1.
        descending: rank 1 to the largest entry instead of the smallest. Default ``False``.

    Returns:
        ``x``'s shape and dtype. Entries at ``+inf`` share the top ranks, entries at ``-inf`` the
        bottom ones (gradient 0); the finite entries are ranked among the ranks in between. A row
        holding a NaN is NaN. Backward: block-wise, O(n) (see :mod:`softtopk.ops.permutahedron`).

    Example:
        >>> import torch, softtopk
        >>> softtopk.soft_rank(torch.tensor([[8.0, 0.0, 5.0, 3.0, 2.0, 1.0, 6.0, 7.0, 9.0]]))
        tensor([[8., 1., 5., 4., 3., 2., 6., 7., 9.]])
        >>> softtopk.soft_rank(torch.tensor([3.0, 1.0, 2.0]), strength=2.0)
        tensor([2.5000, 1.5000, 2.0000])

    References:
        Blondel, Teboul, Berthet, Djolonga. "Fast Differentiable Sorting and Ranking", ICML 2020
        (arXiv:2002.08871).
    """
    return _apply(soft_rank_rows, x, regularization, strength, dim, descending)


def soft_sort(
    x: torch.Tensor,
    *,
    regularization: str = "l2",
    strength: float | torch.Tensor = 1.0,
    dim: int = -1,
    descending: bool = False,
) -> torch.Tensor:
    r"""Soft sort of ``x`` along ``dim``: increasing (``descending=True``: decreasing), like
    ``torch.sort(x, dim).values``.

    .. math::
        s = \mathrm{P}_{\mathcal{P}(x)}(w/\varepsilon), \qquad w = (n, n-1, \dots, 1)

    the projection of the rank weights onto the permutahedron of the values (``'l2'``; ``'kl'``
    in the log-sum-exp geometry of the reference implementation), reordered to increasing order.
    A row of soft-sorted values is monotone and sums to ``sum(x)``; ``ε → 0`` gives
    ``torch.sort``, ``ε → ∞`` gives the row's mean everywhere (l2). Unlike the ranks, the values
    are in the units of ``x``.

    Args:
        x: floating tensor of any shape (float16/bfloat16 computed in float32).
        regularization: ``'l2'`` (default) or ``'kl'``.
        strength: the regularisation strength ``ε > 0``: a float, or a tensor of one value per
            row (the shape of ``x`` without ``dim``, or broadcastable to it), with gradients.
            Default 1.
        dim: the axis to sort along. Default -1.
        descending: sort in decreasing order. Default ``False``.

    Returns:
        ``x``'s shape and dtype, sorted along ``dim``. Entries at ``±inf`` take their ends of the
        sort (gradient 0) and the finite entries are soft-sorted as though they were absent. A
        row holding a NaN is NaN. Backward: block means of the incoming gradient, O(n).

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([[8.0, 0.0, 5.0, 3.0, 2.0, 1.0, 6.0, 7.0, 9.0]])
        >>> softtopk.soft_sort(x)
        tensor([[0.5556, 1.5556, 2.5556, 3.5556, 4.5556, 5.5556, 6.5556, 7.5556, 8.5556]])
        >>> softtopk.soft_sort(x, strength=0.1)
        tensor([[0., 1., 2., 3., 5., 6., 7., 8., 9.]])

    References:
        Blondel, Teboul, Berthet, Djolonga. "Fast Differentiable Sorting and Ranking", ICML 2020
        (arXiv:2002.08871).
    """
    return _apply(soft_sort_rows, x, regularization, strength, dim, descending)


class SoftRank(torch.nn.Module):
    r"""Module twin of :func:`soft_rank`: soft ranks ``1..n`` along ``dim``, the projection of
    ``x/ε`` onto the permutahedron (Blondel et al., ICML 2020).

    .. math::
        r = \mathrm{P}_{\mathcal{P}(w)}(x/\varepsilon), \qquad w = (n, n-1, \dots, 1)

    Args:
        regularization: ``'l2'`` (default) or ``'kl'``.
        strength: ``ε > 0``, a float or a tensor of per-row values; an ``nn.Parameter`` is
            registered as a learnable parameter, any other tensor as a buffer (both follow
            ``.to()`` and ``state_dict``). Default 1.
        dim: the axis to rank along. Default -1.
        descending: rank 1 to the largest entry. Default ``False``.

    Shape:
        input ``(*)``, any floating dtype; output the same shape and dtype.

    Example:
        >>> import torch, softtopk
        >>> layer = softtopk.SoftRank(strength=torch.nn.Parameter(torch.tensor(2.0)))
        >>> layer(torch.tensor([3.0, 1.0, 2.0])).detach()
        tensor([2.5000, 1.5000, 2.0000])
        >>> [name for name, _ in layer.named_parameters()]
        ['strength']

    Reference:
        Blondel, Teboul, Berthet, Djolonga. "Fast Differentiable Sorting and Ranking", ICML 2020
        (arXiv:2002.08871).
    """

    _function = staticmethod(soft_rank)

    def __init__(
        self,
        *,
        regularization: str = "l2",
        strength: float | torch.Tensor = 1.0,
        dim: int = -1,
        descending: bool = False,
    ) -> None:
        super().__init__()
        self.regularization = check_choice("regularization", regularization, msg.REGULARIZATIONS)
        self.descending = check_bool("descending", descending)
        self.params, self._tensors = register_tensor_params(
            self, {"strength": check_positive_or_tensor("strength", strength)}
        )
        self.dim = msg.check_int("dim", dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tensors = {name: getattr(self, name) for name in self._tensors}
        return self._function(
            x, regularization=self.regularization, dim=self.dim, descending=self.descending, **self.params, **tensors
        )

    def extra_repr(self) -> str:
        strength = "<tensor>" if self._tensors else repr(self.params["strength"])
        descending = ", descending=True" if self.descending else ""
        return f"regularization={self.regularization!r}, strength={strength}, dim={self.dim}{descending}"


class SoftSort(SoftRank):
    r"""Module twin of :func:`soft_sort`: the soft sort along ``dim`` (increasing; ``descending``:
    decreasing), the projection of ``w/ε`` onto the permutahedron of the values (Blondel et al.,
    ICML 2020). Arguments as :class:`SoftRank`'s.

    .. math::
        s = \mathrm{P}_{\mathcal{P}(x)}(w/\varepsilon), \qquad w = (n, n-1, \dots, 1)

    Example:
        >>> import torch, softtopk
        >>> softtopk.SoftSort(strength=0.1, descending=True)(torch.tensor([1.0, 3.0, 2.0]))
        tensor([3., 2., 1.])
    """

    _function = staticmethod(soft_sort)
