r"""Exact decreasing isotonic regression of rows, with fixed shapes and no value read on the host.

Two problems, both solved by Pool-Adjacent-Violators (PAV) in Blondel et al. (2020):

* l2: ``v = argmin_{v_1 >= ... >= v_n} ½ ||v - y||²``; a pooled block ``B`` takes ``mean(y_B)``;
* kl: ``v = argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(l), v>``; a block takes
  ``logsumexp(y_B) - logsumexp(l_B)``.

PAV is sequential. Here the row is solved bottom-up instead: segments of size ``m = 1, 2, 4, ...``
are solved exactly, and two solved neighbours ``L`` (left) and ``R`` are merged at each of the
``⌈log2 n⌉`` levels. Merging two decreasing solutions pools a suffix of ``L`` with a prefix of
``R`` into one block of value ``V`` and leaves every other block as it was (the only violated
constraint is at the junction, and PAV's cascade from there pools exactly those blocks). ``V`` is
the root of the increasing function

.. math:: G(t) = \sum_{i \in P(t)} g_i(t), \qquad P(t) = \{i \in L: v_i < t\} \cup \{i \in R: v_i > t\},

with ``g_i(t) = t - v_i`` (l2) or ``exp(l_i) (1 - exp(v_i - t))`` (kl) written through the current
block values ``v`` (a block's own terms sum to zero at its value). The points of ``L`` with
``G(v_i) < 0`` are exactly those with ``v_i < V`` (a suffix: ``p`` of them), the points of ``R``
with ``G(v_i) > 0`` those with ``v_i > V`` (a prefix: ``q``), and ``V`` is the pooled block's value
over those ``p + q`` points. ``G`` is evaluated at every point at once: the sums over ``L``'s
suffixes and ``R``'s prefixes are cumulative sums (log-sum-exps for kl) within each segment, and
the counts across the junction come from one ``searchsorted`` of ``L`` into ``R`` (the counts of
``R`` into ``L`` follow from them by a histogram). Every level is a fixed sequence of tensor
operations on the ``(B, n)`` row padded to a power of two, so the solver runs unchanged under
``torch.compile(fullgraph=True)``, ``vmap`` and on any device; the work is ``O(n log² n)`` and
the memory ``O(n)``. Rounding can only move points whose value is within rounding of ``V``, whose
value is ``V`` either way. The first levels are done in one step, each segment of up to 128
points (4 on the CPU) solved at once from the table of its blocks' values
(:mod:`softtopk.ops.isotonic_small`): a few launches instead of dozens per level.

**CPU shortcuts** (as in :mod:`softtopk.ops.sparse`, under :func:`softtopk.ops.compute.can_inspect`:
a CPU tensor outside ``torch.compile`` and ``vmap``, where reading a value costs no
synchronisation). With numba installed, PAV itself, row by row
(:mod:`softtopk.ops.isotonic_numba`), and the backward's block sums by a pass over the runs.
Without numba, rounds of pooling on the compacted list of blocks, until no violation is left.
Each round pools every maximal run of non-decreasing block values, then takes every remaining
violation's whole left cascade at once (the cascade stops at the minimum of the pooled value
over the blocks it could absorb). Pooling adjacent violators in any order ends at the same
solution, so this is exact too; it is much cheaper than the level merges (a few rounds for
typical soft-rank rows, each a few reads). A kl block's value is the log of a ratio of sums of
exponentials, so where every row spans less than 600 the blocks carry those sums (relative to the
row's maximum), as cheap as l2's, instead of log-sum-exps. Should a row need more than ``8 + 8 log2 n`` rounds,
the fixed-shape solver takes over: for l2 on the row, for kl on the remaining blocks (their
log-sum-exps are a kl problem of their own).

Reference: M. Blondel, O. Teboul, Q. Berthet, J. Djolonga, "Fast Differentiable Sorting and
Ranking", ICML 2020, arXiv:2002.08871 (the problems and PAV); the merge is the bridge of two
concave majorants of the cumulative sums, found through its dual threshold.
"""

from __future__ import annotations

import torch

from . import isotonic_numba, pav_triton
from .compute import can_inspect, scan_rows
from .isotonic_small import small_kl, small_l2, small_size


def _segment_lse(values: torch.Tensor, group: torch.Tensor, keep: torch.Tensor, size: int) -> torch.Tensor:
    """``logsumexp`` of ``values`` (K,) over the contiguous groups ``group`` (K,) that start where
    ``keep`` is set, ``size`` groups (flat), relative to each group's first value; where that
    overflows (a later value far above the first), relative to the group's maximum."""
    top = values.masked_select(keep)
    total = values.new_zeros(size).index_add_(0, group, (values - top.index_select(0, group)).exp())
    if not bool(total.isfinite().all()):
        top = values.new_full((size,), -torch.inf).scatter_reduce(0, group, values, "amax")
        top = torch.where(top.isfinite(), top, 0.0)
        total = values.new_zeros(size).index_add_(0, group, (values - top.index_select(0, group)).exp())
    return top + total.log()


def _window_lse(a: torch.Tensor) -> torch.Tensor:
    """``logcumsumexp`` along the rows of ``a`` (J, W) (its first entry is finite). Not relative
    to the row's maximum: a window may span more than float64's exponent range, and the running
    sums of its first entries would underflow to 0 against a maximum further on."""
    return a.logcumsumexp(-1)


def _absorbed(value: torch.Tensor, agg: tuple[torch.Tensor, ...], size: torch.Tensor, first: torch.Tensor):
    """CPU shortcut (reads values): the blocks to keep after one step of left cascades. At every
    violation (a block ``b`` above its left neighbour, in the same row) PAV's cascade pools ``b``
    with the blocks before it while the pooled value lies above the next one; along a decreasing
    chain the pooled value of ``i..b`` first falls, then rises, so the cascade stops at its
    minimum over ``i``. The window of ``b`` looks back over its chain, at most ``K / J`` blocks
    for ``J`` violations among ``K`` blocks (the step costs ``O(K)``; a cut cascade goes on in the
    next round). Two windows share at most a chain's first block ``c``, itself the right side of a
    violation; then the two groups pool into one, a PAV step too: the left group's value lies below
    ``c``'s and the right group's above. ``None`` when no block violates."""
    viol = torch.cat([first[:1], value[:-1] < value[1:]]) & ~first
    right = torch.nonzero(viol).squeeze(-1)
    if right.numel() == 0:
        return None
    pos = torch.arange(value.shape[0], device=value.device)
    chain = torch.where(first | viol, pos, 0).cummax(0).values  # each block's chain start
    lo = chain.index_select(0, right - 1)
    width = max(2, min(value.shape[0], value.shape[0] // right.numel(), int((right - lo).max()) + 1))
    back = right.unsqueeze(-1) - torch.arange(width, device=value.device)  # (J, W): b, b-1, ...
    valid = back >= lo.unsqueeze(-1)
    idx = back.clamp_min(0)
    if len(agg) == 1:  # l2: the pooled mean of i..b
        sums = torch.where(valid, agg[0].take(idx), 0.0).cumsum(-1)
        pooled = sums / torch.where(valid, size.take(idx), 0.0).cumsum(-1)
    else:  # kl: logsumexp(y) - logsumexp(lw) over i..b
        tops, lows = (_window_lse(torch.where(valid, a.take(idx), -torch.inf)) for a in agg)
        pooled = tops - lows
    reach = torch.where(valid, pooled, torch.inf).argmin(-1)  # blocks b - reach .. b pool
    one = torch.ones_like(right)
    edges = torch.zeros(value.shape[0] + 1, dtype=torch.long, device=value.device)
    edges = edges.index_add_(0, right - reach + 1, one).index_add_(0, right + 1, -one)
    return edges.cumsum(0)[:-1] == 0  # not inside (b - reach, b]


_RATIO_SPAN = 600.0  # rows of kl problems spanning less than this pool in linear sums: e^-600 is normal


def _pooled_runs(y: torch.Tensor, lw: torch.Tensor | None, rounds: int | None = None) -> torch.Tensor | None:
    """CPU shortcut (reads values): PAV by rounds. Each round pools every maximal run of blocks
    whose values do not decrease (a sequence of PAV's own pooling steps), then runs the left
    cascades of the blocks that still violate (:func:`_absorbed`), and keeps the blocks compacted,
    one flat list over all rows, with their exact aggregates combined from the previous step's:
    l2, the sum and the count; kl, the log-sum-exps of ``y`` and ``lw``, or, where every row of
    ``y`` and of ``lw`` spans less than ``_RATIO_SPAN``, the sums of ``exp`` of both relative to
    the row's maximum, whose ratio orders the blocks as the kl values do (a block's value is the
    log of that ratio) at the cost of the l2 sums. After ``rounds`` rounds (by default
    ``8 + 8 log2 n``), kl blocks (a kl problem of their own, with their log-sum-exps as points) go
    to the fixed-shape solver, and l2 returns ``None``."""
    rows, n = y.shape
    size = torch.ones_like(y.reshape(-1))
    first = torch.zeros(rows, n, dtype=torch.bool, device=y.device)
    first[:, 0] = True
    first = first.reshape(-1)
    tops: tuple[torch.Tensor, ...] = ()
    if lw is None:
        agg: tuple[torch.Tensor, ...] = (y.reshape(-1),)
    else:
        tops = (y.amax(-1, keepdim=True), lw.amax(-1, keepdim=True))
        spans = [(top - a.amin(-1, keepdim=True)).amax() for a, top in zip((y, lw), tops, strict=True)]
        if bool((spans[0] < _RATIO_SPAN) & (spans[1] < _RATIO_SPAN)):
            agg = tuple((a - top).exp().reshape(-1) for a, top in zip((y, lw), tops, strict=True))
            base = y - lw  # a point's value alone, as the log-sum-exps give it
        else:
            tops, agg = (), (y.reshape(-1), lw.reshape(-1))
    ratio = bool(tops)

    def values() -> torch.Tensor:
        if lw is None:
            return agg[0] / size
        return agg[0] / agg[1] if ratio else agg[0] - agg[1]

    def solution(value: torch.Tensor) -> torch.Tensor:
        if ratio:  # log of the ratio plus the row's shift; a point alone keeps y - lw, bitwise
            block = torch.repeat_interleave(size.long())  # each point's block
            alone = (size == 1).index_select(0, block).reshape(rows, n)
            pooled = value.log().index_select(0, block).reshape(rows, n) + (tops[0] - tops[1])
            return torch.where(alone, base, pooled)
        return value.repeat_interleave(size.long()).reshape(rows, n)

    for step in range(2 * (8 + 8 * n.bit_length() if rounds is None else rounds)):
        value = values()
        if step % 2:
            keep = _absorbed(value, agg[:1] if ratio else agg, agg[1] if ratio else size, first)
            if keep is None:
                return solution(value)
        else:
            keep = first | torch.cat([first[:1], value[:-1] > value[1:]])
            if bool(keep.all()):
                return solution(value)
        group = keep.cumsum(0) - 1
        count = int(group[-1]) + 1
        size = size.new_zeros(count).index_add_(0, group, size)
        if lw is None or ratio:
            agg = tuple(a.new_zeros(count).index_add_(0, group, a) for a in agg)
        else:
            agg = tuple(_segment_lse(a, group, keep, count) for a in agg)
        first = first.masked_select(keep)
    value = values()
    if bool((first[1:] | (value[:-1] >= value[1:])).all()):
        return solution(value)
    if lw is None:
        return None
    # the remaining blocks, one padded row per row, padding below every block value
    row = first.long().cumsum(0) - 1
    if ratio:  # back to log-sum-exps
        agg = tuple(a.log() + top.squeeze(-1).index_select(0, row) for a, top in zip(agg, tops, strict=True))
        value = agg[0] - agg[1]
    pos = torch.arange(row.shape[0], device=y.device) - torch.nonzero(first).squeeze(-1)[row]
    width = int(pos.max()) + 1
    ys = value.new_full((rows, width), float(value.min()) - 1.0).index_put((row, pos), agg[0])
    lws = value.new_zeros((rows, width)).index_put((row, pos), agg[1])
    solved = levels_kl(ys, lws)[row, pos]
    return solved.repeat_interleave(size.long()).reshape(rows, n)


def _pad(v: torch.Tensor, lw: torch.Tensor | None):
    """``v`` (and ``lw``) padded to a power of two with points that never pool with a real one:
    values below every real block value (a pooled value lies within its points' range)."""
    n = v.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()
    if size == n:
        return v, lw
    low = v.amin(-1, keepdim=True)
    low = low - 1.0 - low.abs()  # strictly below, whatever the magnitude
    v = torch.cat([v, low.expand(*v.shape[:-1], size - n)], -1)
    if lw is not None:
        lw = torch.cat([lw, lw.new_zeros(*lw.shape[:-1], size - n)], -1)
    return v, lw


def _cross_counts(vl: torch.Tensor, vr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``c_i = #{j: vr_j > vl_i}`` and ``d_j = #{i: vl_i < vr_j}`` for decreasing rows ``vl, vr``
    (R, m): one ``searchsorted`` and a histogram of ``c`` (``vl_i < vr_j`` iff ``j < c_i``)."""
    m = vl.shape[-1]
    c = torch.searchsorted(vr.neg().contiguous(), vl.neg().contiguous())
    hist = torch.zeros(c.shape[:-1] + (m + 1,), dtype=c.dtype, device=c.device)
    hist = hist.scatter_add(-1, c, torch.ones_like(c))
    return c, m - scan_rows(hist)[..., :m]


def _merge_l2(v: torch.Tensor, m: int) -> torch.Tensor:
    """One level of l2 merges: the solved segments of size ``m`` of ``v`` (B, N) merged in pairs."""
    shape = v.shape
    v3 = v.reshape(-1, 2, m)
    vl, vr = v3[:, 0], v3[:, 1]
    # values relative to L's last and R's first value: exactly 0 on those blocks, so that G is
    # exactly 0 there when nothing is pooled (G vanishes on a whole interval in that case)
    ul, ur = vl - vl[:, -1:], vr - vr[:, :1]
    cl, cr = scan_rows(ul), scan_rows(ur)
    total = cl[:, -1:]
    zero = cl.new_zeros(cl.shape[0], 1)
    clx, crx = torch.cat([zero, cl], -1), torch.cat([zero, cr], -1)  # sums of the first k points
    pos = torch.arange(m, device=v.device)
    c, d = _cross_counts(vl, vr)
    # G at each point of L (t = vl_i): the points after it in L, the first c_i points of R; at
    # each point of R (t = vr_j): the last d_j points of L, the points before it in R
    shift = vr[:, :1] - vl[:, -1:]  # ur + shift = vr - vl[-1]
    g_left = (m - 1 - pos) * ul - (total - cl) + c * (ul - shift) - crx.gather(-1, c)
    g_right = d * (ur + shift) - (total - clx.gather(-1, m - d)) + pos * ur - (cr - ur)
    p = (g_left < 0).sum(-1, keepdim=True)
    q = (g_right > 0).sum(-1, keepdim=True)
    sum_l = total - clx.gather(-1, m - p) + p * vl[:, -1:]
    sum_r = crx.gather(-1, q) + q * vr[:, :1]
    pooled = (sum_l + sum_r) / (p + q).clamp_min(1)
    new_l = torch.where(pos >= m - p, pooled, vl)
    new_r = torch.where(pos < q, pooled, vr)
    return torch.stack([new_l, new_r], 1).reshape(shape)


def _log_part(a1: torch.Tensor, a2: torch.Tensor, t: torch.Tensor, below: bool) -> torch.Tensor:
    """``log |Σ exp(l_i) (1 - exp(v_i - t))|`` over a set with ``a1 = logsumexp(l)``,
    ``a2 = logsumexp(l + v)`` whose values lie all below (``below``) or all above ``t``; ``-inf``
    for an empty set."""
    empty = a1 == -torch.inf
    gap = torch.where(empty, 0.0, a2 - a1 - t)
    if below:
        body = torch.log(-torch.expm1(gap.clamp(max=0)))
    else:  # log(e^g - 1) as g + log(1 - e^-g): e^g overflows (from g = 89 in float32, 710 in float64)
        gap = gap.clamp(min=0)
        body = gap + torch.log(-torch.expm1(-gap))
    return torch.where(empty, -torch.inf, a1 + body)


def _prefix_lse(x: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` of the first ``k`` entries, ``k = 0..m`` (R, m + 1)."""
    return torch.cat([torch.full_like(x[:, :1], -torch.inf), scan_rows(x, "logsumexp")], -1)


def _suffix_lse(x: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` of the entries from ``k`` on, ``k = 0..m`` (R, m + 1)."""
    return torch.cat([scan_rows(x.flip(-1), "logsumexp").flip(-1), torch.full_like(x[:, :1], -torch.inf)], -1)


def _merge_kl(v: torch.Tensor, lw: torch.Tensor, m: int) -> torch.Tensor:
    """One level of kl merges (``lw`` the log weights ``l``, fixed); the sums of ``exp(l)`` and
    ``exp(l + v)`` over suffixes of ``L`` and prefixes of ``R`` are taken as log-sum-exps."""
    shape = v.shape
    v3, l3 = v.reshape(-1, 2, m), lw.reshape(-1, 2, m)
    vl, vr = v3[:, 0], v3[:, 1]
    s1, s2 = _suffix_lse(l3[:, 0]), _suffix_lse(l3[:, 0] + vl)  # L from point k on
    p1, p2 = _prefix_lse(l3[:, 1]), _prefix_lse(l3[:, 1] + vr)  # R before point k
    pos = torch.arange(m, device=v.device)
    c, d = _cross_counts(vl, vr)
    # G < 0 at t = vl_i: the part below t (after i in L) is smaller than the part above (R's
    # first c_i points); G > 0 at t = vr_j: the part below (L's last d_j points) is larger than
    # the part above (before j in R). Where nothing is pooled one side is empty: -inf, exactly
    start = m - d
    g_left = _log_part(s1[:, 1:], s2[:, 1:], vl, True) < _log_part(p1.gather(-1, c), p2.gather(-1, c), vl, False)
    g_right = _log_part(s1.gather(-1, start), s2.gather(-1, start), vr, True) > _log_part(
        p1[:, :-1], p2[:, :-1], vr, False
    )
    p = g_left.sum(-1, keepdim=True)
    q = g_right.sum(-1, keepdim=True)
    top = torch.logaddexp(s2.gather(-1, m - p), p2.gather(-1, q))
    bottom = torch.logaddexp(s1.gather(-1, m - p), p1.gather(-1, q))
    pooled = torch.where(p + q > 0, top - bottom, 0.0)
    new_l = torch.where(pos >= m - p, pooled, vl)
    new_r = torch.where(pos < q, pooled, vr)
    return torch.stack([new_l, new_r], 1).reshape(shape)


def isotonic_l2(y: torch.Tensor) -> torch.Tensor:
    """The decreasing isotonic fit ``argmin_{v_1 >= ... >= v_n} ½ ||v - y||²`` of rows ``y`` (B, n)."""
    if y.numel() and can_inspect(y):
        found = isotonic_numba.pav_l2(y) if isotonic_numba.available() else _pooled_runs(y, None)
        if found is not None:
            return found
    if pav_triton.usable(y):  # CUDA: one Triton program per row
        return pav_triton.pav_l2(y)
    return levels_l2(y)


def levels_l2(y: torch.Tensor) -> torch.Tensor:
    """:func:`isotonic_l2` by the fixed-shape level merges (no value read, any device)."""
    n = y.shape[-1]
    v, _ = _pad(y, None)
    m = small_size(v.shape, v.device)
    v = small_l2(v, m) if m > 1 else v
    while m < v.shape[-1]:
        v = _merge_l2(v, m)
        m *= 2
    return v[..., :n]


def isotonic_kl(y: torch.Tensor, lw: torch.Tensor) -> torch.Tensor:
    """``argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(lw), v>`` of rows ``y``, ``lw`` (B, n);
    a block's value is ``logsumexp(y_B) - logsumexp(lw_B)``."""
    if y.numel() and can_inspect(y):
        found = isotonic_numba.pav_kl(y, lw) if isotonic_numba.available() else _pooled_runs(y, lw)
        if found is not None:
            return found
    if pav_triton.usable(y):  # CUDA: one Triton program per row
        return pav_triton.pav_kl(y, lw)
    return levels_kl(y, lw)


def levels_kl(y: torch.Tensor, lw: torch.Tensor) -> torch.Tensor:
    """:func:`isotonic_kl` by the fixed-shape level merges (no value read, any device)."""
    n = y.shape[-1]
    v, lw = _pad(y - lw, lw)
    m = small_size(v.shape, v.device)
    v = small_kl(v, lw, m) if m > 1 else v
    while m < v.shape[-1]:
        v = _merge_kl(v, lw, m)
        m *= 2
    return v[..., :n]


def block_ids(v: torch.Tensor) -> torch.Tensor:
    """The pooled block of every point of a solution ``v`` (B, n): its index (int64; a block is a
    run of equal values)."""
    new = torch.cat([torch.ones_like(v[..., :1], dtype=torch.bool), v[..., 1:] != v[..., :-1]], -1)
    return new.long().cumsum(-1) - 1


def block_starts(v: torch.Tensor) -> torch.Tensor:
    """The index of the first point of every point's block (B, n), int64."""
    new = torch.cat([torch.ones_like(v[..., :1], dtype=torch.bool), v[..., 1:] != v[..., :-1]], -1)
    pos = torch.arange(v.shape[-1], device=v.device).expand_as(v)
    return torch.where(new, pos, 0).cummax(-1).values


def block_sum(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The sum over each point's block (B, n), from :func:`block_ids`. Under ``torch.compile``
    the blocks, runs of equal ids, are summed as differences of running sums: Inductor fails to
    generate CUDA code for the scatter-add over long rows. On a CPU tensor with numba, a
    sequential pass over the runs (:mod:`softtopk.ops.isotonic_numba`), where the scatter-add is slow."""
    if can_inspect(values) and can_inspect(ids) and not values.requires_grad and isotonic_numba.available():
        return isotonic_numba.run_sums(values, ids)
    if not torch.compiler.is_compiling():
        return torch.zeros_like(values).scatter_add(-1, ids, values).gather(-1, ids)
    sums = torch.nn.functional.pad(scan_rows(values), (1, 0))
    start, end = torch.searchsorted(ids, ids), torch.searchsorted(ids, ids, right=True)
    return sums.gather(-1, end) - sums.gather(-1, start)
