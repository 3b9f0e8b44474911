"""The numba kernel behind :mod:`softtopk.ops.noised_numba` (imported only from there, at the
first CPU call it runs: this module imports numba): the noised losses' Monte-Carlo (k+1)-th
largest score of each draw, without the ``(R, C, S)`` sums of scores and noise."""

from __future__ import annotations

import numpy as np

from .order_kernels import jit, ranks_before


@jit
def kth_of_draws(logits, noise, kth, draws, index):
    """For rows ``logits`` (R, C) and scaled noise ``noise`` (R, C, S): the ``kth``-largest of
    ``logits[r] + noise[r, :, s]`` (the same float sums as torch's) and its class, written to
    ``draws`` and ``index`` (R, S). Each draw keeps its ``kth`` largest sums in a sorted buffer
    (``topk``'s order; among equal sums the first in the row), entered only above its last."""
    rows, classes, samples = noise.shape
    val = np.empty((samples, kth), noise.dtype)
    idx = np.empty((samples, kth), np.int64)
    for r in range(rows):
        for s in range(samples):
            for j in range(kth):
                val[s, j] = logits[r, j] + noise[r, j, s]
                idx[s, j] = j
                slot = j
                while slot > 0 and ranks_before(val[s, slot], val[s, slot - 1]):
                    val[s, slot], val[s, slot - 1] = val[s, slot - 1], val[s, slot]
                    idx[s, slot], idx[s, slot - 1] = idx[s, slot - 1], idx[s, slot]
                    slot -= 1
        for c in range(kth, classes):
            score = logits[r, c]
            for s in range(samples):
                v = score + noise[r, c, s]
                if v <= val[s, kth - 1] or not ranks_before(v, val[s, kth - 1]):  # the common case first
                    continue
                slot = kth - 1
                while slot > 0 and ranks_before(v, val[s, slot - 1]):
                    val[s, slot] = val[s, slot - 1]
                    idx[s, slot] = idx[s, slot - 1]
                    slot -= 1
                val[s, slot] = v
                idx[s, slot] = c
        for s in range(samples):
            draws[r, s] = val[s, kth - 1]
            index[r, s] = idx[s, kth - 1]
