"""``±inf`` scores in JAX, with the torch API's meaning (:mod:`softtopk._extended`): for a row with
``p`` entries at ``+inf``, ``q`` at ``-inf`` and ``f`` others, the kernels are exact when
``p < k < p + f`` (``+inf`` mask 1, ``-inf`` mask 0, gradient 0 at both); ``p >= k`` shares ``k``
among the ``+inf`` entries, ``p + f <= k`` selects every entry above ``-inf`` and shares the rest
of ``k`` among the ``-inf`` entries. Those two cases are closed forms (gradient 0); the kernel
sees zeros in their rows. Computed with ``where`` on every call (static shapes)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def extended_mask(rows: jax.Array, k, kernel: Callable) -> jax.Array:
    """``kernel(rows)`` (B, n) with the degenerate rows' closed form; ``k`` an int or (B, 1)."""
    pos, neg = rows == jnp.inf, rows == -jnp.inf
    p = jnp.sum(pos, -1, keepdims=True).astype(rows.dtype)
    q = jnp.sum(neg, -1, keepdims=True).astype(rows.dtype)
    f = rows.shape[-1] - p - q
    full = p >= k
    short = (p + f <= k) & ~full
    degenerate = full | short
    body = kernel(jnp.where(degenerate, 0.0, rows))
    share_pos = k / jnp.maximum(p, 1)
    share_neg = (k - p - f) / jnp.maximum(q, 1)
    above = jnp.where(pos, jnp.where(full, share_pos, 1.0), jnp.where(full, 0.0, 1.0))
    closed = jnp.where(neg, jnp.where(full, 0.0, share_neg), above)
    return jnp.where(degenerate, closed.astype(body.dtype), body)
