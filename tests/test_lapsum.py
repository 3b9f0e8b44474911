"""Tests of the closed-form Laplace-CDF soft top-k (``soft_topk(method='lapsum')``, the default).

The operator is ``m_i = F((x_i - t)/tau)`` with ``F`` the Laplace CDF and ``t`` set by
``sum_i m_i = k``. Checked here: a float64 bisection oracle written in this file, the structural
properties (hypothesis), exact float64 gradients for ``x``, a tensor ``tau`` and a per-row tensor
``k``, finiteness at extreme scales/temperatures/ties, the few-candidate fast path against the
``2k``-candidate path, dtypes, ``dim``/batch handling, very long rows, ``torch.compile``,
``torch.vmap``/``torch.func.grad``, the module default and every argument error.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from conftest import assert_same_values_and_grads
from dispatch_counter import accelerator_steps
from softtopk.ops.lapsum import lapsum_mask

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)
F64 = torch.float64


def _match(*parts: str) -> str:
    """A regex requiring the literal ``parts`` in this order."""
    return ".*".join(re.escape(part) for part in parts)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------
# Float64 bisection oracle
# --------------------------------------------------------------------------------------------


def laplace_cdf(z: np.ndarray) -> np.ndarray:
    """F(z) = e^z / 2 (z < 0), 1 - e^{-z} / 2 (z >= 0), without overflow."""
    return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0.0)), 1.0 - 0.5 * np.exp(-np.maximum(z, 0.0)))


def oracle_mask(x, k: float, tau: float) -> np.ndarray:
    """The Laplace mask of one row by bisection on ``t`` (float64, to the last bit of ``t``).

    ``S(t) = sum_i F((x_i - t)/tau)`` decreases from ``n`` to 0; ``k = n`` is the all-ones mask.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if k >= n:
        return np.ones(n)
    lo, hi = float(x.min()) - 60.0 * tau, float(x.max()) + 60.0 * tau  # S(lo) ~ n > k > S(hi) ~ 0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if laplace_cdf((x - mid) / tau).sum() > k:
            lo = mid
        else:
            hi = mid
    candidates = [laplace_cdf((x - t) / tau) for t in (lo, hi)]
    return min(candidates, key=lambda m: abs(m.sum() - k))


def oracle_rows(x: torch.Tensor, k, tau) -> torch.Tensor:
    """``oracle_mask`` on each row of a (B, n) tensor; ``k``/``tau`` scalars or per-row sequences."""
    rows = x.detach().to(F64).numpy()
    ks = np.broadcast_to(np.asarray(k, dtype=np.float64), (rows.shape[0],))
    taus = np.broadcast_to(np.asarray(tau, dtype=np.float64), (rows.shape[0],))
    return torch.from_numpy(np.stack([oracle_mask(r, kk, tt) for r, kk, tt in zip(rows, ks, taus, strict=True)]))


def test_oracle_is_correct_on_a_hand_example():
    """k = 1 of two entries 2 tau apart: t is their midpoint, m = (1 - e^{-1}/2, e^{-1}/2)."""
    m = oracle_mask([1.0, -1.0], 1, 1.0)
    np.testing.assert_allclose(m, [1 - 0.5 * np.exp(-1), 0.5 * np.exp(-1)], rtol=0, atol=1e-15)


def _k_values(n: int) -> list[int]:
    return sorted({k for k in (1, 2, n // 2, n // 2 + 1, n - 1, n) if 1 <= k <= n})


@pytest.mark.parametrize("scale", [1e-6, 1e-2, 1.0, 1e3, 1e6])
@pytest.mark.parametrize("n", [1, 2, 5, 16, 101])
def test_matches_bisection_oracle(n, scale):
    """Every k (1, 2, n/2, n/2 + 1 (complement path), n - 1, n) and tau in 1e-4..1e4, relative to
    the input scale or absolute; float64 to 1e-10."""
    x = torch.randn(3, n, generator=_gen(n), dtype=F64) * scale
    for k in _k_values(n):
        for tau in (1e-4, 1e-2, 1.0, 1e2, 1e4, 1e-2 * scale, scale):
            got = softtopk.soft_topk(x, k, tau=tau)
            torch.testing.assert_close(got, oracle_rows(x, k, tau), rtol=0, atol=1e-10, msg=f"k={k} tau={tau}")


@pytest.mark.parametrize("n", [6, 9, 40])
def test_matches_oracle_with_ties(n):
    """Integer-valued rows (many exact ties, also at the k-th value) at moderate |x|/tau."""
    x = torch.randint(-3, 4, (4, n), generator=_gen(n)).to(F64)
    for k in _k_values(n):
        for tau in (1e-2, 0.3, 1.0, 1e2):
            torch.testing.assert_close(
                softtopk.soft_topk(x, k, tau=tau), oracle_rows(x, k, tau), rtol=0, atol=1e-10, msg=f"k={k} tau={tau}"
            )


def test_matches_oracle_with_per_row_k_and_tau():
    """A floating per-row ``k`` (fractional, both sides of n/2, and = n) and a per-row tensor tau."""
    n = 12
    x = torch.randn(6, n, generator=_gen(1), dtype=F64) * 2
    k = torch.tensor([0.25, 1.0, 3.7, 6.0, 9.5, 12.0], dtype=F64)
    tau = torch.tensor([0.05, 1.0, 0.3, 3.0, 0.01, 1.0], dtype=F64)
    got = softtopk.soft_topk(x, k, tau=tau)
    torch.testing.assert_close(got, oracle_rows(x, k.tolist(), tau.tolist()), rtol=0, atol=1e-10)
    torch.testing.assert_close(got.sum(-1), k, rtol=0, atol=1e-12)
    # an integral tensor k gives the int-k result
    for kk in (1, 5, 8):
        torch.testing.assert_close(
            softtopk.soft_topk(x, torch.tensor(float(kk), dtype=F64), tau=0.5),
            softtopk.soft_topk(x, kk, tau=0.5),
            rtol=0,
            atol=1e-12,
        )


def test_single_entry_and_k_equal_n_give_ones():
    for x in (torch.tensor([3.0]), torch.randn(4, 1, generator=_gen(0)), torch.randn(2, 7, generator=_gen(1))):
        leaf = x.clone().requires_grad_()
        out = softtopk.soft_topk(leaf, x.shape[-1], tau=0.1)
        assert torch.equal(out, torch.ones_like(x))
        out.sum().backward()
        assert torch.equal(leaf.grad, torch.zeros_like(x))


def test_docstring_example_values():
    x = torch.tensor([0.0, 3.0, 1.0, 2.0])
    torch.testing.assert_close(softtopk.soft_topk(x, 2, tau=0.1), oracle_rows(x[None], 2, 0.1)[0].float())


# --------------------------------------------------------------------------------------------
# Properties (hypothesis)
# --------------------------------------------------------------------------------------------


@st.composite
def problems(draw, dtypes=(torch.float32, F64)):
    """(x of 1-3 dims, dim, k, tau): |x| / tau <= ~1e3 so float32 keeps ~1e-4 in z; ties optional."""
    ndim = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    dim = draw(st.integers(-ndim, ndim - 1))
    shape[dim] = draw(st.integers(1, 40))
    k = draw(st.integers(1, shape[dim]))
    scale = draw(st.sampled_from([1e-3, 1.0, 1e3]))
    tau = scale * 10 ** draw(st.floats(-2, 2))
    dtype = draw(st.sampled_from(dtypes))
    x = torch.randn(shape, generator=_gen(draw(st.integers(0, 2**16))), dtype=F64)
    if draw(st.booleans()):  # coarse grid: many exact ties
        x = x.mul(2).round()
    return (x * scale).to(dtype), dim, k, tau


def _sum_tol(dtype: torch.dtype, k: float) -> float:
    return (1e-4 if dtype == torch.float32 else 1e-9) * max(k, 1.0)


@PROPERTY
@given(problems())
def test_sums_to_k_and_lies_in_unit_interval(case):
    x, dim, k, tau = case
    m = softtopk.soft_topk(x, k, tau=tau, dim=dim)
    assert m.shape == x.shape and m.dtype == x.dtype
    assert bool(torch.isfinite(m).all())
    assert m.min() >= 0 and m.max() <= 1
    sums = m.to(F64).sum(dim)
    torch.testing.assert_close(sums, torch.full_like(sums, float(k)), rtol=0, atol=_sum_tol(x.dtype, k))


@PROPERTY
@given(problems(), st.data())
def test_per_row_tensor_k_sums_to_k(case, data):
    x, dim, _, tau = case
    n = x.shape[dim]
    batch = x.movedim(dim, -1).shape[:-1]
    frac = torch.tensor(data.draw(st.lists(st.floats(1e-3, 1.0), min_size=batch.numel(), max_size=batch.numel())))
    k = (frac * n).reshape(batch).to(x.dtype)
    m = softtopk.soft_topk(x, k, tau=tau, dim=dim)
    assert m.min() >= 0 and m.max() <= 1
    torch.testing.assert_close(m.to(F64).sum(dim), k.to(F64), rtol=_sum_tol(x.dtype, 1.0), atol=_sum_tol(x.dtype, 1.0))


@PROPERTY
@given(problems(dtypes=(F64,)), st.integers(0, 2**16))
def test_permutation_equivariance(case, seed):
    x, dim, k, tau = case
    perm = torch.randperm(x.shape[dim], generator=_gen(seed))
    out = softtopk.soft_topk(x, k, tau=tau, dim=dim)
    permuted = softtopk.soft_topk(x.index_select(dim, perm), k, tau=tau, dim=dim)
    torch.testing.assert_close(permuted, out.index_select(dim, perm), rtol=0, atol=1e-12)


@PROPERTY
@given(problems(dtypes=(F64,)), st.integers(0, 2**16), st.floats(1e-3, 10.0))
def test_monotone_in_each_entry(case, seed, step):
    """Raising one entry does not lower its own mask value nor raise anyone else's."""
    x, dim, k, tau = case
    rows = x.movedim(dim, -1).reshape(-1, x.shape[dim])
    i = int(torch.randint(0, rows.shape[-1], (1,), generator=_gen(seed)))
    bumped = rows.clone()
    bumped[:, i] += step * tau
    before, after = softtopk.soft_topk(rows, k, tau=tau), softtopk.soft_topk(bumped, k, tau=tau)
    assert bool((after[:, i] >= before[:, i] - 1e-12).all())
    others = torch.arange(rows.shape[-1]) != i
    assert bool((after[:, others] <= before[:, others] + 1e-12).all())


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("value", [0.0, 0.5, -3.0])
def test_tied_rows_are_k_over_n(dtype, value):
    for n, k in ((1, 1), (2, 1), (7, 3), (8, 4), (9, 5), (30, 29), (200, 37)):
        for tau in (1e-2, 1.0, 1e2):
            m = softtopk.soft_topk(torch.full((2, n), value, dtype=dtype), k, tau=tau)
            # float32 rounds x / tau (ulp ~ 1.2e-7 |x| / tau); the strict version is the next test
            atol = 1e-6 + 1.2e-7 * abs(value) / tau if dtype == torch.float32 else 1e-12
            torch.testing.assert_close(m, torch.full_like(m, k / n), rtol=0, atol=atol, msg=f"n={n} k={k} tau={tau}")


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("value", [0.0, 1.0, -3.0, 1e3, 1e6, -1e6])
@pytest.mark.parametrize("tau", [1e-6, 1e-2, 1.0, 1e6])
def test_tied_rows_are_k_over_n_at_any_offset(dtype, value, tau):
    """An all-equal row is exactly representable and its mask is k/n whatever the common value:
    the operator is shift invariant, so |x|/tau must not cost precision."""
    for n, k in ((10, 1), (10, 3), (100, 30), (100, 60), (1000, 200)):
        m = softtopk.soft_topk(torch.full((n,), value, dtype=dtype), k, tau=tau)
        err = (m.to(F64) - k / n).abs().max().item()
        assert err <= (1e-5 if dtype == torch.float32 else 1e-9), f"n={n} k={k}: max |m - k/n| = {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("offset", [0.0, 1e2, 1e4, 1e6])
@pytest.mark.parametrize("tau", [1e-2, 1.0, 10.0])
def test_shift_invariance_on_an_exact_grid(dtype, offset, tau):
    """``m(x + c) = m(x)``; x = c + a permutation of 0..99 is exact in float32 up to c = 1e6."""
    grid = torch.randperm(100, generator=_gen(0)).to(F64)
    want = softtopk.soft_topk(grid, 10, tau=tau)
    got = softtopk.soft_topk((grid + offset).to(dtype), 10, tau=tau)
    err = (got.to(F64) - want).abs().max().item()
    assert err <= (1e-4 if dtype == torch.float32 else 1e-9), f"max error {err:.3g}, sum {got.sum().item()}"


@pytest.mark.parametrize("n,k", [(5, 1), (5, 2), (5, 3), (5, 4), (64, 10), (64, 50)])
def test_small_tau_gives_the_hard_topk(n, k):
    """Separated inputs (spacing >= 0.5): at tau = 1e-3 the mask is the k-hot mask to 1e-100."""
    x = torch.randperm(n, generator=_gen(n)).to(F64) * 0.5 + torch.rand(n, generator=_gen(1), dtype=F64) * 0.1
    hard = softtopk.hard_topk_mask(x, k)
    torch.testing.assert_close(softtopk.soft_topk(x, k, tau=1e-3), hard, rtol=0, atol=1e-100)
    torch.testing.assert_close(softtopk.soft_topk(x, k, tau=0.02), hard, rtol=0, atol=1e-4)  # gap >= 0.4


@pytest.mark.parametrize("n,k", [(5, 1), (5, 4), (64, 10), (64, 50)])
def test_large_tau_gives_k_over_n(n, k):
    x = torch.randn(3, n, generator=_gen(n), dtype=F64)
    for tau, tol in ((1e3, 1e-2), (1e6, 1e-5)):
        m = softtopk.soft_topk(x, k, tau=tau)
        torch.testing.assert_close(m, torch.full_like(m, k / n), rtol=0, atol=tol)


def test_larger_tau_is_smoother():
    """The distance to the hard mask grows with tau (separated inputs, gaps >= 0.4)."""
    x = torch.stack([torch.randperm(20, generator=_gen(i)) for i in range(4)]).to(F64) * 0.5
    x = x + torch.rand(4, 20, generator=_gen(2), dtype=F64) * 0.1
    hard = softtopk.hard_topk_mask(x, 6)
    dist = [(softtopk.soft_topk(x, 6, tau=tau) - hard).abs().sum().item() for tau in (1e-3, 1e-2, 0.1, 1.0, 10.0)]
    assert dist == sorted(dist) and dist[0] < 1e-6 < dist[-1]


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


GRAD_CASES = [(6, 1, 0.5), (6, 2, 1.0), (6, 3, 0.3), (6, 4, 2.0), (6, 5, 0.7), (11, 7, 0.2), (1, 1, 1.0), (2, 1, 0.1)]


@pytest.mark.parametrize("n,k,tau", GRAD_CASES)
def test_gradcheck_x(n, k, tau):
    """float64 gradcheck (and gradgradcheck is not promised) w.r.t. x; k = 1, n - 1, > n/2."""
    x = torch.randn(3, n, generator=_gen(n + k), dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: softtopk.soft_topk(t, k, tau=tau), (x,))


@pytest.mark.parametrize("n,k", [(6, 2), (6, 4), (9, 8)])
@pytest.mark.parametrize("per_row", [False, True])
def test_gradcheck_tensor_tau(n, k, per_row):
    x = torch.randn(3, n, generator=_gen(n), dtype=F64).requires_grad_()
    tau = (torch.tensor([0.3, 1.0, 2.5], dtype=F64) if per_row else torch.tensor(0.7, dtype=F64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, s: softtopk.soft_topk(t, k, tau=s), (x, tau))


@pytest.mark.parametrize("tau_kind", ["float", "tensor"])
def test_gradcheck_per_row_k(tau_kind):
    """k in (0, n), both sides of n/2, one row near n; gradients w.r.t. x, k (and tau)."""
    n = 7
    x = torch.randn(5, n, generator=_gen(3), dtype=F64).requires_grad_()
    k = torch.tensor([0.4, 1.5, 3.5, 5.2, 6.8], dtype=F64).requires_grad_()
    if tau_kind == "float":
        assert torch.autograd.gradcheck(lambda t, kk: softtopk.soft_topk(t, kk, tau=0.6), (x, k))
    else:
        tau = torch.tensor([0.2, 1.0, 0.6, 3.0, 0.5], dtype=F64).requires_grad_()
        assert torch.autograd.gradcheck(lambda t, kk, s: softtopk.soft_topk(t, kk, tau=s), (x, k, tau))


def test_gradcheck_other_dim_with_tensor_k_and_tau():
    """dim=1 of a (2, 5, 3) input: k and tau have the batch shape (2, 3)."""
    x = torch.randn(2, 5, 3, generator=_gen(4), dtype=F64).requires_grad_()
    k = (torch.rand(2, 3, generator=_gen(5), dtype=F64) * 4.5 + 0.3).requires_grad_()
    tau = (torch.rand(2, 3, generator=_gen(6), dtype=F64) + 0.2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, kk, s: softtopk.soft_topk(t, kk, tau=s, dim=1), (x, k, tau))


def test_gradient_of_k_is_the_weighted_mean_and_of_tau_matches_finite_differences():
    """d(sum_i g_i m_i)/dk = sum w g with w = F'(z) / sum F'(z); checked by central differences."""
    x = torch.randn(1, 9, generator=_gen(7), dtype=F64)
    g = torch.randn(1, 9, generator=_gen(8), dtype=F64)
    k = torch.tensor([3.3], dtype=F64, requires_grad=True)
    (softtopk.soft_topk(x, k, tau=0.4) * g).sum().backward()
    h = 1e-6
    plus, minus = softtopk.soft_topk(x, k.detach() + h, tau=0.4), softtopk.soft_topk(x, k.detach() - h, tau=0.4)
    fd = ((plus - minus) * g).sum() / (2 * h)
    torch.testing.assert_close(k.grad[0], fd, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("tau", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("kind", ["random", "all_equal", "ties"])
def test_gradients_finite_and_rows_sum_to_zero(scale, tau, kind):
    """No NaN/inf in value, grad x, grad tau, grad k; with k and tau fixed, sum_i dL/dx_i = 0."""
    g = _gen(9)
    base = {
        "random": torch.randn(3, 10, generator=g, dtype=F64),
        "all_equal": torch.ones(3, 10, dtype=F64),
        "ties": torch.randint(0, 2, (3, 10), generator=g).to(F64),
    }[kind]
    upstream = torch.randn(3, 10, generator=g, dtype=F64)
    for k in (1, 4, 7, 9):
        x = (base * scale).requires_grad_()
        tau_t = torch.tensor(tau, dtype=F64, requires_grad=True)
        k_t = torch.full((3,), k - 0.5, dtype=F64, requires_grad=True)
        out = softtopk.soft_topk(x, k, tau=tau_t)
        out_k = softtopk.soft_topk(x, k_t, tau=tau_t)
        ((out + out_k) * upstream).sum().backward()
        for t in (out, out_k, x.grad, tau_t.grad, k_t.grad):
            assert bool(torch.isfinite(t).all()), (k, t)
        x.grad = None
        (softtopk.soft_topk(x, k, tau=tau) * upstream).sum().backward()
        row = x.grad.sum(-1)
        assert bool((row.abs() <= 1e-9 * (1 + x.grad.abs().sum(-1))).all()), row


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_gradient_finite_at_extremes_float32(dtype):
    """float32 too: tiny/huge tau at tiny/huge scales, ties; values and gradients finite."""
    g = _gen(10)
    for scale in (1e-6, 1.0, 1e6):
        for tau in (1e-6, 1e-2, 1e6):
            for x in (torch.randn(4, 16, generator=g) * scale, torch.zeros(4, 16), torch.full((4, 16), scale)):
                leaf = x.to(dtype).requires_grad_()
                out = softtopk.soft_topk(leaf, 5, tau=tau)
                (out * torch.arange(16.0, dtype=dtype)).sum().backward()
                assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(leaf.grad).all()), (scale, tau)


# --------------------------------------------------------------------------------------------
# Near ties at the k-th value: the threshold deep among the 2k candidates
# --------------------------------------------------------------------------------------------


def _near_tie_rows(k: int, cluster: int, tau: float, offset: float, seed: int, n: int = 2000) -> torch.Tensor:
    """Rows whose ``cluster`` largest entries tie to within 1e-3 tau at the k-th value, far above
    the rest (so about k/cluster > 1/2 each: close to 2k entries lie above t)."""
    g = _gen(seed)
    x = torch.full((3, n), -10.0 * tau, dtype=F64) - torch.rand(3, n, generator=g, dtype=F64) * tau
    x[:, :cluster] = torch.rand(3, cluster, generator=g, dtype=F64) * 1e-3 * tau
    x = x[:, torch.randperm(n, generator=g)]
    return x + offset


@pytest.mark.parametrize("offset", [0.0, 1.0, 1e2, 1e4])
@pytest.mark.parametrize("tau", [1e-2, 1.0])
def test_threshold_deep_among_the_candidates(tau, offset):
    """38 near-ties at the top, k = 20: 38 of the 40 candidates lie above t. The mask sums to k,
    equals the oracle, and the CPU's candidate search (block maxima) gives one topk's values and
    gradient."""
    k = 20
    x = _near_tie_rows(k, 38, tau, offset, seed=0)
    leaf = x.clone().requires_grad_()
    got = lapsum_mask(leaf, k, tau)
    torch.testing.assert_close(got.sum(-1), torch.full((3,), float(k), dtype=F64), rtol=0, atol=1e-9)
    if offset == 0.0:
        torch.testing.assert_close(got, oracle_rows(x, k, tau), rtol=0, atol=1e-10)
    upstream = torch.randn(3, x.shape[-1], generator=_gen(1), dtype=F64)
    (got * upstream).sum().backward()
    with accelerator_steps():  # one torch.topk for the candidates
        leaf2 = x.clone().requires_grad_()
        want = lapsum_mask(leaf2, k, tau)
        (want * upstream).sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(leaf.grad, leaf2.grad, rtol=0, atol=1e-12)


@PROPERTY
@given(st.integers(4, 40), st.integers(0, 2**16), st.sampled_from([1e-3, 1e-1, 1.0]))
def test_clumps_at_the_kth_value_match_the_oracle(k, seed, tau):
    """Random rows, some with a clump of near-ties at the k-th value, one entry far above the rest;
    half of them as long as where the CPU searches the candidates by block maxima (32 k <= n < 128 k)."""
    g = _gen(seed)
    if seed % 2:
        n = 8 * (4 * k + int(torch.randint(0, 12 * k, (1,), generator=g)))
    else:
        n = 2 * k + int(torch.randint(0, 200, (1,), generator=g))
    x = torch.randn(4, n, generator=g, dtype=F64)
    kth = x.topk(k, -1).values[:, -1:]
    clump = torch.rand(4, n, generator=g) < min(0.4, 3 * k / n)
    x = torch.where(clump, kth + 1e-3 * tau * torch.randn(4, n, generator=g, dtype=F64), x)
    x[:, 0] += 1e3 * tau
    torch.testing.assert_close(lapsum_mask(x, k, tau), oracle_rows(x, k, tau), rtol=0, atol=1e-9)


# --------------------------------------------------------------------------------------------
# dtypes, dims, long rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2), (torch.float32, 0.0)])
def test_dtypes_preserved_and_half_close_to_float32(dtype, tol):
    x = (torch.randn(3, 5, 17, generator=_gen(11)) * 2).to(dtype)
    for k in (1, 6, 12):
        out = softtopk.soft_topk(x, k, tau=0.5, dim=-1)
        assert out.shape == x.shape and out.dtype == dtype
        ref = softtopk.soft_topk(x.float(), k, tau=0.5)
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=tol)
    leaf = x.clone().requires_grad_()
    softtopk.soft_topk(leaf, 4, tau=0.5).pow(2).sum().backward()
    assert leaf.grad.dtype == dtype and bool(torch.isfinite(leaf.grad).all())


def test_float32_close_to_float64():
    x = torch.randn(4, 50, generator=_gen(12), dtype=F64)
    for k in (1, 10, 30):
        for tau in (1e-2, 1.0):
            torch.testing.assert_close(
                softtopk.soft_topk(x.float(), k, tau=tau).double(), softtopk.soft_topk(x, k, tau=tau), rtol=0, atol=2e-5
            )


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
def test_any_dim_equals_moving_dim_last(dim):
    x = torch.randn(2, 3, 5, generator=_gen(13), dtype=F64)
    n = x.shape[dim]
    batch = x.movedim(dim, -1).shape[:-1]
    k_tensor = torch.rand(batch, generator=_gen(14), dtype=F64) * (n - 0.2) + 0.1
    for k in sorted({1, n // 2 + 1, n}):
        want = softtopk.soft_topk(x.movedim(dim, -1), k, tau=0.4).movedim(-1, dim)
        torch.testing.assert_close(softtopk.soft_topk(x, k, tau=0.4, dim=dim), want, rtol=0, atol=1e-14)
    want = softtopk.soft_topk(x.movedim(dim, -1), k_tensor, tau=0.4).movedim(-1, dim)
    got = softtopk.soft_topk(x, k_tensor, tau=0.4, dim=dim)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    torch.testing.assert_close(got.sum(dim), k_tensor, rtol=0, atol=1e-12)


def test_k_and_tau_broadcast_to_the_batch_shape():
    """A scalar tensor, a (1,) tensor and the full batch shape all mean per-row values."""
    x = torch.randn(4, 6, generator=_gen(15), dtype=F64)
    want = softtopk.soft_topk(x, 2, tau=0.5)
    for k in (torch.tensor(2.0, dtype=F64), torch.tensor([2.0], dtype=F64), torch.full((4,), 2.0, dtype=F64)):
        taus = (0.5, torch.tensor(0.5, dtype=F64), torch.tensor([0.5], dtype=F64), torch.full((4,), 0.5, dtype=F64))
        for tau in taus:
            torch.testing.assert_close(softtopk.soft_topk(x, k, tau=tau), want, rtol=0, atol=1e-14)
    taus = torch.tensor([0.1, 0.5, 1.0, 5.0], dtype=F64)
    rows = torch.stack([softtopk.soft_topk(x[i], 2, tau=taus[i].item()) for i in range(4)])
    torch.testing.assert_close(softtopk.soft_topk(x, 2, tau=taus), rows, rtol=0, atol=1e-14)


@pytest.mark.parametrize("k", [10, 10000])
def test_long_rows(k):
    """n = 100000 in float32: finite, in [0, 1], sums to k (1e-4 k), finite gradient."""
    x = torch.randn(2, 100_000, generator=_gen(16)).requires_grad_()
    for tau in (1e-3, 1.0):
        out = softtopk.soft_topk(x, k, tau=tau)
        assert bool(torch.isfinite(out).all()) and out.min() >= 0 and out.max() <= 1
        torch.testing.assert_close(out.double().sum(-1), torch.full((2,), float(k), dtype=F64), rtol=0, atol=1e-4 * k)
        x.grad = None
        (out * out).sum().backward()
        assert bool(torch.isfinite(x.grad).all())
        assert x.grad.double().sum(-1).abs().max() < 1e-3 * x.grad.abs().sum().item() / 2
    k_tensor = torch.full((2,), k - 0.5)
    torch.testing.assert_close(softtopk.soft_topk(x, k_tensor).double().sum(-1), k_tensor.double(), rtol=1e-4, atol=0)


# --------------------------------------------------------------------------------------------
# compile, vmap, torch.func, module
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("k", [3, 7])
def test_compile_fullgraph_matches_eager(k):
    """Forward and gradient (x and a tensor tau) equal eager; k = 3 and k > n/2."""

    def fn(x, tau):
        return softtopk.soft_topk(x, k, tau=tau)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for seed in (0, 1):
        x = torch.randn(4, 10, generator=_gen(seed))
        upstream = torch.randn(4, 10, generator=_gen(seed + 10))
        assert_same_values_and_grads((compiled, fn), x, upstream, 0.7)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compile_fullgraph_per_row_k():
    def fn(x, k):
        return softtopk.soft_topk(x, k, tau=0.5)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 8, generator=_gen(2))
    k = torch.tensor([1.5, 4.0, 6.5])
    results = []
    for f in (compiled, fn):
        leaf, kk = x.clone().requires_grad_(), k.clone().requires_grad_()
        out = f(leaf, kk)
        (out * torch.arange(8.0)).sum().backward()
        results.append((out.detach(), leaf.grad, kk.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 4, 9])
def test_vmap_matches_batched_call(k):
    x = torch.randn(6, 12, generator=_gen(3), dtype=F64)
    got = torch.vmap(lambda row: softtopk.soft_topk(row, k, tau=0.3))(x)
    torch.testing.assert_close(got, softtopk.soft_topk(x, k, tau=0.3), rtol=0, atol=1e-12)
    # vmap over the middle axis of a 3-d input, selecting along the last
    y = torch.randn(2, 5, 12, generator=_gen(4), dtype=F64)
    got = torch.vmap(lambda rows: softtopk.soft_topk(rows, k, tau=0.3), in_dims=1, out_dims=1)(y)
    torch.testing.assert_close(got, softtopk.soft_topk(y, k, tau=0.3), rtol=0, atol=1e-12)


def test_vmap_with_unbatched_tensor_k_and_tau():
    """Tensors closed over (not vmapped) are fine."""
    x = torch.randn(4, 9, generator=_gen(5), dtype=F64)
    k, tau = torch.tensor(2.5, dtype=F64), torch.tensor(0.3, dtype=F64)
    got = torch.vmap(lambda r: softtopk.soft_topk(r, k, tau=tau))(x)
    torch.testing.assert_close(got, softtopk.soft_topk(x, k, tau=tau), rtol=0, atol=1e-12)


def test_vmap_over_per_row_k():
    """vmap over (x, k) pairs: each row's scalar k (the per-row tensor k under vmap)."""
    x = torch.randn(4, 9, generator=_gen(5), dtype=F64)
    k = torch.tensor([0.5, 2.0, 4.5, 8.0], dtype=F64)
    got = torch.vmap(lambda r, kk: softtopk.soft_topk(r, kk, tau=0.3))(x, k)
    torch.testing.assert_close(got, softtopk.soft_topk(x, k, tau=0.3), rtol=0, atol=1e-12)


def test_vmap_over_per_row_tau():
    x = torch.randn(4, 9, generator=_gen(5), dtype=F64)
    tau = torch.tensor([0.1, 1.0, 0.3, 2.0], dtype=F64)
    got = torch.vmap(lambda r, s: softtopk.soft_topk(r, 3, tau=s))(x, tau)
    torch.testing.assert_close(got, softtopk.soft_topk(x, 3, tau=tau), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [2, 6])
def test_func_grad_matches_autograd(k):
    x = torch.randn(8, generator=_gen(6), dtype=F64)
    w = torch.randn(8, generator=_gen(7), dtype=F64)

    def loss(t):
        return (softtopk.soft_topk(t, k, tau=0.4) * w).sum()

    got = torch.func.grad(loss)(x)
    leaf = x.clone().requires_grad_()
    loss(leaf).backward()
    torch.testing.assert_close(got, leaf.grad, rtol=0, atol=1e-14)
    # per-example gradients: vmap of grad over a batch
    batch = torch.randn(3, 8, generator=_gen(8), dtype=F64)
    per_example = torch.vmap(torch.func.grad(loss))(batch)
    for i in range(3):
        torch.testing.assert_close(per_example[i], torch.func.grad(loss)(batch[i]), rtol=0, atol=1e-14)


def test_module_defaults_to_lapsum():
    layer = softtopk.SoftTopK(3)
    assert layer.method == "lapsum" and layer.params == {"tau": 1.0, "hard": False}
    assert "lapsum" in repr(layer)
    x = torch.randn(2, 7, generator=_gen(9))
    torch.testing.assert_close(layer(x), softtopk.soft_topk(x, 3, method="lapsum", tau=1.0), rtol=0, atol=0)
    torch.testing.assert_close(softtopk.soft_topk(x, 3), softtopk.soft_topk(x, 3, method="lapsum"), rtol=0, atol=0)
    sharp = softtopk.SoftTopK(3, tau=0.01, dim=0)
    y = torch.randn(7, 2, generator=_gen(10))
    torch.testing.assert_close(sharp(y), softtopk.soft_topk(y, 3, tau=0.01, dim=0), rtol=0, atol=0)
    info = softtopk.methods()["lapsum"]
    assert info.outputs == ("mask",) and not info.stochastic and info.params == {"tau": 1.0, "hard": False}


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


X = torch.randn(3, 5)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_k_tensor_of_another_kind(dtype):
    message = _match("k must be an int or a real tensor of per-row counts", f"got a tensor of dtype {dtype}")
    with pytest.raises(TypeError, match=message):
        softtopk.soft_topk(X, torch.ones(3, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_integer_k_tensor_counts_as_float(dtype):
    # counts are integers in PyTorch: an integer per-row k is the same k as a float one
    k = torch.tensor([1, 2, 4], dtype=dtype)
    torch.testing.assert_close(softtopk.soft_topk(X, k), softtopk.soft_topk(X, k.float()))
    with pytest.raises(ValueError, match=_match("k must lie in (0, n = 5] in every row", "got 0.0")):
        softtopk.soft_topk(X, torch.tensor([1, 0, 2], dtype=dtype))


@pytest.mark.parametrize("bad", [0.0, -1.0, 5.5, float("nan"), float("inf")])
def test_k_tensor_out_of_range(bad):
    k = torch.tensor([1.0, bad, 2.0])
    with pytest.raises(ValueError, match=_match("k must lie in (0, n = 5] in every row", f"got {bad}")):
        softtopk.soft_topk(X, k)
    with pytest.raises(ValueError, match=_match("k must lie in (0, n = 5]")):
        softtopk.soft_topk(X, torch.tensor(bad))


@pytest.mark.parametrize("shape", [(4,), (3, 5), (2, 3)])
def test_k_tensor_not_broadcastable(shape):
    message = _match("k must be a scalar or broadcastable to the batch shape (3,)", f"got shape {shape}")
    with pytest.raises(ValueError, match=message):
        softtopk.soft_topk(X, torch.ones(shape))


def test_k_tensor_not_broadcastable_other_dim():
    x = torch.randn(2, 5, 3)
    message = _match("k must be a scalar or broadcastable to the batch shape (2, 3)", "got shape (2, 5)")
    with pytest.raises(ValueError, match=message):
        softtopk.soft_topk(x, torch.ones(2, 5), dim=1)


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf"), 0, -2])
def test_tau_not_positive_float(tau):
    with pytest.raises(ValueError, match=_match("tau must be a positive finite number", f"got {tau!r}")):
        softtopk.soft_topk(X, 2, tau=tau)


@pytest.mark.parametrize("tau,shown", [(True, "bool True"), ("1", "str '1'"), (None, "NoneType None")])
def test_tau_not_a_number(tau, shown):
    with pytest.raises(TypeError, match=_match("tau must be a real number", shown)):
        softtopk.soft_topk(X, 2, tau=tau)


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan"), float("inf")])
def test_tau_tensor_not_positive(bad):
    with pytest.raises(ValueError, match=_match("tau must be positive and finite", "got a tensor with min")):
        softtopk.soft_topk(X, 2, tau=torch.tensor(bad))
    with pytest.raises(ValueError, match=_match("tau must be positive and finite")):
        softtopk.soft_topk(X, 2, tau=torch.tensor([1.0, bad, 2.0]))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_tau_integer_tensor(dtype):
    with pytest.raises(TypeError, match=_match("tau must be a floating tensor when given as a tensor", f"got {dtype}")):
        softtopk.soft_topk(X, 2, tau=torch.ones(3, dtype=dtype))


def test_tau_tensor_not_broadcastable():
    message = _match("tau must be a scalar or broadcastable to the batch shape (3,)", "got shape (5,)")
    with pytest.raises(ValueError, match=message):
        softtopk.soft_topk(X, 2, tau=torch.ones(5))


@pytest.mark.parametrize("param", ["l", "steepness", "temperature"])
def test_unknown_parameter(param):
    message = _match("method 'lapsum' got unexpected parameter(s)", f"'{param}'", "it takes ['hard', 'tau']")
    with pytest.raises(TypeError, match=message):
        softtopk.soft_topk(X, 2, **{param: 1.0})
    with pytest.raises(TypeError, match=_match("method 'lapsum' got unexpected parameter(s)", f"'{param}'")):
        softtopk.SoftTopK(2, **{param: 1.0})


@pytest.mark.parametrize("method,params", [("neuralsort", {"tau": 1.0}), ("sparse", {}), ("bitonic", {})])
def test_tensor_k_needs_lapsum(method, params):
    with pytest.raises(TypeError, match=_match("k must be an int", "got Tensor")):
        softtopk.soft_topk(X, torch.full((3,), 2.0), method=method, **params)


@pytest.mark.parametrize("k", [0, 6, -1])
def test_int_k_out_of_range(k):
    with pytest.raises(ValueError, match=_match("k must satisfy 1 <= k <= n = 5", f"got {k}")):
        softtopk.soft_topk(X, k)


@pytest.mark.parametrize("k,shown", [(2.5, "float 2.5"), (True, "bool True"), ("2", "str '2'")])
def test_k_not_an_int_or_tensor(k, shown):
    with pytest.raises(TypeError, match=_match("k must be an int", shown)):
        softtopk.soft_topk(X, k)


def test_bad_x_and_dim():
    with pytest.raises(TypeError, match=_match("x must be a torch.Tensor", "got list")):
        softtopk.soft_topk([1.0, 2.0], 1)
    with pytest.raises(TypeError, match=_match("x must have a floating dtype", "got torch.int64")):
        softtopk.soft_topk(torch.ones(3, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match=_match("dim must be in [-2, 1] for a 2-d input", "got 2")):
        softtopk.soft_topk(X, 1, dim=2)
