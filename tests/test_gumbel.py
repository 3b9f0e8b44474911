"""Gumbel top-k relaxed subset sampling (:mod:`softtopk.ops.gumbel`).

The chi-square check is a probabilistic statement evaluated with a fixed seed (so deterministic):
under the null hypothesis it would fail with probability 1e-3.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from softtopk.ops.gumbel import RELAXATIONS, gumbel_ranks_rows
from softtopk.stochastic import gumbel_topk

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FEW = settings(max_examples=20, deadline=None)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _gumbel(shape, seed: int, dtype=torch.float64) -> torch.Tensor:
    u = torch.rand(shape, generator=_gen(seed), dtype=dtype).clamp_min(1e-30)
    return -torch.log(-torch.log(u))


def _match(*parts: str) -> str:
    return ".*".join(re.escape(part) for part in parts)


def _naive_subset_operator(keys: torch.Tensor, k: int, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Xie & Ermon's SubsetOperator on perturbed keys, written directly: (khot, per-step softmaxes)."""
    tiny = torch.finfo(keys.dtype).tiny
    r, a, khot, steps = keys, torch.zeros_like(keys), torch.zeros_like(keys), []
    for _ in range(k):
        r = r + torch.log(torch.clamp(1 - a, min=tiny))
        a = torch.softmax(r / tau, dim=-1)
        khot = khot + a
        steps.append(a)
    return khot, torch.stack(steps, -1)


def _hard(keys: torch.Tensor, k: int) -> torch.Tensor:
    return torch.zeros_like(keys).scatter(-1, keys.topk(k, -1).indices, 1.0)


# ---------------------------------------------------------------------------------------- values


@pytest.mark.parametrize("relaxation", RELAXATIONS)
@pytest.mark.parametrize("k", [1, 3, 7, 10])
def test_rows_sum_to_k(relaxation, k):
    x = 3 * torch.randn(16, 10, generator=_gen(k), dtype=torch.float64)
    y = gumbel_topk(x, k, relaxation=relaxation, generator=_gen(1))
    torch.testing.assert_close(y.sum(-1), torch.full((16,), float(k), dtype=torch.float64))
    assert (y >= 0).all()


@pytest.mark.parametrize("tau", [0.1, 1.0, 5.0])
def test_lapsum_entries_in_unit_interval(tau):
    x = 3 * torch.randn(64, 20, generator=_gen(0))
    y = gumbel_topk(x, 5, tau=tau, generator=_gen(2))
    assert (y >= 0).all() and (y <= 1).all()


def test_subsets_two_items_gives_one_and_a_half():
    # n = 2, k = 2, tau = 1: the second softmax is exactly [1/2, 1/2], so the kernel's mask is
    # sigmoid(±d) + 1/2; the operator selects both items of a row with k = n (the degenerate-row rule)
    for d in [0.0, 1.0, 10.0, 30.0]:
        x = torch.tensor([[d, 0.0]], dtype=torch.float64)
        y = gumbel_ranks_rows(x, 2, noise=False).sum(-1)[0]
        s = torch.sigmoid(torch.tensor(d, dtype=torch.float64))
        torch.testing.assert_close(y, torch.stack([s + 0.5, 1.5 - s]))
        assert torch.equal(gumbel_topk(x, 2, relaxation="subsets", noise=False), torch.ones_like(x))
    assert y[0] > 1.49


def test_subsets_entries_exceed_one_routinely():
    x = 3 * torch.randn(200, 20, generator=_gen(3))
    y = gumbel_topk(x, 5, relaxation="subsets", generator=_gen(4))
    share = (y.max(-1).values > 1).float().mean()
    assert share > 0.5  # structural, documented; the lapsum relaxation never does this
    assert (gumbel_topk(x, 5, generator=_gen(4)) <= 1).all()


@pytest.mark.parametrize("tau", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_subsets_equals_naive_subset_operator(tau, k):
    x = 2 * torch.randn(6, 8, generator=_gen(k), dtype=torch.float64)
    g = _gumbel(x.shape, 10 + k)
    khot, steps = _naive_subset_operator(x + g, k, tau)
    expected = khot if k < x.shape[-1] else torch.ones_like(khot)  # k = n selects every item
    torch.testing.assert_close(gumbel_topk(x, k, tau=tau, relaxation="subsets", noise=g), expected)
    torch.testing.assert_close(gumbel_ranks_rows(x, k, tau=tau, noise=g), steps)


def test_ranks_rows():
    x = torch.randn(5, 7, generator=_gen(0), dtype=torch.float64)
    g = _gumbel(x.shape, 1)
    ranks = gumbel_ranks_rows(x, 3, tau=0.5, noise=g)
    assert ranks.shape == (5, 7, 3)
    torch.testing.assert_close(ranks.sum(-2), torch.ones(5, 3, dtype=torch.float64))
    torch.testing.assert_close(ranks.sum(-1), gumbel_topk(x, 3, tau=0.5, relaxation="subsets", noise=g))
    hard = gumbel_ranks_rows(x, 3, tau=0.5, hard=True, noise=g)
    order = (x + g).topk(3, -1).indices
    expected = torch.nn.functional.one_hot(order, 7).transpose(-1, -2).to(x.dtype)
    assert torch.equal(hard, expected)
    # noise=False uses the scores themselves; the generator draws reproducibly
    torch.testing.assert_close(gumbel_ranks_rows(x, 3, noise=False), gumbel_ranks_rows(x, 3, noise=torch.zeros_like(x)))
    assert torch.equal(gumbel_ranks_rows(x, 3, generator=_gen(5)), gumbel_ranks_rows(x, 3, generator=_gen(5)))
    # the rows kernel does not validate: the ranks operator refuses a mask-only relaxation
    with pytest.raises(ValueError, match=_match("'lapsum' gives a mask only", "relaxation='subsets'")):
        softtopk.soft_topk_ranks(x, 3, method="gumbel", relaxation="lapsum")


def test_lapsum_is_lapsum_mask_of_keys():
    from softtopk.ops.lapsum import lapsum_mask

    x = torch.randn(4, 9, generator=_gen(0), dtype=torch.float64)
    g = _gumbel(x.shape, 1)
    torch.testing.assert_close(gumbel_topk(x, 3, tau=0.7, noise=g), lapsum_mask(x + g, 3, 0.7))


@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_small_tau_gives_hard_topk_of_keys(relaxation):
    x = torch.randn(32, 12, generator=_gen(0), dtype=torch.float64)
    g = _gumbel(x.shape, 1)
    for k in (1, 4, 11):
        y = gumbel_topk(x, k, tau=1e-5, relaxation=relaxation, noise=g)
        # rows whose k-th and (k+1)-th keys are 1e-3 = 100 tau apart or more are hard to ~e^-100
        top = (x + g).topk(k + 1, -1).values
        apart = top[:, k - 1] - top[:, k] > 1e-3
        assert apart.sum() > 25
        torch.testing.assert_close(y[apart], _hard(x + g, k)[apart], atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------------- hard mode


@pytest.mark.parametrize("relaxation", RELAXATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hard_is_khot_of_keys_with_straight_through_gradient(relaxation, dtype):
    x = (2 * torch.randn(8, 10, generator=_gen(0), dtype=dtype)).requires_grad_()
    g = _gumbel(x.shape, 1, dtype)
    w = torch.randn(8, 10, generator=_gen(2), dtype=dtype)
    hard = gumbel_topk(x, 4, tau=2.0, hard=True, relaxation=relaxation, noise=g)
    assert torch.equal(hard.detach(), _hard(x.detach() + g, 4))  # of the keys, bitwise exact
    (grad_hard,) = torch.autograd.grad((w * hard).sum(), x)
    soft = gumbel_topk(x, 4, tau=2.0, relaxation=relaxation, noise=g)
    (grad_soft,) = torch.autograd.grad((w * soft).sum(), x)
    torch.testing.assert_close(grad_hard, grad_soft)
    assert grad_soft.abs().max() > 0


def test_hard_differs_from_topk_of_relaxed_subsets_khot():
    # the seed took the top-k of the relaxed khot; the sample is the top-k of the keys. The subsets
    # khot does not preserve the keys' order: here item 5 (4th largest key) gets the 2nd largest mass
    x = torch.tensor([0.97, -3.85, -1.24, -3.34, -1.18, -1.36], dtype=torch.float64)
    soft = gumbel_topk(x, 3, tau=0.1, relaxation="subsets", noise=False)
    assert set(soft.topk(3).indices.tolist()) == {0, 4, 5}
    hard = gumbel_topk(x, 3, tau=0.1, hard=True, relaxation="subsets", noise=False)
    assert torch.equal(hard, torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], dtype=torch.float64))


def test_hard_sample_frequencies_match_sampling_without_replacement():
    """Chi-square goodness of fit of the k = 2 subsets of n = 4 items (fixed seed; probabilistic).

    Exact probabilities by enumerating draw orders: P({i, j}) = p_i p_j / (1 - p_i) + p_j p_i / (1 - p_j)
    with p = softmax(x). 5 degrees of freedom; 20.515 is the 0.999 quantile of chi-square(5).
    """
    x = torch.tensor([1.0, 0.5, 0.0, -1.0], dtype=torch.float64)
    draws = 20000
    p = torch.softmax(x, 0)
    pairs = list(itertools.combinations(range(4), 2))
    expected = torch.tensor([sum(p[a] * p[b] / (1 - p[a]) for a, b in (pair, pair[::-1])) for pair in pairs])
    assert math.isclose(float(expected.sum()), 1.0, rel_tol=1e-12)
    for relaxation in RELAXATIONS:
        y = gumbel_topk(x.expand(draws, 4), 2, hard=True, relaxation=relaxation, generator=_gen(2019))
        codes = (y * torch.tensor([1, 2, 4, 8], dtype=y.dtype)).sum(-1).long()
        observed = torch.tensor([float((codes == (1 << a) + (1 << b)).sum()) for a, b in pairs])
        assert observed.sum() == draws
        chi2 = float(((observed - draws * expected) ** 2 / (draws * expected)).sum())
        assert chi2 < 20.515, (relaxation, chi2)


# ------------------------------------------------------------------------------ randomness, shapes


def test_seeded_generator_reproducible():
    x = torch.randn(3, 50, generator=_gen(0))
    for relaxation in RELAXATIONS:
        a = gumbel_topk(x, 5, relaxation=relaxation, generator=_gen(7))
        b = gumbel_topk(x, 5, relaxation=relaxation, generator=_gen(7))
        c = gumbel_topk(x, 5, relaxation=relaxation, generator=_gen(8))
        assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(11)
    a = gumbel_topk(x, 5)
    torch.manual_seed(11)
    assert torch.equal(a, gumbel_topk(x, 5))
    # noise=False is deterministic; an injected noise tensor ignores the generator
    assert torch.equal(gumbel_topk(x, 5, noise=False), gumbel_topk(x, 5, noise=torch.zeros_like(x)))
    g = torch.randn(x.shape, generator=_gen(1))
    assert torch.equal(gumbel_topk(x, 5, noise=g, generator=_gen(1)), gumbel_topk(x, 5, noise=g, generator=_gen(2)))


@st.composite
def _problems(draw, max_dims: int = 3):
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=max_dims))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    k = draw(st.integers(1, shape[dim]))
    seed = draw(st.integers(0, 2**16))
    x = torch.randn(shape, generator=_gen(seed), dtype=torch.float64)
    return x, k, dim, _gumbel(shape, seed + 1)


@FEW
@given(_problems(), st.sampled_from(RELAXATIONS), st.booleans())
def test_any_shape_and_dim(problem, relaxation, hard):
    x, k, dim, g = problem
    y = gumbel_topk(x, k, dim=dim, relaxation=relaxation, hard=hard, noise=g)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y.sum(dim), torch.full_like(y.sum(dim), float(k)))
    moved = gumbel_topk(x.movedim(dim, -1), k, relaxation=relaxation, hard=hard, noise=g.movedim(dim, -1))
    torch.testing.assert_close(y, moved.movedim(-1, dim))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_dtypes(dtype, relaxation):
    x = torch.randn(4, 16, generator=_gen(0)).to(dtype).requires_grad_()
    y = gumbel_topk(x, 3, relaxation=relaxation, generator=_gen(1))
    assert y.dtype == dtype
    torch.testing.assert_close(y.float().sum(-1), torch.full((4,), 3.0), atol=0.05, rtol=0)
    y.float().pow(2).sum().backward()
    assert x.grad.dtype == dtype and torch.isfinite(x.grad.float()).all()


@pytest.mark.parametrize("relaxation", RELAXATIONS)
def test_gradcheck(relaxation):
    g = _gumbel((3, 6), 1)
    for tau, k in [(1.0, 2), (0.5, 3), (2.0, 5)]:
        x = torch.randn(3, 6, generator=_gen(k), dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda v, k=k, tau=tau: gumbel_topk(v, k, tau=tau, relaxation=relaxation, noise=g), (x,)
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("relaxation", RELAXATIONS)
@pytest.mark.parametrize("scale", [1e-6, 1e-3, 1.0, 1e3, 1e6])
def test_no_nan_or_inf_at_extreme_scales(relaxation, scale, dtype):
    x = (scale * torch.randn(8, 30, generator=_gen(0), dtype=dtype)).requires_grad_()
    w = torch.randn(8, 30, generator=_gen(1), dtype=dtype)
    for tau in (1e-3, 1.0, 1e3):
        for hard in (False, True):
            y = gumbel_topk(x, 6, tau=tau, hard=hard, relaxation=relaxation, generator=_gen(2))
            assert torch.isfinite(y).all()
            torch.testing.assert_close(y.sum(-1), torch.full((8,), 6.0, dtype=dtype), rtol=1e-4, atol=1e-4)
            (grad,) = torch.autograd.grad((w * y).sum(), x)
            assert torch.isfinite(grad).all(), (tau, hard)


# ------------------------------------------------------------------------------------------ errors


def test_errors():
    x = torch.randn(2, 5)
    with pytest.raises(TypeError, match=_match("x must be a torch.Tensor")):
        gumbel_topk([1.0, 2.0], 1)
    with pytest.raises(ValueError, match=_match("k must satisfy 1 <= k <= n = 5", "got 0")):
        gumbel_topk(x, 0)
    with pytest.raises(ValueError, match=_match("k must satisfy 1 <= k <= n = 5", "got 6")):
        gumbel_topk(x, 6)
    with pytest.raises(TypeError, match=_match("k must be an int", "True")):
        gumbel_topk(x, True)
    with pytest.raises(ValueError, match=_match("dim must be in [-2, 1]", "got 2")):
        gumbel_topk(x, 1, dim=2)
    for tau in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=_match("tau must be a positive finite number", repr(tau))):
            gumbel_topk(x, 1, tau=tau)
    with pytest.raises(TypeError, match=_match("tau must be a real number", "'1'")):
        gumbel_topk(x, 1, tau="1")
    with pytest.raises(TypeError, match=_match("hard must be a bool", "int 1")):
        gumbel_topk(x, 1, hard=1)
    with pytest.raises(ValueError, match=_match("relaxation must be one of ('lapsum', 'subsets')", "'sparse'")):
        gumbel_topk(x, 1, relaxation="sparse")
    with pytest.raises(TypeError, match=_match("noise must be a floating torch.Tensor", "str")):
        gumbel_topk(x, 1, noise="gumbel")
    with pytest.raises(TypeError, match=_match("noise must be a floating torch.Tensor", "torch.int64")):
        gumbel_topk(x, 1, noise=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=_match("noise must have shape (2, 5), got (5,)")):
        gumbel_topk(x, 1, noise=torch.zeros(5))
    with pytest.raises(TypeError, match=_match("generator must be a torch.Generator or None", "int 0")):
        gumbel_topk(x, 1, generator=0)


def test_registry_checks():
    from softtopk._registry import _REGISTRY

    checks = _REGISTRY["gumbel"].checks
    check_relaxation, check_hard, check_noise_flag = checks["relaxation"], checks["hard"], checks["noise"]

    assert check_relaxation("relaxation", "subsets") == "subsets" and check_hard("hard", True) is True
    assert check_noise_flag("noise", False) is False
    with pytest.raises(ValueError, match=_match("relaxation must be one of", "None")):
        check_relaxation("relaxation", None)
    with pytest.raises(TypeError, match=_match("noise must be a bool", "Tensor")):
        check_noise_flag("noise", torch.zeros(1))
    with pytest.raises(TypeError, match=_match("hard must be a bool", "str 'no'")):
        check_hard("hard", "no")
