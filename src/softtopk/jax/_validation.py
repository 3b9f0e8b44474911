"""The argument checks of :mod:`softtopk.jax`: the torch API's checks and messages, from the
framework-free :mod:`softtopk._checks` (no torch), with ``axis`` for ``dim`` and JAX arrays for
tensors. Values are checked where they are concrete; a traced ``l``/``tau``/``k`` (under ``jit``)
is not inspected."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks as msg
from .._checks import check_bool, check_choice, check_int, check_real

__all__ = ["check_bool", "check_choice", "check_int", "check_real"]


def compute_dtype(dtype: Any) -> Any:
    """float64 stays float64; every other float is computed in float32 (as in the torch API)."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def is_concrete(value: Any) -> bool:
    """Whether an array's values may be read here (not a tracer under ``jit``/``vmap``/``grad``)."""
    return not isinstance(value, jax.core.Tracer)


def check_x(x: Any) -> jax.Array:
    """Scores: a floating JAX (or NumPy) array with at least one dimension."""
    if not isinstance(x, (jax.Array, np.ndarray)):
        raise TypeError(msg.not_an_array("x", "JAX array", x))
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(msg.not_floating("x", x.dtype))
    if x.ndim == 0:
        raise ValueError(msg.zero_dim("x", "array"))
    return jnp.asarray(x)


def check_axis(x: jax.Array, axis: Any) -> int:
    """``axis`` as a non-negative axis of ``x``."""
    return msg.check_axis("axis", axis, x.ndim)


def check_k(k: Any, n: int, axis: int) -> int:
    """An int ``k`` with ``1 <= k <= n`` (``n`` the size of ``axis``)."""
    return msg.check_k(k, n, axis, "axis")


def check_k_array(k: Any, n: int) -> jax.Array:
    """An array ``k`` of per-row values in ``(0, n]``, floating or integer (counts; returned as
    float32), values unchecked when traced."""
    if k.dtype == jnp.bool_ or not (jnp.issubdtype(k.dtype, jnp.floating) or jnp.issubdtype(k.dtype, jnp.integer)):
        raise TypeError(msg.k_dtype(k.dtype))
    if not jnp.issubdtype(k.dtype, jnp.floating):
        k = k.astype(jnp.float32)
    if is_concrete(k) and k.size and not bool(jnp.all((k > 0) & (k <= n))):
        bad = k[~((k > 0) & (k <= n))].ravel()[0]
        raise ValueError(msg.k_out_of_range(n, float(bad)))
    return k


def check_scale(name: str, value: Any, dtype: Any) -> Any:
    """A positive scale (``l``, ``tau``): a finite float or a floating array of positive values, with
    every concrete value in ``[tiny, 1/tiny]`` of the compute dtype of ``dtype`` scores."""
    if isinstance(value, (jax.Array, np.ndarray)):
        if not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(msg.scale_not_floating(name, value.dtype))
        if not (is_concrete(value) and value.size):
            return value
        lowest, highest = float(value.min()), float(value.max())
        if not (lowest > 0 and math.isfinite(highest)):
            raise ValueError(msg.scale_not_positive(name, lowest))
        worst = lowest if lowest < _bounds(dtype)[0] else highest
    else:
        worst = value = check_real(name, value, positive=True)
    low, high = _bounds(dtype)
    if not low <= worst <= high:
        raise ValueError(msg.scale_out_of_range(name, low, high, jnp.dtype(dtype).name,
                                                jnp.dtype(compute_dtype(dtype)).name, worst))
    return value


def _bounds(dtype: Any) -> tuple[float, float]:
    tiny = float(jnp.finfo(compute_dtype(dtype)).tiny)
    return tiny, 1.0 / tiny


def per_row(name: str, value: Any, batch: tuple[int, ...]) -> jax.Array:
    """A scalar or per-row array argument as ``(B, 1)``, aligned with the rows of ``x``."""
    try:
        return jnp.broadcast_to(value, batch).reshape(-1, 1)
    except ValueError:
        raise ValueError(msg.not_broadcastable(name, batch, "axis", tuple(jnp.shape(value)))) from None


def rows_of(x: jax.Array, axis: int) -> jax.Array:
    """The rows ``(B, n)`` of ``x`` along ``axis``, in the compute dtype."""
    moved = jnp.moveaxis(x, axis, -1)
    return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1]).astype(compute_dtype(x.dtype))


def from_rows(rows: jax.Array, x: jax.Array, axis: int) -> jax.Array:
    """Rows ``(B, n)`` back in ``x``'s shape (``axis`` in place) and dtype."""
    moved = jnp.moveaxis(x, axis, -1).shape
    return jnp.moveaxis(rows.astype(x.dtype).reshape(moved), -1, axis)
