r"""The sparse soft top-k operators (Sander et al., ICML 2023: p-norm regularised, exact zeros) and
the hard references, along ``dim`` of ``x`` (shapes as :mod:`softtopk.operators`).
"""

from __future__ import annotations

import torch

from . import _checks as msg
from ._layout import along_rows, oriented
from ._registry import resolve
from ._validation import check_scales, check_scores, check_topk_args
from .operators import soft_topk
from .ops.sparse import hard_mask_rows, sparse_mag_rows

__all__ = ["hard_topk_mag", "hard_topk_mask", "sparse_topk_mag", "sparse_topk_mask"]


def sparse_topk_mask(
    x: torch.Tensor,
    k: int,
    *,
    l: float = 0.1,
    p: float = 4 / 3,
    solver: str = "pav",  # noqa: E741
    dim: int = -1,
    n_iter: int = 500,
    largest: bool = True,
    hard: bool = False,
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
    return soft_topk(x, k, method="sparse", dim=dim, largest=largest, l=l, p=p, solver=solver, n_iter=n_iter, hard=hard)


def sparse_topk_mag(
    x: torch.Tensor,
    k: int,
    *,
    l: float = 0.1,
    p: float = 4 / 3,
    solver: str = "pav",  # noqa: E741
    dim: int = -1,
    n_iter: int = 500,
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
        raise TypeError(msg.MAG_L_IS_FLOAT)
    _, params = resolve("sparse", {"l": l, "p": p, "solver": solver, "n_iter": n_iter}, "mask")
    del params["hard"]  # the magnitude has no k-hot forward
    msg.check_mag_l(params["l"], params["p"])
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
    return along_rows(x, dim, oriented(lambda rows: hard_mask_rows(rows, k), largest), None)


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
