"""The numba kernel behind :mod:`softtopk.ops.networks_numba` (imported only from there, at the
first CPU backward it runs: this module imports numba): the label sweep's backward, every layer
of the network in one call, with the rows innermost (contiguous in the saved tensors, so each
wire's loop vectorises)."""

from __future__ import annotations

import math

import numba
import numpy as np

jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@jit
def label_backward(grad, out_wires, partner, sign, diffs, alphas, z, far, beta, out):
    """The gradient of the scores ``out`` (B, n) from that of the label's ranks ``grad`` (k, B),
    through the saved value sweep of :class:`~softtopk.ops.sorting_networks._LabelSweep` with the
    Cauchy swap: ``diffs`` (L, n, 2, B) the differences of the values and of the riding row,
    ``alphas`` (L, n, B), ``z`` (n, B) the wires entering the network (``β x``, infinities at
    ``±far``), ``partner`` and ``sign`` (L, n).

    Each layer, last first, as the torch path: with ``s = sign / (π (1 + d²))``, the gradients
    ``(g, h)`` of the values and the riding row become ``(g (α + d s) + h e s, h α)`` on each wire
    plus its partner's share ``(g - g_d)[p]``."""
    depth, n = partner.shape
    rows = z.shape[1]
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
            out[b, i] = g[i, b] * beta if abs(z[i, b]) < far else 0.0
