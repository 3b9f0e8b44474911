"""softtopk for JAX: sparse soft top-k (Sander et al., ICML 2023) exact and jit-able on any backend,
the closed-form Laplace soft top-k, the hard top-k, and soft sort and rank (Blondel et al., ICML
2020), in pure JAX (no callbacks, no numba).

Install with ``pip install "softtopk[jax]"``; ``import softtopk`` never imports JAX, and
``import softtopk.jax`` never imports torch. The functions
mirror the torch API (``axis`` for ``dim``) and agree with it to rounding::

    >>> import jax, jax.numpy as jnp
    >>> from softtopk.jax import sparse_topk_mask
    >>> x = jnp.array([[0.0, 3.0, 1.0, 2.0]])
    >>> print(sparse_topk_mask(x, 2, l=2.0, p=2))
    [[0.   1.   0.25 0.75]]
    >>> print(jax.grad(lambda x: sparse_topk_mask(x, 2, l=2.0, p=2)[0, 3])(x))
    [[ 0.    0.   -0.25  0.25]]

``soft_topk(x, k, *, method="lapsum", axis=-1, **params)`` takes the torch API's method names for
the methods JAX has (``"lapsum"``, ``"sparse"``). Every function works under ``jax.jit``,
``jax.vmap``, ``jax.grad`` and ``jax.jvp`` (derivatives are ``custom_jvp`` rules from the implicit
function theorem, O(n)). The original package's names are in
:mod:`softtopk.jax.compat.sparse_soft_topk`. The tree mirrors the torch one: ``operators.py``,
``sorting.py``, ``_registry.py``, ``_validation.py``, ``_layout.py``, ``_extended.py`` and the row
kernels in ``ops/``; it imports no torch (``pip install "softtopk[jax]"`` installs none).
"""

from __future__ import annotations

try:
    import jax  # noqa: F401
except ImportError as error:  # pragma: no cover - the jax extra is missing
    raise ImportError('softtopk.jax needs JAX: pip install "softtopk[jax]"') from error

from .operators import hard_topk_mag, hard_topk_mask, soft_topk, sparse_topk_mag, sparse_topk_mask
from .sorting import soft_rank, soft_sort

__all__ = [
    "hard_topk_mag",
    "hard_topk_mask",
    "soft_rank",
    "soft_sort",
    "soft_topk",
    "sparse_topk_mag",
    "sparse_topk_mask",
]
