"""Checks of the float64 PAV oracle ``tests/pav_reference.py`` against independent solvers.

(a) the primal KKT threshold solution and a brute force over all block partitions of the dual,
(b) the printed outputs of the original's README (float32, so to 1e-4),
(c) the threshold form of the magnitude operator.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pav_reference import hard_mag, hard_mask, isotonic_mag, isotonic_mask, pav_mag, pav_mask

PS = (2.0, 4 / 3)
LS = (1e-2, 0.1, 1.0, 10.0)
README_X = np.array([-5.0, -2.0, 3.0, 1.0])
README_BATCH = np.array(
    [[[-11, 1, 4, -7], [5, 1, 4, 1], [-10, -3, 4, -6]], [[7, -6, -8, -4], [-1, 9, 8, 4], [0, 0, -5, 5]]],
    dtype=np.float64,
)


def _q(p):
    return p / (p - 1.0)


def _bisect_decreasing(f, target, lo, hi, largest=False):
    """t with f(t) = target for a non-increasing f, f(lo) >= target >= f(hi).

    Where f is flat at ``target`` this returns the flat stretch's lower end, or its upper end if
    ``largest``.
    """
    for _ in range(3000):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        above = f(mid) >= target if largest else f(mid) > target
        lo, hi = (mid, hi) if above else (lo, mid)
    return lo if largest else hi


def kkt_mask(x, k, l, p):
    """Primal argmax <x,y> - (l/p) sum|y|^p over the capped simplex, by bisection on the threshold."""

    def y(t):
        return np.clip((np.maximum(x - t, 0.0) / l) ** (1.0 / (p - 1.0)), 0.0, 1.0)

    t = _bisect_decreasing(lambda t: y(t).sum(), k, x.min() - l - 1.0, x.max() + 1.0)
    return y(t)


def mag_threshold(x, k, l, p):
    """The lead's formulation: sign(x)(theta u + (|x| - theta)_+), u clipped, sum u = k."""
    a, q = np.abs(x), _q(p)

    def u(th):
        return np.clip((np.maximum(a - th, 0.0) / (l * th ** (1.0 / (q - 1.0)))) ** (q - 1.0), 0.0, 1.0)

    # when the pooled block ends at k, every theta in [s_(k+1), theta_max] fits: take theta_max,
    # where (|x_i| - theta)_+ of the tail is exactly 0 (the lower end leaves rounding noise there)
    th = _bisect_decreasing(lambda th: u(th).sum(), k, 1e-300, a.max() + 1.0, largest=True)
    return np.sign(x) * (th * u(th) + np.maximum(a - th, 0.0)), th


def primal_mask_objective(x, y, l, p):
    return float(x @ y - l / p * np.sum(np.abs(y) ** p))


def _block_root(s, c, mag):
    """g with sum (g - s_i)^3 + c [g] = 0 (increasing in g), by plain bisection."""

    def f(g):
        return -(np.sum((g - s) ** 3) + c * (g if mag else 1.0))

    return _bisect_decreasing(f, 0.0, min(0.0, s.min()) - c - 1.0, max(0.0, s.max()) + 1.0)


def brute_force_dual(s, w, l, p, mag):
    """argmin of the isotonic dual over every partition of 0..n-1 into consecutive blocks."""
    n, q = len(s), _q(p)
    best, best_obj = None, np.inf
    for cuts in itertools.product((False, True), repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        v = np.empty(n)
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            sb, wb = s[a:b], w[a:b]
            if p == 2.0:
                v[a:b] = sb.sum() / (b - a + l * wb.sum()) if mag else (sb - l * wb).mean()
            else:  # p = 4/3: sum (g - s)^3 + l^3 W [g] = 0
                v[a:b] = _block_root(sb, l**3 * wb.sum(), mag)
        if np.any(np.diff(v) > 1e-12):
            continue
        obj = np.sum(np.abs(s - v) ** q) / (q * l ** (q - 1)) + (0.5 * w @ v**2 if mag else w @ v)
        if obj < best_obj:
            best, best_obj = v, obj
    return best


def _cases(seed, count, n_max=8):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(1, n_max + 1))
        scale = float(rng.choice([0.1, 1.0, 10.0]))
        x = rng.normal(size=n) * scale
        if n > 2 and rng.random() < 0.3:  # ties
            x[1] = x[0]
        yield x, int(rng.integers(0, n + 1)), float(rng.choice(LS))


@pytest.mark.parametrize("p", PS)
def test_mask_matches_primal_kkt(p):
    for x, k, l in _cases(0, 300):
        y = pav_mask(x, k, l, p)
        np.testing.assert_allclose(y, kkt_mask(x, k, l, p), atol=1e-8, err_msg=f"{x} {k} {l}")
        assert abs(y.sum() - k) < 1e-9 and y.min() >= -1e-12 and y.max() <= 1 + 1e-12


@pytest.mark.parametrize("p", PS)
def test_mask_primal_optimal_against_feasible_moves(p):
    rng = np.random.default_rng(1)
    for x, k, l in _cases(2, 60):
        y = pav_mask(x, k, l, p)
        best = primal_mask_objective(x, y, l, p)
        for _ in range(50):  # move mass between two entries, staying in the capped simplex
            i, j = rng.integers(0, len(x), size=2)
            step = min(rng.random() * 0.3, 1.0 - y[i], y[j])
            z = y.copy()
            z[i] += step
            z[j] -= step
            assert primal_mask_objective(x, z, l, p) <= best + 1e-12


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("mag", [False, True])
def test_dual_matches_partition_brute_force(p, mag):
    for x, k, l in _cases(3 + mag, 60, n_max=7):
        s = -np.sort(-(np.abs(x) if mag else x))
        w = (np.arange(len(s)) < k).astype(float)
        v = (isotonic_mag if mag else isotonic_mask)(s, w, l, p)
        ref = brute_force_dual(s, w, l, p, mag)
        np.testing.assert_allclose(v, ref, rtol=1e-9, atol=1e-9 * (1 + np.abs(s).max()))


@pytest.mark.parametrize("p", PS)
def test_mag_equals_threshold_formulation(p):
    """Confirms sign(x)(theta u + (|x|-theta)_+), u_i = clip(((|x_i|-theta)_+/(l theta^(1/(q-1))))^(q-1))."""
    for x, k, l in _cases(5, 300):
        if k == 0 or np.all(x == 0):
            continue
        r = pav_mag(x, k, l, p)
        ref, theta = mag_threshold(x, k, l, p)
        assert theta > 0
        np.testing.assert_allclose(r, ref, rtol=1e-8, atol=1e-8, err_msg=f"{x} {k} {l}")


def test_mag_keeps_top_entries_and_zeroes_tail():
    x = np.array([10.0, -9.0, 0.5, 0.1, -0.2])
    for p in PS:
        r = pav_mag(x, 2, 1e-2, p)
        np.testing.assert_allclose(r, [10.0, -9.0, 0.0, 0.0, 0.0], atol=1e-12)


def test_readme_single_vector():
    np.testing.assert_allclose(pav_mask(README_X, 2, 1e-2), [0, 0, 0.99999714, 0.99999714], atol=1e-4)
    np.testing.assert_allclose(pav_mag(README_X, 2, 1e-2), [-5.000036, -0.0, 2.9999416, 0.0], atol=1e-4)
    np.testing.assert_array_equal(hard_mask(README_X, 2), [0, 0, 1, 1])
    np.testing.assert_array_equal(hard_mag(README_X, 2), [-5, -0.0, 3, 0])


def test_readme_batched():
    mask = [
        [[0, 0.99999714, 0.99999714, 0], [1.0000687, 0, 0.99999714, 0], [0, 0.99999714, 0.99999714, 0]],
        [[1.0000687, 0, 0, 1.0000687], [0, 1.0000687, 1.0000687, 0], [0.49999988, 0.49999988, 0, 1.0000687]],
    ]
    mag = [
        [[-10.999428, 0, 0, -7.0002456], [5.000036, 0, 3.9999368, 0], [-10.000449, -0.0, 0, -5.999853]],
        [[7.0002456, -0.0, -7.99995, -0.0], [-0.0, 8.999435, 7.99995, 0], [0, 0, -5.000036, 5.000036]],
    ]
    np.testing.assert_allclose(pav_mask(README_BATCH, 2, 1e-2), mask, atol=1e-4)
    # the original's float32 cubic loses ~5e-5 relative on the kept entries (exact: the inputs)
    np.testing.assert_allclose(pav_mag(README_BATCH, 2, 1e-2), mag, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(pav_mag(README_BATCH, 2, 1e-2), hard_mag(README_BATCH, 2), atol=1e-9)


def test_p2_mask_is_capped_simplex_projection():
    """p = 2: y = clip(x/l - tau, 0, 1) with sum y = k (Euclidean projection of x/l)."""
    x, l, k = np.array([0.3, -1.2, 0.25, 0.9, 0.1]), 0.5, 2
    y = pav_mask(x, k, l, 2.0)
    tau = _bisect_decreasing(lambda t: np.clip(x / l - t, 0, 1).sum(), k, -10.0, 10.0)
    np.testing.assert_allclose(y, np.clip(x / l - tau, 0, 1), atol=1e-12)


def test_large_lambda_is_dense_and_small_lambda_is_hard():
    x = np.random.default_rng(7).normal(size=20)
    np.testing.assert_allclose(pav_mask(x, 5, 1e-4, 2.0), hard_mask(x, 5), atol=1e-12)
    y = pav_mask(x, 5, 1e3, 4 / 3)
    assert np.all(y > 0) and abs(y.sum() - 5) < 1e-9


def test_argument_checks():
    with pytest.raises(ValueError):
        pav_mask(np.ones(3), 4, 0.1)
    with pytest.raises(ValueError):
        pav_mag(np.ones(3), 1, 0.1, p=1.0)
