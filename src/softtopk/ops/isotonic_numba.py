r"""Optional CPU kernels of the isotonic solver: Pool-Adjacent-Violators row by row, compiled by numba.

PAV is sequential and ``O(n)`` per row (Blondel et al., ICML 2020; torchsort's C++ kernel runs
the same algorithm). Where numba is installed and a tensor's values may be read
(:func:`softtopk.ops.compute.can_inspect`: a CPU tensor, eager, outside ``vmap``),
:mod:`softtopk.ops.isotonic` calls these kernels instead of its rounds of tensor operations;
everywhere else (accelerators, ``torch.compile``, ``vmap``, or no numba) the pure-torch solver
runs, and it is the reference the tests hold these kernels to. The environment variable
``SOFTTOPK_NUMBA=0`` (read at import) turns the kernels off. The first call in a process imports
numba and compiles the kernels; numba caches the machine code on disk for later processes.

* :func:`pav_l2`: ``argmin_{v_1 >= ... >= v_n} ½ ||v - y||²``, a block's value the mean of ``y``;
* :func:`pav_kl`: ``argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(lw), v>``, a block's value
  ``logsumexp(y_B) - logsumexp(lw_B)``: where a row of ``y`` and of ``lw`` spans less than 600, the
  blocks carry the sums of ``exp`` relative to the row's maxima, whose ratio orders them as their
  values do (as the torch solver's rounds); elsewhere log-sum-exps, as maxima and sums relative to them;
* :func:`run_sums`: the sum of ``values`` over each point's run of equal block ids, the block
  reductions of the backward pass.

Adjacent blocks with equal values are pooled, as the torch solver pools them, so the blocks of a
solution are its runs of equal values either way.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import torch


def _build() -> dict[str, Any]:
    import numba
    import numpy as np

    jit = numba.njit(cache=True, nogil=True)
    span = 600.0  # kl rows spanning less pool in linear sums: exp(-600) is a normal float64

    @jit
    def l2(y, out):
        rows, n = y.shape
        sums = np.empty(n)
        counts = np.empty(n, np.int64)
        for b in range(rows):
            top = -1
            for i in range(n):
                total, count = y[b, i], 1
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
                    out[b, i] = value
                    i += 1

    @jit
    def kl(y, lw, out):
        rows, n = y.shape
        ymax, ysum = np.empty(n), np.empty(n)  # a block's log-sum-exp: ymax + log(ysum)
        lmax, lsum = np.empty(n), np.empty(n)
        values = np.empty(n)  # log-sum-exps: the block values; linear sums: exp(value - shift)
        counts = np.empty(n, np.int64)
        for b in range(rows):
            ytop, ltop = y[b].max(), lw[b].max()
            linear = ytop - y[b].min() < span and ltop - lw[b].min() < span
            top = -1
            for i in range(n):
                count = 1
                if linear:  # sums of exp relative to the row's maxima: no log or exp per merge
                    ys, ls = np.exp(y[b, i] - ytop), np.exp(lw[b, i] - ltop)
                    value = ys / ls
                    while top >= 0 and values[top] <= value:
                        ys += ysum[top]
                        ls += lsum[top]
                        count += counts[top]
                        value = ys / ls
                        top -= 1
                    ysum[top + 1], lsum[top + 1] = ys, ls
                else:
                    ym, ys, lm, ls = y[b, i], 1.0, lw[b, i], 1.0
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
                    ymax[top + 1], ysum[top + 1], lmax[top + 1], lsum[top + 1] = ym, ys, lm, ls
                top += 1
                values[top], counts[top] = value, count
            i = 0
            for t in range(top + 1):
                if counts[t] == 1:  # a point alone keeps y - lw, bitwise
                    out[b, i] = y[b, i] - lw[b, i]
                    i += 1
                    continue
                value = np.log(values[t]) + (ytop - ltop) if linear else values[t]
                for _ in range(counts[t]):
                    out[b, i] = value
                    i += 1

    @jit
    def sums(ids, values, out):
        rows, n = ids.shape
        for b in range(rows):
            start = 0
            while start < n:
                stop, total = start, 0.0
                while stop < n and ids[b, stop] == ids[b, start]:
                    total += values[b, stop]
                    stop += 1
                for i in range(start, stop):
                    out[b, i] = total
                start = stop

    return {"l2": l2, "kl": kl, "sums": sums}


ENABLED = os.environ.get("SOFTTOPK_NUMBA") != "0"


@functools.cache
def _kernels() -> dict[str, Any] | None:
    if not ENABLED or importlib.util.find_spec("numba") is None:
        return None
    try:
        return _build()
    except ImportError:  # a numba that does not support the installed numpy or Python
        return None


def available() -> bool:
    """Whether the kernels can run: numba is installed and importable, and ``SOFTTOPK_NUMBA`` is
    not ``"0"``. The callers decide where (:func:`softtopk.ops.compute.can_inspect` on their
    tensors)."""
    return _kernels() is not None


def _kernel(name: str):
    kernels = _kernels()
    assert kernels is not None, "isotonic_numba used without numba (check available() first)"
    return kernels[name]


def _array(t: torch.Tensor):
    return t.detach().contiguous().numpy()


def pav_l2(y: torch.Tensor) -> torch.Tensor:
    """The decreasing l2 isotonic fit of the float64 CPU rows ``y`` (B, n)."""
    out = torch.empty(y.shape, dtype=y.dtype)
    _kernel("l2")(_array(y), out.numpy())
    return out


def pav_kl(y: torch.Tensor, lw: torch.Tensor) -> torch.Tensor:
    """The decreasing kl isotonic solution of the float64 CPU rows ``y``, ``lw`` (B, n)."""
    out = torch.empty(y.shape, dtype=y.dtype)
    _kernel("kl")(_array(y), _array(lw), out.numpy())
    return out


def run_sums(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The sum of the float64 CPU ``values`` (B, n) over each point's run of equal ``ids`` (B, n;
    block indices, or the solution's values themselves)."""
    out = torch.empty(values.shape, dtype=values.dtype)
    _kernel("sums")(_array(ids), _array(values), out.numpy())
    return out
