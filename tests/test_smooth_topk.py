"""Smooth top-k SVM losses: the subset definition of :func:`softtopk.smooth_topk_svm`, gradients, the hard
switch of :func:`softtopk.compat.difftopk.smooth_hard_topk_loss` (a batch mean, ``(N, C)`` input), reduction,
dtypes."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from softtopk import smooth_topk_svm
from softtopk.compat.difftopk import smooth_hard_topk_loss


def smooth_topk_loss(input: torch.Tensor, target: torch.Tensor, k: int, **kwargs) -> torch.Tensor:
    """:func:`softtopk.smooth_topk_svm` with ``k`` positional."""
    return smooth_topk_svm(input, target, k=k, **kwargs)


def per_row_hard(s: torch.Tensor, y: torch.Tensor, k: int, **kwargs) -> torch.Tensor:
    """Per-sample values of the batch-mean ``smooth_hard_topk_loss`` (one row at a time)."""
    return torch.stack([smooth_hard_topk_loss(s[i : i + 1], y[i : i + 1], k, **kwargs) for i in range(len(s))])


def subset_definition(s: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """L_{k,τ} by enumerating the k-subsets of classes (float64, per sample)."""
    s = s.double()
    losses = []
    for row, label in zip(s, y.tolist(), strict=True):
        subsets = list(itertools.combinations(range(s.shape[1]), k))
        means = torch.stack([row[list(a)].mean() for a in subsets])
        has_label = torch.tensor([label in a for a in subsets])
        everything = torch.logsumexp((means + alpha * (~has_label)) / tau, 0)
        losses.append(tau * (everything - torch.logsumexp(means[has_label] / tau, 0)))
    return torch.stack(losses)


def _data(n: int, classes: int, seed: int = 0, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, classes, generator=g, dtype=torch.float64) * scale
    return scores, torch.randint(0, classes, (n,), generator=g)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
@pytest.mark.parametrize("tau", [0.5, 2.0])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_matches_subset_definition(k, tau, alpha):
    s, y = _data(5, 6, seed=k)
    loss = smooth_topk_loss(s, y, k, tau=tau, alpha=alpha, reduction="none")
    torch.testing.assert_close(loss, subset_definition(s, y, k, tau, alpha), atol=1e-12, rtol=1e-12)


def test_top1_without_margin_is_cross_entropy():
    s, y = _data(8, 10)
    torch.testing.assert_close(smooth_topk_loss(s, y, 1, alpha=0.0), torch.nn.functional.cross_entropy(s, y))


@pytest.mark.parametrize("loss_fn", [smooth_topk_loss, smooth_hard_topk_loss])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_gradcheck(loss_fn, k):
    s, y = _data(6, 7, seed=k)
    s[:2, 0] += 40.0  # hard rows for smooth_hard_topk_loss (top-1 gap) ...
    s[:2, 1] += 40.0 * (k > 1)  # ... and top-2 gap; away from every kink of the hinge
    assert torch.autograd.gradcheck(lambda t: loss_fn(t, y, k, tau=0.7), s.requires_grad_())


def test_hard_switch():
    s, y = _data(6, 7)
    s[:3, 2] += 40.0  # gap >= k τ log(1000) for k = 1 on rows 0-2
    mixed = per_row_hard(s, y, 1)
    hinge = torch.clamp(1.0 + s.scatter(1, y[:, None], -math.inf).max(1).values - s.gather(1, y[:, None])[:, 0], min=0)
    torch.testing.assert_close(mixed[:3], hinge[:3])
    torch.testing.assert_close(mixed[3:], smooth_topk_loss(s, y, 1, reduction="none")[3:])
    # τ -> 0: every row switches, and the smooth loss tends to the same hinge
    torch.testing.assert_close(per_row_hard(s, y, 1, tau=1e-3), hinge)
    torch.testing.assert_close(smooth_hard_topk_loss(s, y, 1), mixed.mean())  # the batch mean
    torch.testing.assert_close(smooth_topk_loss(s, y, 1, tau=1e-3, reduction="none"), hinge, atol=1e-2, rtol=0)


def test_reduction_weight_ignore_index_and_spatial_input():
    s, y = _data(12, 5)
    y[3] = -100
    weight = torch.rand(5, dtype=torch.float64) + 0.5
    per_sample = smooth_topk_loss(s, y, 2, reduction="none")
    assert per_sample[3] == 0
    valid = y != -100
    w = weight[y[valid]]
    torch.testing.assert_close(smooth_topk_loss(s, y, 2, weight=weight), (per_sample[valid] * w).sum() / w.sum())
    torch.testing.assert_close(smooth_topk_loss(s, y, 2, reduction="sum"), per_sample.sum())
    spatial = s.view(3, 4, 5).permute(0, 2, 1)  # (N, C, d1)
    out = smooth_topk_loss(spatial, y.view(3, 4), 2, reduction="none")
    torch.testing.assert_close(out, per_sample.view(3, 4))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtypes(dtype):
    s, y = _data(8, 10)
    for loss_fn in (smooth_topk_loss, smooth_hard_topk_loss):
        x = s.to(dtype).requires_grad_()
        loss = loss_fn(x, y, 3)
        loss.backward()
        assert loss.dtype == dtype and torch.isfinite(x.grad.float()).all()
        torch.testing.assert_close(loss.double(), loss_fn(s, y, 3), atol=2e-2, rtol=2e-2)


def test_finite_gradients_at_extreme_scales():
    """The smooth path alone stays finite where Berrada's float32 ESF backward gives NaN/inf."""
    s, y = _data(8, 100, scale=1e6)
    s[0, :2] = s[0, 5]  # ties at the top
    x = s.float().requires_grad_()
    smooth_topk_loss(x, y, 5, tau=1e-2).backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({"k": 5}, ValueError),
        ({"k": 0}, ValueError),
        ({"k": 2.0}, TypeError),
        ({"tau": 0.0}, ValueError),
        ({"alpha": math.nan}, ValueError),
        ({"reduction": "avg"}, ValueError),
        ({"target": torch.tensor([0, 5])}, ValueError),
        ({"input": torch.zeros(2, 5, dtype=torch.long)}, TypeError),
    ],
)
def test_bad_arguments(kwargs, error):
    call = {"input": torch.zeros(2, 5), "target": torch.tensor([0, 1]), "k": 2, **kwargs}
    with pytest.raises(error):
        smooth_topk_loss(call.pop("input"), call.pop("target"), call.pop("k"), **call)


def test_autocast_returns_float32():
    s, y = _data(4, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = smooth_hard_topk_loss(s.to(torch.bfloat16), y, 2)
    assert loss.dtype == torch.float32
