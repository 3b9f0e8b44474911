"""Tests of the exact smooth top-k SVM losses (``softtopk.losses.smooth_svm``, Berrada et al. 2018).

Checked against:

* the subset definition (REFERENCE §2.2), brute force over ``itertools.combinations`` in float64;
* a float64 log-space reference written here (a DP over the classes, ``log e_j`` updated with
  ``logaddexp``), for ``n`` up to 1000, ``tau`` 1e-3..1e2 and logits scaled 1e-4..1e6;
* the ESF factorisation ``tau * softplus(alpha/tau + log e_k - log e_{k-1} - s_y/(k tau))``;
* continuity along lines in logit space (the original jumps at its hard switch), finite gradients,
  float64 ``gradcheck``, shift invariance against ``nn.CrossEntropyLoss``;
* ``nn.CrossEntropyLoss`` conventions (reduction, weight, ignore_index, ``(N, C, d1)``), half dtypes,
  argument errors.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from softtopk import (
    SmoothTop1SVM,
    SmoothTopKSVM,
    Top1SVM,
    TopKSVM,
    smooth_top1_svm,
    smooth_topk_svm,
    top1_svm,
    topk_svm,
)

EPS32 = torch.finfo(torch.float32).eps


def brute_force(s: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """L_{k,tau} per sample by enumerating every k-subset (float64)."""
    s = s.double()
    subsets = list(itertools.combinations(range(s.shape[1]), k))
    index = torch.tensor(subsets)
    losses = []
    for row, label in zip(s, y.tolist(), strict=True):
        means = row[index].mean(-1)
        has_label = (index == label).any(-1)
        everything = torch.logsumexp((means + alpha * (~has_label).double()) / tau, 0)
        losses.append(tau * (everything - torch.logsumexp(means[has_label] / tau, 0)))
    return torch.stack(losses)


def dp_log_esf(a: torch.Tensor, k: int) -> torch.Tensor:
    """log e_0..log e_k of exp(a) (float64), a DP over classes: e_j <- e_j + x_i e_{j-1}."""
    a = a.double()
    log_e = torch.full((a.shape[0], k + 1), -math.inf, dtype=torch.float64)
    log_e[:, 0] = 0.0
    for i in range(a.shape[1]):
        shifted = log_e[:, :-1] + a[:, i : i + 1]
        log_e = torch.cat([log_e[:, :1], torch.logaddexp(log_e[:, 1:], shifted)], dim=1)
    return log_e


def dp_reference(s: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """tau * softplus(alpha/tau + log e_k - log e_{k-1} - z_y), z = s/(k tau), in float64 log space."""
    s = s.double()
    shift = s.max(1, keepdim=True).values  # exact in float64 for float32 inputs, keeps the DP in range
    z = (s - shift) / (k * tau)
    z_y = z.gather(1, y[:, None])[:, 0]
    others = z.scatter(1, y[:, None], -math.inf)
    log_e = dp_log_esf(others, k)
    margin = alpha / tau + log_e[:, k] - log_e[:, k - 1] - z_y
    return tau * torch.logaddexp(margin, torch.zeros_like(margin))  # softplus without its threshold


def data(rows: int, classes: int, *, seed: int = 0, scale: float = 1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    s = (torch.randn(rows, classes, generator=g, dtype=torch.float64) * scale).to(dtype)
    return s, torch.randint(0, classes, (rows,), generator=g)


def float32_tolerance(s: torch.Tensor) -> float:
    """Absolute float32 error budget: a few ulps of the spread of the (shifted) scores."""
    return 8 * EPS32 * float((s.double() - s.double().amax(1, keepdim=True)).abs().max())


# --- the definition ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 7, 10])
def test_brute_force_float64(n):
    for k in range(1, min(10, n - 1) + 1):
        for tau, alpha in [(1.0, 1.0), (0.3, 0.0), (5.0, 2.0)]:
            s, y = data(4, n, seed=n * 10 + k, scale=2.0, dtype=torch.float64)
            alpha = alpha + 0.1  # not a dyadic number
            expected = brute_force(s, y, k, tau, alpha)
            torch.testing.assert_close(
                smooth_topk_svm(s, y, k=k, tau=tau, alpha=alpha, reduction="none"), expected, rtol=1e-10, atol=1e-12
            )
            got32 = smooth_topk_svm(s.float(), y, k=k, tau=tau, alpha=alpha, reduction="none").double()
            torch.testing.assert_close(got32, expected, rtol=1e-5, atol=1e-6)


def test_factorisation_matches_brute_force():
    """The ESF form (computed here by the DP) equals the subset definition."""
    for n, k in [(6, 1), (6, 3), (8, 5), (9, 8)]:
        s, y = data(5, n, seed=n + k, scale=3.0, dtype=torch.float64)
        torch.testing.assert_close(dp_reference(s, y, k, 0.7, 1.3), brute_force(s, y, k, 0.7, 1.3), rtol=1e-10, atol=0)


@pytest.mark.parametrize(
    "n,k", [(20, 3), (200, 5), (1000, 5), (1000, 20), (1000, 40), (1000, 1), (1000, 2), (300, 7), (1000, 10), (11, 10)]
)
@pytest.mark.parametrize("tau", [1e-3, 1e-1, 1.0, 1e2])
def test_float32_against_float64_dp(n, k, tau):
    for scale in [1e-4, 1e-1, 1.0, 1e2, 1e4, 1e6]:
        s, y = data(8, n, seed=n + k, scale=scale)
        s.requires_grad_()
        loss = smooth_topk_svm(s, y, k=k, tau=tau, reduction="none")
        expected = dp_reference(s.detach(), y, k, tau, 1.0)
        torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=float32_tolerance(s.detach()))
        loss.sum().backward()
        assert torch.isfinite(s.grad).all()
        # |grad|_1 per row is at most 2 (tau softplus' <= tau, and d(log e_k - log e_{k-1}) has l1 norm 1)
        assert float(s.grad.abs().sum(1).max()) <= 2.0 + 1e-4


@pytest.mark.parametrize("k", [1, 3, 20])
def test_gradient_against_float64(k):
    """float32 autograd gradient vs float64 autograd gradient, including large |s|/(k tau)."""
    for tau, scale in [(1.0, 1.0), (1e-3, 1e6), (1e2, 1e6), (0.1, 100.0)]:
        s, y = data(8, 1000, seed=k, scale=scale)
        s32, s64 = s.clone().requires_grad_(), s.double().requires_grad_()
        smooth_topk_svm(s32, y, k=k, tau=tau, reduction="sum").backward()
        smooth_topk_svm(s64, y, k=k, tau=tau, reduction="sum").backward()
        torch.testing.assert_close(s32.grad.double(), s64.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_gradcheck_float64(k):
    s, y = data(5, 7, seed=k, scale=2.0, dtype=torch.float64)
    for tau in [0.05, 1.0, 10.0]:
        assert torch.autograd.gradcheck(
            lambda t, tau=tau: smooth_topk_svm(t, y, k=k, tau=tau, reduction="sum"), s.clone().requires_grad_()
        )
    assert torch.autograd.gradcheck(lambda t: smooth_top1_svm(t, y, tau=0.3), s.clone().requires_grad_())


def test_ties_and_huge_scores_have_finite_gradients():
    s = torch.zeros(4, 1000)
    s[:, :10] = 1.0  # ties at the top, straddling k
    for tau, scale in [(1e-2, 1e6), (1.0, 1e8), (1e-3, 1e8)]:
        x = (s * scale).requires_grad_()
        loss = smooth_topk_svm(x, torch.tensor([0, 5, 500, 999]), k=5, tau=tau)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


# --- special cases and limits --------------------------------------------------------------------


def test_k1_general_equals_smooth_top1():
    for tau, alpha, scale in [(1.0, 1.0, 1.0), (0.01, 0.5, 10.0), (100.0, 2.0, 1e4)]:
        s, y = data(16, 50, seed=3, scale=scale)
        general = smooth_topk_svm(s, y, k=1, tau=tau, alpha=alpha, reduction="none")
        top1 = smooth_top1_svm(s, y, tau=tau, alpha=alpha, reduction="none")
        torch.testing.assert_close(general, top1, rtol=1e-5, atol=float32_tolerance(s))
        torch.testing.assert_close(SmoothTop1SVM(tau=tau, alpha=alpha)(s, y), top1.mean(), rtol=1e-6, atol=0)


def test_top1_without_margin_is_cross_entropy():
    s, y = data(8, 10, dtype=torch.float64)
    ce = torch.nn.functional.cross_entropy(s, y)
    torch.testing.assert_close(smooth_top1_svm(s, y, alpha=0.0), ce)
    torch.testing.assert_close(smooth_topk_svm(s, y, k=1, alpha=0.0), ce)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_hard_loss_and_small_tau_limit(k):
    s, y = data(10, 12, seed=k, scale=3.0, dtype=torch.float64)
    label = s.gather(1, y[:, None])[:, 0]
    kth_other = s.scatter(1, y[:, None], -math.inf).topk(k, dim=1).values[:, -1]
    hinge = torch.clamp(1.0 + (kth_other - label) / k, min=0)
    torch.testing.assert_close(topk_svm(s, y, k=k, reduction="none"), hinge)
    torch.testing.assert_close(TopKSVM(k=k)(s, y), hinge.mean())
    # the smooth loss is within tau * log C(n-1, k) of the hinge, and tends to it
    tau = 1e-4
    smooth = smooth_topk_svm(s, y, k=k, tau=tau, reduction="none")
    assert float((smooth - hinge).abs().max()) <= tau * math.log(math.comb(11, k) + 1) + 1e-12
    if k == 1:
        torch.testing.assert_close(top1_svm(s, y, reduction="none"), hinge)
        torch.testing.assert_close(Top1SVM()(s, y), hinge.mean())


# --- continuity and shift invariance -------------------------------------------------------------


@pytest.mark.parametrize("k,tau,scale", [(1, 1.0, 30.0), (5, 1.0, 30.0), (5, 0.1, 10.0), (3, 1e-2, 1.0)])
def test_continuous_along_lines(k, tau, scale):
    """No jumps: |L(t + h) - L(t)| <= 2 h |d|_inf (the loss is 2-Lipschitz in l_inf, see above).

    The lines cross the original's hard switch (top-k gap = k tau log 1000) many times."""
    n, steps = 100, 2001
    g = torch.Generator().manual_seed(k)
    start = torch.randn(8, n, generator=g, dtype=torch.float64) * scale
    direction = torch.randn(8, n, generator=g, dtype=torch.float64) * scale
    t = torch.linspace(-1.0, 1.0, steps, dtype=torch.float64)
    h = float(t[1] - t[0])
    y = torch.randint(0, n, (8,), generator=g)
    points = (start[:, None, :] + t[None, :, None] * direction[:, None, :]).float()  # (8, steps, n)
    loss = smooth_topk_svm(points.reshape(-1, n), y.repeat_interleave(steps), k=k, tau=tau, reduction="none")
    jumps = loss.view(8, steps).double().diff(dim=1).abs()
    bound = 2 * h * direction.abs().amax(1, keepdim=True) * 1.01 + float32_tolerance(points.reshape(-1, n))
    assert bool((jumps <= bound).all()), float((jumps / bound).max())


def test_shift_invariance_against_cross_entropy():
    """Adding 1e4 to every logit moves the float32 batch-mean loss by at most 10x CE's move.

    Measured (n = 1000, batch 64, randn): |dL| = 7.2e-6 for SmoothTopkSVM(k=5, tau=1),
    3.4e-5 for nn.CrossEntropyLoss (ratio 0.21; the original: 1.8e-2, REFERENCE §7.2).
    Both are dominated by the rounding of s + 1e4 to float32 (ulp 1e-3)."""
    s, y = data(64, 1000, seed=7)
    moved = s + 1e4
    ours = abs(float(SmoothTopKSVM(k=5, tau=1.0)(moved, y)) - float(SmoothTopKSVM(k=5)(s, y)))
    ce = abs(float(torch.nn.CrossEntropyLoss()(moved, y)) - float(torch.nn.CrossEntropyLoss()(s, y)))
    assert ours <= 10 * max(ce, EPS32)
    # exactly invariant for shifts the float32 input represents exactly
    torch.testing.assert_close(smooth_topk_svm(s + 1024.0, y), smooth_topk_svm(s, y), rtol=3e-4, atol=0)


# --- PyTorch conventions -------------------------------------------------------------------------


@pytest.mark.parametrize("loss_fn", [smooth_topk_svm, topk_svm])
def test_reduction_weight_ignore_index_like_cross_entropy(loss_fn):
    s, y = data(12, 6, seed=1, dtype=torch.float64)
    y[3] = -100
    y[7] = 4
    weight = torch.rand(6, dtype=torch.float64) + 0.5
    per_sample = loss_fn(s, y, k=2, reduction="none")
    assert per_sample[3] == 0
    valid = y != -100
    w = weight[y[valid]]
    torch.testing.assert_close(loss_fn(s, y, k=2, weight=weight), (per_sample[valid] * w).sum() / w.sum())
    torch.testing.assert_close(loss_fn(s, y, k=2), per_sample[valid].mean())
    torch.testing.assert_close(loss_fn(s, y, k=2, reduction="sum", weight=weight), (per_sample[valid] * w).sum())
    torch.testing.assert_close(loss_fn(s, y, k=2, reduction="none", weight=weight)[valid], per_sample[valid] * w)
    # custom ignore_index; the same weighted-mean normaliser as nn.CrossEntropyLoss
    y2 = torch.where(valid, y, 5)
    ours = loss_fn(s, y2, k=2, weight=weight, ignore_index=5)
    ce_like = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=5, reduction="none")(s, y2)
    normaliser = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=5, reduction="sum")(
        s, y2
    ) / torch.nn.CrossEntropyLoss(weight=weight, ignore_index=5)(s, y2)
    assert (ce_like[y2 == 5] == 0).all()
    torch.testing.assert_close(ours, loss_fn(s, y2, k=2, weight=weight, ignore_index=5, reduction="sum") / normaliser)
    # every target ignored: 0, not NaN
    assert loss_fn(s, torch.full_like(y, -100), k=2) == 0


def test_spatial_input_and_modules():
    s, y = data(12, 5, seed=2)
    spatial = s.view(3, 4, 5).permute(0, 2, 1)  # (N, C, d1)
    for fn, module in [
        (lambda a, b, **kw: smooth_topk_svm(a, b, k=2, tau=0.5, **kw), SmoothTopKSVM(k=2, tau=0.5, reduction="none")),
        (lambda a, b, **kw: smooth_top1_svm(a, b, **kw), SmoothTop1SVM(reduction="none")),
        (lambda a, b, **kw: topk_svm(a, b, k=3, **kw), TopKSVM(k=3, reduction="none")),
        (lambda a, b, **kw: top1_svm(a, b, **kw), Top1SVM(reduction="none")),
    ]:
        flat = fn(s, y, reduction="none")
        torch.testing.assert_close(fn(spatial, y.view(3, 4), reduction="none"), flat.view(3, 4))
        torch.testing.assert_close(module(spatial, y.view(3, 4)), flat.view(3, 4))
        torch.testing.assert_close(fn(spatial, y.view(3, 4)), flat.mean())


def test_module_state_buffer_and_repr():
    weight = torch.rand(10) + 0.1
    loss = SmoothTopKSVM(k=3, tau=0.5, alpha=2.0, weight=weight, ignore_index=1)
    assert "weight" in dict(loss.named_buffers())
    assert repr(loss) == "SmoothTopKSVM(k=3, tau=0.5, alpha=2.0, reduction='mean', ignore_index=1, weight=True)"
    assert repr(Top1SVM()) == "Top1SVM(alpha=1.0, reduction='mean')"
    s, y = data(6, 10)
    loss.alpha = 0.0  # attributes are read at every forward (the original froze them)
    torch.testing.assert_close(
        loss(s, y), smooth_topk_svm(s, y, k=3, tau=0.5, alpha=0.0, weight=weight, ignore_index=1)
    )
    assert loss.double().weight.dtype == torch.float64
    assert SmoothTopKSVM().cpu() is not None  # the original's .cpu() raised


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes_computed_in_float32(dtype):
    s, y = data(8, 30, seed=4, scale=3.0)
    half = s.to(dtype).requires_grad_()
    loss = smooth_topk_svm(half, y, k=3, reduction="none")
    assert loss.dtype == dtype
    expected = smooth_topk_svm(half.detach().float(), y, k=3, reduction="none")
    torch.testing.assert_close(loss, expected.to(dtype))
    loss.sum().backward()
    assert half.grad.dtype == dtype and torch.isfinite(half.grad.float()).all()
    assert SmoothTopKSVM(k=3)(s.to(dtype), y).dtype == dtype


# --- errors --------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    s, y = data(4, 6)
    with pytest.raises(ValueError, match=r"k must satisfy 1 <= k <= 5 \(k < C, the number of classes\)"):
        smooth_topk_svm(s, y, k=6)
    with pytest.raises(ValueError, match="k < C"):
        topk_svm(s, y, k=7)
    with pytest.raises(ValueError, match="k must satisfy 1 <= k"):
        smooth_topk_svm(s, y, k=0)
    with pytest.raises(TypeError, match="k must be an int"):
        smooth_topk_svm(s, y, k=2.0)
    for tau in [0.0, -1.0, math.nan, math.inf]:
        with pytest.raises(ValueError, match="tau"):
            smooth_topk_svm(s, y, tau=tau, k=2)
        with pytest.raises(ValueError, match="tau"):
            SmoothTop1SVM(tau=tau)
    for alpha in [-0.5, math.nan, math.inf]:
        with pytest.raises(ValueError, match="alpha"):
            smooth_topk_svm(s, y, alpha=alpha, k=2)
        with pytest.raises(ValueError, match="alpha"):
            Top1SVM(alpha=alpha)
    with pytest.raises(ValueError, match="target values must be in"):
        smooth_topk_svm(s, torch.tensor([0, 1, 6, 2]), k=2)
    with pytest.raises(ValueError, match="target values must be in"):
        top1_svm(s, torch.tensor([0, -1, 2, 2]))
    with pytest.raises(TypeError, match="target must hold integer"):
        smooth_topk_svm(s, y.float(), k=2)
    with pytest.raises(ValueError, match="target must have shape"):
        smooth_topk_svm(s, y[:3], k=2)
    with pytest.raises(ValueError, match="weight must have shape"):
        smooth_topk_svm(s, y, k=2, weight=torch.ones(5))
    with pytest.raises(ValueError, match="weight must have shape"):
        SmoothTopKSVM(k=2, weight=torch.ones(6, 1))
    with pytest.raises(ValueError, match="k < C"):
        SmoothTopKSVM(k=6)(s, y)
    with pytest.raises(ValueError, match="weight must have shape"):
        SmoothTopKSVM(k=2, weight=torch.ones(5))(s, y)
    with pytest.raises(ValueError, match="reduction"):
        smooth_topk_svm(s, y, k=2, reduction="avg")
    with pytest.raises(ValueError, match="input must have shape"):
        smooth_topk_svm(s[0], y[0], k=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tau", [1e-3, 1e-20])
@pytest.mark.parametrize(
    ("fn", "k"), [(smooth_top1_svm, 1), (smooth_topk_svm, 1), (smooth_topk_svm, 2), (smooth_topk_svm, 10)]
)
def test_a_small_tau_on_scores_near_the_largest_keeps_a_representable_loss_finite(fn, k, tau, dtype):
    """Scores near the dtype's largest over a small ``tau``: the margin ``(s_[k] - s_y)/(k tau)``
    overflows, the loss (about the hard hinge) does not; it was ``inf`` (k = 1, 2 the subset kernel,
    10 the log-space one)."""
    big = torch.finfo(dtype).max / 10
    x = torch.tensor([[big, -big, 0.5 * big, 0.1] + [0.0] * 12], dtype=dtype, requires_grad=True)
    target = torch.tensor([1])
    loss = fn(x, target, tau=tau, reduction="none", **({} if fn is smooth_top1_svm else {"k": k}))
    (grad,) = torch.autograd.grad(loss.sum(), x)
    torch.testing.assert_close(loss, topk_svm(x.detach(), target, k=k, reduction="none"))
    assert grad.isfinite().all()
    assert abs(grad[0, 1].item() + 1.0 / k) < 1e-6 and grad.sum().abs() < 1e-4
