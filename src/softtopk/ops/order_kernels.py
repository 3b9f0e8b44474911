"""What the numba kernels of the CPU share (imported only by them: this module imports numba):
their compiler settings, ``topk``'s order of values and a buffer kept in that order."""

from __future__ import annotations

import numba

jit = numba.njit(cache=True, nogil=True, error_model="numpy")  # no zero-division checks in loops


@jit
def ranks_before(a, b):
    """Whether ``a`` ranks before ``b`` in ``topk``'s order: NaN first, then by value."""
    if a != a:
        return b == b
    return a > b


@jit
def insert_ranked(v, j, val, idx, filled, size):
    """``(v, j)`` into the first ``filled`` slots of ``val``/``idx``, kept in ``topk``'s order (a
    tie after the entries already there), the last one dropped at ``size``; the new count."""
    slot = filled if filled < size else size - 1
    while slot > 0 and ranks_before(v, val[slot - 1]):
        val[slot] = val[slot - 1]
        idx[slot] = idx[slot - 1]
        slot -= 1
    val[slot] = v
    idx[slot] = j
    return min(filled + 1, size)
