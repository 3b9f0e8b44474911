r"""Soft sort and soft rank in JAX (Blondel et al., ICML 2020): the torch API's
:func:`softtopk.soft_sort` and :func:`softtopk.soft_rank` (``axis`` for ``dim``), exact projections
onto the permutahedron, under ``jit``, ``vmap``, ``grad`` and ``jvp``.

Both act along ``axis`` of ``x`` and return ``x``'s shape and dtype (float16/bfloat16 computed in
float32; the isotonic problems in float64 when ``jax_enable_x64`` is on). With
``w = (n, n-1, ..., 1)`` and ``ε`` the ``strength``:

.. math::
    r(x) = \arg\min_{\mu \in \mathcal{P}(w)} \tfrac12 \|\mu - x/\varepsilon\|^2,
    \qquad
    s(x) = \arg\min_{\mu \in \mathcal{P}(x)} \tfrac12 \|\mu - w/\varepsilon\|^2

(``'l2'``; ``'kl'``: the KL geometry of the paper), solved exactly by isotonic regression on the
sorted row (:mod:`softtopk.jax.ops.isotonic`: fixed shapes, ``O(n log² n)``), with ``custom_jvp``
derivatives, O(n) (:mod:`softtopk.jax.ops.permutahedron`). Values and ``±inf``/NaN rules are the
torch API's, and agree with it to rounding (float64: 1e-9, checked by the test suite).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from .._checks import REGULARIZATIONS
from ._layout import along_rows, per_row
from ._validation import (
    check_axis,
    check_bool,
    check_choice,
    check_positive_or_array,
    check_scale,
    check_scores,
    is_array,
)
from .ops.permutahedron import soft_rank_rows, soft_sort_rows
from .ops.sparse import wide_dtype

__all__ = ["soft_rank", "soft_sort"]


def _apply(rank: bool, x: Any, regularization: Any, strength: Any, axis: Any, descending: Any) -> jax.Array:
    """Check the arguments (as the torch API does), then the compiled rows function."""
    x = check_scores("x", x)
    axis = check_axis(x, axis)
    kl = check_choice("regularization", regularization, REGULARIZATIONS) == "kl"
    descending = check_bool("descending", descending)
    strength = check_scale("strength", check_positive_or_array("strength", strength), x.dtype)
    if is_array(strength):
        strength = per_row("strength", strength, x.shape[:axis] + x.shape[axis + 1 :])
    else:  # a Python float: exact in the wide dtype, traced (a new strength compiles nothing)
        strength = jnp.asarray(strength, wide_dtype())
    return _sorting(x, strength, rank=rank, axis=axis, kl=kl, descending=descending)


@partial(jax.jit, static_argnames=("rank", "axis", "kl", "descending"))
def _sorting(x: jax.Array, strength: jax.Array, *, rank: bool, axis: int, kl: bool, descending: bool) -> jax.Array:
    """:func:`soft_rank` (``rank``) or :func:`soft_sort` on checked arguments, compiled once per
    shape, dtype and static argument; ``strength`` is a scalar or ``(B, 1)``."""
    fn = soft_rank_rows if rank else soft_sort_rows

    def rows_fn(rows: jax.Array) -> jax.Array:
        eps = jnp.broadcast_to(strength, (rows.shape[0], 1))
        return fn(rows, eps, kl=kl, descending=descending)

    return along_rows(x, axis, rows_fn)


def soft_rank(
    x: jax.Array,
    *,
    regularization: str = "l2",
    strength: float | jax.Array = 1.0,
    axis: int = -1,
    descending: bool = False,
) -> jax.Array:
    r"""Soft ranks of ``x`` along ``axis``, ``1..n`` (rank ``n`` to the largest entry; rank 1 with
    ``descending=True``): :func:`softtopk.soft_rank` in JAX.

    .. math::
        r = \mathrm{P}_{\mathcal{P}(w)}(x/\varepsilon), \qquad w = (n, n-1, \dots, 1)

    Arguments, values and the ``±inf``/NaN rules are the torch function's, with ``axis`` for
    ``dim`` and arrays for tensors; ``strength`` may be traced (a float or one value per row) and
    has a derivative.

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import soft_rank
        >>> print(soft_rank(jnp.array([3.0, 1.0, 2.0]), strength=2.0))
        [2.5 1.5 2. ]

    References:
        Blondel, Teboul, Berthet, Djolonga. "Fast Differentiable Sorting and Ranking", ICML 2020
        (arXiv:2002.08871).
    """
    return _apply(True, x, regularization, strength, axis, descending)


def soft_sort(
    x: jax.Array,
    *,
    regularization: str = "l2",
    strength: float | jax.Array = 1.0,
    axis: int = -1,
    descending: bool = False,
) -> jax.Array:
    r"""Soft sort of ``x`` along ``axis``, increasing (decreasing with ``descending=True``):
    :func:`softtopk.soft_sort` in JAX, tending to ``jnp.sort`` as ``ε → 0``.

    .. math::
        s = \mathrm{P}_{\mathcal{P}(x)}(w/\varepsilon), \qquad w = (n, n-1, \dots, 1)

    Arguments, values and the ``±inf``/NaN rules as :func:`soft_rank`.

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import soft_sort
        >>> print(soft_sort(jnp.array([5.0, 1.0, 2.0]), strength=0.1))
        [1. 2. 5.]
    """
    return _apply(False, x, regularization, strength, axis, descending)
