"""The public JAX operators: sparse soft top-k (mask and magnitude), the closed-form Laplace mask
and the hard top-k, on any shape and ``axis``, under ``jit``, ``vmap``, ``grad`` and ``jvp``.

Every function mirrors its torch twin in :mod:`softtopk.operators` (``axis`` for ``dim``; the same
arguments, defaults, method names and error messages; ``±inf`` as in the torch API) and agrees with
it to rounding (float64: 1e-9, checked by the test suite); ``soft_topk(method=...)`` takes the
methods of :mod:`softtopk.jax._registry`."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from .. import _checks as msg
from ._layout import along_rows, per_row
from ._registry import lookup, resolve
from ._validation import (
    check_axis,
    check_bool,
    check_k,
    check_k_array,
    check_scales,
    check_scores,
    check_topk_args,
    is_array,
)
from .ops import dykstra, sparse
from .ops._straight_through import hard_mask_rows

__all__ = ["hard_topk_mag", "hard_topk_mask", "soft_topk", "sparse_topk_mag", "sparse_topk_mask"]


def sparse_topk_mask(
    x: jax.Array,
    k: int,
    *,
    l: float | jax.Array = 0.1,
    p: float = 4 / 3,
    solver: str = "pav",  # noqa: E741
    axis: int = -1,
    n_iter: int = 500,
    largest: bool = True,
    hard: bool = False,
) -> jax.Array:
    r"""Sparse soft top-k mask (Sander et al. 2023): p-norm regularised, with exact zeros.

    .. math::
        y^\star = \arg\max_{y \in [0,1]^n,\ \sum_i y_i = k} \langle x, y\rangle - \frac{\lambda}{p} \|y\|_p^p
        = \mathrm{clip}\big(((x - t)_+ / \lambda)^{1/(p-1)}, 0, 1\big)

    ``p = 2``: the Euclidean projection of ``x/λ`` onto the capped simplex (piecewise linear);
    ``p = 4/3``: smooth where an entry leaves 0 (not where one reaches 1). In ``[0, 1]``, summing to
    ``k``, exactly 0 below ``t``.

    Args:
        x: scores, a floating array of any shape (float16/bfloat16 computed in float32; the
            threshold in float64 when ``jax_enable_x64`` is on).
        k: an int, ``1 <= k <= n``.
        l: λ > 0, a float or an array broadcastable to the batch shape (``x`` without ``axis``),
            traced or not, with a gradient. Default 0.1.
        p: 4/3 (default) or 2.
        solver: ``'pav'`` (default; ``'exact'`` names the same solver, in both frameworks): the
            threshold search, O(n) memory; ``'dykstra'``: the
            original's ``n_iter`` alternating projections (p = 2), whose derivative is the exact
            problem's.
        axis: the axis to select along. Default -1.
        n_iter: Dykstra's number of projections. Default 500.
        largest: ``False`` selects the ``k`` smallest entries. Default ``True``.
        hard: ``True``: forward the exact k-hot mask, derivative of the soft mask. Default ``False``.

    Returns:
        ``x``'s shape and dtype. Derivative (``custom_jvp``, O(n)):
        ``ẏ = d (ẋ - Σ d ẋ / Σ d) - d (x - x̄) λ̇ / λ``, ``d = y'/λ`` on ``0 < y < 1``.

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import sparse_topk_mask
        >>> print(sparse_topk_mask(jnp.array([0.0, 3.0, 1.0, 2.0]), 2, l=2.0, p=2))
        [0.   1.   0.25 0.75]

    References:
        Sander, Puigcerver, Djolonga, Peyré, Blondel. "Fast, Differentiable and Sparse Top-k: a
        Convex Analysis Perspective", ICML 2023 (arXiv:2302.01425).
    """
    return soft_topk(
        x, k, method="sparse", axis=axis, largest=largest, l=l, p=p, solver=solver, n_iter=n_iter, hard=hard
    )


def sparse_topk_mag(
    x: jax.Array,
    k: int,
    *,
    l: float = 0.1,
    p: float = 4 / 3,
    solver: str = "pav",  # noqa: E741
    axis: int = -1,
    n_iter: int = 500,
) -> jax.Array:
    r"""Sparse soft top-k in magnitude: a smooth ``x ⊙ topkmask(|x|)`` that keeps signs (pruning).

    .. math::
        o_i = \mathrm{sign}(x_i)\big(\theta u_i + (|x_i| - \theta)_+\big), \quad
        u_i = \mathrm{clip}\Big(\big(\tfrac{(|x_i| - \theta)_+}{\lambda \theta^{p-1}}\big)^{1/(p-1)}, 0, 1\Big),
        \quad \sum_i u_i = k

    Entries with ``u = 1`` are kept exactly, ``|x| <= θ`` gives exactly 0. Arguments as
    :func:`sparse_topk_mask`, except ``l``: a Python float (at most 1e30 for p = 4/3), and no
    ``largest``/``hard``. Derivatives are finite everywhere (the original's p = 4/3 gradient is
    NaN at zeros).

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import sparse_topk_mag
        >>> print(sparse_topk_mag(jnp.array([-5.0, -2.0, 3.0, 1.0]), 2, l=1e-2))
        [-5. -0.  3.  0.]
    """
    if is_array(l):
        raise TypeError(msg.MAG_L_IS_FLOAT)
    _, params = resolve("sparse", {"l": l, "p": p, "solver": solver, "n_iter": n_iter})
    msg.check_mag_l(params["l"], params["p"])
    x, axis, k = check_topk_args(x, k, axis)
    check_scales(params, x.dtype)
    if k >= x.shape[axis]:
        return x
    # λ traced, weakly typed as the float it is, and k traced: a new λ, or a new k with the same
    # candidate count, compiles nothing
    lam, count = jnp.asarray(params["l"]), jnp.asarray(k, jnp.int32)
    size = sparse.candidates(x.shape[axis], k)
    return _sparse_topk_mag(
        x, lam, count, axis=axis, size=size, p=params["p"], solver=params["solver"], n_iter=params["n_iter"]
    )


@partial(jax.jit, static_argnames=("axis", "size", "p", "solver", "n_iter"))
def _sparse_topk_mag(
    x: jax.Array,
    l: jax.Array,
    k: jax.Array,
    *,
    axis: int,
    size: int,
    p: float,
    solver: str,  # noqa: E741
    n_iter: int,
) -> jax.Array:
    """:func:`sparse_topk_mag` on checked arguments, compiled once per shape, dtype, candidate count
    ``size`` and static argument; ``l`` and ``k`` are traced (0-d arrays that the kernels'
    derivative rules hold fixed)."""
    if solver == "dykstra":
        return along_rows(x, axis, lambda rows: dykstra.mag_rows(rows, l, k, n_iter, size))
    return along_rows(x, axis, lambda rows: sparse.mag_rows(rows, l, k, sparse.exponent(p), size))


def soft_topk(
    x: jax.Array, k: int | jax.Array, *, method: str = "lapsum", axis: int = -1, largest: bool = True, **params: Any
) -> jax.Array:
    r"""Relaxed top-k mask of ``x``'s shape, summing to ``k`` along ``axis``: the torch API's
    :func:`softtopk.soft_topk` (``axis`` for ``dim``) for the methods JAX has, ``'lapsum'``
    (default) and ``'sparse'`` (:func:`sparse_topk_mask`); another method of
    :func:`softtopk.methods` is a ``ValueError`` naming these.

    ``'lapsum'``, the closed-form Laplace soft top-k:

    .. math::
        m_i = F\Big(\frac{x_i - t}{\tau}\Big), \quad F(z) = \begin{cases} \tfrac12 e^{z} & z < 0 \\
        1 - \tfrac12 e^{-z} & z \ge 0 \end{cases}, \qquad \sum_i m_i = k,

    with the threshold ``t`` solved exactly (a quadratic per segment among the ``2k`` largest
    entries): smooth, dense, in (0, 1). O(n) time and memory beyond a ``top_k`` of ``2k``.

    Args:
        x: scores, a floating array of any shape.
        k: an int in ``[1, n]``; for ``'lapsum'`` also a floating array of per-row values in
            ``(0, n]`` (broadcastable to the batch shape; a gradient in ``k``; sorts the whole row).
        method: ``'lapsum'`` (default) or ``'sparse'``.
        axis: the axis to select along. Default -1.
        largest: ``False`` selects the smallest entries. Default ``True``.
        **params: the method's parameters, as in the torch API: ``'lapsum'``: ``tau`` (temperature
            τ > 0, a float or a per-row array with a gradient; default 1.0) and ``hard``
            (``True``: the exact k-hot forward with this mask's derivative, int ``k`` only);
            ``'sparse'``: those of :func:`sparse_topk_mask`.

    Returns:
        ``x``'s shape and dtype. ``'lapsum'``'s derivative with ``d = F'(z)/τ``, ``w = d/Σd``:
        ``ṁ = d (ẋ - Σ w ẋ) - d (z - Σ w z) τ̇ + w k̇``.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from softtopk.jax import soft_topk
        >>> print(np.asarray(soft_topk(jnp.array([0.0, 3.0, 1.0, 2.0]), 2, tau=0.1)).round(3))
        [0.    1.    0.003 0.997]
        >>> print(soft_topk(jnp.array([0.0, 3.0, 1.0, 2.0]), 2, method="sparse", l=2.0, p=2))
        [0.   1.   0.25 0.75]

    References:
        Struski, Bednarczyk, Podolak, Tabor. "LapSum - One Method to Differentiate Them All",
        ICML 2025.
    """
    spec, params = resolve(method, params)
    x = check_scores("x", x)
    axis = check_axis(x, axis)
    check_scales(params, x.dtype)
    n = x.shape[axis]
    given = {name: params.pop(name) for name in spec.tensor_args if name != "k"}
    row_k: int | None = None
    if is_array(k) and "k" in spec.tensor_args:
        if params.get("hard"):
            raise ValueError(msg.HARD_NEEDS_INT_K)
        given["k"] = check_k_array(k, n)
    else:
        row_k = check_k(k, n, axis)
    count = None
    if spec.traced_k and row_k is not None and row_k < n and not params.get("hard"):
        # k traced: a new k with the same candidate count compiles nothing
        params["size"] = sparse.candidates(n, row_k)
        count, row_k = jnp.asarray(row_k, jnp.int32), None
    return _soft_topk(
        x,
        given,
        count,
        method=method,
        axis=axis,
        largest=check_bool("largest", largest),
        k=row_k,
        static=tuple(sorted(params.items())),
    )


@partial(jax.jit, static_argnames=("method", "axis", "largest", "k", "static"))
def _soft_topk(
    x: jax.Array,
    given: dict[str, Any],
    count: jax.Array | None,
    *,
    method: str,
    axis: int,
    largest: bool,
    k: int | None,
    static: tuple[tuple[str, Any], ...],
) -> jax.Array:
    """:func:`soft_topk` on checked arguments, compiled once per shape, dtype and static argument:
    ``given`` holds the arguments that may be arrays (traced: a new ``tau`` or ``l`` compiles
    nothing), ``k`` is the static int ``k``, or ``count`` the traced one (a 0-d int array, for a
    method with ``traced_k``), or else ``given["k"]`` per row; ``static`` the others."""
    batch = x.shape[:axis] + x.shape[axis + 1 :]

    def mask(rows: jax.Array) -> jax.Array:
        arrays = {name: per_row(name, jnp.asarray(value, rows.dtype), batch) for name, value in given.items()}
        kk = k if k is not None else count if count is not None else arrays.pop("k")
        return lookup(method).mask(rows, kk, **dict(static), **arrays)

    return along_rows(x, axis, mask if largest else lambda rows: mask(-rows))


def hard_topk_mask(x: jax.Array, k: int, *, axis: int = -1, largest: bool = True) -> jax.Array:
    """The k-hot mask of the ``k`` largest (``largest=False``: smallest) entries along ``axis``
    (``x``'s shape and dtype; zero derivative; ``lax.top_k``'s choice among ties).

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import hard_topk_mask
        >>> print(hard_topk_mask(jnp.array([-5.0, -2.0, 3.0, 1.0]), 2))
        [0. 0. 1. 1.]
    """
    x, axis, k = check_topk_args(x, k, axis)
    return _hard_topk_mask(x, axis=axis, k=k, largest=check_bool("largest", largest))


@partial(jax.jit, static_argnames=("axis", "k", "largest"))
def _hard_topk_mask(x: jax.Array, *, axis: int, k: int, largest: bool) -> jax.Array:
    return along_rows(x, axis, lambda rows: hard_mask_rows(rows if largest else -rows, k))


def hard_topk_mag(x: jax.Array, k: int, *, axis: int = -1, largest: bool = True) -> jax.Array:
    """``x ⊙ hard_topk_mask(|x|)``: the ``k`` entries largest (``largest=False``: smallest) in
    magnitude, others 0 (also at an unselected ``±inf``).

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import hard_topk_mag
        >>> print(hard_topk_mag(jnp.array([-5.0, -2.0, 3.0, 1.0]), 2))
        [-5. -0.  3.  0.]
    """
    x, axis, k = check_topk_args(x, k, axis)
    return _hard_topk_mag(x, axis=axis, k=k, largest=check_bool("largest", largest))


@partial(jax.jit, static_argnames=("axis", "k", "largest"))
def _hard_topk_mag(x: jax.Array, *, axis: int, k: int, largest: bool) -> jax.Array:
    """:func:`hard_topk_mag` on checked arguments: one program per shape, dtype and static argument
    (op by op, each of its five operations would compile on its own)."""
    kept = _hard_topk_mask(jnp.abs(x), axis=axis, k=k, largest=largest)
    return jnp.where(kept > 0, x, jnp.where(jnp.isinf(x), 0.0, x * 0))
