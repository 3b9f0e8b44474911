"""Operator tests for ``soft_topk``, ``soft_topk_ranks`` and ``soft_permutation``.

Every ranks-capable method (and, for sorting networks, every comparator distribution) is checked
for: exact float64 gradients (``gradcheck``), agreement with independent dense reference
implementations written here from REFERENCE.md §1.2/§1.4/§1.6, the structural properties of the
outputs (hypothesis), the hard limit, straight-through ``hard=True``, permutation equivariance,
``dim``/batch handling, dtypes, devices and degenerate shapes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from conftest import (
    DISTRIBUTIONS,
    EQUIVARIANT_METHODS,
    NETWORK_TYPES,
    RANK_METHODS,
    hard_topk_ranks,
    method_params,
)
from softtopk.ops.networks import build_network
from softtopk.ops.sorting_networks import network_label_ranks

# (method, distribution) pairs: every network × every distribution, plus the softmax relaxations.
METHOD_CASES = [(m, d) for m in NETWORK_TYPES for d in DISTRIBUTIONS] + [
    (m, None) for m in RANK_METHODS if m not in NETWORK_TYPES
]
CASE_IDS = [m if d is None else f"{m}-{d}" for m, d in METHOD_CASES]
SORTING_METHODS = ("bitonic", "odd_even", "neuralsort", "softsort")  # permutation[..., :k] == ranks
PROPERTY = settings(max_examples=25, deadline=None, derandomize=True)


def params_for(method: str, distribution: str | None, *, sharp: bool = False) -> dict:
    return method_params(method, sharp=sharp, distribution=distribution or "cauchy")


def separated_inputs(rows: int, n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """Rows of a shuffled grid with spacing 0.7 plus small jitter: no ties, far from kinks."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.stack([torch.randperm(n, generator=g) for _ in range(rows)]).to(dtype) * 0.7
    return grid + 0.1 * torch.rand(rows, n, generator=g, dtype=dtype) - 0.3 * (n - 1)


def test_method_matrix_is_complete():
    """The parametrisation covers every ranks-capable method and every distribution."""
    assert set(RANK_METHODS) == set(NETWORK_TYPES) | set(EQUIVARIANT_METHODS)
    assert len(METHOD_CASES) == len(NETWORK_TYPES) * len(DISTRIBUTIONS) + len(EQUIVARIANT_METHODS)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, distribution", METHOD_CASES, ids=CASE_IDS)
def test_gradcheck_float64(method, distribution):
    """Analytic and finite-difference gradients agree (float64) for mask and ranks, n = 6, k = 2.

    Inputs are tie-free (NeuralSort/SoftSort are not differentiable at ties)."""
    params = params_for(method, distribution)
    x = separated_inputs(2, 6, seed=len(method)).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: softtopk.soft_topk(t, 2, method=method, **params), (x,))
    assert torch.autograd.gradcheck(lambda t: softtopk.soft_topk_ranks(t, 2, method=method, **params), (x,))


# --------------------------------------------------------------------------------------------
# Independent dense references
# --------------------------------------------------------------------------------------------


def reference_swap(d: torch.Tensor, distribution: str, steepness: float, art_lambda: float) -> torch.Tensor:
    """α = f(d) written from REFERENCE.md §1.2 (logistic_phi with softtopk's smoothed |d|)."""
    v = steepness * d
    if distribution == "logistic":
        return torch.sigmoid(v)
    if distribution == "logistic_phi":
        return torch.sigmoid(v / torch.sqrt(d**2 + 1e-6) ** art_lambda)
    if distribution == "gaussian":
        return 0.5 + 0.5 * torch.erf(v / math.sqrt(2.0))
    if distribution == "reciprocal":
        return 0.5 * (v / (2 + v.abs()) + 1)
    if distribution == "cauchy":
        return torch.atan(v) / math.pi + 0.5
    if distribution == "optimal":
        safe = torch.where(v.abs() > 0.25, v, torch.ones_like(v))
        return torch.where(v > 0.25, 1 - 1 / (16 * safe), torch.where(v < -0.25, -1 / (16 * safe), v + 0.5))
    raise AssertionError(distribution)


def reference_network_ranks(x: torch.Tensor, kind: str, k: int, **params) -> torch.Tensor:
    """Dense diffsort-style forward sweep (REFERENCE.md §1.4): X starts as I_n (rows = inputs,
    columns = wires); each comparator mixes its two columns with the local [[α, 1-α], [1-α, α]]."""
    n = x.shape[-1]
    net = build_network(kind, n, k if kind == "splitter_selection" else n)
    values = x.clone()
    mixing = torch.eye(n, dtype=x.dtype).expand(x.shape[0], n, n).clone()
    for layer in net.layers:
        for hi, lo in layer:
            a, b = values[:, hi].clone(), values[:, lo].clone()
            alpha = reference_swap(a - b, **params)
            values[:, hi], values[:, lo] = alpha * a + (1 - alpha) * b, (1 - alpha) * a + alpha * b
            ca, cb = mixing[:, :, hi].clone(), mixing[:, :, lo].clone()
            mixing[:, :, hi] = alpha[:, None] * ca + (1 - alpha[:, None]) * cb
            mixing[:, :, lo] = (1 - alpha[:, None]) * ca + alpha[:, None] * cb
    return mixing[:, :, list(net.out_wires[:k])]


def reference_neuralsort(x: torch.Tensor, k: int, tau: float) -> torch.Tensor:
    """O(n²) NeuralSort (REFERENCE.md §1.6) in descending rank order."""
    n = x.shape[-1]
    a = (x.unsqueeze(-1) - x.unsqueeze(-2)).abs().sum(-1)
    coefficient = n - 1 - 2 * torch.arange(k, dtype=x.dtype)
    return torch.softmax((x.unsqueeze(-1) * coefficient - a.unsqueeze(-1)) / tau, dim=-2)


def reference_softsort(x: torch.Tensor, k: int, tau: float, power: float) -> torch.Tensor:
    top = torch.sort(x, dim=-1, descending=True).values[..., :k]
    return torch.softmax(-((x.unsqueeze(-1) - top.unsqueeze(-2)).abs() ** power) / tau, dim=-2)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("kind", NETWORK_TYPES)
def test_network_ranks_match_dense_reference(kind, distribution):
    """The reverse-sweep ranks/mask equal an explicit dense product of the relaxed layers (ties
    included), for every distribution, at two steepnesses and two art_lambdas."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat(
        [
            torch.randn(3, 11, generator=g, dtype=torch.float64) * 2,
            torch.randint(0, 3, (2, 11), generator=g).to(torch.float64),
        ]
    )
    for steepness, art_lambda in [(0.7, 0.25), (9.0, 0.5)]:
        params = {"distribution": distribution, "steepness": steepness, "art_lambda": art_lambda}
        want = reference_network_ranks(x, kind, 4, **params)
        got = softtopk.soft_topk_ranks(x, 4, method=kind, **params)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        torch.testing.assert_close(softtopk.soft_topk(x, 4, method=kind, **params), want.sum(-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", NETWORK_TYPES)
def test_network_label_ranks_are_the_label_rows_of_ranks(kind):
    """The forward-sweep single row (used by the loss) equals ``ranks[b, position[b], :]``."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 13, generator=g, dtype=torch.float64)
    position = torch.randint(0, 13, (6,), generator=g)
    params = {"distribution": "logistic_phi", "steepness": 3.0, "art_lambda": 0.25}
    ranks = softtopk.soft_topk_ranks(x, 5, method=kind, **params)
    got = network_label_ranks(x, position, 5, network=kind, **params)
    torch.testing.assert_close(got, ranks[torch.arange(6), position], rtol=0, atol=1e-12)


def test_neuralsort_and_softsort_match_dense_formulas():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 9, generator=g, dtype=torch.float64) * 3
    for tau in (0.3, 2.0):
        torch.testing.assert_close(
            softtopk.soft_topk_ranks(x, 4, method="neuralsort", tau=tau),
            reference_neuralsort(x, 4, tau),
            rtol=0,
            atol=1e-12,
        )
        for power in (1.0, 2.0):
            torch.testing.assert_close(
                softtopk.soft_topk_ranks(x, 4, method="softsort", tau=tau, power=power),
                reference_softsort(x, 4, tau, power),
                rtol=0,
                atol=1e-12,
            )


# --------------------------------------------------------------------------------------------
# Structural properties (hypothesis)
# --------------------------------------------------------------------------------------------


@st.composite
def method_inputs(draw, method: str):
    """(x (B, n) float32 with possible ties, k, params) for ``method``."""
    n = draw(st.integers(1, 12))
    rows = draw(st.integers(1, 3))
    values = draw(st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=n * rows, max_size=n * rows))
    x = torch.tensor(values, dtype=torch.float32).reshape(rows, n)
    k = draw(st.integers(1, n))
    if method in NETWORK_TYPES:
        params = {
            "distribution": draw(st.sampled_from(DISTRIBUTIONS)),
            "steepness": draw(st.floats(0.1, 100)),
            "art_lambda": draw(st.floats(0, 0.9)),
        }
    else:
        params = {"tau": draw(st.floats(0.05, 10))}
        if method == "softsort":
            params["power"] = draw(st.sampled_from([1.0, 1.5, 2.0]))
    return x, k, params


@pytest.mark.parametrize("method", RANK_METHODS)
def test_mask_bounds_and_sum(method):
    """Masks sum to k (1e-4, float32); networks' masks lie in [0, 1], NeuralSort/SoftSort's are
    >= 0 only (an item's weights over ranks may exceed 1, as ``softtopk.methods()`` documents)."""

    @PROPERTY
    @given(method_inputs(method))
    def check(case):
        x, k, params = case
        mask = softtopk.soft_topk(x, k, method=method, **params)
        assert mask.shape == x.shape and mask.dtype == x.dtype
        torch.testing.assert_close(mask.sum(-1), torch.full((x.shape[0],), float(k)), rtol=0, atol=1e-4)
        assert mask.min() >= -1e-6
        if method in NETWORK_TYPES:
            assert mask.max() <= 1 + 1e-6

    check()


@pytest.mark.parametrize("method", RANK_METHODS)
def test_rank_columns_sum_to_one_and_rows_give_the_mask(method):
    @PROPERTY
    @given(method_inputs(method))
    def check(case):
        x, k, params = case
        ranks = softtopk.soft_topk_ranks(x, k, method=method, **params)
        assert ranks.shape == x.shape + (k,)
        assert ranks.min() >= -1e-6
        torch.testing.assert_close(ranks.sum(-2), torch.ones(x.shape[0], k), rtol=0, atol=1e-5)
        mask = softtopk.soft_topk(x, k, method=method, **params)
        if k < x.shape[-1]:
            torch.testing.assert_close(ranks.sum(-1), mask, rtol=0, atol=1e-5)
        else:  # a row with at most k entries selects all of them (an item's rank weights need not sum to 1)
            torch.testing.assert_close(mask, torch.ones_like(mask), rtol=0, atol=0)

    check()


@pytest.mark.parametrize("method", RANK_METHODS)
def test_soft_permutation_is_stochastic(method):
    """Columns (ranks) always sum to 1; for networks rows sum to 1 too (doubly stochastic).
    For full sorters and NeuralSort/SoftSort the first k columns are ``soft_topk_ranks``."""

    @PROPERTY
    @given(method_inputs(method))
    def check(case):
        x, k, params = case
        n = x.shape[-1]
        perm = softtopk.soft_permutation(x, method=method, **params)
        assert perm.shape == x.shape + (n,)
        assert perm.min() >= -1e-6
        torch.testing.assert_close(perm.sum(-2), torch.ones_like(x), rtol=0, atol=1e-5)
        if method in NETWORK_TYPES:
            torch.testing.assert_close(perm.sum(-1), torch.ones_like(x), rtol=0, atol=1e-5)
            assert perm.max() <= 1 + 1e-6
        if method in SORTING_METHODS:
            ranks = softtopk.soft_topk_ranks(x, k, method=method, **params)
            torch.testing.assert_close(perm[..., :k], ranks, rtol=0, atol=1e-6)

    check()


def test_softmax_relaxations_can_exceed_one_per_item():
    """Documents why the upper bound is only checked for networks: NeuralSort's mask exceeds 1."""
    mask = softtopk.soft_topk(torch.tensor([0.0, 1.0, 2.0, 3.0]), 3, method="neuralsort", tau=1.0)
    assert mask[2] > 1.04  # measured 1.0452
    assert "exceed 1" in softtopk.methods()["neuralsort"].summary


# --------------------------------------------------------------------------------------------
# Hard limits
# --------------------------------------------------------------------------------------------


@st.composite
def distinct_inputs(draw):
    """1-3 rows of 1..12 distinct values in [-1, 1] on a 1e-3 grid (gap >= 1e-3 of the range)."""
    n = draw(st.integers(1, 12))
    rows = [
        draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n, unique=True))
        for _ in range(draw(st.integers(1, 3)))
    ]
    return torch.tensor(rows, dtype=torch.float32) / 1000, draw(st.integers(1, n))


@pytest.mark.parametrize("method, distribution", METHOD_CASES, ids=CASE_IDS)
def test_sharp_parameters_give_hard_topk(method, distribution):
    """Sharp parameters reproduce ``torch.topk``'s one-hot ranks (to 1e-3) on distinct values."""
    params = params_for(method, distribution, sharp=True)

    @settings(max_examples=15, deadline=None, derandomize=True)
    @given(distinct_inputs())
    def check(case):
        x, k = case
        want = hard_topk_ranks(x, k)
        torch.testing.assert_close(softtopk.soft_topk_ranks(x, k, method=method, **params), want, rtol=0, atol=1e-3)
        torch.testing.assert_close(softtopk.soft_topk(x, k, method=method, **params), want.sum(-1), rtol=0, atol=1e-3)

    check()


@pytest.mark.parametrize("n", [22, 38, 45, 100])
@pytest.mark.parametrize("kind", NETWORK_TYPES)
def test_sharp_networks_select_exactly_at_difftopk_failing_sizes(kind, n):
    """End to end at sizes where difftopk's bitonic network mis-sorts (REFERENCE.md §7.1): sharp
    logistic_phi ranks equal the one-hot top-5 for 64 random permutations."""
    g = torch.Generator().manual_seed(n)
    x = torch.stack([torch.randperm(n, generator=g) for _ in range(64)]).float()
    params = method_params(kind, sharp=True, distribution="logistic_phi")
    torch.testing.assert_close(
        softtopk.soft_topk_ranks(x, 5, method=kind, **params), hard_topk_ranks(x, 5), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("method, distribution", METHOD_CASES, ids=CASE_IDS)
def test_smooth_parameters_are_not_hard(method, distribution):
    """Guards the hard-limit test: at the smooth parameters the same inputs are visibly soft."""
    x = torch.tensor([[0.0, 0.3, 0.1, 0.2]])
    ranks = softtopk.soft_topk_ranks(x, 2, method=method, **params_for(method, distribution))
    assert (ranks - hard_topk_ranks(x, 2)).abs().max() > 0.05


@pytest.mark.parametrize("method", EQUIVARIANT_METHODS)
def test_hard_true_is_one_hot_forward_and_relaxed_backward(method):
    """``hard=True``: forward equals the one-hot top-k exactly; gradient equals the relaxed one."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 8, generator=g)
    cotangent = torch.randn(4, 8, 3, generator=g)
    xh, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    hard = softtopk.soft_topk_ranks(xh, 3, method=method, tau=0.5, hard=True)
    soft = softtopk.soft_topk_ranks(xs, 3, method=method, tau=0.5, hard=False)
    assert torch.equal(hard, hard_topk_ranks(x, 3))
    assert not torch.equal(soft, hard_topk_ranks(x, 3))
    (hard * cotangent).sum().backward()
    (soft * cotangent).sum().backward()
    assert xh.grad.abs().max() > 0
    torch.testing.assert_close(xh.grad, xs.grad, rtol=1e-6, atol=1e-7)
    mask = softtopk.soft_topk(x, 3, method=method, tau=0.5, hard=True)
    assert torch.equal(mask, hard_topk_ranks(x, 3).sum(-1))


@pytest.mark.parametrize("method", EQUIVARIANT_METHODS)
def test_hard_true_with_ties_is_a_partial_permutation(method):
    x = torch.tensor([[1.0, 1.0, 1.0, 0.0, 2.0]])
    hard = softtopk.soft_topk_ranks(x, 3, method=method, hard=True)
    assert set(hard.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(hard.sum(-2), torch.ones(1, 3))
    assert hard.sum(-1).max() == 1.0
    assert hard[0, 4, 0] == 1.0


# --------------------------------------------------------------------------------------------
# Equivariance
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", EQUIVARIANT_METHODS)
def test_permuting_inputs_permutes_rank_rows_float64(method):
    """ranks(x[π]) == ranks(x)[π] to 1e-6 (float64; values with ties allowed)."""

    @PROPERTY
    @given(method_inputs(method), st.randoms(use_true_random=False))
    def check(case, rnd):
        x, k, params = case
        x = x.double()
        perm = torch.tensor(rnd.sample(range(x.shape[-1]), x.shape[-1]))
        ranks = softtopk.soft_topk_ranks(x, k, method=method, **params)
        permuted = softtopk.soft_topk_ranks(x[:, perm], k, method=method, **params)
        torch.testing.assert_close(permuted, ranks[:, perm], rtol=0, atol=1e-6)

    check()


def test_softsort_is_equivariant_in_float32():
    g = torch.Generator().manual_seed(7)
    for tau in (0.05, 1.0):
        x = torch.randn(64, 12, generator=g) * 3
        perm = torch.randperm(12, generator=g)
        ranks = softtopk.soft_topk_ranks(x, 5, method="softsort", tau=tau)
        torch.testing.assert_close(
            softtopk.soft_topk_ranks(x[:, perm], 5, method="softsort", tau=tau), ranks[:, perm], rtol=0, atol=1e-6
        )


def test_neuralsort_is_equivariant_in_float32():
    """Regression: centring with the unsorted mean rounded differently for permuted rows (error 2.1e-5
    at tau=0.05); the mean of the sorted values is order independent."""
    g = torch.Generator().manual_seed(7)
    for tau in (0.05, 1.0):
        x = torch.randn(64, 12, generator=g) * 3
        perm = torch.randperm(12, generator=g)
        ranks = softtopk.soft_topk_ranks(x, 5, method="neuralsort", tau=tau)
        torch.testing.assert_close(
            softtopk.soft_topk_ranks(x[:, perm], 5, method="neuralsort", tau=tau), ranks[:, perm], rtol=0, atol=1e-6
        )


# --------------------------------------------------------------------------------------------
# dim, batch shapes, dtypes, devices
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", RANK_METHODS)
def test_dim_and_batch_shape(method):
    """(2, 3, n) along -1 equals (2, n, 3) along 1 (moved back), and each row equals its own call."""
    params = method_params(method)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, 7, generator=g)
    moved = x.movedim(-1, 1)
    mask = softtopk.soft_topk(x, 3, method=method, **params)
    ranks = softtopk.soft_topk_ranks(x, 3, method=method, **params)
    perm = softtopk.soft_permutation(x, method=method, **params)
    mask_1 = softtopk.soft_topk(moved, 3, method=method, dim=1, **params)
    ranks_1 = softtopk.soft_topk_ranks(moved, 3, method=method, dim=1, **params)
    perm_1 = softtopk.soft_permutation(moved, method=method, dim=-2, **params)
    assert mask_1.shape == (2, 7, 3) and ranks_1.shape == (2, 7, 3, 3) and perm_1.shape == (2, 7, 3, 7)
    torch.testing.assert_close(mask_1, mask.movedim(-1, 1), rtol=0, atol=0)
    torch.testing.assert_close(ranks_1, ranks.movedim(2, 1), rtol=0, atol=0)
    torch.testing.assert_close(perm_1, perm.movedim(2, 1), rtol=0, atol=0)
    for i in range(2):
        for j in range(3):
            row = softtopk.soft_topk_ranks(x[i, j], 3, method=method, **params)
            torch.testing.assert_close(ranks[i, j], row, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(ranks[0, 0], ranks[0, 1])  # rows really differ


@pytest.mark.parametrize("method", RANK_METHODS)
@pytest.mark.parametrize("shape", [(7,), (1, 7), (0, 7), (2, 0, 7), (2, 1, 3, 7)])
def test_any_leading_shape(method, shape):
    params = method_params(method)
    x = torch.randn(shape, requires_grad=True)
    mask = softtopk.soft_topk(x, 3, method=method, **params)
    ranks = softtopk.soft_topk_ranks(x, 3, method=method, **params)
    perm = softtopk.soft_permutation(x, method=method, **params)
    assert mask.shape == x.shape
    assert ranks.shape == x.shape + (3,)
    assert perm.shape == x.shape + (7,)
    (mask.sum() + ranks.sum() + perm.sum()).backward()
    assert x.grad.shape == x.shape
    if x.numel():
        torch.testing.assert_close(mask.sum(-1), torch.full(shape[:-1], 3.0), rtol=0, atol=1e-4)


@pytest.mark.parametrize("method", NETWORK_TYPES)
def test_single_item_output_stays_in_the_graph(method):
    """n = 1: the mask is the constant 1 with zero gradient; ``backward`` must still work (as for
    ``torch.topk`` and NeuralSort/SoftSort)."""
    x = torch.randn(3, 1, requires_grad=True)
    mask = softtopk.soft_topk(x, 1, method=method)
    mask.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("method", EQUIVARIANT_METHODS)
def test_single_item_softmax_relaxations_are_differentiable(method):
    x = torch.randn(3, 1, requires_grad=True)
    mask = softtopk.soft_topk(x, 1, method=method)
    assert torch.equal(mask, torch.ones(3, 1))
    mask.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("method", RANK_METHODS)
@pytest.mark.parametrize("dtype, atol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
def test_low_precision_inputs_return_their_dtype(method, dtype, atol):
    """float16/bfloat16 in → same dtype out, within rounding of the float32 result on the same
    (rounded) inputs; gradients come back in the input dtype and are finite."""
    params = method_params(method)
    x = (torch.randn(3, 9, generator=torch.Generator().manual_seed(9)) * 2).to(dtype).requires_grad_()
    for fn, args in [(softtopk.soft_topk, (3,)), (softtopk.soft_topk_ranks, (3,)), (softtopk.soft_permutation, ())]:
        out = fn(x, *args, method=method, **params)
        ref = fn(x.detach().float(), *args, method=method, **params)
        assert out.dtype == dtype
        torch.testing.assert_close(out.float(), ref, rtol=0, atol=atol)
        out.float().sum().backward()
        assert x.grad.dtype == dtype and torch.isfinite(x.grad).all()
        x.grad = None


@pytest.mark.parametrize("method", RANK_METHODS)
def test_float64_is_computed_in_float64(method):
    """float64 stays float64 end to end: column sums are exact to 1e-12 (float32 would give ~1e-7)
    and the result differs from the float32 computation."""
    params = method_params(method)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(10), dtype=torch.float64) * 3
    ranks = softtopk.soft_topk_ranks(x, 4, method=method, **params)
    assert ranks.dtype == torch.float64
    torch.testing.assert_close(ranks.sum(-2), torch.ones(5, 4, dtype=torch.float64), rtol=0, atol=1e-12)
    ranks32 = softtopk.soft_topk_ranks(x.float(), 4, method=method, **params)
    assert ranks32.dtype == torch.float32
    assert not torch.equal(ranks, ranks32.double())
    torch.testing.assert_close(ranks, ranks32.double(), rtol=0, atol=1e-5)
    assert softtopk.soft_topk(x, 4, method=method, **params).dtype == torch.float64
    assert softtopk.soft_permutation(x, method=method, **params).dtype == torch.float64


def _devices():
    return ["cpu", "meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("method", RANK_METHODS)
def test_output_device_is_input_device(method, device):
    params = method_params(method)
    x = torch.randn(2, 6, device=device)
    for out in (
        softtopk.soft_topk(x, 2, method=method, **params),
        softtopk.soft_topk_ranks(x, 2, method=method, **params),
        softtopk.soft_permutation(x, method=method, **params),
    ):
        assert out.device == x.device
    if device == "cuda":
        cpu = softtopk.soft_topk_ranks(x.cpu(), 2, method=method, **params)
        torch.testing.assert_close(softtopk.soft_topk_ranks(x, 2, method=method, **params).cpu(), cpu)


@pytest.mark.parametrize("method", RANK_METHODS)
def test_invalid_arguments_raise_clear_errors(method):
    x = torch.randn(2, 5)
    with pytest.raises(ValueError, match="k must satisfy"):
        softtopk.soft_topk(x, 6, method=method)
    with pytest.raises(ValueError, match="dim must be"):
        softtopk.soft_topk(x, 2, method=method, dim=2)
    with pytest.raises(TypeError, match="floating"):
        softtopk.soft_topk(torch.arange(5), 2, method=method)
    with pytest.raises(TypeError, match="unexpected parameter"):
        softtopk.soft_topk(x, 2, method=method, temperature=1.0)


def test_random_inputs_are_not_degenerate():
    """Sanity: the helper generates distinct, well-separated values (min gap >= 0.5)."""
    x = separated_inputs(3, 7, seed=0)
    gaps = np.diff(np.sort(x.numpy(), axis=1), axis=1)
    assert gaps.min() >= 0.5
