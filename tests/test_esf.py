"""Log-space elementary symmetric polynomials: brute force, gradients, both summation paths, edges."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from softtopk.ops import esf, svm_subsets
from softtopk.ops.esf import log_esf


def brute_force(log_x: torch.Tensor, k: int) -> torch.Tensor:
    """log e_j by enumerating every j-subset, float64."""
    x = log_x.double().exp()
    n = x.shape[-1]
    columns = []
    for j in range(k + 1):
        total = torch.zeros(x.shape[:-1], dtype=torch.float64)
        for subset in itertools.combinations(range(n), j):
            total = total + x[..., list(subset)].prod(-1)
        columns.append(total.log())
    return torch.stack(columns, -1)


@pytest.fixture
def log_space_path(monkeypatch):
    """Force the logcumsumexp path (normally taken only when C(n, k) overflows the dtype)."""
    monkeypatch.setattr(esf, "largest_log_binomial", lambda n, k: math.inf)


@pytest.mark.parametrize("path", ["linear", "log_space"])
def test_matches_brute_force(path, request):
    if path == "log_space":
        request.getfixturevalue("log_space_path")
    a = torch.randn(3, 2, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3
    torch.testing.assert_close(log_esf(a, 9), brute_force(a, 9), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(log_esf(a.float(), 5), brute_force(a, 5).float(), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("path", ["linear", "log_space"])
def test_gradcheck(path, request):
    if path == "log_space":
        request.getfixturevalue("log_space_path")
    a = torch.randn(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    assert torch.autograd.gradcheck(lambda t: log_esf(t, 4), a.requires_grad_())
    assert torch.autograd.gradgradcheck(lambda t: log_esf(t, 3), a)


def test_degrees_above_n_are_minus_infinity():
    out = log_esf(torch.zeros(2, 3), 5)
    torch.testing.assert_close(out[:, :4].exp(), torch.tensor([[1.0, 3.0, 3.0, 1.0]] * 2))
    assert torch.equal(out[:, 4:], torch.full((2, 2), -math.inf))
    assert torch.equal(log_esf(torch.randn(4, 3), 0), torch.zeros(4, 1))


def test_minus_infinity_entries_are_zeros():
    a = torch.randn(4, 8, dtype=torch.float64)
    a[:, 5:] = -math.inf
    a.requires_grad_()
    out = log_esf(a, 5)
    torch.testing.assert_close(out, brute_force(a.detach()[:, :5], 5))
    out.sum().backward()
    assert torch.isfinite(a.grad).all() and (a.grad[:, 5:] == 0).all()


def test_shift_equivariant_and_finite_at_large_scale():
    a = torch.randn(4, 100) * 1e4
    shifted = log_esf(a + 1e5, 5) - log_esf(a, 5)
    torch.testing.assert_close(shifted, 1e5 * torch.arange(6.0).expand(4, 6), atol=0.1, rtol=1e-6)
    a.requires_grad_()
    log_esf(a, 5)[:, -2:].sum().backward()
    assert torch.isfinite(a.grad).all()


def test_equal_inputs_reach_the_log_space_path_in_float32():
    """n = 1000, all x_i = 1: e_j = C(1000, j) exceeds float32 for j >= 19 (log-space path)."""
    x = torch.zeros(2, 1000, requires_grad=True)
    out = log_esf(x, 20)
    exact = torch.tensor([math.lgamma(1001) - math.lgamma(j + 1) - math.lgamma(1001 - j) for j in range(21)])
    torch.testing.assert_close(out, exact.expand(2, 21), atol=1e-4, rtol=1e-6)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 1000), sum(j / 1000 for j in range(21))))


def test_permutation_invariant_and_dtypes():
    a = torch.randn(3, 20)
    torch.testing.assert_close(log_esf(a, 5), log_esf(a.flip(-1), 5))
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        out = log_esf(a.to(dtype), 5)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), log_esf(a, 5), atol=0.1, rtol=1e-2)


def test_vmap_of_grad_matches_the_batched_gradient():
    """Per-sample gradients (``vmap(grad(...))``, e.g. for DP-SGD) through the tail Function."""
    a = torch.randn(5, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def loss(row):
        out = log_esf(row, 4)
        return out[..., 4] - out[..., 3]

    per_sample = torch.func.vmap(torch.func.grad(loss))(a)
    batched = a.clone().requires_grad_()
    loss(batched).sum().backward()
    torch.testing.assert_close(per_sample, batched.grad)


@pytest.mark.parametrize("case", ["dominant", "ties", "spread"])
def test_float32_gradient_matches_float64(case):
    """The deflation backward (module doc): absolute gradient error at float32 rounding level, also
    where a few entries dominate the rest (the case deflation cancels in) and for exact ties."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(32, 500, generator=g)
    if case == "dominant":
        a[:, :3] += 40.0
    elif case == "ties":
        a = a.round()
    else:
        a = a * 10.0
    weights = torch.randn(11, generator=g, dtype=torch.float64)
    grads = []
    for dtype in (torch.float32, torch.float64):
        leaf = a.to(dtype, copy=True).requires_grad_()
        (log_esf(leaf, 10) * weights.to(dtype)).sum().backward()
        grads.append(leaf.grad.double())
    assert (grads[0] - grads[1]).abs().max() <= 5e-5 * weights.abs().sum()


def _tails() -> dict[str, torch.Tensor]:
    """Tails in [0, 1] of 1000 entries where Newton's identities cancel most: a few ties with the
    k-th largest over tiny or zero values, all ties, values spread over 30 orders of magnitude."""
    g = torch.Generator().manual_seed(0)
    few = torch.full((1000,), 1e-6, dtype=torch.float64)
    few[:7] = 1.0
    spread = 10 ** (-30 * torch.rand(1000, generator=g, dtype=torch.float64))
    return {
        "seven ties over 1e-6": few,
        "seven ties over zeros": torch.cat([torch.ones(7), torch.zeros(993)]).double(),
        "all ties": torch.ones(1000, dtype=torch.float64),
        "spread": spread,
        "uniform": torch.rand(1000, generator=g, dtype=torch.float64),
        "one": torch.cat([torch.ones(1), torch.rand(999, generator=g, dtype=torch.float64) * 1e-3]),
    }


@pytest.mark.parametrize("name", list(_tails()))
def test_power_sum_polynomials_have_a_small_absolute_error(name):
    """``_newton_esf`` against the float64 scans: each ``e_b`` within a few float64 roundings of
    ``sum_{c<=b} e_c`` (the scale that :class:`_SmoothTopKRows` gives its error, module doc)."""
    y = _tails()[name]
    for degree in (1, 2, 5, svm_subsets.SUBSET_K):
        want = esf._tail_esf(y, degree)
        got = svm_subsets._newton_esf(y, degree)
        assert got.dtype == torch.float64 and got[0] == 1
        assert ((got - want).abs() <= 1e-13 * want.cumsum(-1)).all(), (degree, got, want)
    # float32 values: the sums still run in float64
    got = svm_subsets._newton_esf(y.float(), 5)
    want = esf._tail_esf(y.float().double(), 5)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-7, atol=1e-13 * float(want.sum()))
