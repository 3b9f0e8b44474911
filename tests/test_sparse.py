"""Tests of the sparse soft top-k operators (Sander et al. 2023): ``sparse_topk_mask`` and
``sparse_topk_mag`` (p = 2 and 4/3, solver ``'pav'`` and ``'dykstra'``), and the hard versions.

Checked here: the float64 PAV oracle (``tests/pav_reference.py``) and entmax's ``budget_bisect``
(the p = 2 mask is the Euclidean projection of ``x / l`` onto the capped simplex), structural
properties with hypothesis (sum, exact [0, 1], exact zeros and ones, support, equivariance,
monotonicity, limits), gradients (gradcheck, finite differences at n = 1000, finiteness at zeros,
ties and extreme scales), Dykstra (convergence, exact-Jacobian gradient, compile), vmap, long rows,
the candidate-doubling path, dtypes, dims and every argument error.
"""

from __future__ import annotations

import inspect
import itertools
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from pav_reference import pav_mag, pav_mask
from softtopk.ops import sparse as sparse_ops

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)
F64 = torch.float64
P_VALUES = (2.0, 4.0 / 3.0)
OPS = {"mask": softtopk.sparse_topk_mask, "mag": softtopk.sparse_topk_mag}
ORACLES = {"mask": pav_mask, "mag": pav_mag}


def _match(*parts: str) -> str:
    """A regex requiring the literal ``parts`` in this order."""
    return ".*".join(re.escape(part) for part in parts)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _oracle(kind: str, x: torch.Tensor, k: int, l: float, p: float) -> torch.Tensor:
    return torch.from_numpy(ORACLES[kind](x.detach().to(F64).numpy(), k, l, p))


def _separated(rows: int, n: int, seed: int, spacing: float = 0.5, dtype=F64) -> torch.Tensor:
    """Rows of a shuffled grid (spacing ``spacing``, jitter 0.1 spacing, centred): no ties."""
    g = _gen(seed)
    grid = torch.stack([torch.randperm(n, generator=g) for _ in range(rows)]).to(F64)
    x = (grid + 0.1 * torch.rand(rows, n, generator=g, dtype=F64) - (n - 1) / 2) * spacing
    return x.to(dtype)


def _mag_lower_knot(s_k: float, l: float, p: float) -> float:
    """The smallest possible magnitude threshold: theta with theta + l theta^(p-1) = s_k."""
    lo, hi = 0.0, s_k
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid + l * mid ** (p - 1.0) < s_k:
            lo = mid
        else:
            hi = mid
    return lo


# --------------------------------------------------------------------------------------------
# Oracles
# --------------------------------------------------------------------------------------------


def _random_problem(rng: np.random.Generator, kind: str):
    n = int(rng.integers(1, 51))
    k = int(rng.integers(1, n + 1))
    l = float(10 ** rng.uniform(-3, 2))
    if kind == "normal":
        x = rng.standard_normal(n) * 10 ** rng.uniform(-1, 1)
    elif kind == "integers":
        x = rng.integers(-4, 5, n).astype(np.float64)
    else:  # normal values with a block tied at the k-th value and some exact zeros
        x = rng.standard_normal(n)
        kth = np.sort(x)[::-1][k - 1]
        x[rng.random(n) < 0.3] = kth
        x[rng.random(n) < 0.15] = 0.0
    return x, k, l


@pytest.mark.parametrize("kind", ["normal", "integers", "ties"])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_matches_pav_oracle(p, kind):
    """30 random (n <= 50, k, l in 1e-3..1e2) per case, mask and magnitude, float64 to 1e-9
    (magnitude relative to max |x|)."""
    rng = np.random.default_rng(int(p * 3) * 10 + len(kind))
    worst = {"mask": 0.0, "mag": 0.0}
    for _ in range(30):
        x, k, l = _random_problem(rng, kind)
        xt = torch.from_numpy(x)
        for name, op in OPS.items():
            err = (op(xt, k, l=l, p=p) - _oracle(name, xt, k, l, p)).abs().max().item()
            err /= max(1.0, float(np.abs(x).max())) if name == "mag" else 1.0
            worst[name] = max(worst[name], err)
            assert err <= 1e-9, (name, x.tolist(), k, l, err)


@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_matches_pav_oracle_batched_any_dim(p):
    x = torch.randn(3, 12, 4, generator=_gen(1), dtype=F64)
    for name, op in OPS.items():
        got = op(x, 5, l=0.3, p=p, dim=1)
        want = _oracle(name, x.movedim(1, -1), 5, 0.3, p).movedim(-1, 1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_docstring_examples():
    mask = softtopk.sparse_topk_mask(torch.tensor([0.0, 3.0, 1.0, 2.0]), 2, l=2.0, p=2)
    torch.testing.assert_close(mask, torch.tensor([0.0, 1.0, 0.25, 0.75]))
    mag = softtopk.sparse_topk_mag(torch.tensor([-5.0, -2.0, 3.0, 1.0]), 2, l=1e-2)
    assert torch.equal(mag.round(decimals=3), torch.tensor([-5.0, 0.0, 3.0, 0.0]))
    assert mag[0] == -5.0 and mag[1] == 0 and mag[3] == 0  # saturated entry kept exactly, exact zeros


def test_p2_mask_is_entmax_budget_projection():
    """p = 2: the Euclidean projection of x / l onto {y in [0, 1]^n, sum y = k}, which entmax's
    ``budget_bisect(X, budget)`` computes by bisection (it maximises <X, y> - ||y||^2 / 2)."""
    entmax = pytest.importorskip("entmax", reason="entmax (the budget-sparsemax oracle) is not installed")
    params = inspect.signature(entmax.budget_bisect).parameters
    assert "budget" in params and "dim" in params
    extra = {"n_iter": 100} if "n_iter" in params else {}
    x = torch.randn(6, 40, generator=_gen(2), dtype=F64)
    for l in (1e-2, 0.3, 3.0, 30.0):
        for k in (1, 2, 10, 25, 39):
            want = entmax.budget_bisect(x / l, budget=k, dim=-1, **extra)
            torch.testing.assert_close(softtopk.sparse_topk_mask(x, k, l=l, p=2), want, rtol=0, atol=1e-6)
    # along another dim
    y = torch.randn(4, 9, 3, generator=_gen(3), dtype=F64)
    want = entmax.budget_bisect(y / 0.5, budget=3, dim=1, **extra)
    torch.testing.assert_close(softtopk.sparse_topk_mask(y, 3, l=0.5, p=2, dim=1), want, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Properties (hypothesis)
# --------------------------------------------------------------------------------------------


@st.composite
def problems(draw, dtypes=(torch.float32, F64)):
    """(x of 1-3 dims, dim, k, l, p): l in 1e-3..1e2, ties and exact zeros optional."""
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    dim = draw(st.integers(-ndim, ndim - 1))
    shape[dim] = draw(st.integers(1, 40))
    k = draw(st.integers(1, shape[dim]))
    l = 10 ** draw(st.floats(-3, 2))
    p = draw(st.sampled_from(P_VALUES))
    x = torch.randn(shape, generator=_gen(draw(st.integers(0, 2**16))), dtype=F64)
    if draw(st.booleans()):  # coarse grid: ties and exact zeros
        x = x.mul(2).round()
    return x.to(draw(st.sampled_from(dtypes))), dim, k, l, p


def _rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.movedim(dim, -1).reshape(-1, x.shape[dim])


def _sum_tol(dtype: torch.dtype, k: int) -> float:
    return 1e-9 * k if dtype == F64 else 2e-6 * k + 1e-4


@PROPERTY
@given(problems())
def test_mask_properties(case):
    """Sums to k; in [0, 1] exactly; exactly 0 at or below s_k - l, exactly 1 at or above s_k + l
    (the threshold lies in [s_k - l, s_k]); the hard top-k is in the support."""
    x, dim, k, l, p = case
    m = softtopk.sparse_topk_mask(x, k, l=l, p=p, dim=dim)
    assert m.shape == x.shape and m.dtype == x.dtype
    assert bool(torch.isfinite(m).all()) and m.min() >= 0 and m.max() <= 1
    sums = m.to(F64).sum(dim)
    torch.testing.assert_close(sums, torch.full_like(sums, float(k)), rtol=0, atol=_sum_tol(x.dtype, k))
    xr, mr = _rows(x, dim).to(F64), _rows(m, dim)
    s_k = xr.topk(k, -1).values[:, -1:]
    margin = 1e-6 * (1 + s_k.abs())
    assert bool((mr[xr <= s_k - l - margin] == 0).all())
    assert bool((mr[xr >= s_k + l + margin] == 1).all())
    assert int((mr == 0).sum()) >= int((xr <= s_k - l - margin).sum())
    assert bool((mr[xr >= s_k] > 0).all())  # contains every hard top-k entry (ties included)


@PROPERTY
@given(problems())
def test_mag_properties(case):
    """Signs kept, |out| <= |x|; exactly 0 where |x| <= the smallest possible threshold, exactly x
    where |x| >= s_k + l s_k^(p-1) (saturated); every nonzero hard top-k entry survives."""
    x, dim, k, l, p = case
    out = softtopk.sparse_topk_mag(x, k, l=l, p=p, dim=dim)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert bool(torch.isfinite(out).all())
    assert bool((out * x >= 0).all()) and bool((out.abs() <= x.abs()).all())
    xr, outr = _rows(x, dim).to(F64), _rows(out, dim).to(F64)
    s = xr.abs()
    for row in range(xr.shape[0]):
        s_k = s[row].topk(k).values[-1].item()
        lower = _mag_lower_knot(s_k, l, p) * (1 - 1e-6)
        upper = (s_k + l * s_k ** (p - 1.0)) * (1 + 1e-6)
        assert bool((outr[row][s[row] <= lower] == 0).all())
        assert bool((outr[row][s[row] >= upper] == xr[row][s[row] >= upper]).all())
        assert bool((outr[row][(s[row] >= s_k) & (s[row] > 0)] != 0).all())


@PROPERTY
@given(problems(dtypes=(F64,)), st.integers(0, 2**16))
def test_permutation_equivariance(case, seed):
    x, dim, k, l, p = case
    perm = torch.randperm(x.shape[dim], generator=_gen(seed))
    for op in OPS.values():
        out = op(x, k, l=l, p=p, dim=dim)
        permuted = op(x.index_select(dim, perm), k, l=l, p=p, dim=dim)
        torch.testing.assert_close(permuted, out.index_select(dim, perm), rtol=0, atol=1e-12)


@PROPERTY
@given(problems(dtypes=(F64,)), st.integers(0, 2**16), st.floats(1e-3, 10.0))
def test_monotone(case, seed, step):
    """Mask: raising x_i does not lower m_i nor raise the others. Magnitude: growing |x_i| does
    not shrink |out_i|."""
    x, dim, k, l, p = case
    rows = _rows(x, dim)
    i = int(torch.randint(0, rows.shape[-1], (1,), generator=_gen(seed)))
    bumped = rows.clone()
    bumped[:, i] += step * l
    before, after = softtopk.sparse_topk_mask(rows, k, l=l, p=p), softtopk.sparse_topk_mask(bumped, k, l=l, p=p)
    assert bool((after[:, i] >= before[:, i] - 1e-12).all())
    others = torch.arange(rows.shape[-1]) != i
    assert bool((after[:, others] <= before[:, others] + 1e-12).all())
    grown = rows.clone()
    grown[:, i] += torch.where(rows[:, i] >= 0, 1.0, -1.0) * step * l
    before, after = softtopk.sparse_topk_mag(rows, k, l=l, p=p), softtopk.sparse_topk_mag(grown, k, l=l, p=p)
    assert bool((after[:, i].abs() >= before[:, i].abs() - 1e-12).all())


@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_float32_small_l_stays_in_unit_interval_and_sums_to_k(p):
    """l = 1e-3, k = 100, n = 1000 in float32: the original left [0, 1] and missed the sum by
    1e-2 here. Measured max |sum - k|: 4.7e-5 (p = 2), 1.5e-4 (p = 4/3)."""
    x = torch.randn(16, 1000, generator=_gen(0))
    m = softtopk.sparse_topk_mask(x, 100, l=1e-3, p=p)
    assert m.dtype == torch.float32 and m.min() >= 0 and m.max() <= 1
    assert (m.double().sum(-1) - 100).abs().max() < 1e-3
    ref = softtopk.sparse_topk_mask(x.double(), 100, l=1e-3, p=p)
    assert (m.double() - ref).abs().max() < 5e-3  # interior entries: (x - t) / l amplifies x's rounding
    mag = softtopk.sparse_topk_mag(x, 100, l=1e-3, p=p)
    assert bool((mag.abs() <= x.abs()).all()) and bool((mag * x >= 0).all())


@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
@pytest.mark.parametrize("n,k", [(1, 1), (5, 1), (5, 4), (9, 5), (64, 10), (64, 63)])
def test_small_l_gives_the_hard_topk(p, n, k):
    """float64, separated inputs (gaps >= 0.4, |x| <= 16): the mask is the k-hot mask, the
    magnitude output keeps the k largest |x| (signs included); both are exactly 0 elsewhere.
    (Up to the rounding of the threshold: |x| ulp / l ~ 4e-9 at l = 1e-6.)"""
    x = _separated(3, n, seed=n + k)
    hard, hard_mag = softtopk.hard_topk_mask(x, k), softtopk.hard_topk_mag(x, k)
    for l in (1e-6, 1e-3, 0.1):
        m = softtopk.sparse_topk_mask(x, k, l=l, p=p)
        torch.testing.assert_close(m, hard, rtol=0, atol=1e-8)
        assert bool((m[hard == 0] == 0).all())
        if l <= 1e-3:  # magnitude saturation needs |x| >= theta + l theta^(p-1): l small against gaps/|x|
            mag = softtopk.sparse_topk_mag(x, k, l=l, p=p)
            torch.testing.assert_close(mag, hard_mag, rtol=1e-8, atol=0)
            assert bool((mag[hard_mag == 0] == 0).all())


FLOAT32_SEPARATED = {
    "3,-2,1,.5_k2": (torch.tensor([[3.0, -2.0, 1.0, 0.5]]), 2),
    "1.3,.7,.1_k1": (torch.tensor([[1.3, 0.7, 0.1]]), 1),
    "3.3,2.1,0_k1": (torch.tensor([[3.3, 2.1, 0.0]]), 1),
    "11.3,10.7,12,0_k2": (torch.tensor([[11.3, 10.7, 12.0, 0.0]]), 2),
    "grid64_k10": (_separated(3, 64, seed=74, dtype=torch.float32), 10),
}


@pytest.mark.parametrize("case", FLOAT32_SEPARATED)
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
@pytest.mark.parametrize("l", [1e-4, 1e-5, 1e-6, 1e-7, 1e-8])
def test_small_l_gives_the_hard_topk_float32(case, p, l):
    """float32 inputs with gaps >= 0.1: the hard limit holds in float32 too, i.e. rounding the
    threshold to float32 must not shrink or drop a selected entry (the mask must still sum to k)."""
    x, k = FLOAT32_SEPARATED[case]
    m = softtopk.sparse_topk_mask(x, k, l=l, p=p)
    torch.testing.assert_close(m.sum(-1), torch.full((x.shape[0],), float(k)), rtol=0, atol=1e-5)
    torch.testing.assert_close(m, softtopk.hard_topk_mask(x, k), rtol=0, atol=1e-5)
    mag = softtopk.sparse_topk_mag(x, k, l=l, p=p)
    torch.testing.assert_close(mag, softtopk.hard_topk_mag(x, k), rtol=1e-5, atol=0)


@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
@pytest.mark.parametrize("n,k", [(5, 1), (5, 4), (64, 10), (64, 50)])
def test_large_l_gives_k_over_n(p, n, k):
    x = torch.randn(3, n, generator=_gen(n), dtype=F64)
    for l, tol in ((1e3, 1e-1), (1e8, 1e-6)):
        m = softtopk.sparse_topk_mask(x, k, l=l, p=p)
        torch.testing.assert_close(m, torch.full_like(m, k / n), rtol=0, atol=tol)


def test_tied_rows_are_k_over_n():
    """All-equal rows: k/n each, up to the threshold's rounding near |x| (ulp(|x|) / l)."""
    for value in (0.0, 1.0, -3.0, 1e6):
        for n, k in ((1, 1), (7, 3), (10, 9), (100, 37)):
            for p in P_VALUES:
                for l in (1e-3, 1.0, 1e2):
                    m = softtopk.sparse_topk_mask(torch.full((2, n), value, dtype=F64), k, l=l, p=p)
                    atol = 1e-12 + 1e-15 * abs(value) / l
                    torch.testing.assert_close(m, torch.full_like(m, k / n), rtol=0, atol=atol)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


GRAD_CASES = [(6, 1, 0.8), (6, 2, 1.3), (6, 3, 2.0), (6, 5, 0.9), (10, 4, 3.0), (10, 7, 0.6), (1, 1, 1.0)]


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
@pytest.mark.parametrize("n,k,l", GRAD_CASES)
def test_gradcheck(kind, p, n, k, l):
    """float64 gradcheck on tie-free inputs (spacing 0.5, with jitter: no entry at a breakpoint)
    with l large enough that several entries are strictly inside (0, 1)."""
    x = _separated(2, n, seed=n * 10 + k)
    x = x.requires_grad_()
    op = OPS[kind]
    assert torch.autograd.gradcheck(lambda t: op(t, k, l=l, p=p), (x,))
    if n > 1:  # the problem is non-trivial: some entry is strictly inside (0, 1)
        m = softtopk.sparse_topk_mask(x.detach(), k, l=l, p=p)
        assert bool(((m > 0) & (m < 1)).any())


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_gradient_matches_finite_differences_n1000(kind, p):
    """Directional derivatives <grad, v> vs central differences (h = 1e-7) at n = 1000."""
    x = torch.randn(2, 1000, generator=_gen(4), dtype=F64)
    w = torch.randn(2, 1000, generator=_gen(5), dtype=F64)
    op = OPS[kind]
    leaf = x.clone().requires_grad_()
    (op(leaf, 50, l=0.5, p=p) * w).sum().backward()
    assert leaf.grad.abs().sum() > 0
    h = 1e-7
    for seed in range(3):
        v = torch.randn(2, 1000, generator=_gen(100 + seed), dtype=F64)
        fd = ((op(x + h * v, 50, l=0.5, p=p) - op(x - h * v, 50, l=0.5, p=p)) * w).sum() / (2 * h)
        torch.testing.assert_close((leaf.grad * v).sum(), fd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_mask_gradient_rows_sum_to_zero(p):
    """sum m = k for every x, so every row of dL/dx sums to 0."""
    x = torch.randn(4, 30, generator=_gen(6), dtype=F64).requires_grad_()
    (softtopk.sparse_topk_mask(x, 8, l=1.0, p=p) * torch.randn(4, 30, generator=_gen(7), dtype=F64)).sum().backward()
    torch.testing.assert_close(x.grad.sum(-1), torch.zeros(4, dtype=F64), rtol=0, atol=1e-12)
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_gradients_finite_at_zeros_ties_and_extreme_scales(dtype, p):
    """Magnitude p = 4/3 at exact zeros (the original gave NaN), ties, all-zero rows, scales
    1e-6..1e6, l 1e-6..1e6, every k: values and gradients finite."""
    g = _gen(8)
    base = torch.randn(3, 9, generator=g, dtype=F64)
    inputs = {
        "zeros_inside": torch.where(torch.rand(3, 9, generator=g) < 0.4, torch.zeros(3, 9, dtype=F64), base),
        "all_zero": torch.zeros(3, 9, dtype=F64),
        "ties": torch.randint(-1, 2, (3, 9), generator=g).to(F64),
        "all_equal": torch.ones(3, 9, dtype=F64),
        "random": base,
    }
    upstream = torch.randn(3, 9, generator=g, dtype=F64).to(dtype)
    for name, base_x in inputs.items():
        for scale in (1e-6, 1.0, 1e6):
            for l in (1e-6, 1e-2, 1.0, 1e6):
                for k in (1, 3, 8, 9):
                    for kind, op in OPS.items():
                        leaf = (base_x * scale).to(dtype).requires_grad_()
                        out = op(leaf, k, l=l, p=p)
                        (out * upstream).sum().backward()
                        ok = bool(torch.isfinite(out).all()) and bool(torch.isfinite(leaf.grad).all())
                        assert ok, (kind, name, scale, l, k, out, leaf.grad)


def test_mag_gradient_at_exact_zero_is_zero_and_finite():
    """A zero entry outside the support contributes nothing and receives a zero (finite) gradient."""
    x = torch.tensor([[0.0, 0.0, 1.0, -2.0, 0.5, 0.0, 3.0]], dtype=F64, requires_grad=True)
    for k in (1, 2, 4, 5, 6):
        for l in (1e-3, 0.1, 1.0, 10.0):
            x.grad = None
            softtopk.sparse_topk_mag(x, k, l=l, p=4 / 3).pow(2).sum().backward()
            assert bool(torch.isfinite(x.grad).all()), (k, l, x.grad)
            assert bool((x.grad[0, [0, 1, 5]] == 0).all())


# --------------------------------------------------------------------------------------------
# Dykstra
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mask", "mag"])
def test_dykstra_converges_to_pav(kind):
    """n = 1000, k = 100, l = 0.01, p = 2: max error to the exact solution shrinks with n_iter.
    Measured (mask): 0.32 (2), 0.043 (10), 9e-6 (50), 2e-14 (200)."""
    x = torch.randn(4, 1000, generator=_gen(9), dtype=F64)
    op = OPS[kind]
    exact = op(x, 100, l=0.01, p=2)
    errs = [
        (op(x, 100, l=0.01, p=2, solver="dykstra", n_iter=it) - exact).abs().max().item()
        for it in (2, 10, 50, 200, 400)
    ]
    assert all(b <= a * (1 + 1e-9) + 1e-13 for a, b in itertools.pairwise(errs)), errs
    assert errs[0] > 1e-2 and errs[2] < 1e-3 and errs[-1] < 1e-9, errs
    if kind == "mask":  # Dykstra keeps the sum at every iteration
        approx = op(x, 100, l=0.01, p=2, solver="dykstra", n_iter=4)
        torch.testing.assert_close(approx.sum(-1), torch.full((4,), 100.0, dtype=F64), rtol=0, atol=1e-9)


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("n_iter", [1, 2, 8, 500])
def test_dykstra_gradient_is_the_exact_jacobian(kind, n_iter):
    x = torch.randn(3, 40, generator=_gen(10), dtype=F64)
    w = torch.randn(3, 40, generator=_gen(11), dtype=F64)
    grads = []
    for solver in ("dykstra", "pav"):
        leaf = x.clone().requires_grad_()
        (OPS[kind](leaf, 7, l=0.5, p=2, solver=solver, n_iter=n_iter) * w).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)
    assert grads[1].abs().sum() > 0


@pytest.mark.parametrize("kind", ["mask", "mag"])
def test_exact_is_the_pav_solver(kind):
    """``solver='exact'`` (softtopk.jax's name) is ``'pav'``: the same values and gradients."""
    x = torch.randn(3, 25, generator=_gen(13), dtype=F64)
    w = torch.randn(3, 25, generator=_gen(14), dtype=F64)
    outs = []
    for solver in ("exact", "pav"):
        leaf = x.clone().requires_grad_()
        out = OPS[kind](leaf, 4, l=0.3, solver=solver)
        (out * w).sum().backward()
        outs.append((out.detach(), leaf.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[0][1].abs().sum() > 0


def test_dykstra_without_grad_is_the_plain_iteration():
    """No autograd: the returned value is Dykstra's, not the exact one (different at n_iter = 2)."""
    x = torch.randn(2, 30, generator=_gen(12), dtype=F64)
    approx = softtopk.sparse_topk_mask(x, 5, l=0.5, p=2, solver="dykstra", n_iter=2)
    exact = softtopk.sparse_topk_mask(x, 5, l=0.5, p=2)
    assert (approx - exact).abs().max() > 1e-3
    with torch.no_grad():
        leaf = x.clone().requires_grad_()
        torch.testing.assert_close(softtopk.sparse_topk_mask(leaf, 5, l=0.5, p=2, solver="dykstra", n_iter=2), approx)
    leaf = x.clone().requires_grad_()
    torch.testing.assert_close(softtopk.sparse_topk_mask(leaf, 5, l=0.5, p=2, solver="dykstra", n_iter=2), approx)


@pytest.mark.parametrize("kind", ["mask", "mag"])
def test_dykstra_rejects_p_four_thirds(kind):
    with pytest.raises(ValueError, match=_match("solver='dykstra' solves p=2 only", "got p=1.333", "use solver='pav'")):
        OPS[kind](torch.randn(2, 5), 2, p=4 / 3, solver="dykstra")


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("solver", ["dykstra", "pav"])
def test_compile_fullgraph(solver):
    """``torch.compile(fullgraph=True, backend='aot_eager')`` equals eager, values and gradients."""

    def fn(x):
        return softtopk.sparse_topk_mask(x, 3, l=0.5, p=2, solver=solver, n_iter=8)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for seed in (0, 1):
        x = torch.randn(4, 10, generator=_gen(seed))
        results = []
        for f in (compiled, fn):
            leaf = x.clone().requires_grad_()
            out = f(leaf)
            (out * torch.arange(10.0)).sum().backward()
            results.append((out.detach(), leaf.grad))
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_vmap_matches_batched_call(kind, p):
    x = torch.randn(5, 12, generator=_gen(13), dtype=F64)
    op = OPS[kind]
    got = torch.vmap(lambda row: op(row, 4, l=0.5, p=p))(x)
    torch.testing.assert_close(got, op(x, 4, l=0.5, p=p), rtol=0, atol=1e-12)
    w = torch.randn(12, generator=_gen(14), dtype=F64)
    per_example = torch.vmap(torch.func.grad(lambda row: (op(row, 4, l=0.5, p=p) * w).sum()))(x)
    leaf = x.clone().requires_grad_()
    (op(leaf, 4, l=0.5, p=p) * w).sum().backward()
    torch.testing.assert_close(per_example, leaf.grad, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------
# Long rows and the candidate-doubling path
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [10, 10000])
def test_long_rows(k):
    """n = 100000, B = 2 (float32): finite, mask sums to k, [0, 1], gradients finite."""
    x = torch.randn(2, 100_000, generator=_gen(15)).requires_grad_()
    for p in P_VALUES:
        for kind, op in OPS.items():
            x.grad = None
            out = op(x, k, l=0.1, p=p)
            assert bool(torch.isfinite(out).all())
            (out * out).sum().backward()
            assert bool(torch.isfinite(x.grad).all())
            if kind == "mask":
                assert out.min() >= 0 and out.max() <= 1
                assert (out.double().sum(-1) - k).abs().max() < 1e-6 * k + 1e-4
            else:
                assert int((out != 0).sum(-1).min()) >= k


def _full_sort_threshold(x: torch.Tensor, k: int, lam: float, r: int, magnitude: bool):
    """The threshold from the fully sorted row (what the candidate search must reproduce), as
    :func:`softtopk.ops.sparse.threshold` returns it (the mask's as ``(s_k, (t - s_k)/λ)``)."""
    scores = x.detach().abs() if magnitude else x.detach()
    return sparse_ops._solve_sorted(scores.sort(-1, descending=True).values.to(F64), k, lam, r, magnitude)


def _absolute(found, lam: float, magnitude: bool) -> torch.Tensor:
    """The threshold ``t`` itself."""
    return found if magnitude else found[0] + found[1] * lam


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_candidate_doubling_with_many_ties_at_the_threshold(kind, p, monkeypatch):
    """5000 entries equal to the k-th value (l = 1): far more than the first 2k + 8 candidates lie
    above the threshold; threshold and output equal those of a forced full sort."""
    k, n = 100, 20000
    magnitude = kind == "mag"
    x = torch.randn(2, n, generator=_gen(16), dtype=F64)
    kth = x.topk(k, -1).values[:, -1:]
    tied = torch.stack([torch.randperm(n, generator=_gen(17 + i))[:5000] for i in range(2)])
    x = x.scatter(-1, tied, kth.expand(2, 5000))
    r = sparse_ops.exponent(p)
    scores = x.abs() if magnitude else x
    t = _absolute(sparse_ops.threshold(x, k, 1.0, r, magnitude), 1.0, magnitude)
    full = _absolute(_full_sort_threshold(x, k, 1.0, r, magnitude), 1.0, magnitude)
    assert int((scores > t).sum(-1).min()) > 2 * k + 8  # the first topk could not have been enough
    torch.testing.assert_close(t, full, rtol=0, atol=1e-12)
    out = OPS[kind](x, k, l=1.0, p=p)
    monkeypatch.setattr(sparse_ops, "threshold", _full_sort_threshold)
    torch.testing.assert_close(out, OPS[kind](x, k, l=1.0, p=p), rtol=0, atol=1e-12)
    if not magnitude:
        torch.testing.assert_close(out.sum(-1), torch.full((2,), float(k), dtype=F64), rtol=0, atol=1e-9)


@PROPERTY
@given(
    st.integers(1, 30),
    st.integers(0, 2**16),
    st.sampled_from([1e-2, 0.3, 3.0]),
    st.sampled_from(P_VALUES),
    st.booleans(),
)
def test_threshold_equals_full_sort(k, seed, l, p, magnitude):
    """The topk-with-doubling threshold equals the threshold from the fully sorted row."""
    g = _gen(seed)
    n = k + int(torch.randint(0, 200, (1,), generator=g))
    x = torch.randn(3, n, generator=g, dtype=F64)
    if seed % 2:
        x = x.mul(2).round()
    if k >= n:
        return
    r = sparse_ops.exponent(p)
    t = _absolute(sparse_ops.threshold(x, k, l, r, magnitude), l, magnitude)
    torch.testing.assert_close(
        t, _absolute(_full_sort_threshold(x, k, l, r, magnitude), l, magnitude), rtol=0, atol=1e-12
    )


# --------------------------------------------------------------------------------------------
# dtypes, dims, hard top-k
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3), (torch.float32, 0.0), (F64, 1e-6)]
)
@pytest.mark.parametrize("kind", ["mask", "mag"])
def test_dtypes(dtype, tol, kind):
    """Shape and dtype kept; half types are computed in float32 and rounded once."""
    x = torch.randn(2, 3, 16, generator=_gen(18)).to(dtype)
    op = OPS[kind]
    for p in P_VALUES:
        out = op(x, 5, l=0.5, p=p)
        assert out.shape == x.shape and out.dtype == dtype
        ref = op(x.float(), 5, l=0.5, p=p)
        scale = 1.0 if kind == "mask" else x.float().abs().max().item()
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=tol * scale)
        leaf = x.clone().requires_grad_()
        op(leaf, 5, l=0.5, p=p).pow(2).sum().backward()
        assert leaf.grad.dtype == dtype and bool(torch.isfinite(leaf.grad).all())


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
def test_any_dim(dim):
    x = torch.randn(4, 5, 6, generator=_gen(19), dtype=F64)
    k = 2
    for op in OPS.values():
        for p in P_VALUES:
            want = op(x.movedim(dim, -1), k, l=0.7, p=p).movedim(-1, dim)
            torch.testing.assert_close(op(x, k, l=0.7, p=p, dim=dim), want, rtol=0, atol=1e-14)
        want = softtopk.hard_topk_mask(x.movedim(dim, -1), k).movedim(-1, dim)
        assert torch.equal(softtopk.hard_topk_mask(x, k, dim=dim), want)
        assert torch.equal(softtopk.hard_topk_mag(x, k, dim=dim), x * softtopk.hard_topk_mask(x.abs(), k, dim=dim))


def test_k_equal_n():
    x = torch.randn(3, 6, generator=_gen(20), dtype=F64, requires_grad=True)
    for p in P_VALUES:
        assert torch.equal(softtopk.sparse_topk_mask(x, 6, p=p), torch.ones(3, 6, dtype=F64))
        assert torch.equal(softtopk.sparse_topk_mag(x, 6, p=p), x.detach())
    softtopk.sparse_topk_mag(x, 6).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_hard_topk():
    x = torch.tensor([[-5.0, -2.0, 3.0, 1.0], [0.5, -4.0, 2.0, -0.1]], requires_grad=True)
    mask = softtopk.hard_topk_mask(x, 2)
    mag = softtopk.hard_topk_mag(x, 2)
    assert mask.shape == mag.shape == (2, 4)
    assert torch.equal(mask, torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]]))
    assert torch.equal(mag.detach(), torch.tensor([[-5.0, 0.0, 3.0, 0.0], [0.0, -4.0, 2.0, 0.0]]))
    mask.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    x.grad = None
    (mag * torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])).sum().backward()
    assert torch.equal(x.grad, torch.tensor([[1.0, 0.0, 3.0, 0.0], [0.0, 6.0, 7.0, 0.0]]))
    for dtype in (torch.float16, torch.bfloat16, torch.float32, F64):
        y = torch.randn(3, 2, 7, generator=_gen(21)).to(dtype)
        for op in (softtopk.hard_topk_mask, softtopk.hard_topk_mag):
            out = op(y, 3, dim=-1)
            assert out.shape == y.shape and out.dtype == dtype
        assert torch.equal(softtopk.hard_topk_mask(y, 3).sum(-1), torch.full((3, 2), 3.0, dtype=dtype))


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


X = torch.randn(3, 5)
ALL_OPS = [softtopk.sparse_topk_mask, softtopk.sparse_topk_mag, softtopk.hard_topk_mask, softtopk.hard_topk_mag]


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("l", [0.0, -1.0, float("nan"), float("inf"), 0])
def test_l_not_positive(kind, l):
    with pytest.raises(ValueError, match=_match("l must be a positive finite number", f"got {l!r}")):
        OPS[kind](X, 2, l=l)


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("l,shown", [(True, "bool True"), ("0.1", "str '0.1'"), (None, "NoneType None")])
def test_l_not_a_number(kind, l, shown):
    with pytest.raises(TypeError, match=_match("l must be a real number", shown)):
        OPS[kind](X, 2, l=l)


def test_l_tensor_is_for_the_mask_only():
    # a per-row tensor l is the mask's (tests/test_parameter_ranges.py); the magnitude refuses it
    with pytest.raises(TypeError, match="l must be a float for sparse_topk_mag .*, got a tensor"):
        OPS["mag"](X, 2, l=torch.tensor(0.1))


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("p", [1.5, 3, 1.0, 4 / 3 + 1e-3, True, "2", None])
def test_p_not_allowed(kind, p):
    with pytest.raises(ValueError, match=_match("p must be one of (2.0, 1.333", f"got {p!r}")):
        OPS[kind](X, 2, p=p)


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("solver", ["PAV", "bisect", "", None])
def test_solver_unknown(kind, solver):
    with pytest.raises(
        ValueError, match=_match("solver must be one of ('exact', 'pav', 'dykstra')", f"got {solver!r}")
    ):
        OPS[kind](X, 2, solver=solver)


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("n_iter", [0, -3])
def test_n_iter_not_positive(kind, n_iter):
    with pytest.raises(ValueError, match=_match("n_iter must be >= 1", f"got {n_iter}")):
        OPS[kind](X, 2, p=2, solver="dykstra", n_iter=n_iter)


@pytest.mark.parametrize("kind", ["mask", "mag"])
@pytest.mark.parametrize("n_iter,shown", [(10.0, "float 10.0"), (True, "bool True"), ("10", "str '10'")])
def test_n_iter_not_an_int(kind, n_iter, shown):
    with pytest.raises(TypeError, match=_match("n_iter must be an int", shown)):
        OPS[kind](X, 2, p=2, solver="dykstra", n_iter=n_iter)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("k", [0, 6, -1])
def test_k_out_of_range(op, k):
    with pytest.raises(ValueError, match=_match("k must satisfy 1 <= k <= n = 5", f"got {k}")):
        op(X, k)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize(
    "k,shown", [(2.0, "float 2.0"), (True, "bool True"), (torch.tensor(2), "Tensor"), ("2", "str '2'")]
)
def test_k_not_an_int(op, k, shown):
    with pytest.raises(TypeError, match=_match("k must be an int", shown)):
        op(X, k)


@pytest.mark.parametrize("op", ALL_OPS)
def test_x_not_a_tensor_or_not_floating(op):
    for x, shown in (([1.0, 2.0], "list"), (np.ones(3), "ndarray"), (None, "NoneType")):
        with pytest.raises(TypeError, match=_match("x must be a torch.Tensor", f"got {shown}")):
            op(x, 1)
    with pytest.raises(TypeError, match=_match("x must have a floating dtype", "got torch.int64")):
        op(torch.ones(3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match=_match("x must have at least one dimension")):
        op(torch.tensor(1.0), 1)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("dim", [2, -3, 10])
def test_dim_out_of_range(op, dim):
    with pytest.raises(ValueError, match=_match("dim must be in [-2, 1] for a 2-d input", f"got {dim}")):
        op(X, 1, dim=dim)


@pytest.mark.parametrize("op", [softtopk.sparse_topk_mask, softtopk.sparse_topk_mag])
def test_dim_not_an_int(op):
    with pytest.raises(TypeError, match=_match("dim must be an int", "float 1.0")):
        op(X, 1, dim=1.0)


def test_soft_topk_sparse_method_matches_and_validates():
    """``soft_topk(method='sparse')`` is the mask with the same parameters and checks."""
    x = torch.randn(3, 8, generator=_gen(22), dtype=F64)
    for p in P_VALUES:
        torch.testing.assert_close(
            softtopk.soft_topk(x, 3, method="sparse", l=0.4, p=p),
            softtopk.sparse_topk_mask(x, 3, l=0.4, p=p),
            rtol=0,
            atol=0,
        )
    with pytest.raises(TypeError, match=_match("method 'sparse' got unexpected parameter(s) ['tau']")):
        softtopk.soft_topk(x, 3, method="sparse", tau=1.0)
    with pytest.raises(ValueError, match=_match("l must be a positive finite number", "got -1.0")):
        softtopk.soft_topk(x, 3, method="sparse", l=-1.0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("p", P_VALUES, ids=["p2", "p4_3"])
def test_ties_with_a_tiny_l_share_exactly(p, dtype):
    """Two tied maxima and an l below their float resolution: each gets 1/2 to rounding (the threshold is
    kept as (s_k, (t - s_k)/l), which cannot round to s_k)."""
    for scale, lam in ((1.0, 1e-30), (1.0, 1e-3), (1e6, 1e-2)):
        x = torch.tensor([[1.0, 1.0, 0.0, 0.5]], dtype=dtype) * scale
        torch.testing.assert_close(
            softtopk.sparse_topk_mask(x, 1, l=lam, p=p),
            torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=dtype),
            atol=1e-12,
            rtol=0,
        )
