"""How the JAX row kernels compute (as :mod:`softtopk.ops.compute`): the compute dtype of a score
dtype, whether an array's values may be read for an argument check, and row-wise gathers and
searches."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp


def compute_dtype(dtype: Any) -> Any:
    """The dtype scores are computed in: float64 stays float64, every other float becomes float32."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def can_inspect(value: Any) -> bool:
    """Whether an argument check may read an array's values: not for a tracer (under ``jit``,
    ``vmap``, ``grad``), whose values do not exist yet. The computation itself never reads values."""
    return not isinstance(value, jax.core.Tracer)


def take_rows(rows: jax.Array, index: jax.Array) -> jax.Array:
    """``rows[b, index[b, j]]`` along the last axis (``torch.gather(rows, -1, index)``)."""
    return jnp.take_along_axis(rows, index, -1)


def search_rows(sorted_rows: jax.Array, queries: jax.Array, side: str) -> jax.Array:
    """``searchsorted`` of each row of ``queries`` into the same row of ``sorted_rows`` (increasing)."""
    return jax.vmap(partial(jnp.searchsorted, side=side))(sorted_rows, queries)
