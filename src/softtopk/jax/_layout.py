"""The row view ``(B, n)`` of an operator's input along ``axis`` (as :mod:`softtopk._layout`), and
per-row arguments aligned with those rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .. import _checks as msg
from .ops.compute import compute_dtype


def along_rows(x: jax.Array, axis: int, fn: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Apply ``fn`` to the rows ``(B, n)`` of ``x`` along ``axis`` (in the compute dtype); put the
    result ``(B, n)`` back in place, in ``x``'s dtype."""
    moved = jnp.moveaxis(x, axis, -1)
    # explicit row count: reshape(-1, 0) is ambiguous for rows of length 0
    rows = moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1]).astype(compute_dtype(x.dtype))
    return jnp.moveaxis(fn(rows).astype(x.dtype).reshape(moved.shape), -1, axis)


def per_row(name: str, value: Any, batch: tuple[int, ...]) -> jax.Array:
    """A scalar or per-row array argument as ``(B, 1)``, aligned with :func:`along_rows`' rows."""
    try:
        return jnp.broadcast_to(value, batch).reshape(-1, 1)
    except ValueError:
        raise ValueError(msg.not_broadcastable(name, batch, "axis", tuple(jnp.shape(value)))) from None
