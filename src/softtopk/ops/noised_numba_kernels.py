"""The numba kernels behind :mod:`softtopk.ops.noised_numba` (imported only from there, at the
first CPU call one runs: this module imports numba): the noised losses' Monte-Carlo (k+1)-th
largest score of each draw, of given noise without the ``(R, C, S)`` sums of scores and noise
(:func:`kth_of_draws`), or of noise the kernel draws itself, only where it can matter
(:func:`kth_of_fresh_draws`)."""

from __future__ import annotations

import math

import numpy as np

from . import random_kernels
from .order_kernels import insert_ranked, jit, ranks_before

TIERS = 3  # the classes drawn by chance, in tiers of scores up to their bounds (_split makes 3)
_SAMPLE = 32  # the strided sample of a row that estimates those bounds


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


@jit
def kth_of_fresh_draws(logits, epsilon, kth, width, seed, draws, index):
    """The ``kth``-largest of ``logits[r] + epsilon * Z`` (``Z`` standard Gaussian, drawn here) and
    its class, for each row ``r`` of ``logits`` (R, C) and each draw ``s``, written to ``draws``
    and ``index`` (R, S); row ``r`` draws from stream ``r`` of ``seed``. Only the sums that can
    be among the ``kth`` largest are drawn, exactly in law:

    * the classes above a bound (:func:`_split`: about ``width`` to ``2 width`` of them, all of a
      short row) get a Gaussian each; let ``t`` be the ``kth``-largest sum so far;
    * every other class is in one of :data:`TIERS` tiers, each of scores up to a bound ``b``. A
      class of a tier can pass ``t`` only if its noise exceeds ``a = (t - b) / epsilon``, which it
      does with probability ``Q(a)``, independently: the tier's next such class is a geometric
      skip ahead, and its noise a Gaussian conditioned on exceeding ``a``. Its sum enters if it
      passes ``t``; ``t`` only grows, so a class whose noise is below the ``a`` of its turn
      stays below ``t`` for good.

    Rows with a score of ``±inf`` or NaN draw every sum and rank them as ``topk`` does."""
    rows, classes = logits.shape
    val = np.empty(kth)
    idx = np.empty(kth, np.int64)
    cand = np.empty(2 * width)
    cand_idx = np.empty(2 * width, np.int64)
    members = np.empty((TIERS, classes), np.int64)
    sizes = np.empty(TIERS, np.int64)
    bounds = np.empty(TIERS)
    scratch = np.empty(2 * _SAMPLE)
    state = np.empty(4, np.uint64)
    base = np.uint64(seed)
    for r in range(rows):
        random_kernels.seed(state, base, np.uint64(r))
        row = logits[r]
        count = _split(row, width, cand, cand_idx, members, sizes, bounds, scratch)
        for s in range(draws.shape[1]):
            if count < 0:  # a score is ±inf or NaN
                _draw_ranked(row, epsilon, val, idx, state)
            else:
                filled = 0
                for j in range(count):
                    v = cand[j] + epsilon * random_kernels.normal(state)
                    if filled < kth or v > val[kth - 1]:
                        filled = insert_ranked(v, cand_idx[j], val, idx, filled, kth)
                for tier in range(TIERS):
                    filled = _draw_tier(
                        row, members[tier, : sizes[tier]], bounds[tier], epsilon, val, idx, filled, state
                    )
            draws[r, s] = val[kth - 1]
            index[r, s] = idx[kth - 1]


@jit
def _draw_ranked(row, epsilon, val, idx, state):
    """Every sum of ``row`` and a Gaussian into the ``kth`` largest ``val``/``idx``, in ``topk``'s order."""
    kth = val.shape[0]
    filled = 0
    for c in range(row.shape[0]):
        v = row[c] + epsilon * random_kernels.normal(state)
        if filled < kth or ranks_before(v, val[kth - 1]):
            filled = insert_ranked(v, c, val, idx, filled, kth)


@jit
def _draw_tier(row, members, bound, epsilon, val, idx, filled, state):
    """The classes ``members`` of ``row`` (scores ``<= bound``) into the ``kth`` largest sums
    ``val``/``idx`` (``filled`` of them): a tier of :func:`kth_of_fresh_draws`."""
    size = members.shape[0]
    if size == 0:  # no draw at all: a row's stream must not depend on its tiers' bounds
        return filled
    least, above, chance, step = _threshold(val, filled, bound, epsilon)
    pos = -1
    while chance > 0.0:
        if chance < 1.0:
            skip = math.log(random_kernels.uniform(state)) / step
            if skip >= size - 1 - pos:
                break
            pos += 1 + int(skip)
        else:
            pos += 1
            if pos >= size:
                break
        c = members[pos]
        v = row[c] + epsilon * random_kernels.normal_above(state, above)
        if v > least:
            filled = insert_ranked(v, c, val, idx, filled, val.shape[0])
            least, above, chance, step = _threshold(val, filled, bound, epsilon)
    return filled


@jit
def _threshold(val, filled, bound, epsilon):
    """The least of the ``kth`` largest sums (``-inf`` until there are ``kth``), the noise a score
    ``<= bound`` needs to pass it, the chance of that and ``log(1 - chance)``."""
    kth = val.shape[0]
    least = val[kth - 1] if filled == kth else -np.inf
    above = (least - bound) / epsilon
    chance = random_kernels.upper_tail(above)
    return least, above, chance, math.log1p(-chance)


@jit
def _split(row, width, cand, cand_idx, members, sizes, bounds, scratch):
    """Split the classes of ``row`` for :func:`kth_of_fresh_draws`: those drawn exactly into
    ``cand``/``cand_idx`` (their count is returned), the others into the tiers ``members[t, :
    sizes[t]]`` of scores up to ``bounds[t]``. The bounds are estimates of the ``1.5 width · 3^t``-th
    largest score from a sorted strided sample of about :data:`_SAMPLE`; the first is raised
    where more than ``2 width`` scores pass it, to the least of the ``width`` largest of those
    seen (:func:`_keep_largest`; the others move to the first tier). A short row is drawn
    whole. A count of -1 where a score is ``±inf`` or NaN."""
    classes = row.shape[0]
    sizes[:] = 0
    bounds[:] = -np.inf
    if classes <= 2 * width:
        for c in range(classes):
            cand[c] = row[c]
            cand_idx[c] = c
            if not abs(cand[c]) < np.inf:
                return -1
        return classes
    stride = max(1, classes // _SAMPLE)
    taken = classes // stride
    for j in range(taken):
        scratch[j] = row[j * stride]
    sample = scratch[:taken]
    _sort(sample)
    top = (3 * width) // 2
    for tier in range(TIERS):
        rank = (top * 3**tier) // stride
        bounds[tier] = sample[taken - 1 - rank] if rank < taken else -np.inf
    first, second, third = bounds[0], bounds[1], bounds[2]
    count = first_size = second_size = third_size = 0
    for c in range(classes):
        v = np.float64(row[c])
        if v > first:
            if v == np.inf:
                return -1
            cand[count] = v
            cand_idx[count] = c
            count += 1
            if count == 2 * width:
                first = _keep_largest(cand, cand_idx, count, width)
                for j in range(width, count):
                    members[0, first_size] = cand_idx[j]
                    first_size += 1
                count = width
        elif not v > -np.inf:  # -inf or NaN
            return -1
        else:  # the tier without a branch (which tier is data: a branch would mispredict): the
            # class is written to every tier and kept where the count moves on
            low, lower = np.int64(v <= second), np.int64(v <= third)  # lower implies low
            members[0, first_size] = c
            members[1, second_size] = c
            members[2, third_size] = c
            first_size += 1 - low
            second_size += low - lower
            third_size += lower
    bounds[0] = first
    sizes[0], sizes[1], sizes[2] = first_size, second_size, third_size
    return count


@jit
def _keep_largest(val, idx, count, keep):
    """Reorder ``val``/``idx[:count]`` so that ``keep`` of the largest come first (quickselect);
    the least of those (every value moved past them is at most it)."""
    lo, hi = 0, count - 1
    while lo < hi:
        pivot = val[(lo + hi) >> 1]
        i, j = lo, hi
        while i <= j:
            while val[i] > pivot:
                i += 1
            while val[j] < pivot:
                j -= 1
            if i <= j:
                val[i], val[j] = val[j], val[i]
                idx[i], idx[j] = idx[j], idx[i]
                i += 1
                j -= 1
        if keep - 1 <= j:
            hi = j
        elif keep - 1 >= i:
            lo = i
        else:
            break
    least = val[0]
    for q in range(1, keep):
        least = min(least, val[q])
    return least


@jit
def _sort(values):
    """Sort the short array ``values`` in place, ascending (insertion: faster than quicksort here)."""
    for i in range(1, values.shape[0]):
        v = values[i]
        j = i
        while j > 0 and values[j - 1] > v:
            values[j] = values[j - 1]
            j -= 1
        values[j] = v
