"""google-research ``sparse_soft_topk`` names and signatures, computed by softtopk on torch tensors.

``from softtopk.compat.sparse_soft_topk import sparse_soft_topk_mask_pav`` replaces
``from sparse_soft_topk import sparse_soft_topk_mask_pav``: same function names, argument order and
defaults, top-k along the last axis. The relaxed top-k mask (Sander et al.) is

    y* = argmax_{y in [0,1]^n, sum(y) = k}  <x, y> - (l/p) sum_i |y_i|^p,

and the top-k in magnitude keeps the signed values of the (softly) k largest |x_i|.

Intended differences from the original (JAX + numba):

* every function accepts any batch shape, top-k along the last axis; the original's Dykstra and
  hard functions were 1-D only (a 2-D input raised in Dykstra, and ``hard_topk_mask`` silently
  returned a (k, n) array for a (B, n) input);
* float32 and float64 (and, via softtopk, any floating dtype) work; the original raised
  ``TypeError`` for float64. Integer inputs are computed in the default float dtype, as the
  original's float32;
* the PAV functions are exact for p = 2 and p = 4/3 (``bisect_max_iter`` is accepted and ignored),
  ``l`` may change between calls without recompiling, and nothing builds an n x n matrix (the
  original permuted with a dense one-hot matrix: O(B n^2) memory);
* the Dykstra functions run the same iteration (``num_iter`` single projections) and their gradient
  is the exact Jacobian of the p = 2 problem, not a 1e-4-tolerance block re-detection.

Reference: M. E. Sander, J. Puigcerver, J. Djolonga, G. Peyre, M. Blondel, "Fast, Differentiable
and Sparse Top-k: a Convex Analysis Perspective", ICML 2023, arXiv:2302.01425.
"""

from __future__ import annotations

from typing import Any

import torch

import softtopk

__all__ = [
    "hard_topk_mag",
    "hard_topk_mask",
    "sparse_soft_topk_mag_dykstra",
    "sparse_soft_topk_mag_pav",
    "sparse_soft_topk_mask_dykstra",
    "sparse_soft_topk_mask_pav",
]


def _tensor(x: Any) -> torch.Tensor:
    """A floating tensor: array-likes are converted; integer/bool inputs go to the default dtype."""
    x = torch.as_tensor(x)
    if not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    return x


def sparse_soft_topk_mask_pav(x, k: int, l: float = 1e-1, p: float = 4 / 3, bisect_max_iter: int = 50):
    """Relaxed top-k mask of ``x`` along the last axis, exact (the original's PAV).

    ``y = argmax_{y in [0,1]^n, sum y = k} <x, y> - (l/p) ||y||_p^p``: sparse (exact zeros outside
    the soft support), smooth where entries leave 0 for p = 4/3 (not where they reach 1), piecewise
    linear for p = 2.

    Args:
        x: tensor (or array-like) of shape (..., n).
        k: int, number of selected entries, 0 <= k <= n.
        l: regularisation strength lambda > 0, trading sparsity for smoothness (default 0.1).
        p: regulariser's p-norm, 2 or 4/3 (default 4/3).
        bisect_max_iter: accepted for compatibility and ignored (the solver is exact).

    Returns:
        Tensor of x's shape with entries in [0, 1] summing to k along the last axis.

    Example:
        >>> sparse_soft_topk_mask_pav(torch.tensor([-5.0, -2.0, 3.0, 1.0]), k=2, l=1e-2).round(decimals=4)
        tensor([0., 0., 1., 1.])
    """
    del bisect_max_iter
    return softtopk.sparse_topk_mask(_tensor(x), k, l=l, p=p, solver="pav")


def sparse_soft_topk_mag_pav(x, k: int, l: float = 1e-1, p: float = 4 / 3, bisect_max_iter: int = 50):
    """Relaxed top-k in magnitude of ``x`` along the last axis, exact (the original's PAV).

    ``sign(x) * (out + out^(1/(q-1)) * l)`` with ``out = ((s - v*)/l)^(q-1)``, ``v*`` the isotonic
    dual solution on the sorted ``|x|`` and q = p/(p-1): the k largest |x_i| are kept (softly),
    the others are exactly 0.

    Args:
        x: tensor (or array-like) of shape (..., n).
        k: int, number of kept entries, 0 <= k <= n.
        l: regularisation strength lambda > 0 (default 0.1).
        p: regulariser's p-norm, 2 or 4/3 (default 4/3).
        bisect_max_iter: accepted for compatibility and ignored.

    Returns:
        Tensor of x's shape.

    Example:
        >>> out = sparse_soft_topk_mag_pav(torch.tensor([-5.0, -2.0, 3.0, 1.0]), k=2, l=1e-2)
        >>> torch.allclose(out, torch.tensor([-5.0, 0.0, 3.0, 0.0]), atol=1e-4)
        True
    """
    del bisect_max_iter
    return softtopk.sparse_topk_mag(_tensor(x), k, l=l, p=p, solver="pav")


def sparse_soft_topk_mask_dykstra(x, k: int, l: float = 1e-1, num_iter: int = 500):
    """Relaxed top-k mask (p = 2) along the last axis by Dykstra's projections (approximate).

    The isotonic dual ``argmin_{v decreasing} ||v - (s - l w)||^2`` is approximated by
    ``num_iter`` alternating projections; ``y = (s - v)/l`` sums to k at every iteration, and
    needs roughly (block size)^2 iterations to reach [0, 1] and exact zeros.

    Args:
        x: tensor (or array-like) of shape (..., n) (the original: 1-D only).
        k: int, 0 <= k <= n.
        l: regularisation strength lambda > 0 (default 0.1).
        num_iter: number of single projections (default 500).

    Returns:
        Tensor of x's shape.

    Example:
        >>> sparse_soft_topk_mask_dykstra(torch.tensor([-5.0, -2.0, 3.0, 1.0]), k=2, l=1e-2).round(decimals=4)
        tensor([0., 0., 1., 1.])
    """
    return softtopk.sparse_topk_mask(_tensor(x), k, l=l, p=2.0, solver="dykstra", n_iter=num_iter)


def sparse_soft_topk_mag_dykstra(x, k: int, l: float = 1e-1, num_iter: int = 500):
    """Relaxed top-k in magnitude (p = 2) along the last axis by Dykstra's projections.

    ``sign(x) * (s - v)/l * (1 + l)`` with ``v`` the (approximate) isotonic regression of
    ``s / (1 + l w)`` weighted by ``1 + l w``, s = sorted |x|. The arguments are those of
    :func:`sparse_soft_topk_mask_dykstra`; the result, of x's shape, approaches the exact
    :func:`sparse_soft_topk_mag_pav` with ``p=2`` as ``num_iter`` grows.

    Example:
        >>> x = torch.tensor([-5.0, -2.0, 3.0, 1.0])
        >>> exact = sparse_soft_topk_mag_pav(x, k=2, l=1e-2, p=2)
        >>> torch.allclose(sparse_soft_topk_mag_dykstra(x, k=2, l=1e-2), exact, atol=1e-4)
        True
    """
    return softtopk.sparse_topk_mag(_tensor(x), k, l=l, p=2.0, solver="dykstra", n_iter=num_iter)


def hard_topk_mask(x, k: int):
    """Hard top-k mask: 1 at the k largest entries of each last-axis row, 0 elsewhere.

    Args:
        x: tensor (or array-like) of shape (..., n) (the original: 1-D only; a (B, n) input
            returned a (k, n) array there).
        k: int, 0 <= k <= n.

    Returns:
        Tensor of x's shape and (floating) dtype.

    Example:
        >>> hard_topk_mask(torch.tensor([-5.0, -2.0, 3.0, 1.0]), k=2)
        tensor([0., 0., 1., 1.])
    """
    return softtopk.hard_topk_mask(_tensor(x), k)


def hard_topk_mag(x, k: int):
    """Hard top-k in magnitude: ``x * hard_topk_mask(|x|, k)``, along the last axis.

    Args:
        x: tensor (or array-like) of shape (..., n).
        k: int, 0 <= k <= n.

    Returns:
        Tensor of x's shape.

    Example:
        >>> hard_topk_mag(torch.tensor([-5.0, -2.0, 3.0, 1.0]), k=2).abs()
        tensor([5., 0., 3., 0.])
    """
    return softtopk.hard_topk_mag(_tensor(x), k)
