"""The hard top-k of rows and the straight-through estimator of the relaxations that offer
``hard=True`` (as :mod:`softtopk.ops._straight_through`): the forward is exactly the hard top-k of
``x`` (``lax.top_k``'s choice among ties), the derivative the relaxation's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def hard_mask_rows(rows: jax.Array, k: int) -> jax.Array:
    """k-hot rows (B, n) of the ``k`` largest entries, no derivative."""
    index = lax.top_k(lax.stop_gradient(rows), k)[1]
    return jnp.zeros_like(rows).at[jnp.arange(rows.shape[0])[:, None], index].set(1.0)


def straight_through_mask(rows: jax.Array, k: int, soft: jax.Array) -> jax.Array:
    """Forward: the exact k-hot mask of rows (B, n); derivative: that of the relaxed mask ``soft``."""
    return soft + lax.stop_gradient(hard_mask_rows(rows, k) - soft)
