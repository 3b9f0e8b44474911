"""The argument checks of :mod:`softtopk.jax` (as :mod:`softtopk._validation`): the torch API's
checks and messages, with ``axis`` for ``dim`` and JAX arrays for tensors. The checks of Python
values and every message come from the framework-free :mod:`softtopk._checks` (no torch). Values
are checked where they are concrete, on the host with NumPy (a check compiles no XLA program for
each new shape and dtype); a traced ``l``/``tau``/``k`` (under ``jit``) is not inspected."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _checks as msg
from .._checks import SCALES, check_bool, check_choice, check_int, check_real
from .ops.compute import can_inspect, compute_dtype

__all__ = ["check_bool", "check_choice", "check_int", "check_real"]  # re-exported, as the torch side does


def is_array(value: Any) -> bool:
    """A JAX or NumPy array (the arrays a JAX function takes)."""
    return isinstance(value, (jax.Array, np.ndarray))


def check_scores(name: str, value: Any) -> jax.Array:
    """A floating JAX (or NumPy) array with at least one dimension."""
    if not is_array(value):
        raise TypeError(msg.not_an_array(name, "JAX array", value))
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(msg.not_floating(name, value.dtype))
    if value.ndim == 0:
        raise ValueError(msg.zero_dim(name, "array"))
    return jnp.asarray(value)


def check_axis(x: jax.Array, axis: Any) -> int:
    """``axis`` as a non-negative axis of ``x``."""
    return msg.check_axis("axis", axis, x.ndim)


def check_k(k: Any, n: int, axis: int) -> int:
    """An int ``k`` with ``1 <= k <= n`` (``n`` the size of ``axis``)."""
    return msg.check_k(k, n, axis, "axis")


def check_topk_args(x: Any, k: Any, axis: Any) -> tuple[jax.Array, int, int]:
    """An operator's scores ``x``, its ``axis`` (non-negative) and an int ``k`` in ``[1, n]``."""
    x = check_scores("x", x)
    axis = check_axis(x, axis)
    return x, axis, check_k(k, x.shape[axis], axis)


def check_k_array(k: Any, n: int) -> jax.Array:
    """An array ``k`` of per-row values in ``(0, n]``, floating or integer (counts; returned as
    float32), values unchecked when traced."""
    if k.dtype == jnp.bool_ or not (jnp.issubdtype(k.dtype, jnp.floating) or jnp.issubdtype(k.dtype, jnp.integer)):
        raise TypeError(msg.k_dtype(k.dtype))
    if not jnp.issubdtype(k.dtype, jnp.floating):
        k = k.astype(jnp.float32)
    if can_inspect(k) and k.size:
        values = np.asarray(k)
        outside = ~((values > 0) & (values <= n))
        if outside.any():
            raise ValueError(msg.k_out_of_range(n, float(values[outside].ravel()[0])))
    return k


def check_positive_or_array(name: str, value: Any) -> Any:
    """A positive finite number, or a floating array of positive finite values (one per row or one)."""
    if not is_array(value):
        return check_real(name, value, positive=True)
    if not jnp.issubdtype(value.dtype, jnp.floating):
        raise TypeError(msg.scale_not_floating(name, value.dtype))
    if can_inspect(value) and value.size:
        values = np.asarray(value)
        if not ((values > 0) & np.isfinite(values)).all():
            raise ValueError(msg.scale_not_positive(name, float(values.min())))
    return value


def check_scale(name: str, value: Any, dtype: Any) -> Any:
    """A positive scale parameter (a float or array values) that the computation can use for scores
    of ``dtype``: between the smallest normal number of the compute dtype and its reciprocal."""
    tiny = float(jnp.finfo(compute_dtype(dtype)).tiny)
    low, high = tiny, 1.0 / tiny
    if is_array(value):
        if not (can_inspect(value) and value.size):
            return value
        # in float64: the bounds are powers of two, compared exactly as in the array's dtype
        values = np.asarray(value, np.float64)
        ok = (values >= low) & (values <= high)
        if ok.all():
            return value
        value = float(values[~ok].ravel()[0])
    elif low <= value <= high:
        return value
    raise ValueError(
        msg.scale_out_of_range(name, low, high, jnp.dtype(dtype).name, jnp.dtype(compute_dtype(dtype)).name, value)
    )


def check_scales(params: dict[str, Any], dtype: Any) -> None:
    """:func:`check_scale` for every scale parameter of a method's ``params``."""
    for name in SCALES:
        if name in params:
            check_scale(name, params[name], dtype)
