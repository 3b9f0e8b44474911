"""The numba kernels behind :mod:`softtopk.ops.networks_numba` (imported only from there, at the
first CPU sweep it runs: this module imports numba): the label sweep's forward and backward, every
layer of the network in one call each, with the rows innermost (contiguous in the saved tensors,
so each wire's loop vectorises; the swap's ``atan`` is a rational approximation, not a call)."""

from __future__ import annotations

import math

import numpy as np

from .order_kernels import jit

# a rational approximation of atan on [0, 0.66] in the form of Cephes' atan (S. L. Moshier), after
# the reductions atan t = π/4 + atan((t - 1)/(t + 1)) and π/2 - atan(1/t): within an ulp of float64
# (the Triton kernels' ``networks_kernels._atan``)
_P: tuple[float, ...] = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1)
_P += (-1.228866684490136173410e2, -6.485021904942025371773e1)
_Q: tuple[float, ...] = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2)
_Q += (4.853903996359136964868e2, 1.945506571482613964425e2)
_HALF_PI_LOW = 6.123233995736765886130e-17  # π/2 minus its float64 rounding


@jit
def _atan(v):
    """``atan(v)`` of a float64 ``v``, every branch a select (the loops calling it vectorise)."""
    t = abs(v)
    big = t > 2.41421356237309504880  # tan(3π/8)
    mid = (t > 0.66) & (not big)
    quarters = 2.0 if big else (1.0 if mid else 0.0)  # the reduction's multiples of π/4
    u = -1.0 / (t if big else 1.0) if big else ((t - 1.0) / (t + 1.0) if mid else t)
    z = u * u
    num = (((_P[0] * z + _P[1]) * z + _P[2]) * z + _P[3]) * z + _P[4]
    den = ((((z + _Q[0]) * z + _Q[1]) * z + _Q[2]) * z + _Q[3]) * z + _Q[4]
    r = quarters * (math.pi / 4) + (u * (z * num / den) + quarters * (0.5 * _HALF_PI_LOW)) + u
    return -r if v < 0 else r


@jit
def _lerp(start, end, w):
    """``torch.lerp(start, end, w)`` in float64: exact at ``w`` 0 and 1."""
    start, end, w = np.float64(start), np.float64(end), np.float64(w)
    return start + w * (end - start) if w < 0.5 else end - (end - start) * (1.0 - w)


@jit
def label_forward(wires, partner, sign, out_wires, far, diffs, alphas, out):
    """The label sweep's forward (:func:`softtopk.ops.sorting_networks._value_sweep` with the
    label's one-hot row riding along; the Cauchy swap at unit steepness): from the wires ``wires``
    (n, 2, B) entering the network (row 0 ``β x`` with infinities at ``±far``, row 1 the label's
    one-hot), written in place: each layer's differences of the values and of the riding row
    ``diffs`` (L, n, 2, B), its swap probabilities ``alphas`` (L, n, B) and the riding row at the
    output wires ``out`` (k, B). Differences are taken in the rows' dtype, ``atan`` and the lerps
    in float64; beyond ``far / 2`` only an infinity's stand-in differs, and the comparison is
    decided."""
    depth, n = partner.shape
    v, r = wires[:, 0].copy(), wires[:, 1].copy()
    rows = v.shape[1]
    v_next, r_next = np.empty_like(v), np.empty_like(v)
    for layer in range(depth):
        for i in range(n):
            p, s = partner[layer, i], np.float64(sign[layer, i])
            # a wire's rows as views, each loop over them short enough in arrays to vectorise
            vi, vp, ri, rp = v[i], v[p], r[i], r[p]
            d_row, e_row, a_row = diffs[layer, i, 0], diffs[layer, i, 1], alphas[layer, i]
            for b in range(rows):
                d = vi[b] - vp[b]
                swap = 0.5 + s * (_atan(np.float64(d)) * (1.0 / math.pi))
                a_row[b] = (1.0 if s * d > 0 else 0.0) if abs(d) > 0.5 * far else swap
                d_row[b] = d
            for b in range(rows):
                e_row[b] = ri[b] - rp[b]
            v_out, r_out = v_next[i], r_next[i]
            for b in range(rows):  # alpha as saved, in the rows' dtype (the backward reads it)
                v_out[b] = _lerp(vp[b], vi[b], a_row[b])
            for b in range(rows):
                r_out[b] = _lerp(rp[b], ri[b], a_row[b])
        v, v_next, r, r_next = v_next, v, r_next, r
    for j in range(out_wires.shape[0]):
        for b in range(rows):
            out[j, b] = r[out_wires[j], b]


@jit
def label_backward(grad, out_wires, partner, sign, diffs, alphas, wires, far, beta, out):
    """The gradient of the scores ``out`` (B, n) from that of the label's ranks ``grad`` (k, B),
    through the saved value sweep of :class:`~softtopk.ops.sorting_networks._LabelSweep` with the
    Cauchy swap: ``diffs`` (L, n, 2, B) the differences of the values and of the riding row,
    ``alphas`` (L, n, B), ``wires`` (n, 2, B) the wires entering the network (row 0 ``β x``,
    infinities at ``±far``), ``partner`` and ``sign`` (L, n).

    Each layer, last first, as the torch path: with ``s = sign / (π (1 + d²))``, the gradients
    ``(g, h)`` of the values and the riding row become ``(g (α + d s) + h e s, h α)`` on each wire
    plus its partner's share ``(g - g_d)[p]``."""
    depth, n = partner.shape
    rows = wires.shape[2]
    g, h = np.zeros((n, rows)), np.zeros((n, rows))
    gd, hd = np.empty((n, rows)), np.empty((n, rows))
    g_next, h_next = np.empty((n, rows)), np.empty((n, rows))
    for j in range(out_wires.shape[0]):
        for b in range(rows):
            h[out_wires[j], b] = grad[j, b]
    inv_pi = 1.0 / math.pi
    for step in range(depth):
        layer = depth - 1 - step
        for i in range(n):
            sgn = sign[layer, i]
            for b in range(rows):
                d = np.float64(diffs[layer, i, 0, b])
                a = np.float64(alphas[layer, i, b])
                slope = 1.0 / (d * d + 1.0) * sgn * inv_pi
                gd[i, b] = g[i, b] * (a + d * slope) + h[i, b] * (np.float64(diffs[layer, i, 1, b]) * slope)
                hd[i, b] = h[i, b] * a
        for i in range(n):
            p = partner[layer, i]
            for b in range(rows):
                g_next[i, b] = gd[i, b] + (g[p, b] - gd[p, b])
                h_next[i, b] = hd[i, b] + (h[p, b] - hd[p, b])
        g, g_next, h, h_next = g_next, g, h_next, h
    for i in range(n):
        for b in range(rows):
            out[b, i] = g[i, b] * beta if abs(wires[i, 0, b]) < far else 0.0
