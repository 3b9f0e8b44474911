"""softtopk.compat.pytopk against the pytopk 0.1.0 oracle: same global seed -> bitwise equal values
and gradients (float32).

Bitwise equality holds because both draw the same ``torch.randn(x.shape + (S,))`` float32 noise,
add ``epsilon * Z`` in float32, take the same k-th largest value (``topk`` vs ``kthvalue`` return
the same element), average and reduce with the same operations in the same order, and build the
gradient as ``count / S * grad`` (pytopk: ``mean`` of 0/1, an exact ``count / S``).
"""

from __future__ import annotations

import pytest
import torch

from softtopk.compat import pytopk as ours
from softtopk.losses import ldam_margins

pytopk = pytest.importorskip(
    "pytopk", reason="the pytopk 0.1.0 oracle is not installed (pip install --no-deps pytopk==0.1.0)"
)

EXACT = {"rtol": 0, "atol": 0}


def _run(module, *inputs, seed: int):
    """Value and gradients (w.r.t. the floating inputs) of ``module(*inputs)`` after ``manual_seed(seed)``."""
    leaves = [x.detach().clone().requires_grad_() if x.is_floating_point() else x for x in inputs]
    torch.manual_seed(seed)
    out = module(*leaves)
    out.sum().backward()
    after = torch.rand(())  # the RNG state after the call must agree too
    return out.detach(), [x.grad for x in leaves if x.is_floating_point()], after


def _assert_same(a, b):
    (va, ga, ra), (vb, gb, rb) = a, b
    assert va.dtype == vb.dtype and va.shape == vb.shape
    torch.testing.assert_close(va, vb, **EXACT)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, **EXACT)
    assert torch.equal(ra, rb)


@pytest.mark.parametrize(
    "shape, dim, k",
    [
        ((7,), -1, 1),
        ((7,), 0, 7),
        ((4, 9), -1, 3),
        ((4, 9), 0, 2),
        ((4, 9), 1, 9),
        ((3, 5, 6), 1, 4),
        ((3, 5, 6), -2, 1),
        ((3, 5, 6), 0, 3),
        ((2, 3, 4, 5), 2, 2),
        ((2, 3, 4, 5), -1, 5),
    ],
)
@pytest.mark.parametrize("epsilon, n_sample", [(1.0, 5), (0.3, 1), (2.5, 8)])
def test_noised_topk_matches_pytopk(shape, dim, k, epsilon, n_sample):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape) + k)) * 3
    a = _run(ours.NoisedTopK(k, epsilon, n_sample, dim), x, seed=k)
    b = _run(pytopk.NoisedTopK(k, epsilon, n_sample, dim), x, seed=k)
    _assert_same(a, b)


def test_noised_topk_defaults_and_repeated_calls():
    x = torch.randn(16, 30)
    mine, theirs = ours.NoisedTopK(4), pytopk.NoisedTopK(4)
    torch.manual_seed(3)
    first = [mine(x) for _ in range(3)]
    torch.manual_seed(3)
    second = [theirs(x) for _ in range(3)]
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], first[1])  # fresh noise every call


@pytest.mark.parametrize("batch, classes, k", [(1, 3, 1), (8, 10, 1), (32, 100, 5), (64, 1000, 5), (5, 6, 5)])
@pytest.mark.parametrize("epsilon, n_sample", [(1.0, 5), (0.2, 10), (0.01, 1)])
def test_bal_noised_topk_matches_pytopk(batch, classes, k, epsilon, n_sample):
    gen = torch.Generator().manual_seed(batch * classes)
    s = torch.randn(batch, classes, generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    s[: batch // 2].scatter_(1, y[: batch // 2, None], 4.0)  # some rows with an inactive hinge
    a = _run(ours.BalNoisedTopK(k, epsilon, n_sample), s, y, seed=classes)
    b = _run(pytopk.BalNoisedTopK(k, epsilon, n_sample), s, y, seed=classes)
    _assert_same(a, b)
    assert a[0].dim() == 0


@pytest.mark.parametrize("batch, classes, k", [(1, 3, 1), (8, 10, 2), (32, 100, 5), (64, 1000, 5)])
@pytest.mark.parametrize("epsilon, max_m, scale, n_sample", [(0.1, 0.3, 50, 5), (0.01, 0.2, 60, 5), (1.0, 0.5, 1, 3)])
def test_imbal_noised_topk_matches_pytopk(batch, classes, k, epsilon, max_m, scale, n_sample):
    gen = torch.Generator().manual_seed(batch + classes)
    counts = torch.randint(1, 500, (classes,), generator=gen).tolist()
    s = torch.randn(batch, classes, generator=gen) * 0.3
    y = torch.randint(0, classes, (batch,), generator=gen)
    mine = ours.ImbalNoisedTopK(k, epsilon, max_m, counts, scale, n_sample)
    theirs = pytopk.ImbalNoisedTopK(k, epsilon, max_m, counts, scale, n_sample)
    assert mine.m_list.dtype == theirs.m_list.dtype == torch.float32
    assert torch.equal(mine.m_list, theirs.m_list)
    _assert_same(_run(mine, s, y, seed=batch), _run(theirs, s, y, seed=batch))


def test_imbal_margins_match_pytopk_on_many_count_lists():
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        classes = int(torch.randint(1, 50, (), generator=gen))
        counts = torch.randint(1, 10**6, (classes,), generator=gen).tolist()
        max_m = float(torch.rand((), generator=gen))
        theirs = pytopk.ImbalNoisedTopK(1, 0.1, max_m, counts).m_list
        assert torch.equal(ldam_margins(counts, max_m).to(torch.float32), theirs), (trial, counts, max_m)
        if classes > 1:
            assert torch.equal(ours.ImbalNoisedTopK(1, 0.1, max_m, counts).m_list, theirs), (trial, counts, max_m)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # pytopk divides by zero
def test_zero_count_raises_where_pytopk_gives_nan():
    theirs = pytopk.ImbalNoisedTopK(1, 0.1, 0.3, [0, 10, 20]).m_list
    assert torch.isnan(theirs[0]) and bool((theirs[1:] == 0).all())
    with pytest.raises(ValueError, match="positive finite class counts, got 0.0 for class 0"):
        ours.ImbalNoisedTopK(1, 0.1, 0.3, [0, 10, 20])
    with pytest.raises(ValueError, match="positive finite class counts, got -3.0 for class 1"):
        ours.ImbalNoisedTopK(1, 0.1, 0.3, [4, -3, 20])


def test_wrong_cls_num_list_length_raises():
    loss = ours.ImbalNoisedTopK(1, 0.1, 0.3, [5, 10, 20])
    with pytest.raises(ValueError, match="cls_num_list must have one count per class, C = 4, got length 3"):
        loss(torch.randn(2, 4), torch.tensor([0, 1]))


def test_argument_errors():
    with pytest.raises(ValueError, match="k must be >= 1"):
        ours.NoisedTopK(0)
    with pytest.raises(ValueError, match="k must satisfy 1 <= k <= n = 3"):
        ours.NoisedTopK(4)(torch.randn(2, 3))
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        ours.BalNoisedTopK(1, -1.0)
    with pytest.raises(ValueError, match="n_sample must be >= 1"):
        ours.BalNoisedTopK(1, 1.0, 0)
    with pytest.raises(ValueError, match="dim must be in"):
        ours.NoisedTopK(1, dim=2)(torch.randn(3, 3))
    with pytest.raises(ValueError, match=r"k must satisfy 1 <= k <= 2 \(k < C, the number of classes"):
        ours.BalNoisedTopK(3, 1.0)(torch.randn(2, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"k must satisfy 1 <= k <= 2 \(k < C, the number of classes"):
        ours.ImbalNoisedTopK(3, 1.0, 0.3, [1, 2, 3])
    with pytest.raises(ValueError, match="max_m must be a finite number >= 0"):
        ours.ImbalNoisedTopK(1, 1.0, -0.3, [1, 2, 3])
    with pytest.raises(ValueError, match="scale must be a positive"):
        ours.ImbalNoisedTopK(1, 1.0, 0.3, [1, 2, 3], scale=0)


def test_float64_and_half_inputs():
    x = torch.randn(4, 9, dtype=torch.float64)
    torch.manual_seed(0)
    out = ours.NoisedTopK(3)(x)
    assert out.dtype == torch.float64
    torch.manual_seed(0)
    reference = pytopk.NoisedTopK(3)(x)  # float32 noise promoted to float64 in both
    torch.testing.assert_close(out, reference, **EXACT)
    y = torch.tensor([0, 1, 2, 3])
    for dtype in (torch.float16, torch.bfloat16):
        loss = ours.BalNoisedTopK(2, 1.0)(x.to(dtype), y)
        assert loss.dtype == dtype and torch.isfinite(loss)


def test_epsilon_zero_is_exact_kth_value():
    x = torch.randn(5, 11)
    out = ours.NoisedTopK(4, epsilon=0.0)(x)
    assert torch.equal(out, x.topk(4, dim=-1).values[:, -1])


def test_repr():
    assert "k=2, epsilon=0.5, n_sample=5, dim=-1" in repr(ours.NoisedTopK(2, 0.5))
    assert "max_m=0.3, scale=50, classes=3" in repr(ours.ImbalNoisedTopK(1, 0.1, 0.3, [5, 15, 10]))
