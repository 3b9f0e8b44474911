r"""Soft top-k operators: a mask, ranks or a permutation of the scores along ``dim``, by any method
of :func:`softtopk.methods`, the sparse (p-norm) operators and the hard references, with the Module
twins :class:`SoftTopK` and :class:`SoftTopKRanks`.

Shapes: the operators act along ``dim`` of ``x`` with ``n = x.shape[dim]``; ``*`` below is every
other axis in place. Masks have ``x``'s shape; ranks and permutations append one axis
(``x.shape + (k,)``, ``x.shape + (n,)``), i.e. ``(*, n, k)`` for ``dim=-1``. float16/bfloat16
inputs are computed in float32 and returned in their own dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ._layout import along_rows, per_row
from ._registry import register_tensor_params, resolve
from ._validation import check_bool, check_dim, check_k, check_k_tensor, check_scales, check_scores, check_topk_args
from .ops.compute import compute_dtype
from .ops.lapsum import lapsum_topk
from .ops.sparse import hard_mask_rows, sparse_mag_rows

__all__ = [
    "SoftTopK",
    "SoftTopKRanks",
    "TopK",
    "hard_topk_mag",
    "hard_topk_mask",
    "soft_permutation",
    "soft_topk",
    "soft_topk_ranks",
    "sparse_topk_mag",
    "sparse_topk_mask",
    "topk",
]


def _oriented(fn: Callable[[torch.Tensor], torch.Tensor], largest: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fn`` on the rows, or on the negated rows for the ``k`` smallest (``largest=False``)."""
    return fn if check_bool("largest", largest) else (lambda rows: fn(-rows))


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
    return along_rows(x, dim, _oriented(lambda rows: spec.rank_kernel()(rows, k, **params), largest), k)


def soft_topk(
    x: torch.Tensor, k: int | torch.Tensor, *, method: str = "lapsum", dim: int = -1, largest: bool = True,
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
    return along_rows(x, dim, _oriented(lambda rows: spec.mask_kernel()(rows, k, **params), largest), None)


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
    return along_rows(x, dim, _oriented(lambda rows: spec.rank_kernel()(rows, n, **params), largest), n)


def sparse_topk_mask(
    x: torch.Tensor, k: int, *, l: float = 0.1, p: float = 4 / 3, solver: str = "pav",  # noqa: E741
    dim: int = -1, n_iter: int = 500, largest: bool = True, hard: bool = False,
) -> torch.Tensor:
    r"""Sparse soft top-k mask (Sander et al. 2023): p-norm regularised, with exact zeros.

    .. math::
        y^\star = \arg\max_{y \in [0,1]^n,\ \sum_i y_i = k} \langle x, y\rangle
            - \frac{\lambda}{p} \|y\|_p^p
        \;=\; \mathrm{clip}\big(((x - t)_+ / \lambda)^{1/(p-1)}, 0, 1\big)

    ``p = 2`` is the Euclidean projection of ``x/λ`` onto the capped simplex (piecewise linear);
    ``p = 4/3`` is smooth where an entry leaves 0 (its derivative still jumps where an entry reaches
    1). Both are exactly 0 below the threshold ``t``, lie in
    ``[0, 1]`` and sum to ``k``; ``λ → 0`` gives the hard top-k, ``λ → ∞`` gives ``k/n``.

    Args:
        x: scores, floating tensor of any shape (float16/bfloat16 computed in float32).
        k: ``1 <= k <= n``.
        l: the regularisation strength λ > 0 (the original's ``l``), a float or a per-row tensor
            (with gradients). Default 0.1.
        p: 4/3 (default) or 2.
        solver: ``'pav'`` (default; alias ``'exact'``, :mod:`softtopk.jax`'s name): the exact
            solution (the minimiser PAV returns) by a threshold search on the sorted top candidates
            with float64 prefix moments, O(n) memory; ``'dykstra'``: the original's approximate
            alternating projections (p = 2 only, ``n_iter`` of them). Every iterate sums to ``k``,
            but before convergence it may leave [0, 1] slightly (``docs/compat.md``); its gradient
            is the exact Jacobian of the problem, not that of the truncated iteration.
        dim: the axis to select along.
        n_iter: Dykstra's number of projections (ignored by the exact solver). Default 500.
        largest: ``False`` selects the ``k`` smallest entries (the mask of ``-x``). Default ``True``.
        hard: ``True``: forward the exact k-hot mask (``torch.topk``'s ties), backward this mask's
            gradient (straight-through). Default ``False``.

    Returns:
        ``x``'s shape and dtype. Backward: ``d ⊙ (g - Σ d g / Σ d)`` with ``d = y'(z)/λ`` on the
        entries strictly between 0 and 1 (the PAV block); O(n).

    Example:
        >>> import torch, softtopk
        >>> softtopk.sparse_topk_mask(torch.tensor([-5.0, -2.0, 3.0, 1.0]), 2, l=1e-2).round(decimals=3)
        tensor([0., 0., 1., 1.])
        >>> softtopk.sparse_topk_mask(torch.tensor([0.0, 3.0, 1.0, 2.0]), 2, l=2.0, p=2)
        tensor([0.0000, 1.0000, 0.2500, 0.7500])

    References:
        Sander, Puigcerver, Djolonga, Peyré, Blondel. "Fast, Differentiable and Sparse Top-k: a
        Convex Analysis Perspective", ICML 2023 (arXiv:2302.01425).
    """
    return soft_topk(x, k, method="sparse", dim=dim, largest=largest, l=l, p=p, solver=solver, n_iter=n_iter,
                     hard=hard)


def sparse_topk_mag(
    x: torch.Tensor, k: int, *, l: float = 0.1, p: float = 4 / 3, solver: str = "pav",  # noqa: E741
    dim: int = -1, n_iter: int = 500,
) -> torch.Tensor:
    r"""Sparse soft top-k in magnitude: a smooth ``x ⊙ topkmask(|x|)`` that keeps signs (pruning).

    .. math::
        o_i = \mathrm{sign}(x_i)\big(\theta u_i + (|x_i| - \theta)_+\big), \quad
        u_i = \mathrm{clip}\Big(\big(\tfrac{(|x_i| - \theta)_+}{\lambda \theta^{p-1}}\big)^{1/(p-1)}, 0, 1\Big),
        \quad \sum_i u_i = k

    — the solution of Sander et al.'s magnitude problem written through its PAV block value ``θ``:
    entries with ``u = 1`` are kept exactly, entries with ``|x| <= θ`` are exactly 0, the rest are
    shrunk continuously. Arguments as :func:`sparse_topk_mask` (it selects by magnitude: no
    ``largest``, no ``hard``, a float ``l``, at most 1e30 for p = 4/3; :func:`hard_topk_mag` is the
    hard version). Gradients are finite everywhere (the original's p = 4/3 gradient is NaN at exact
    zeros). ``±inf`` entries are the largest magnitudes (``docs/methods/index.md``).

    Example:
        >>> import torch, softtopk
        >>> softtopk.sparse_topk_mag(torch.tensor([-5.0, -2.0, 3.0, 1.0]), 2, l=1e-2).round(decimals=3)
        tensor([-5., -0.,  3.,  0.])
    """
    if isinstance(l, torch.Tensor):
        raise TypeError("l must be a float for sparse_topk_mag (a per-row tensor l is the mask's), got a tensor")
    _, params = resolve("sparse", {"l": l, "p": p, "solver": solver, "n_iter": n_iter}, "mask")
    del params["hard"]  # the magnitude has no k-hot forward
    if params["p"] != 2 and params["l"] > 1e30:  # θ ~ Σ|x|³/(k l³): its gradient is NaN from ~1e36 on
        raise ValueError(f"l must be at most 1e+30 for sparse_topk_mag with p=4/3, got {params['l']!r}")
    x, dim, k = check_topk_args(x, k, dim)
    check_scales(params, x.dtype)
    return along_rows(x, dim, lambda rows: sparse_mag_rows(rows, k, **params), None)


def hard_topk_mask(x: torch.Tensor, k: int, *, dim: int = -1, largest: bool = True) -> torch.Tensor:
    """The k-hot mask of the ``k`` largest (``largest=False``: smallest) entries along ``dim``
    (``x``'s shape; zero gradient).

    Example:
        >>> import torch, softtopk
        >>> softtopk.hard_topk_mask(torch.tensor([[-5.0, -2.0, 3.0, 1.0]]), 2)
        tensor([[0., 0., 1., 1.]])
    """
    x, dim, k = check_topk_args(x, k, dim)
    return along_rows(x, dim, _oriented(lambda rows: hard_mask_rows(rows, k), largest), None)


def hard_topk_mag(x: torch.Tensor, k: int, *, dim: int = -1, largest: bool = True) -> torch.Tensor:
    """``x ⊙ hard_topk_mask(|x|)``: the ``k`` entries largest (``largest=False``: smallest) in
    magnitude, others 0.

    Example:
        >>> import torch, softtopk
        >>> softtopk.hard_topk_mag(torch.tensor([-5.0, -2.0, 3.0, 1.0]), 2)
        tensor([-5., -0.,  3.,  0.])
    """
    kept = hard_topk_mask(check_scores("x", x).abs(), k, dim=dim, largest=largest)
    return torch.where(kept > 0, x, torch.where(x.isinf(), 0.0, x * 0))


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
        return self._operator(x, self.k, method=self.method, dim=self.dim, largest=self.largest, **self.params,
                              **tensors)

    def extra_repr(self) -> str:
        params = "".join(f", {key}={value!r}" for key, value in self.params.items())
        tensors = "".join(f", {name}=<{type(getattr(self, name)).__name__}>" for name in self._tensors)
        largest = "" if self.largest else ", largest=False"
        return f"k={self.k if 'k' not in self._tensors else '<tensor>'}, method={self.method!r}, dim={self.dim}" \
            f"{largest}{params}{tensors}"


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

    def __init__(
        self, k: int, *, method: str = "softsort", dim: int = -1, largest: bool = True, **params: Any
    ) -> None:
        super().__init__(k, method=method, dim=dim, largest=largest, **params)
