"""Plain float64 NumPy oracle for the sparse soft top-k operators (tests only, not optimised).

The relaxed top-k mask of Sander et al. is

    y* = argmax_{y in [0,1]^n, sum(y) = k}  <x, y> - (l/p) sum_i |y_i|^p,

computed through its isotonic dual (q = p/(p-1), w = (1,...,1,0,...,0) with k ones, s = x
sorted in decreasing order):

    mask: v* = argmin_{v_1 >= ... >= v_n} ||s - v||_q^q / (q l^(q-1)) + sum_i w_i v_i,
          y  = ((s - v*)/l)^(q-1), un-permuted;
    mag:  s = |x| sorted decreasingly,
          v* = argmin_{v_1 >= ... >= v_n} ||s - v||_q^q / (q l^(q-1)) + (1/2) sum_i w_i v_i^2,
          out = ((s - v*)/l)^(q-1),  result = sign(x) * (out + out^(1/(q-1)) * l), un-permuted.

Both are solved exactly by Pool-Adjacent-Violators (PAV). A block B of pooled entries takes the
value g with  sum_B phi(g - s_i) + l^(q-1) sum_B w_i = 0  (mask) or
sum_B phi(g - s_i) + l^(q-1) g sum_B w_i = 0  (mag), where phi(t) = sign(t)|t|^(q-1).
For p = 2 this is the closed form g = mean(s - l w) (mask) or g = sum(s)/sum(1 + l w) (mag); for
other p (p = 4/3 gives the cubic  sum_B (g - s_i)^3 + l^3 sum_B w_i [g] = 0) the increasing
left-hand side is bisected to the last float64 bit.

Reference: M. E. Sander, J. Puigcerver, J. Djolonga, G. Peyre, M. Blondel, "Fast, Differentiable
and Sparse Top-k: a Convex Analysis Perspective", ICML 2023, arXiv:2302.01425.

Example:
    >>> import numpy as np
    >>> np.round(pav_mask(np.array([-5.0, -2.0, 3.0, 1.0]), k=2, l=1e-2, p=4 / 3), 6)
    array([0., 0., 1., 1.])
    >>> hard_mask(np.array([-5.0, -2.0, 3.0, 1.0]), 2)
    array([0., 0., 1., 1.])
"""

from __future__ import annotations

import numpy as np

__all__ = ["hard_mag", "hard_mask", "isotonic_mag", "isotonic_mask", "pav", "pav_mag", "pav_mask"]


def _phi(t, q):
    """sign(t) |t|^(q-1): the derivative of |t|^q / q."""
    return np.sign(t) * np.abs(t) ** (q - 1.0)


def _bisect(f, lo: float, hi: float) -> float:
    """Root of the non-decreasing scalar function f on [lo, hi] (f(lo) <= 0 <= f(hi)), to the last bit."""
    assert f(lo) <= 0.0 <= f(hi), (lo, hi, f(lo), f(hi))
    for _ in range(3000):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if f(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return lo if abs(f(lo)) <= abs(f(hi)) else hi


def _block_value_mask(s: np.ndarray, w: np.ndarray, l: float, q: float) -> float:
    """g solving sum phi(g - s_i) + l^(q-1) sum w_i = 0."""
    if q == 2.0:
        return float(np.mean(s - l * w))
    c = l ** (q - 1.0) * np.sum(w)

    def f(g):
        return float(np.sum(_phi(g - s, q)) + c)

    # f(min(s) - l - 1) <= |B| (-(l+1)^(q-1)) + l^(q-1) |B| < 0 and f(max(s)) >= 0
    return _bisect(f, float(np.min(s)) - l - 1.0, float(np.max(s)))


def _block_value_mag(s: np.ndarray, w: np.ndarray, l: float, q: float) -> float:
    """g solving sum phi(g - s_i) + l^(q-1) g sum w_i = 0 (s >= 0)."""
    if q == 2.0:
        return float(np.sum(s) / np.sum(1.0 + l * w))
    c = l ** (q - 1.0) * np.sum(w)

    def f(g):
        return float(np.sum(_phi(g - s, q)) + c * g)

    # both terms are < 0 below min(0, min s) and >= 0 at max(s) >= 0
    return _bisect(f, min(0.0, float(np.min(s))) - 1.0, max(0.0, float(np.max(s))))


def pav(s: np.ndarray, block_value) -> np.ndarray:
    """Decreasing isotonic fit of ``s`` by PAV with a per-block solver ``block_value(indices)``.

    Blocks are kept on a stack; a new singleton is pooled with its left neighbour while the left
    block's value is not strictly larger, exactly like the original's ``sol[i] > sol[k]`` test.
    """
    n = s.shape[0]
    blocks: list[list] = []  # [start, stop, value]
    for i in range(n):
        blocks.append([i, i + 1, block_value(np.arange(i, i + 1))])
        while len(blocks) > 1 and blocks[-2][2] <= blocks[-1][2]:
            _, stop, _ = blocks.pop()
            start = blocks[-1][0]
            blocks[-1] = [start, stop, block_value(np.arange(start, stop))]
    v = np.empty(n)
    for start, stop, value in blocks:
        v[start:stop] = value
    return v


def _prepare(x, k: int, p: float):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError("expected a 1-D array")
    n = x.shape[0]
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, {n}], got {k}")
    if not p > 1.0:
        raise ValueError(f"p must be > 1, got {p}")
    q = 2.0 if p == 2 else p / (p - 1.0)
    w = (np.arange(n) < k).astype(np.float64)
    return x, n, q, w


def isotonic_mask(s: np.ndarray, w: np.ndarray, l: float, p: float) -> np.ndarray:
    """v* = argmin_{v decreasing} ||s - v||_q^q / (q l^(q-1)) + <w, v> for sorted ``s``."""
    q = 2.0 if p == 2 else p / (p - 1.0)
    return pav(s, lambda idx: _block_value_mask(s[idx], w[idx], l, q))


def isotonic_mag(s: np.ndarray, w: np.ndarray, l: float, p: float) -> np.ndarray:
    """v* = argmin_{v decreasing} ||s - v||_q^q / (q l^(q-1)) + (1/2) sum w_i v_i^2, ``s >= 0``."""
    q = 2.0 if p == 2 else p / (p - 1.0)
    return pav(s, lambda idx: _block_value_mag(s[idx], w[idx], l, q))


def _rows(fn, x, *args):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim <= 1:
        return fn(x, *args)
    flat = x.reshape(-1, x.shape[-1])
    return np.stack([fn(row, *args) for row in flat]).reshape(x.shape)


def _pav_mask_1d(x, k, l, p):
    x, n, q, w = _prepare(x, k, p)
    perm = np.argsort(-x, kind="stable")
    s = x[perm]
    v = isotonic_mask(s, w, l, p)
    y_sorted = _phi((s - v) / l, q)
    y = np.empty(n)
    y[perm] = y_sorted
    return y


def _pav_mag_1d(x, k, l, p):
    x, n, q, w = _prepare(x, k, p)
    a = np.abs(x)
    perm = np.argsort(-a, kind="stable")
    s = a[perm]
    v = isotonic_mag(s, w, l, p)
    out = _phi((s - v) / l, q)
    # out^(1/(q-1)) * l == s - v (sign-safe form of the original's formula)
    r_sorted = out + _phi(out, 1.0 + 1.0 / (q - 1.0)) * l
    r = np.empty(n)
    r[perm] = r_sorted
    return np.sign(x) * r


def pav_mask(x, k: int, l: float = 0.1, p: float = 4 / 3) -> np.ndarray:
    """Exact relaxed top-k mask along the last axis (float64).

    Args:
        x: array, shape (..., n).
        k: number of selected entries, 0 <= k <= n.
        l: regularisation strength lambda > 0 (default 0.1).
        p: p-norm of the regulariser, p > 1 (2 and 4/3 are the paper's cases; default 4/3).

    Returns:
        float64 array of x's shape with entries in [0, 1] summing to k along the last axis.
    """
    return _rows(_pav_mask_1d, x, k, l, p)


def pav_mag(x, k: int, l: float = 0.1, p: float = 4 / 3) -> np.ndarray:
    """Exact relaxed top-k in magnitude along the last axis (float64).

    Args:
        x: array, shape (..., n).
        k: number of kept entries, 0 <= k <= n.
        l: regularisation strength lambda > 0 (default 0.1).
        p: p-norm of the regulariser, p > 1 (default 4/3).

    Returns:
        float64 array of x's shape: ``sign(x) * (out + out^(1/(q-1)) * l)``.
    """
    return _rows(_pav_mag_1d, x, k, l, p)


def _hard_mask_1d(x, k):
    x = np.asarray(x, dtype=np.float64)
    y = np.zeros(x.shape[0])
    y[np.argsort(-x, kind="stable")[:k]] = 1.0
    return y


def hard_mask(x, k: int) -> np.ndarray:
    """Hard top-k mask along the last axis (ties: the lower index wins), float64, x's shape."""
    return _rows(_hard_mask_1d, x, k)


def hard_mag(x, k: int) -> np.ndarray:
    """Hard top-k in magnitude: ``x * hard_mask(|x|, k)``."""
    x = np.asarray(x, dtype=np.float64)
    return x * hard_mask(np.abs(x), k)
