"""What the numba kernels of the CPU share (imported only by them: this module imports numba):
their compiler settings and ``topk``'s order of values."""

from __future__ import annotations

import numba

jit = numba.njit(cache=True, nogil=True, error_model="numpy")  # no zero-division checks in loops


@jit
def ranks_before(a, b):
    """Whether ``a`` ranks before ``b`` in ``topk``'s order: NaN first, then by value."""
    if a != a:
        return b == b
    return a > b
