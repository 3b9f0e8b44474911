"""softtopk.soft_rank and soft_sort at extreme scales and strengths, on every solver (on the CPU,
numba's PAV or the rounds, in linear sums or log-sum-exps; the fixed-shape merges with an
accelerator's base case): finite values and gradients, ranks summing to n(n+1)/2, sorts monotone
and agreeing between the solvers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import permutahedron_reference as R
import softtopk
from softtopk.ops import isotonic, isotonic_numba, isotonic_small, permutahedron


@pytest.fixture(params=["cpu-pav", "cpu-rounds"])
def cpu_solver(request, monkeypatch):
    """The CPU solver that ``_both_paths`` compares with the fixed-shape one."""
    if request.param == "cpu-pav" and not isotonic_numba.available():
        pytest.skip("numba is not installed, so the CPU PAV kernels are not used (pip install numba)")
    if request.param == "cpu-rounds":
        monkeypatch.setattr(isotonic_numba, "available", lambda: False)


def _both_paths(fn, x, monkeypatch):
    leaf = x.clone().requires_grad_()
    rounds = fn(leaf)
    rounds.sum().backward()
    with monkeypatch.context() as patch:  # what an accelerator runs
        patch.setattr("softtopk.ops.isotonic.can_inspect", lambda value: False)
        patch.setattr("softtopk.ops.permutahedron.can_inspect", lambda value: False)
        patch.setattr(isotonic_small, "_cap", lambda device: 128)
        fixed = fn(x)
    return rounds, leaf.grad, fixed


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("strength", [1e-6, 1.0, 1e6])
def test_extreme_scales_and_strengths(reg, scale, strength, monkeypatch, cpu_solver):
    x = torch.randn(3, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * scale
    x[0, ::7] = x[0, 3]  # ties
    n = x.shape[-1]
    ranks, grad, fixed = _both_paths(
        lambda t: softtopk.soft_rank(t, regularization=reg, strength=strength), x, monkeypatch
    )
    assert ranks.isfinite().all() and grad.isfinite().all()
    # a pooled rank rounds at float64's eps |x / ε| (l2), or that times the rank (kl: w e^δ)
    atol = 1e-9 + 1e-15 * (n * n if reg == "kl" else n) * float(x.abs().max()) / strength
    torch.testing.assert_close(ranks.sum(-1), torch.full((3,), n * (n + 1) / 2, dtype=torch.float64), rtol=0, atol=atol)
    torch.testing.assert_close(fixed, ranks, rtol=1e-9, atol=atol)
    values, grad, fixed = _both_paths(
        lambda t: softtopk.soft_sort(t, regularization=reg, strength=strength), x, monkeypatch
    )
    assert values.isfinite().all() and grad.isfinite().all()
    assert (values.diff(dim=-1) >= -1e-9 * scale).all()
    torch.testing.assert_close(fixed, values, rtol=1e-9, atol=1e-9 * scale)


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize(
    ("row", "strength", "want"),
    [
        ([1e300], 1e-10, [1.0]),  # x/ε overflowed: NaN
        ([1e300, -1e300, 0.0], 1e-10, [3.0, 1.0, 2.0]),
        ([3e37, 3e37, 3e37], 1.0, [2.0, 2.0, 2.0]),  # x/ε - w lost w: the ties got ranks 3, 2, 1
        ([2.0, 1.0, 1.0, 0.0, 1.0], 1e-16, [5.0, 3.0, 3.0, 1.0, 3.0]),  # l2 summed to 11, kl to 9
        ([2.0, float("inf"), 1.0, float("-inf"), 1.0], 1e-16, [4.0, 5.0, 2.5, 1.0, 2.5]),
    ],
)
def test_ranks_where_x_over_strength_is_beyond_float64(reg, row, strength, want, monkeypatch, cpu_solver):
    """``|x/ε|`` far above ``2^53`` or past float64's largest: the exact ranks (ties share theirs),
    finite gradients, on both solvers."""
    x = torch.tensor([row], dtype=torch.float64)
    ranks, grad, fixed = _both_paths(
        lambda t: softtopk.soft_rank(t, regularization=reg, strength=strength), x, monkeypatch
    )
    want = torch.tensor([want], dtype=torch.float64)
    torch.testing.assert_close(ranks, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fixed, want, rtol=1e-12, atol=1e-12)
    assert grad.isfinite().all()


def test_rows_whose_sum_overflows_are_finite_rows():
    """The CPU's finiteness check sums the rows first; a sum that overflows is checked entry by entry."""
    x = torch.tensor([[3e38, 3e38, -1.0, 2.0]])  # float32: the sum is inf
    assert permutahedron._plain(x)
    assert not permutahedron._plain(torch.tensor([[3e38, float("inf"), 2.0]]))
    assert not permutahedron._plain(torch.tensor([[1.0, float("nan")]]))
    torch.testing.assert_close(softtopk.soft_rank(x, strength=1e-3), torch.tensor([[3.5, 3.5, 1.0, 2.0]]))


def test_kl_rounds_pool_windows_wider_than_the_exponent_range():
    """The CPU rounds' left cascades in log-sum-exps (rows spanning more than 600): a window's
    running log-sum-exp must not be taken relative to its maximum, where its first entries lie
    more than float64's exponent range below it (found by hypothesis: 0.048 off)."""
    rng = np.random.default_rng(2458020)
    y = -np.cumsum(rng.exponential(size=(3, 60 * 29)), -1)
    y[:, 59::60] += rng.exponential(size=(3, 29)) * 60 * rng.choice([0.1, 1, 10])
    lw = rng.normal(size=y.shape)
    want = np.stack([R.isotonic_kl(a, b) for a, b in zip(y, lw, strict=True)])
    got = isotonic._pooled_runs(torch.tensor(y), torch.tensor(lw))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-9)
