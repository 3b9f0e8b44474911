"""How the JAX row kernels compute (as :mod:`softtopk.ops.compute`): the compute dtype of a score
dtype, and whether an array's values may be read for an argument check."""

from __future__ import annotations

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
