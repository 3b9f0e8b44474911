"""The public JAX operators: sparse soft top-k (mask and magnitude), the closed-form Laplace mask
and the hard top-k, on any shape and ``axis``, under ``jit``, ``vmap``, ``grad`` and ``jvp``.

Every function mirrors its torch twin in :mod:`softtopk` (``axis`` for ``dim``; the same
arguments, defaults and error messages; ``±inf`` as in the torch API) and agrees with it to
rounding (float64: 1e-9, checked by the test suite)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _checks as msg
from . import _dykstra, _sparse
from ._checks import (
    check_axis,
    check_bool,
    check_choice,
    check_int,
    check_k,
    check_k_array,
    check_scale,
    check_x,
    from_rows,
    per_row,
    rows_of,
)
from ._extended import extended_mask
from ._laplace import laplace_mask

__all__ = ["hard_topk_mag", "hard_topk_mask", "soft_topk", "sparse_topk_mag", "sparse_topk_mask"]

P_VALUES, SOLVERS = msg.P_VALUES, msg.SOLVERS


def _hard_rows(rows: jax.Array, k: int) -> jax.Array:
    """k-hot rows (B, n) of the ``k`` largest entries (``lax.top_k``'s ties), no gradient."""
    index = lax.top_k(lax.stop_gradient(rows), k)[1]
    return jnp.zeros_like(rows).at[jnp.arange(rows.shape[0])[:, None], index].set(1.0)


def _along(x: jax.Array, axis: int, fn, largest: bool = True) -> jax.Array:
    rows = rows_of(x, axis)
    return from_rows(fn(rows if largest else -rows), x, axis)


def _sparse_params(x: jax.Array, k: Any, axis: Any, l: Any, p: Any, solver: Any, n_iter: Any):  # noqa: E741
    x = check_x(x)
    axis = check_axis(x, axis)
    k = check_k(k, x.shape[axis], axis)
    p = float(check_choice("p", p, P_VALUES))
    solver = check_choice("solver", solver, SOLVERS)
    n_iter = check_int("n_iter", n_iter, low=1)
    msg.check_dykstra_p(solver, p)
    return x, axis, k, check_scale("l", l, x.dtype), _sparse.exponent(p), solver, n_iter


def sparse_topk_mask(
    x: jax.Array, k: int, *, l: float | jax.Array = 0.1, p: float = 4 / 3, solver: str = "exact",  # noqa: E741
    axis: int = -1, n_iter: int = 500, largest: bool = True, hard: bool = False,
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
        solver: ``'exact'`` (default; ``'pav'``, the torch default, names the same solver, and both
            frameworks take both names): the threshold search, O(n) memory; ``'dykstra'``: the
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
    x, axis, k, l, r, solver, n_iter = _sparse_params(x, k, axis, l, p, solver, n_iter)  # noqa: E741
    hard = check_bool("hard", hard)
    check_bool("largest", largest)
    batch = x.shape[:axis] + x.shape[axis + 1 :]
    n = x.shape[axis]

    def mask(rows: jax.Array) -> jax.Array:
        lam = per_row("l", jnp.asarray(l, rows.dtype), batch)
        if k >= n:
            return jnp.ones_like(rows)
        if solver == "dykstra":
            soft = extended_mask(rows, k, lambda clean: _dykstra.mask_rows(clean, lam, k, n_iter))
        else:
            soft = extended_mask(rows, k, lambda clean: _sparse.mask_rows(clean, lam, k, r))
        return soft + lax.stop_gradient(_hard_rows(rows, k) - soft) if hard else soft

    return _along(x, axis, mask, largest)


def sparse_topk_mag(
    x: jax.Array, k: int, *, l: float = 0.1, p: float = 4 / 3, solver: str = "exact",  # noqa: E741
    axis: int = -1, n_iter: int = 500,
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
    if isinstance(l, jax.Array):
        raise TypeError(msg.MAG_L_IS_FLOAT)
    x, axis, k, l, r, solver, n_iter = _sparse_params(x, k, axis, l, p, solver, n_iter)  # noqa: E741
    msg.check_mag_l(l, p)
    if k >= x.shape[axis]:
        return x
    if solver == "dykstra":
        return _along(x, axis, lambda rows: _dykstra.mag_rows(rows, l, k, n_iter))
    return _along(x, axis, lambda rows: _sparse.mag_rows(rows, l, k, r))


def soft_topk(
    x: jax.Array, k: int | jax.Array, *, tau: float | jax.Array = 1.0, axis: int = -1, largest: bool = True,
    hard: bool = False,
) -> jax.Array:
    r"""Closed-form soft top-k mask (the torch API's default, ``method='lapsum'``).

    .. math::
        m_i = F\Big(\frac{x_i - t}{\tau}\Big), \quad F(z) = \begin{cases} \tfrac12 e^{z} & z < 0 \\
        1 - \tfrac12 e^{-z} & z \ge 0 \end{cases}, \qquad \sum_i m_i = k,

    with the threshold ``t`` solved exactly (a quadratic per segment among the ``2k`` largest
    entries): smooth, dense, in (0, 1). O(n) time and memory beyond a ``top_k`` of ``2k``.

    Args:
        x: scores, a floating array of any shape.
        k: an int in ``[1, n]`` or a floating array of per-row values in ``(0, n]``
            (broadcastable to the batch shape; a gradient in ``k``; sorts the whole row).
        tau: temperature τ > 0, a float or a per-row array (with a gradient). Default 1.0.
        axis: the axis to select along. Default -1.
        largest: ``False`` selects the smallest entries. Default ``True``.
        hard: ``True``: the exact k-hot forward with this mask's derivative (int ``k`` only).

    Returns:
        ``x``'s shape and dtype. Derivative with ``d = F'(z)/τ``, ``w = d/Σd``:
        ``ṁ = d (ẋ - Σ w ẋ) - d (z - Σ w z) τ̇ + w k̇``.

    Example:
        >>> import jax.numpy as jnp, numpy as np
        >>> from softtopk.jax import soft_topk
        >>> print(np.asarray(soft_topk(jnp.array([0.0, 3.0, 1.0, 2.0]), 2, tau=0.1)).round(3))
        [0.    1.    0.003 0.997]

    References:
        Struski, Bednarczyk, Podolak, Tabor. "LapSum - One Method to Differentiate Them All",
        ICML 2025.
    """
    x = check_x(x)
    axis = check_axis(x, axis)
    n = x.shape[axis]
    batch = x.shape[:axis] + x.shape[axis + 1 :]
    tau = check_scale("tau", tau, x.dtype)
    hard = check_bool("hard", hard)
    check_bool("largest", largest)
    if isinstance(k, (jax.Array, np.ndarray)):
        if hard:
            raise ValueError(msg.HARD_NEEDS_INT_K)
        k = per_row("k", check_k_array(k, n), batch)
    else:
        k = check_k(k, n, axis)

    def mask(rows: jax.Array) -> jax.Array:
        t = per_row("tau", jnp.asarray(tau, rows.dtype), batch)
        kk = k if isinstance(k, int) else k.astype(rows.dtype)
        soft = laplace_mask(rows, t, kk)
        return soft + lax.stop_gradient(_hard_rows(rows, k) - soft) if hard else soft

    return _along(x, axis, mask, largest)


def hard_topk_mask(x: jax.Array, k: int, *, axis: int = -1, largest: bool = True) -> jax.Array:
    """The k-hot mask of the ``k`` largest (``largest=False``: smallest) entries along ``axis``
    (``x``'s shape and dtype; zero derivative; ``lax.top_k``'s choice among ties).

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import hard_topk_mask
        >>> print(hard_topk_mask(jnp.array([-5.0, -2.0, 3.0, 1.0]), 2))
        [0. 0. 1. 1.]
    """
    x = check_x(x)
    axis = check_axis(x, axis)
    k = check_k(k, x.shape[axis], axis)
    check_bool("largest", largest)
    return _along(x, axis, lambda rows: _hard_rows(rows, k), largest)


def hard_topk_mag(x: jax.Array, k: int, *, axis: int = -1, largest: bool = True) -> jax.Array:
    """``x ⊙ hard_topk_mask(|x|)``: the ``k`` entries largest (``largest=False``: smallest) in
    magnitude, others 0 (also at an unselected ``±inf``).

    Example:
        >>> import jax.numpy as jnp
        >>> from softtopk.jax import hard_topk_mag
        >>> print(hard_topk_mag(jnp.array([-5.0, -2.0, 3.0, 1.0]), 2))
        [-5. -0.  3.  0.]
    """
    kept = hard_topk_mask(jnp.abs(check_x(x)), k, axis=axis, largest=largest)
    return jnp.where(kept > 0, x, jnp.where(jnp.isinf(x), 0.0, x * 0))
