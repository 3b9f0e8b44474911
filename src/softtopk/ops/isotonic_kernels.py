r"""The numba kernels behind :mod:`softtopk.ops.isotonic_numba` (imported only from there, at the
first CPU solve: this module imports numba).

Row solvers, Pool-Adjacent-Violators with a stack of blocks (Blondel et al., ICML 2020):

* ``_l2_row``: ``argmin_{v_1 >= ... >= v_n} ½ ||v - y||²``, a block's value the mean of ``y``;
* ``_kl_row``: ``argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(lw), v>``, a block's value
  ``logsumexp(y_B) - logsumexp(lw_B)``. Where the row of ``y`` and of ``lw`` spans less than 600,
  the blocks carry the sums of ``exp`` relative to the row's maxima, whose ratio orders them as
  their values do (no log or exp per merge); elsewhere log-sum-exps, as maxima and sums relative
  to them. A point alone keeps ``y - lw``, bitwise.

Adjacent blocks with equal values are pooled, as the torch solver pools them, so the blocks of a
solution are its runs of equal values either way. On top of them, the soft rank's and soft sort's
whole forward on the sorted rows, and their backward from the runs of the solution, in one pass
each (the formulas of :mod:`softtopk.ops.permutahedron`, in the same order of operations).
"""

from __future__ import annotations

import functools

import numpy as np

from .order_kernels import jit

SPAN = 600.0  # kl rows spanning less pool in linear sums: exp(-600) is a normal float64


@jit
def _l2_row(y, out, sums, counts):
    top = -1
    for i in range(y.shape[0]):
        total, count = y[i], 1
        while top >= 0 and sums[top] / counts[top] <= total / count:
            total += sums[top]
            count += counts[top]
            top -= 1
        top += 1
        sums[top], counts[top] = total, count
    i = 0
    for t in range(top + 1):
        value = sums[t] / counts[t]
        for _ in range(counts[t]):
            out[i] = value
            i += 1


@jit
def _push_ratio(ys, ls, top, ysum, lsum, values, counts):
    """Push a point with the linear sums ``(ys, ls)`` onto the stack of blocks, pooling it with the
    blocks below while their ratio ``ysum / lsum`` is at most its own; the new top."""
    count, value = 1, ys / ls
    while top >= 0 and values[top] <= value:
        ys += ysum[top]
        ls += lsum[top]
        count += counts[top]
        value = ys / ls
        top -= 1
    top += 1
    ysum[top], lsum[top], values[top], counts[top] = ys, ls, value, count
    return top


@jit
def _kl_row(y, lw, out, ymax, ysum, lmax, lsum, values, counts):
    ytop, ltop = y.max(), lw.max()
    linear = ytop - y.min() < SPAN and ltop - lw.min() < SPAN
    top = -1
    for i in range(y.shape[0]):
        if linear:
            top = _push_ratio(np.exp(y[i] - ytop), np.exp(lw[i] - ltop), top, ysum, lsum, values, counts)
            continue
        ym, ys, lm, ls, count = y[i], 1.0, lw[i], 1.0, 1
        value = ym - lm
        while top >= 0 and values[top] <= value:
            m = max(ym, ymax[top])
            ys = ys * np.exp(ym - m) + ysum[top] * np.exp(ymax[top] - m)
            ym = m
            m = max(lm, lmax[top])
            ls = ls * np.exp(lm - m) + lsum[top] * np.exp(lmax[top] - m)
            lm = m
            count += counts[top]
            value = (ym + np.log(ys)) - (lm + np.log(ls))
            top -= 1
        top += 1
        ymax[top], ysum[top], lmax[top], lsum[top] = ym, ys, lm, ls
        values[top], counts[top] = value, count
    i = 0
    for t in range(top + 1):
        if counts[t] == 1:
            out[i] = y[i] - lw[i]
            i += 1
            continue
        value = np.log(values[t]) + (ytop - ltop) if linear else values[t]
        for _ in range(counts[t]):
            out[i] = value
            i += 1


@jit
def _buffers(n):
    return np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n, np.int64)


@jit
def _solve_row(y, lw, kl, out, buffers):
    a, b, c, d, values, counts = buffers
    if kl:
        _kl_row(y, lw, out, a, b, c, d, values, counts)
    else:
        _l2_row(y, out, a, counts)


@jit
def pav_l2(y, out):
    buffers = _buffers(y.shape[1])
    for b in range(y.shape[0]):
        _solve_row(y[b], y[b], False, out[b], buffers)


@jit
def pav_kl(y, lw, out):
    buffers = _buffers(y.shape[1])
    for b in range(y.shape[0]):
        _solve_row(y[b], lw[b], True, out[b], buffers)


@jit
def _run_end(keys, start):
    """The end of the run of values equal to ``keys[start]`` (a block of a solution)."""
    stop = start + 1
    while stop < keys.shape[0] and keys[stop] == keys[start]:
        stop += 1
    return stop


@jit
def run_sums(ids, values, out):
    rows, n = ids.shape
    for b in range(rows):
        start = 0
        while start < n:
            stop = _run_end(ids[b], start)
            total = 0.0
            for i in range(start, stop):
                total += values[b, i]
            for i in range(start, stop):
                out[b, i] = total
            start = stop


@functools.cache
def _key_constants(dtype: np.dtype) -> tuple:
    unsigned = np.uint32 if dtype == np.float32 else np.uint64
    width = 8 * np.dtype(unsigned).itemsize
    high, full = 1 << (width - 1), (1 << width) - 1
    inf = int(np.array(np.inf, dtype).view(unsigned))
    return unsigned, tuple(unsigned(c) for c in (high, full, full ^ high, inf, 255, 8))


def sort_keys(values: np.ndarray) -> tuple[np.ndarray, tuple]:
    """The bits of the float32 or float64 rows ``values`` as unsigned integers, and
    :func:`sorted_rows`' constants in their type (a plain function: it runs once a call)."""
    unsigned, constants = _key_constants(values.dtype)
    return values.view(unsigned), constants


@jit
def sorted_rows(bits, constants, x, sign, perm, s):
    """``sign * x`` (B, n) sorted in decreasing order, ``s`` (float64), and its permutation
    ``perm``: a stable least-significant-digit radix sort, a byte a pass, of order-preserving
    integer keys of the float bits ``bits`` (``-0`` read as ``+0``, NaN first), with
    no comparison to mispredict; ``O(n)`` work per row, and ties keep their order in the row, as
    ``torch.sort(stable=True)`` keeps them. ``constants``: the sign bit, all bits, the magnitude
    bits, the bits of ``inf``, a byte's mask and 8, in the keys' unsigned type (numba would mix a
    Python int with them into a float)."""
    high, full, magnitude, inf, byte_mask, eight = constants
    rows, n = bits.shape
    keys, spare = np.empty(n, bits.dtype), np.empty(n, bits.dtype)
    order, other = np.empty(n, np.int64), np.empty(n, np.int64)
    counts = np.empty(256, np.int64)
    for b in range(rows):
        for i in range(n):
            u = bits[b, i]
            if (u & magnitude) == 0:
                key = high  # -0 and +0 alike
            elif u & high:
                key = full ^ u
            else:
                key = u | high
            keys[i] = full ^ key if sign > 0 else key  # decreasing order of sign * x
            if (u & magnitude) > inf:
                keys[i] = full ^ full  # NaN first, as torch.sort(descending=True) puts it
            order[i] = i
        shift = eight ^ eight
        for _ in range(bits.itemsize):
            counts[:] = 0
            for i in range(n):
                counts[np.int64((keys[i] >> shift) & byte_mask)] += 1
            if counts.max() < n:  # else every key has this byte: the pass would change nothing
                start = 0
                for d in range(256):
                    counts[d], start = start, start + counts[d]
                for i in range(n):
                    d = np.int64((keys[i] >> shift) & byte_mask)
                    spare[counts[d]], other[counts[d]] = keys[i], order[i]
                    counts[d] += 1
                keys, spare = spare, keys
                order, other = other, order
            shift += eight
        for i in range(n):
            perm[b, i] = order[i]
            s[b, i] = sign * np.float64(x[b, order[i]])


@jit
def rank_forward(s, perm, eps, kl, out, r, v, theta):
    """Soft ranks of the finite decreasing rows ``s`` (sorted by ``perm``): ``θ`` (the clamped
    gaps' running sum over ``ε``), ``v`` and ``r`` in sorted order, ``out`` in the rows' order."""
    rows, n = s.shape
    bound = 2.0 * n + 2.0
    buffers = _buffers(n)
    y, lw = np.empty(n), np.empty(n)
    for i in range(n):  # the (log) weights, the same for every row
        lw[i] = np.log(float(n - i)) if kl else float(n - i)
    for b in range(rows):
        theta[b, 0] = 0.0
        for i in range(1, n):
            theta[b, i] = theta[b, i - 1] + max((s[b, i] - s[b, i - 1]) / eps[b], -bound)
        if not (kl and _kl_rank_linear(theta[b], lw, v[b], r[b], buffers, y)):
            for i in range(n):
                y[i] = theta[b, i] if kl else theta[b, i] - lw[i]
            _solve_row(y, lw, kl, v[b], buffers)
            for i in range(n):
                if kl:
                    r[b, i] = np.exp((theta[b, i] - lw[i]) - v[b, i]) * float(n - i)
                else:
                    r[b, i] = float(n - i) - (v[b, i] - y[i])
        for i in range(n):
            out[b, perm[b, i]] = r[b, i]


@jit
def _kl_rank_linear(theta, lw, v, r, buffers, ey):
    """A kl soft rank's row in linear sums, where ``θ`` spans less than ``SPAN`` (else ``False``):
    PAV on ``e^{θ - max θ}`` against ``w / n`` (``lw = log w``), one ``exp`` per point. A pooled
    block's value is ``v_B = log(Σ e^θ / Σ w)`` and its ranks ``r = e^{θ - v_B} = e^{θ - max θ}
    n Σ_B(w/n) / Σ_B e^{θ - max θ}``, with no ``exp`` of their own; a point alone keeps
    ``v = θ - log w`` and ``r = w``, exactly."""
    n = theta.shape[0]
    top = theta.max()
    if top - theta.min() >= SPAN:
        return False
    ysum, lsum, _, _, values, counts = buffers
    stack = -1
    for i in range(n):
        ey[i] = np.exp(theta[i] - top)
        stack = _push_ratio(ey[i], float(n - i) / n, stack, ysum, lsum, values, counts)
    i = 0
    for t in range(stack + 1):
        if counts[t] == 1:
            v[i], r[i] = theta[i] - lw[i], float(n - i)
            i += 1
            continue
        block = np.log(values[t]) + (top - np.log(float(n)))
        scale = n * lsum[t] / ysum[t]
        for _ in range(counts[t]):
            v[i], r[i] = block, ey[i] * scale
            i += 1
    return True


@jit
def rank_backward(grad, perm, v, r, kl, scale, out):
    """``∂x`` of the soft ranks (no strength gradient) from ``grad`` in the rows' order:
    ``g - mean_B g`` (l2), ``g r - r Σ_B(g r) / Σ_B w`` (kl), times ``sign/ε``."""
    rows, n = v.shape
    g = np.empty(n)
    for b in range(rows):
        for i in range(n):
            g[i] = grad[b, perm[b, i]] * r[b, i] if kl else grad[b, perm[b, i]]
        start = 0
        while start < n:
            stop = _run_end(v[b], start)
            total = 0.0
            for i in range(start, stop):
                total += g[i]
            # Σ_B w over positions start..stop-1 (w_i = n - i), exact in float64
            size = (stop - start) * (2 * n - start - stop + 1) / 2 if kl else stop - start
            for i in range(start, stop):
                out[b, perm[b, i]] = (g[i] - (r[b, i] if kl else 1.0) * (total / size)) * scale[b]
            start = stop


@jit
def sort_forward(s, eps, kl, sign, h, v):
    """Soft sorts of the finite decreasing rows ``s`` (in sorted order, times ``sign``)."""
    rows, n = s.shape
    buffers = _buffers(n)
    ws, base = np.empty(n), np.empty(n)
    for b in range(rows):
        for i in range(n):
            ws[i] = float(n - i) / eps[b]
            base[i] = ws[i] - s[b, i]
        _solve_row(ws if kl else base, s[b], kl, v[b], buffers)
        for i in range(n):
            h[b, i] = (s[b, i] - (v[b, i] - base[i])) * sign


@jit
def sort_backward(grad, perm, v, s, kl, out):
    """``∂x`` of the soft sorts (no strength gradient) from ``grad`` in sorted order:
    ``mean_B g`` (l2), ``softmax_B(s) Σ_B g`` (kl)."""
    rows, n = v.shape
    for b in range(rows):
        start = 0
        while start < n:
            stop = _run_end(v[b], start)
            total, mass = 0.0, 0.0
            for i in range(start, stop):
                total += grad[b, i]
                mass += np.exp(s[b, i] - s[b, start]) if kl else 1.0
            for i in range(start, stop):
                share = np.exp(s[b, i] - s[b, start]) if kl else 1.0
                out[b, perm[b, i]] = share / mass * total
            start = stop
