"""Plain float64 NumPy oracle for soft ranks and sorts (tests only, not optimised).

Follows the reference implementation of Blondel et al. (google-research/fast-soft-sort,
``numpy_ops.py``): with ``w = (n, ..., 1)`` and ``s`` the row sorted decreasingly,

* rank l2: ``s/ε - isotonic_l2(s/ε - w)``; rank kl: ``exp(s/ε - isotonic_kl(s/ε, log w))``, put back
  in the row's order (ascending ranks; descending ranks are those of ``-x``);
* sort l2: ``sign (w/ε - isotonic_l2(w/ε - s))``; sort kl: ``sign (w/ε - isotonic_kl(w/ε, s))``, with
  ``s`` the sorted ``sign x`` and ``sign = -1`` for the ascending sort.

``isotonic_l2`` is computed two independent ways: sequential PAV and the min-max formula
``v_i = min_{a <= i} max_{b >= i} mean(y[a..b])`` (O(n²)). The vector-Jacobian products are the
reference's block formulas (with the kl sort's softmax over the sorted values, as torchsort has it).
"""

from __future__ import annotations

import numpy as np


def _lse(a: float, b: float) -> float:
    big = max(a, b)
    return big + float(np.log1p(np.exp(min(a, b) - big)))


def isotonic_l2(y: np.ndarray) -> np.ndarray:
    """``argmin_{v decreasing} ½||v - y||²`` by PAV (a block pools while its left neighbour is not larger)."""
    blocks: list[list[float]] = []  # [sum, count]
    for value in y:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] <= blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return np.concatenate([np.full(int(c), t / c) for t, c in blocks])


def isotonic_l2_minmax(y: np.ndarray) -> np.ndarray:
    """The same fit by the min-max formula (independent of PAV)."""
    n = len(y)
    prefix = np.concatenate([[0.0], np.cumsum(y)])
    mean = np.full((n, n), -np.inf)
    for a in range(n):
        for b in range(a, n):
            mean[a, b] = (prefix[b + 1] - prefix[a]) / (b - a + 1)
    return np.array([min(max(mean[a, b] for b in range(i, n)) for a in range(i + 1)) for i in range(n)])


def isotonic_kl(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``argmin_{v decreasing} <exp(y - v), 1> + <exp(w), v>`` by PAV; a block's value is
    ``logsumexp(y_B) - logsumexp(w_B)``."""
    blocks: list[list[float]] = []  # [lse y, lse w, count]
    for a, b in zip(y, w, strict=False):
        blocks.append([float(a), float(b), 1.0])
        while len(blocks) > 1 and blocks[-2][0] - blocks[-2][1] <= blocks[-1][0] - blocks[-1][1]:
            ly, lw, count = blocks.pop()
            blocks[-1] = [_lse(blocks[-1][0], ly), _lse(blocks[-1][1], lw), blocks[-1][2] + count]
    return np.concatenate([np.full(int(c), ly - lw) for ly, lw, c in blocks])


def _sizes(v: np.ndarray) -> list[int]:
    sizes = [1]
    for i in range(1, len(v)):
        if abs(v[i] - v[i - 1]) > 1e-9:
            sizes.append(0)
        sizes[-1] += 1
    return sizes


def _block_map(v: np.ndarray, fn) -> np.ndarray:
    out, start = np.zeros_like(v), 0
    for size in _sizes(v):
        out[start : start + size] = fn(slice(start, start + size))
        start += size
    return out


def soft_rank_1d(x, strength=1.0, regularization="l2", descending=False, grad=None):
    """Soft ranks of a 1-d row (and, given ``grad``, the vector-Jacobian product in ``x``)."""
    x = np.asarray(x, dtype=np.float64) * (-1.0 if descending else 1.0)
    n = len(x)
    w = np.arange(n, 0, -1, dtype=np.float64)
    perm = np.argsort(-x, kind="stable")
    s = x[perm] / strength
    if regularization == "l2":
        v = isotonic_l2(s - w)
        r = s - v
    else:
        v = isotonic_kl(s, np.log(w))
        r = np.exp(s - v)
    out = np.empty(n)
    out[perm] = r
    if grad is None:
        return out
    g = np.asarray(grad, dtype=np.float64)[perm]
    if regularization == "l2":
        d = g - _block_map(v, lambda b: g[b].mean())
    else:
        gr = g * r
        d = gr - r * _block_map(v, lambda b: gr[b].sum() / w[b].sum())
    back = np.empty(n)
    back[perm] = d / strength
    return out, back * (-1.0 if descending else 1.0)


def soft_sort_1d(x, strength=1.0, regularization="l2", descending=False, grad=None):
    """Soft sort of a 1-d row (and the vector-Jacobian product in ``x``)."""
    sign = 1.0 if descending else -1.0
    x = np.asarray(x, dtype=np.float64) * sign
    n = len(x)
    ws = np.arange(n, 0, -1, dtype=np.float64) / strength
    perm = np.argsort(-x, kind="stable")
    s = x[perm]
    v = isotonic_l2(ws - s) if regularization == "l2" else isotonic_kl(ws, s)
    out = sign * (ws - v)
    if grad is None:
        return out
    g = np.asarray(grad, dtype=np.float64)
    if regularization == "l2":
        d = _block_map(v, lambda b: g[b].mean())
    else:
        d = _block_map(v, lambda b: np.exp(s[b] - s[b].max()) / np.exp(s[b] - s[b].max()).sum() * g[b].sum())
    back = np.empty(n)
    back[perm] = d
    return out, back


def rows(fn, x, **kwargs) -> np.ndarray:
    """``fn`` on every row of a 2-d array (values only)."""
    return np.stack([fn(row, **kwargs) for row in np.asarray(x, dtype=np.float64)])
