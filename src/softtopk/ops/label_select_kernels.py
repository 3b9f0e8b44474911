"""The numba kernel behind :mod:`softtopk.ops.label_select` (imported only from there, at the
first CPU selection: this module imports numba): each row's ``m - 1`` largest scores other than
the label's, and the label's, in ascending order, in two passes over the row and a few
insertions.

Where the row has at least ``4 m`` entries, the first pass takes the maxima of ``2 m`` blocks of
the row and the ``m``-th largest of them, ``t``. Those maxima are entries of the row at distinct
places, at most one of them the label's, so at least ``m - 1`` other entries are ``>= t``: every
entry of the top ``m - 1`` others is ``>= t`` (or NaN). The second pass inserts only those
candidates into a sorted buffer, so a row costs two comparisons an entry and a few dozen
insertions, not ``topk``'s partial sort. A row with a NaN, or a short one, inserts every entry
(NaN ranks first, as in ``topk``)."""

from __future__ import annotations

import math

import numpy as np

from .order_kernels import insert_ranked, jit, ranks_before


@jit
def _floor(row, best, m):
    """The ``m``-th largest of the maxima of ``len(best)`` blocks of ``row`` (a lower bound of its
    ``m - 1`` largest entries other than any one), or ``-inf`` where a block holds a NaN."""
    n, blocks = row.shape[0], best.shape[0]
    for b in range(blocks):
        top = row[b * n // blocks]
        for j in range(b * n // blocks + 1, (b + 1) * n // blocks):
            top = row[j] if row[j] > top else top
        if top != top:
            return -math.inf
        best[b] = top
    for b in range(blocks):  # the block whose maximum has m - 1 before it (ties by place)
        before = 0
        for c in range(blocks):
            before += (best[c] > best[b]) | ((best[c] == best[b]) & (c < b))
        if before == m - 1:
            return best[b]
    return -math.inf


@jit
def select_rows(x, label, cap, scores, index, position, masked):
    """Rows ``x`` (R, C) and labels ``label`` (R,) in ``[0, C)`` -> written in place: the ``m - 1``
    largest other scores and the label's (``scores`` (R, m), ascending, the label last among
    scores equal to it, NaN last, clamped above at ``cap``) and their classes (``index``); the
    label's slot ``position`` (R,), the number of others ``<=`` its score; and ``masked`` (R,),
    where the label's score is ``-inf`` (its score enters as 0)."""
    rows, n = x.shape
    size = scores.shape[1] - 1
    val, idx = np.empty(size, x.dtype), np.empty(size, np.int64)
    best = np.empty(2 * (size + 1) if 4 * (size + 1) <= n else 0, x.dtype)
    for r in range(rows):
        row, y = x[r], label[r]
        t = _floor(row, best, size + 1) if best.shape[0] else -math.inf
        filled = 0
        for j in range(n):
            v = row[j]
            if not (v < t) and j != y and (filled < size or ranks_before(v, val[size - 1])):
                filled = insert_ranked(v, j, val, idx, filled, size)
        s = row[y]
        masked[r] = s == -math.inf
        s = 0.0 if s == -math.inf else s
        below = 0
        for i in range(size):
            below += val[i] <= s
        position[r] = below
        at = below if s == s else size  # a NaN label goes last, after the NaN others
        for out in range(size + 1):
            i = size - out if out > at else size - 1 - out
            v, j = (s, y) if out == at else (val[i], idx[i])
            scores[r, out] = v if not v > cap else cap
            index[r, out] = j
