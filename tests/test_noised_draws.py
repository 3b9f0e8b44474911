"""The noised losses' own draws on CPU rows (``softtopk.ops.noised_numba.kth_of_fresh_draws``): the
law of each draw's (k+1)-th largest noisy score, and of its class, is the torch path's (every score
plus a Gaussian); ties, infinities, NaN, extreme scales, seeds, and the losses that use it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from softtopk.ops import compute, isotonic_numba, noised_numba, triton_gate

pytestmark = pytest.mark.skipif(
    not isotonic_numba.available(), reason="numba is not installed, so there is no kernel to test (pip install numba)"
)

INF, NAN = float("inf"), float("nan")
DRAWS = 4000  # per row; a two-sample KS distance above _KS_LIMIT has a chance below 1e-5 under one law
_KS_LIMIT = math.sqrt(-math.log(0.5e-5) / 2) * math.sqrt(2 / DRAWS)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _fresh(x, epsilon, kth, samples=DRAWS, seed=0):
    return noised_numba.kth_of_fresh_draws(x, noised_numba.FreshDraws(epsilon, samples, seed), kth)


def _reference(x, epsilon, kth, samples=DRAWS, seed=1):
    """The torch path's draws: every score plus its own Gaussian, then the kth largest."""
    z = torch.randn(*x.shape, samples, generator=_gen(seed), dtype=x.dtype)
    return compute.kth_largest(x.unsqueeze(-1) + epsilon * z, kth, dim=1)


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov distance of the samples ``a`` and ``b``."""
    grid = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a.sort().values, grid, right=True) / a.numel()
    cdf_b = torch.searchsorted(b.sort().values, grid, right=True) / b.numel()
    return (cdf_a - cdf_b).abs().max().item()


def _rows(kind: str, classes: int) -> torch.Tensor:
    gen = _gen(classes)
    if kind == "tied":  # every score equal: the noise alone decides, every class in one tier
        return torch.zeros(2, classes, dtype=torch.float64)
    if kind == "outliers":  # a few far above the rest, which the noise can still reach
        x = 0.2 * torch.randn(2, classes, generator=gen, dtype=torch.float64)
        x[:, :3] += 2.5
        return x
    return float(kind) * torch.randn(2, classes, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize(
    ("kind", "classes", "kth"),
    [("0.1", 1000, 6), ("1", 1000, 6), ("10", 1000, 2), ("1", 50, 3), ("1", 3000, 101), ("tied", 400, 4)]
    + [("outliers", 1000, 5), ("3", 200, 1)],
)
def test_the_law_of_the_draws_is_the_torch_paths(kind, classes, kth):
    """Short rows (drawn whole), long ones (drawn by tiers), a large k, all scores tied: the kth
    largest noisy score and its class have the law of the torch path's draws."""
    x = _rows(kind, classes)
    got, got_idx = _fresh(x, 1.0, kth)
    want, want_idx = _reference(x, 1.0, kth)
    for r in range(x.shape[0]):
        assert _ks(got[r], want[r]) < _KS_LIMIT
        freq_got = torch.bincount(got_idx[r], minlength=classes) / DRAWS
        freq_want = torch.bincount(want_idx[r], minlength=classes) / DRAWS
        spread = ((freq_got + freq_want) / 2 * (1 - (freq_got + freq_want) / 2) * 2 / DRAWS).sqrt()
        assert ((freq_got - freq_want).abs() <= 6 * spread + 2 / DRAWS).all()
    assert got.dtype == x.dtype and got_idx.dtype == torch.int64


def test_the_draws_are_the_sum_at_their_class():
    """Each draw is its class's score plus noise of scale epsilon: tiny noise gives the kth largest
    score itself (drawn whole and by tiers)."""
    for classes in (40, 2000):
        x = torch.randn(5, classes, generator=_gen(classes), dtype=torch.float64)
        values, index = _fresh(x, 1e-12, 4, samples=3)
        exact = x.sort(dim=1, descending=True).values[:, 3:4].expand(5, 3)
        torch.testing.assert_close(values, exact, rtol=0, atol=1e-10)
        torch.testing.assert_close(x.gather(1, index), exact, rtol=0, atol=0)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**16),
    st.integers(2, 300),
    st.integers(1, 8),
    st.sampled_from([1e-6, 1.0, 1e6]),
    st.sampled_from([1e-6, 0.5, 1e6]),
)
def test_finite_rows_give_finite_draws_in_range(seed, classes, kth, scale, epsilon):
    kth = min(kth, classes)
    x = scale * torch.randn(3, classes, generator=_gen(seed))
    values, index = _fresh(x, epsilon, kth, samples=4, seed=seed)
    assert values.isfinite().all() and ((index >= 0) & (index < classes)).all()
    # the kth largest of the noisy row is at least the kth largest score's own noisy value, in law:
    # here, at most the largest score plus many noise scales
    assert (values <= x.max(dim=1, keepdim=True).values + 40 * epsilon).all()


def test_infinities_and_nan_rank_as_topk_ranks_them():
    """Rows with ±inf or NaN draw every sum and rank them as ``topk`` does (NaN first)."""
    x = torch.tensor(
        [
            [1.0, NAN, 0.0, 2.0] * 10,  # NaN ranks first: the 10 NaN are the 10 largest
            [INF, 1.0, INF, 0.0] * 10,  # 20 of +inf
            [-INF] * 37 + [1.0, 2.0, 3.0],  # three finite scores, then -inf
        ]
    )
    values, index = _fresh(x, 1.0, 4, samples=6)
    assert values[0].isnan().all() and x[0, index[0]].isnan().all()
    assert (values[1] == INF).all() and (x[1, index[1]] == INF).all()
    assert (values[2] == -INF).all() and (index[2] < 37).all()
    finite, _ = _fresh(x[2:], 1.0, 3, samples=6)
    assert finite.isfinite().all()


def test_seeds_and_rows():
    x = torch.randn(4, 500, generator=_gen(2))
    a, b, c = _fresh(x, 1.0, 3, samples=5), _fresh(x, 1.0, 3, samples=5), _fresh(x, 1.0, 3, samples=5, seed=1)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    assert not torch.equal(a[0][0], a[0][1])  # each row its own stream
    assert torch.equal(_fresh(x[:2], 1.0, 3, samples=5)[0], a[0][:2])  # a row's stream is its index's


def test_the_losses_draw_in_the_kernel(monkeypatch):
    """On CPU rows the losses' own draws are the kernel's (one seed from the generator); the
    caller's noise, ``epsilon = 0`` and the torch path keep the drawn tensor."""
    calls = []
    kernel = noised_numba.kth_of_fresh_draws
    monkeypatch.setattr(noised_numba, "kth_of_fresh_draws", lambda *a: calls.append(a[1]) or kernel(*a))
    x, y = torch.randn(6, 300, generator=_gen(4)), torch.arange(6)
    gen = _gen(5)
    softtopk.bal_noised_topk(x, y, k=3, epsilon=0.5, n_samples=7, generator=gen)
    softtopk.imbal_noised_topk(x, y, k=3, epsilon=0.5, max_m=0.2, cls_num_list=[1.0] * 300)
    assert [(c.epsilon, c.samples) for c in calls] == [(0.5, 7), (0.5, 5)]
    assert calls[0].seed == torch.randint(2**63 - 1, (), generator=_gen(5)).item()
    assert gen.initial_seed() == 5 and not torch.equal(gen.get_state(), _gen(5).get_state())  # advanced
    softtopk.bal_noised_topk(x, y, k=3, epsilon=0.5, noise=torch.randn(6, 300, 5))
    softtopk.bal_noised_topk(x, y, k=3, epsilon=0.0)
    with triton_gate.torch_path():
        softtopk.bal_noised_topk(x, y, k=3, epsilon=0.5)
    assert len(calls) == 2


def test_gradcheck_with_a_seeded_generator():
    """The kernel's draws do not move with an infinitesimal change of the scores (only its
    comparisons split the classes), so a seeded loss is piecewise linear there."""
    x = torch.randn(4, 200, generator=_gen(6), dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 5, 9, 100])

    def loss(s):
        return softtopk.bal_noised_topk(s, y, k=2, epsilon=0.3, generator=_gen(3), reduction="none")

    assert torch.autograd.gradcheck(loss, (x,), eps=1e-7, atol=1e-6)


def test_the_losses_expected_value_is_the_torch_paths():
    """The loss averaged over many calls equals the torch path's average (its law, not its draws)."""
    x, y = 0.5 * torch.randn(4, 800, generator=_gen(8), dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    x[:, :4] += 1.5  # labels near the top: the hinge is active on some draws only
    kernel = softtopk.bal_noised_topk(x, y, k=3, epsilon=1.0, n_samples=4000, generator=_gen(1), reduction="none")
    with triton_gate.torch_path():
        torch_path = softtopk.bal_noised_topk(
            x, y, k=3, epsilon=1.0, n_samples=4000, generator=_gen(2), reduction="none"
        )
    torch.testing.assert_close(kernel, torch_path, rtol=0, atol=0.03)


def _one_sample_ks(sample: torch.Tensor, cdf) -> float:
    ordered = sample.sort().values
    n = ordered.numel()
    fitted = cdf(ordered)
    steps = torch.arange(1, n + 1, dtype=torch.float64) / n
    return max((steps - fitted).abs().max().item(), (fitted - (steps - 1 / n)).abs().max().item())


def test_the_kernels_gaussians():
    """The kernels' standard Gaussian (ziggurat) and Gaussian above ``a`` (rejection below 0.75, an
    exponential proposal above) against their CDFs; uniforms in ``(0, 1]``."""
    import numpy as np

    from softtopk.ops import random_kernels

    state = np.empty(4, np.uint64)
    random_kernels.seed(state, np.uint64(3), np.uint64(0))
    n = 20000
    limit = math.sqrt(-math.log(0.5e-5) / 2) / math.sqrt(n)  # chance below 1e-5 under the law
    z = torch.tensor([random_kernels.normal(state) for _ in range(n)], dtype=torch.float64)
    assert _one_sample_ks(z, torch.special.ndtr) < limit
    for a in (-INF, -1.0, 0.5, 0.8, 2.0, 6.0):
        tail = torch.tensor([random_kernels.normal_above(state, a) for _ in range(n)], dtype=torch.float64)
        assert (tail > a).all()
        upper = 0.5 * math.erfc(a / math.sqrt(2))
        assert _one_sample_ks(tail, lambda t, a=a, upper=upper: 1 - 0.5 * torch.erfc(t / math.sqrt(2)) / upper) < limit
        assert random_kernels.upper_tail(a) == pytest.approx(upper, rel=1e-12)
    u = torch.tensor([random_kernels.uniform(state) for _ in range(n)], dtype=torch.float64)
    assert (u > 0).all() and (u <= 1).all() and _one_sample_ks(u, lambda t: t) < limit


@pytest.mark.parametrize(("dim", "largest"), [(-1, True), (0, True), (1, False)])
def test_noised_kth_value_draws_in_the_kernel(monkeypatch, dim, largest):
    """``noised_kth_value`` on CPU rows: the kernel's draws along ``dim`` (``largest=False`` on the
    negated rows), with the torch path's expected value; the output in the input's dtype."""
    calls = []
    kernel = noised_numba.kth_of_fresh_draws
    monkeypatch.setattr(noised_numba, "kth_of_fresh_draws", lambda *a: calls.append(a[0].shape) or kernel(*a))
    x = torch.randn(4, 30, 5, generator=_gen(9), dtype=torch.float64)
    kw = {"epsilon": 0.8, "n_samples": 20000, "dim": dim, "largest": largest}  # means to 0.006 or so
    got = softtopk.noised_kth_value(x, 3, generator=_gen(1), **kw)
    assert calls == [(x.numel() // x.shape[dim], x.shape[dim])]
    with triton_gate.torch_path():
        want = softtopk.noised_kth_value(x, 3, generator=_gen(2), **kw)
    assert got.shape == want.shape and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=0.03)
    half = softtopk.noised_kth_value(x.half(), 3, epsilon=0.8, dim=dim, largest=largest, generator=_gen(1))
    assert half.dtype == torch.float16 and len(calls) == 2


def test_noised_kth_value_gradients_with_a_seeded_generator():
    x = torch.randn(3, 7, 50, generator=_gen(4), dtype=torch.float64, requires_grad=True)

    def kth(s):
        return softtopk.noised_kth_value(s, 4, epsilon=0.5, dim=2, largest=False, generator=_gen(3))

    assert torch.autograd.gradcheck(kth, (x,), eps=1e-7, atol=1e-6)
    kth(x).sum().backward()  # each output's gradient: S one-hots of 1/S, on its own row
    torch.testing.assert_close(x.grad.sum(2), torch.ones(3, 7, dtype=torch.float64))


def test_a_short_row_draws_one_gaussian_per_class_in_order():
    """A short row's draws are exactly its stream's Gaussians, one per class in order, per draw:
    nothing else consumes the stream (an empty tier drew a uniform or not from an unset bound,
    so the values depended on leftover memory)."""
    import numpy as np

    from softtopk.ops import random_kernels

    x = torch.randn(3, 9, generator=_gen(11), dtype=torch.float64)
    values, index = _fresh(x, 0.7, 2, samples=4, seed=5)
    state = np.empty(4, np.uint64)
    for r in range(3):
        random_kernels.seed(state, np.uint64(5), np.uint64(r))
        for s in range(4):
            sums = torch.tensor(
                [x[r, c].item() + 0.7 * random_kernels.normal(state) for c in range(9)], dtype=torch.float64
            )
            want, at = sums.topk(2)
            assert values[r, s].item() == want[1].item() and index[r, s].item() == at[1].item()
