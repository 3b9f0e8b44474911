"""google-research ``sparse_soft_topk`` names, argument order and defaults, on JAX arrays.

``import softtopk.jax.compat.sparse_soft_topk as sparse_soft_topk`` replaces
``import sparse_soft_topk``; top-k along the last axis. The mask solves
``y* = argmax_{y in [0,1]^n, sum(y) = k} <x, y> - (l/p) sum_i |y_i|^p`` and the magnitude keeps the
signed values of the (softly) k largest ``|x_i|`` (Sander et al., ICML 2023, arXiv:2302.01425).

The seed README's examples::

    >>> import functools, jax, jax.numpy as jnp
    >>> import softtopk.jax.compat.sparse_soft_topk as sparse_soft_topk
    >>> values = jnp.array([-5., -2., 3., 1.])
    >>> print(sparse_soft_topk.sparse_soft_topk_mask_pav(values, k=2, l=1e-2))
    [0. 0. 1. 1.]
    >>> print(sparse_soft_topk.sparse_soft_topk_mag_pav(values, k=2, l=1e-2))
    [-5. -0.  3.  0.]
    >>> print(sparse_soft_topk.sparse_soft_topk_mask_dykstra(values, k=2, l=1e-2))
    [0.         0.         0.99999905 0.99999905]
    >>> print(sparse_soft_topk.hard_topk_mask(values, k=2))
    [0. 0. 1. 1.]
    >>> print(sparse_soft_topk.hard_topk_mag(values, k=2))
    [-5. -0.  3.  0.]
    >>> print(sparse_soft_topk.sparse_soft_topk_mag_dykstra(values, k=2, l=1e-2))
    [-4.9999804 -0.         2.999993   0.       ]
    >>> values = jnp.array([[[-11, 1, 4, -7], [5, 1, 4, 1], [-10, -3, 4, -6]],
    ...                     [[7, -6, -8, -4], [-1, 9, 8, 4], [0, 0, -5, 5]]])
    >>> print(sparse_soft_topk.sparse_soft_topk_mask_pav(values, k=2, l=1e-2))
    [[[0.  1.  1.  0. ]
      [1.  0.  1.  0. ]
      [0.  1.  1.  0. ]]
    <BLANKLINE>
     [[1.  0.  0.  1. ]
      [0.  1.  1.  0. ]
      [0.5 0.5 0.  1. ]]]
    >>> print(sparse_soft_topk.sparse_soft_topk_mag_pav(values, k=2, l=1e-2))
    [[[-11.   0.   0.  -7.]
      [  5.   0.   4.   0.]
      [-10.  -0.   0.  -6.]]
    <BLANKLINE>
     [[  7.  -0.  -8.  -0.]
      [ -0.   9.   8.   0.]
      [  0.   0.  -5.   5.]]]
    >>> fn = functools.partial(sparse_soft_topk.sparse_soft_topk_mask_dykstra, k=2, num_iter=100, l=1e-2)
    >>> print(jax.vmap(jax.vmap(fn), in_axes=1, out_axes=1)(values))
    [[[0.         0.99999905 0.99999905 0.        ]
      [1.0000229  0.         0.99999905 0.        ]
      [0.         0.99999905 0.99999905 0.        ]]
    <BLANKLINE>
     [[1.0000229  0.         0.         1.0000229 ]
      [0.         1.0000229  1.0000229  0.        ]
      [0.5        0.5        0.         1.0000229 ]]]
    >>> fn = functools.partial(sparse_soft_topk.sparse_soft_topk_mag_dykstra, k=2, num_iter=100, l=1e-2)
    >>> print(jax.vmap(jax.vmap(fn), in_axes=1, out_axes=1)(values))
    [[[-10.999967    0.          0.         -6.999992 ]
      [  4.9999804   0.          3.9999988   0.       ]
      [ -9.999961   -0.          0.         -5.999986 ]]
    <BLANKLINE>
     [[  6.999992   -0.         -7.9999976  -0.       ]
      [ -0.          8.999955    7.9999976   0.       ]
      [  0.          0.         -4.9999804   4.9999804]]]

The README's ``jax.grad`` example (its inputs come from ``jax_threefry_partitionable=False``, the
pre-0.5 random numbers) is ``tests/test_jax_compat.py``.

Intended differences (``docs/compat.md``): the PAV functions are exact (1.0 where the original's
float32 PAV printed 1.0000687 or 0.99999714), pure JAX (no numba, no host callback; ``l``, ``p``
may be traced or change without recompiling), O(n) memory (no n x n permutation matrix), float64
accepted; every function takes any batch shape (the original's Dykstra and hard functions were
1-D only, and its ``hard_topk_mask`` returned a (k, n) array for a (B, n) input); the Dykstra
derivative is the exact p = 2 problem's, and every magnitude derivative is finite at zeros.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import softtopk.jax as sj  # the face: this module's names repeat its hard_topk_*

__all__ = [
    "hard_topk_mag",
    "hard_topk_mask",
    "sparse_soft_topk_mag_dykstra",
    "sparse_soft_topk_mag_pav",
    "sparse_soft_topk_mask_dykstra",
    "sparse_soft_topk_mask_pav",
]


def _array(x: Any) -> jax.Array:
    """A floating JAX array: integer and bool inputs go to the default float dtype (the original's float32)."""
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def sparse_soft_topk_mask_pav(x, k: int, l: float = 1e-1, p: float = 4 / 3, bisect_max_iter: int = 50):  # noqa: E741
    """Relaxed top-k mask along the last axis, exact; ``bisect_max_iter`` is accepted and ignored.

    Args:
        x: array of shape (..., n). k: int, 1 <= k <= n. l: λ > 0 (default 0.1). p: 2 or 4/3 (default).

    Returns:
        x's shape: in [0, 1], summing to k, exactly 0 outside the soft support.
    """
    del bisect_max_iter
    return sj.sparse_topk_mask(_array(x), k, l=l, p=p)


def sparse_soft_topk_mag_pav(x, k: int, l: float = 1e-1, p: float = 4 / 3, bisect_max_iter: int = 50):  # noqa: E741
    """Relaxed top-k in magnitude along the last axis, exact; ``bisect_max_iter`` is ignored.

    Args:
        x: array of shape (..., n). k: int, 1 <= k <= n. l: λ > 0, a float (default 0.1). p: 2 or 4/3.

    Returns:
        x's shape: the k largest ``|x_i|`` kept (softly) with their signs, the others exactly 0.
    """
    del bisect_max_iter
    return sj.sparse_topk_mag(_array(x), k, l=l, p=p)


def sparse_soft_topk_mask_dykstra(x, k: int, l: float = 1e-1, num_iter: int = 500):  # noqa: E741
    """Relaxed top-k mask (p = 2) by ``num_iter`` Dykstra projections, any batch shape.

    Every iterate sums to k; [0, 1] and exact zeros hold at convergence only (the README's
    1.0000229 after 100 projections). ``l`` may be traced, with a gradient.
    """
    return sj.sparse_topk_mask(_array(x), k, l=l, p=2.0, solver="dykstra", n_iter=num_iter)


def sparse_soft_topk_mag_dykstra(x, k: int, l: float = 1e-1, num_iter: int = 500):  # noqa: E741
    """Relaxed top-k in magnitude (p = 2) by ``num_iter`` Dykstra projections, any batch shape."""
    return sj.sparse_topk_mag(_array(x), k, l=l, p=2.0, solver="dykstra", n_iter=num_iter)


def hard_topk_mask(x, k: int):
    """The k-hot mask of the k largest entries along the last axis (x's shape)."""
    return sj.hard_topk_mask(_array(x), k)


def hard_topk_mag(x, k: int):
    """``x * hard_topk_mask(|x|, k)`` along the last axis."""
    return sj.hard_topk_mag(_array(x), k)
