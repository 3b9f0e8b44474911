r"""Soft top-k operators: a mask, ranks or a permutation of the scores along ``dim``, by any method
of :func:`softtopk.methods`, the hard top-k with soft weights (:func:`topk`), with the Module twins
:class:`SoftTopK` and :class:`SoftTopKRanks`; the sparse (p-norm) operators and the hard references
are in :mod:`softtopk.sparse`.

Shapes: the operators act along ``dim`` of ``x`` with ``n = x.shape[dim]``; ``*`` below is every
other axis in place. Masks have ``x``'s shape; ranks and permutations append one axis
(``x.shape + (k,)``, ``x.shape + (n,)``), i.e. ``(*, n, k)`` for ``dim=-1``. float16/bfloat16
inputs are computed in float32 and returned in their own dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ._layout import along_rows, oriented, per_row
from ._registry import register_tensor_params, resolve
from ._validation import check_bool, check_dim, check_k, check_k_tensor, check_scales, check_scores, check_topk_args
from .ops.compute import compute_dtype
from .ops.lapsum import lapsum_topk

__all__ = [
    "SoftTopK",
    "SoftTopKRanks",
    "TopK",
    "soft_permutation",
    "soft_topk",
    "soft_topk_ranks",
    "topk",
]


def _per_row_params(spec: Any, params: dict[str, Any], x: torch.Tensor, dim: int) -> None:
    """Tensor parameters (``tau``, ...) as ``(B, 1)`` columns aligned with the rows, in place."""
    batch = x.shape[:dim] + x.shape[dim + 1 :]
    for name in spec.tensor_args:
        if name != "k" and isinstance(params.get(name), torch.Tensor):
            params[name] = per_row(name, params[name], batch, x.device)


def soft_topk_ranks(
    x: torch.Tensor, k: int, *, method: str = "softsort", dim: int = -1, largest: bool = True, **params: Any
) -> torch.Tensor:
    """Relaxed top-k ranks ``x.shape + (k,)``: ``[..., i, r]`` is the weight of item ``i`` at rank
    ``r`` (0 = largest). See :class:`SoftTopKRanks` for details.

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
        >>> softtopk.soft_topk_ranks(x, 2, method="bitonic", distribution="logistic", steepness=20.0).round(decimals=2)
        tensor([[[0., 0.],
                 [1., 0.],
                 [0., 0.],
                 [0., 1.]]])
    """
    spec, params = resolve(method, params, "ranks")
    x, dim, k = check_topk_args(x, k, dim)
    check_scales(params, x.dtype)
    _per_row_params(spec, params, x, dim)
    return along_rows(x, dim, oriented(lambda rows: spec.rank_kernel()(rows, k, **params), largest), k)


def soft_topk(
    x: torch.Tensor,
    k: int | torch.Tensor,
    *,
    method: str = "lapsum",
    dim: int = -1,
    largest: bool = True,
    **params: Any,
) -> torch.Tensor:
    """Relaxed top-k mask of ``x``'s shape: a soft indicator of the ``k`` largest entries along
    ``dim``, summing to ``k``. See :class:`SoftTopK` for details.

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([0.0, 3.0, 1.0, 2.0])
        >>> softtopk.soft_topk(x, 2, tau=0.1).round(decimals=3)
        tensor([0.0000, 1.0000, 0.0030, 0.9970])
        >>> softtopk.soft_topk(x, 2, method="neuralsort", tau=0.01).round(decimals=2)
        tensor([0., 1., 0., 1.])
    """
    spec, params = resolve(method, params, "mask")
    x = check_scores("x", x)
    dim = check_dim(x, dim)
    check_scales(params, x.dtype)
    n = x.shape[dim]
    batch = x.shape[:dim] + x.shape[dim + 1 :]
    if isinstance(k, torch.Tensor) and "k" in spec.tensor_args:
        if params.get("hard"):
            raise ValueError("hard=True needs an int k (its forward is the k-hot mask), got a tensor k")
        k = per_row("k", check_k_tensor(k, n), batch, x.device)
    else:
        k = check_k(k, n, dim)
    _per_row_params(spec, params, x, dim)
    return along_rows(x, dim, oriented(lambda rows: spec.mask_kernel()(rows, k, **params), largest), None)


def soft_permutation(
    x: torch.Tensor, *, method: str = "softsort", dim: int = -1, largest: bool = True, **params: Any
) -> torch.Tensor:
    """Relaxed sorting permutation (descending; ascending for ``largest=False``): ``[..., i, r]`` =
    weight of item ``i`` at rank ``r``.

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
    x = check_scores("x", x)
    dim = check_dim(x, dim)
    check_scales(params, x.dtype)
    _per_row_params(spec, params, x, dim)
    n = x.shape[dim]
    return along_rows(x, dim, oriented(lambda rows: spec.rank_kernel()(rows, n, **params), largest), n)


class TopK(NamedTuple):
    """What :func:`topk` returns: ``torch.topk``'s ``values`` and ``indices`` and the soft mask's
    ``weights`` at those indices, each of shape ``x.shape`` with ``dim`` of size ``k``."""

    values: torch.Tensor
    indices: torch.Tensor
    weights: torch.Tensor


def topk(
    x: torch.Tensor, k: int, *, method: str = "lapsum", dim: int = -1, largest: bool = True, **params: Any
) -> TopK:
    """Hard top-k with differentiable weights, for routers (mixture of experts) and pruning.

    ``values``, ``indices``: ``torch.topk(x, k, dim, largest)``'s (its choice among ties); ``weights``:
    :func:`soft_topk`'s mask (same ``method`` and parameters) at ``indices``, differentiable in ``x``
    and tensor parameters; ``hard=True``: exactly 1 forward with the soft mask's gradient (routers).

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([[0.1, 2.0, -1.0, 1.5]], requires_grad=True)
        >>> out = softtopk.topk(x, 2, tau=0.5)
        >>> out.indices, out.weights.detach().round(decimals=3)
        (tensor([[1, 3]]), tensor([[0.9590, 0.8890]]))
        >>> softtopk.topk(x, 2, tau=0.5, hard=True).weights  # ones, with the soft mask's gradient
        tensor([[1., 1.]], grad_fn=<PermuteBackward0>)
    """
    x, dim, k = check_topk_args(x, k, dim)
    if method == "lapsum":  # one solve gives the selection and the weights
        spec, params = resolve(method, params, "mask")
        check_scales(params, x.dtype)
        _per_row_params(spec, params, x, dim)
        return TopK(*lapsum_topk(x, k, dim, check_bool("largest", largest), **params))
    mask = soft_topk(x, k, method=method, dim=dim, largest=largest, **params)
    rows = x.movedim(dim, -1).to(compute_dtype(x.dtype))
    indices = (rows if largest else -rows).topk(k, dim=-1).indices.movedim(-1, dim)  # hard=True's, weights 1
    return TopK(x.gather(dim, indices), indices, mask.gather(dim, indices))


class SoftTopK(torch.nn.Module):
    r"""Relaxed top-k mask: a soft indicator of the ``k`` largest entries along ``dim``.

    .. math::
        m_i \in [0, 1], \qquad \sum_i m_i = k, \qquad
        m \to \text{the k-hot mask of the } k \text{ largest as the temperature} \to 0 .

    The default ``method='lapsum'`` is the closed-form Laplace-CDF mask
    :math:`m_i = F((x_i - t)/\tau)` with the threshold ``t`` solved exactly (no iterations): O(n)
    per row plus one ``topk(2k)``, an analytic backward, gradients for ``x``, ``tau`` and a per-row
    tensor ``k``. ``'sparse'`` gives exact zeros (:func:`sparse_topk_mask`); ``'perturbed'`` is the
    Monte-Carlo mean of hard masks (:func:`softtopk.perturbed_topk`); ``'gumbel'`` a relaxed subset
    sample (:func:`softtopk.gumbel_topk`); every ranks method gives ``R.sum(-1)`` of
    :class:`SoftTopKRanks` (sorting networks with a single reverse sweep). Parameters are checked
    at construction; the functional form is :func:`softtopk.soft_topk`.

    Args:
        k: ``1 <= k <= n``; for ``'lapsum'`` also a floating tensor of per-row values in ``(0, n]``
            with the shape of ``x`` without ``dim`` (or broadcastable to it).
        method: a method of :func:`softtopk.methods`. Default ``'lapsum'``.
        dim: the axis to select along. Default -1.
        largest: ``False`` selects the ``k`` smallest entries (the mask of ``-x``). Default ``True``.
        **params: the method's parameters (see :func:`softtopk.methods` for every method's
            parameters and defaults). ``tau`` (lapsum, neuralsort, softsort), ``steepness``
            (sorting networks) and ``l`` (sparse) may be tensors of per-row values like ``k``, with
            gradients. Every
            deterministic method and ``perturbed`` take ``hard``: ``True`` forwards the exact k-hot
            mask (``torch.topk``'s choice among ties) and backpropagates the soft mask's gradient
            (straight-through); ``gumbel``'s ``hard`` forwards the sampled subset. A tensor
            parameter given to the Module (``tau=nn.Parameter(...)``) is registered: a parameter
            stays learnable, any other tensor is a buffer; both follow ``.to()`` and ``state_dict``.

    Scores may be ``±inf``: ``-inf`` entries are not selected (mask and gradient 0) while more than
    ``k`` entries lie above ``-inf``, and the rest of the row is the answer for the other entries
    alone; ``+inf`` entries are selected (see docs/methods/index.md, "Infinite scores").

    Shape:
        input ``(*)`` with ``n = input.shape[dim] >= k``; output the same shape and dtype.

    Example:
        >>> import torch, softtopk
        >>> layer = softtopk.SoftTopK(2, method="softsort", tau=0.01)
        >>> layer(torch.tensor([0.5, -1.0, 2.0, 1.0])).round(decimals=3)
        tensor([0., 0., 1., 1.])

    Reference:
        Struski et al., "LapSum - One Method to Differentiate Them All", ICML 2025 (Laplace-CDF
        sums); the other methods' papers are listed by :func:`softtopk.methods`.
    """

    _operator: Callable[..., torch.Tensor]
    _output, _operator = "mask", staticmethod(soft_topk)

    def __init__(
        self, k: int | torch.Tensor, *, method: str = "lapsum", dim: int = -1, largest: bool = True, **params: Any
    ) -> None:
        super().__init__()
        _, params = resolve(method, params, self._output)
        # a tensor k (per-row k of lapsum) is registered like a tensor tau
        self.params, self._tensors = register_tensor_params(self, {**params, "k": k})
        if "k" not in self._tensors:
            self.k = self.params.pop("k")
        self.method, self.dim, self.largest = method, dim, check_bool("largest", largest)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tensors = {name: getattr(self, name) for name in self._tensors if name != "k"}
        return self._operator(
            x, self.k, method=self.method, dim=self.dim, largest=self.largest, **self.params, **tensors
        )

    def extra_repr(self) -> str:
        params = "".join(f", {key}={value!r}" for key, value in self.params.items())
        tensors = "".join(f", {name}=<{type(getattr(self, name)).__name__}>" for name in self._tensors)
        largest = "" if self.largest else ", largest=False"
        return (
            f"k={self.k if 'k' not in self._tensors else '<tensor>'}, method={self.method!r}, dim={self.dim}"
            f"{largest}{params}{tensors}"
        )


class SoftTopKRanks(SoftTopK):
    r"""Relaxed top-k attribution: where each item lands among the ``k`` largest along ``dim``.

    .. math::
        R[\ldots, i, r] \approx \mathbb{1}[x_i \text{ is the } (r{+}1)\text{-th largest along dim}]

    Columns (fixed ``r``) sum to 1; ``R.sum(-1)`` is :class:`SoftTopK`'s mask. The functional form
    is :func:`softtopk.soft_topk_ranks`.

    Args:
        k: number of ranks, ``1 <= k <= n``.
        method: a ranks-capable method of :func:`softtopk.methods` (``bitonic``, ``odd_even``,
            ``splitter_selection``, ``neuralsort``, ``softsort``, ``gumbel`` with
            ``relaxation='subsets'``). Default ``'softsort'`` (O(n k), permutation equivariant).
        dim: the axis to rank along. Default -1.
        largest: ``False`` ranks the ``k`` smallest (rank 0 = the smallest). Default ``True``.
        **params: the method's parameters (``steepness``, ``distribution``, ``art_lambda`` for
            networks; ``tau``, ``hard`` (and ``power`` for softsort) for NeuralSort/SoftSort).

    Shape:
        input ``(*)`` with ``n = input.shape[dim] >= k``; output ``input.shape + (k,)``, entry
        ``[..., i, r]`` the weight of item ``i`` at rank ``r`` (0 = largest).

    Example:
        >>> import torch, softtopk
        >>> ranks = softtopk.SoftTopKRanks(2, method="neuralsort", tau=0.05)
        >>> ranks(torch.tensor([0.1, 2.0, -1.0, 1.5])).argmax(dim=0)  # the items at ranks 0 and 1
        tensor([1, 3])

    References:
        Petersen et al., ICML 2021 / ICLR 2022 / ICML 2022 (sorting networks); Grover et al., ICLR
        2019 (NeuralSort); Prillo & Eisenschlos, ICML 2020 (SoftSort).
    """

    _output, _operator = "ranks", staticmethod(soft_topk_ranks)

    def __init__(self, k: int, *, method: str = "softsort", dim: int = -1, largest: bool = True, **params: Any) -> None:
        super().__init__(k, method=method, dim=dim, largest=largest, **params)
