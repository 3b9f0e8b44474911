"""softtopk.compat.subsets.SubsetOperator against a naive re-implementation of the original's math
(REFERENCE §4.6: r = s + G; a = 0, khot = 0; k times: r <- r + log max(1 - a, tiny), a = softmax(r / tau)
along dim 1, khot <- khot + a; hard: the k-hot of the top-k of the relaxed khot, straight-through)."""

from __future__ import annotations

import math

import pytest
import torch

from softtopk.compat.subsets import SubsetOperator, SubsetsDKNN
from softtopk.stochastic import gumbel_topk

TINY = torch.finfo(torch.float32).tiny


def naive_subset_operator(scores, noise, k, tau, hard=False):
    """The original's math, written out (CPU, any dtype)."""
    r = scores + noise
    khot = torch.zeros_like(r)
    a = torch.zeros_like(r)
    for _ in range(k):
        r = r + torch.log(torch.clamp(1.0 - a, min=TINY))
        a = torch.softmax(r / tau, dim=1)
        khot = khot + a
    if not hard:
        return khot
    khot_hard = torch.zeros_like(khot).scatter_(1, khot.topk(k, dim=1).indices, 1.0)
    return khot_hard - khot.detach() + khot


def gumbel_draw(scores):
    return torch.distributions.Gumbel(torch.zeros_like(scores), torch.ones_like(scores)).sample()


def _scores(b, n, seed, dtype=torch.float64, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, k", [(2, 1), (2, 2), (5, 3), (10, 1), (10, 4), (20, 9)])
@pytest.mark.parametrize("tau", [0.5, 1.0, 5.0, 64.0])
def test_equals_naive_with_injected_noise(dtype, n, k, tau):
    x = _scores(4, n, n * k, dtype)
    noise = gumbel_draw(x)
    tol = {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    # the reference runs in float64: the original's float32 log(1 - a) loses digits as a -> 1, where
    # softtopk's log-space form stays exact
    xa, xb = x.clone().requires_grad_(), x.double().requires_grad_()
    ours = SubsetOperator(k, tau)(xa, noise=noise)
    # k = n selects every item exactly (docs/compat.md); the original's k softmaxes do not sum to 1 per item
    ref = naive_subset_operator(xb, noise.double(), k, tau) if k < n else (xb * 0 + 1)
    torch.testing.assert_close(ours, ref.to(dtype), **tol)
    w = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (ours * w.to(dtype)).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad.to(dtype), **tol)
    assert ours.dtype == dtype


@pytest.mark.parametrize("hard", [False, True])
def test_same_global_seed_same_noise_as_the_original(hard):
    x = _scores(3, 8, 0, torch.float32)
    torch.manual_seed(5)
    ours = SubsetOperator(3, 0.5, hard)(x)
    after_ours = torch.rand(())
    torch.manual_seed(5)
    ref = naive_subset_operator(x, gumbel_draw(x), 3, 0.5, hard)
    after_ref = torch.rand(())
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(after_ours, after_ref)  # the same RNG consumption


@pytest.mark.parametrize("tau", [0.1, 1.0, 16.0])
def test_sums_to_k_and_nonnegative(tau):
    x = _scores(16, 12, 3, torch.float32, scale=3.0)
    for k in (1, 5, 12):
        out = SubsetOperator(k, tau)(x)
        assert (out >= 0).all()
        torch.testing.assert_close(out.sum(1), torch.full((16,), float(k)), rtol=1e-5, atol=1e-5)


def test_entries_may_exceed_one_as_in_the_original():
    # n = 3, k = 2: the top item keeps ~1 after the first softmax and gains ~1/2 from the second
    x = torch.tensor([[10.0, -10.0, -10.0]], dtype=torch.float64)
    out = SubsetOperator(2, 1.0)(x, noise=False)
    torch.testing.assert_close(out, naive_subset_operator(x, torch.zeros_like(x), 2, 1.0))
    assert out[0, 0] > 1.4


def test_every_item_selected_when_k_is_n():
    x = torch.tensor([[10.0, -10.0]], dtype=torch.float64)
    assert torch.equal(SubsetOperator(2, 1.0)(x, noise=False), torch.ones_like(x))


@pytest.mark.parametrize("k, tau", [(1, 1.0), (3, 0.1), (5, 2.0)])
def test_hard_is_k_hot_with_straight_through_gradient(k, tau):
    x = _scores(6, 9, k, torch.float32)
    noise = gumbel_draw(x)
    xh, xs = x.clone().requires_grad_(), x.clone().requires_grad_()
    hard = SubsetOperator(k, tau, hard=True)(xh, noise=noise)
    soft = SubsetOperator(k, tau)(xs, noise=noise)
    assert set(hard.detach().unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(hard.detach().sum(1), torch.full((6,), float(k)))
    # the original's semantics: the k-hot of the top-k of the relaxed khot
    expected = torch.zeros_like(soft).scatter_(1, soft.detach().topk(k, 1).indices, 1.0)
    assert torch.equal(hard.detach(), expected)
    torch.testing.assert_close(hard, naive_subset_operator(x, noise, k, tau, hard=True), rtol=0, atol=1e-5)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    (hard * w).sum().backward()
    (soft * w).sum().backward()
    torch.testing.assert_close(xh.grad, xs.grad, rtol=0, atol=0)


def test_hard_keeps_seed_semantics_not_the_gumbel_sample():
    # REFERENCE §4.6 / softtopk.ops.gumbel: the keys' top-3 is {0, 4, 2}, the relaxed khot's {0, 5, 4}
    x = torch.tensor([[0.97, -3.85, -1.24, -3.34, -1.18, -1.36]])
    ours = SubsetOperator(3, 0.1, hard=True)(x, noise=False)
    assert ours[0].nonzero().flatten().tolist() == [0, 4, 5]
    sample = gumbel_topk(x, 3, tau=0.1, hard=True, relaxation="subsets", noise=False, dim=1)
    assert sample[0].nonzero().flatten().tolist() == [0, 2, 4]


def test_noise_false_is_deterministic_and_equals_gumbel_topk():
    x = _scores(3, 7, 1)
    a = SubsetOperator(3, 0.7)(x, noise=False)
    assert torch.equal(a, SubsetOperator(3, 0.7)(x, noise=False))
    assert torch.equal(a, gumbel_topk(x, 3, tau=0.7, relaxation="subsets", noise=False, dim=1))


def test_selects_along_dim_1_of_3d_scores():
    x = _scores(2, 6, 0).reshape(2, 3, 2)
    noise = gumbel_draw(x)
    out = SubsetOperator(2, 1.0)(x, noise=noise)
    torch.testing.assert_close(out, naive_subset_operator(x, noise, 2, 1.0))
    torch.testing.assert_close(out.sum(1), torch.full((2, 2), 2.0, dtype=torch.float64))


def test_runs_on_cpu_and_repr():
    op = SubsetOperator(2, tau=0.5, hard=True).cpu()
    out = op(torch.randn(4, 5))
    assert out.device.type == "cpu"
    assert repr(op) == "SubsetOperator(k=2, tau=0.5, hard=True)"
    assert (op.k, op.tau, op.hard) == (2, 0.5, True)


def test_defaults():
    op = SubsetOperator(3)
    assert (op.tau, op.hard) == (1.0, False)


# ------------------------------------------------------------------------------------------ errors


def test_bad_k():
    for k in (0, -2):
        with pytest.raises(ValueError, match="k must be >= 1"):
            SubsetOperator(k)
    for k in (2.0, True):
        with pytest.raises(TypeError, match="k must be an int"):
            SubsetOperator(k)
    with pytest.raises(ValueError, match="k must satisfy 1 <= k <= n = 4"):
        SubsetOperator(5)(torch.randn(2, 4))


def test_bad_tau_and_hard():
    for tau in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="tau must be a positive finite number"):
            SubsetOperator(2, tau)
    with pytest.raises(TypeError, match="hard must be a bool"):
        SubsetOperator(2, 1.0, 1)


def test_bad_scores_and_noise():
    with pytest.raises(ValueError, match="scores must have shape"):
        SubsetOperator(1)(torch.randn(5))
    with pytest.raises(ValueError, match="noise must have shape"):
        SubsetOperator(1)(torch.randn(2, 5), noise=torch.randn(2, 4))


# ------------------------------------------------------------------------------------ SubsetsDKNN


def naive_dknn(query, neighbors, noise, k, tau, hard=False):
    """The original's SubsetsDKNN.forward, written out: scores -||q - c||^2, then the subset operator."""
    scores = -((query.unsqueeze(1) - neighbors.unsqueeze(0)) ** 2).sum(2)
    return naive_subset_operator(scores, noise, k, tau, hard)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("k, tau", [(1, 1.0), (3, 0.5), (9, 5.0)])
def test_dknn_equals_naive_with_injected_noise(k, tau, hard):
    g = torch.Generator().manual_seed(k)
    query = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    neighbors = torch.randn(12, 4, generator=g, dtype=torch.float64, requires_grad=True)
    noise = gumbel_draw(torch.zeros(6, 12, dtype=torch.float64))
    ours = SubsetsDKNN(k, tau, hard=hard)(query, neighbors, noise=noise)
    w = torch.randn(6, 12, generator=g, dtype=torch.float64)
    ours_grads = torch.autograd.grad((ours * w).sum(), (query, neighbors))
    ref = naive_dknn(query, neighbors, noise, k, tau, hard)
    ref_grads = torch.autograd.grad((ref * w).sum(), (query, neighbors))
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)
    for a, b in zip(ours_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.sum(1), torch.full((6,), float(k), dtype=torch.float64))


def test_dknn_same_global_seed_same_noise_as_the_original():
    query, neighbors = torch.randn(5, 3), torch.randn(8, 3)
    torch.manual_seed(7)
    ours = SubsetsDKNN(4, 0.5)(query, neighbors)
    torch.manual_seed(7)
    scores = -((query.unsqueeze(1) - neighbors.unsqueeze(0)) ** 2).sum(2)
    ref = naive_subset_operator(scores.double(), gumbel_draw(scores).double(), 4, 0.5)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=1e-5)


def test_dknn_gradient_pulls_same_label_neighbours_closer():
    """One step of the seed's loss (-sum over same-label neighbours of the relaxed top-k) lowers it."""
    g = torch.Generator().manual_seed(0)
    query = torch.randn(4, 2, generator=g, dtype=torch.float64)
    neighbors = torch.randn(10, 2, generator=g, dtype=torch.float64, requires_grad=True)
    same = (torch.arange(10) % 2 == 0).double().expand(4, 10)
    noise = gumbel_draw(torch.zeros(4, 10, dtype=torch.float64))
    layer = SubsetsDKNN(3, 1.0)
    loss = -(same * layer(query, neighbors, noise=noise)).sum()
    (grad,) = torch.autograd.grad(loss, neighbors)
    stepped = -(same * layer(query, neighbors.detach() - 0.05 * grad, noise=noise)).sum()
    assert stepped < loss


def test_dknn_defaults_repr_and_unused_arguments():
    layer = SubsetsDKNN(2)
    assert (layer.k, layer.num_samples, layer.subset_sample.tau, layer.subset_sample.hard) == (2, -1, 1.0, False)
    assert "k=2" in repr(layer) and "SubsetOperator" in repr(layer)
    query, neighbors = torch.randn(2, 3), torch.randn(5, 3)
    # forward's tau is unused, as in the original
    torch.testing.assert_close(layer(query, neighbors, 0.01, noise=False), layer(query, neighbors, noise=False))


@pytest.mark.parametrize(
    "query, neighbors, match",
    [
        (torch.randn(3), torch.randn(5, 3), r"query must have shape \(Q, d\)"),
        (torch.randn(2, 3), torch.randn(5, 4), "query and neighbors must have the same feature size d"),
        (torch.randn(2, 3), torch.randn(1, 3), r"k must satisfy k <= N = 1 \(the number of neighbors\)"),
        (torch.arange(6).reshape(2, 3), torch.randn(5, 3), "query"),
    ],
)
def test_dknn_bad_inputs(query, neighbors, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SubsetsDKNN(2)(query, neighbors)


def test_dknn_bad_constructor_arguments():
    with pytest.raises(TypeError, match="num_samples must be an int"):
        SubsetsDKNN(2, num_samples=1.5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        SubsetsDKNN(0)
    with pytest.raises(ValueError, match="tau"):
        SubsetsDKNN(2, tau=0.0)
