"""The numba kernel behind :mod:`softtopk.ops.noised_numba` (imported only from there, at the
first CPU call it runs: this module imports numba): the noised losses' Monte-Carlo (k+1)-th
largest score of each draw, without the ``(R, C, S)`` sums of scores and noise."""

from __future__ import annotations

import numpy as np

from .order_kernels import insert_ranked, jit, ranks_before


@jit
def kth_of_draws(logits, noise, kth, draws, index):
    """For rows ``logits`` (R, C) and scaled noise ``noise`` (R, C, S): the ``kth``-largest of
    ``logits[r] + noise[r, :, s]`` (the same float sums as torch's) and its class, written to
    ``draws`` and ``index`` (R, S). Each draw keeps its ``kth`` largest sums in a sorted buffer
    (``topk``'s order; among equal sums the first in the row), entered only above its last."""
    rows, classes, samples = noise.shape
    val = np.empty((samples, kth), noise.dtype)
    idx = np.empty((samples, kth), np.int64)
    filled = np.empty(samples, np.int64)
    for r in range(rows):
        filled[:] = 0
        for c in range(classes):
            score = logits[r, c]
            for s in range(samples):
                v = score + noise[r, c, s]
                if filled[s] < kth or ranks_before(v, val[s, kth - 1]):
                    filled[s] = insert_ranked(v, c, val[s], idx[s], filled[s], kth)
        for s in range(samples):
            draws[r, s] = val[s, kth - 1]
            index[r, s] = idx[s, kth - 1]
