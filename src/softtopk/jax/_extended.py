"""``±inf`` scores in JAX, with the torch API's meaning (:mod:`softtopk._extended`): for a row with
``p`` entries at ``+inf``, ``q`` at ``-inf`` and ``f`` others, the kernels are exact when
``p < k < p + f`` (``+inf`` mask 1, ``-inf`` mask 0, gradient 0 at both); ``p >= k`` shares ``k``
among the ``+inf`` entries, ``p + f <= k`` selects every entry above ``-inf`` and shares the rest
of ``k`` among the ``-inf`` entries. Those two cases are closed forms (gradient 0); the kernel
sees zeros in their rows. Computed with ``where`` on every call (static shapes)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def extended_mask(rows: jax.Array, k, kernel: Callable) -> jax.Array:
    """``kernel(rows)`` (B, n) with the degenerate rows' closed form; ``k`` an int or (B, 1)."""
    n = rows.shape[-1]
    p = jnp.sum(rows == jnp.inf, -1, keepdims=True).astype(rows.dtype)
    above = n - jnp.sum(rows == -jnp.inf, -1, keepdims=True).astype(rows.dtype)  # p + f
    full = p >= k
    degenerate = full | (above <= k)
    body = kernel(jnp.where(degenerate, 0.0, rows))
    return jnp.where(degenerate, closed_form(rows, k, full, p, above).astype(body.dtype), body)


def closed_form(rows: jax.Array, k, full: jax.Array, p: jax.Array, above: jax.Array) -> jax.Array:
    """The mask of degenerate rows: ``full`` ones (``p >= k`` entries at ``+inf``) share ``k`` among
    those; the others (``above <= k`` entries above ``-inf``) select them and share the rest of
    ``k`` among the ``-inf`` entries."""
    share_pos, share_neg = k / jnp.maximum(p, 1), (k - above) / jnp.maximum(rows.shape[-1] - above, 1)
    return jnp.where(
        rows == jnp.inf,
        jnp.where(full, share_pos, 1.0),
        jnp.where(full, 0.0, jnp.where(rows == -jnp.inf, share_neg, 1.0)),
    )
