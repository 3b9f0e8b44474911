"""softtopk.compat.smooth_topk: the original's signatures and defaults (oval-group/smooth-topk @12c1645,
``topk/svm.py``: ``_SVMLoss.__init__`` sets ``alpha = 1`` for ``alpha=None``; ``forward`` returns the
batch mean), values and gradients equal to softtopk's losses, and agreement with a float64 brute-force
sum over k-subsets (REFERENCE §2.2), the setting in which the original's smooth path is accurate
(n <= 10)."""

from __future__ import annotations

import inspect
import itertools
import math

import pytest
import torch

from softtopk import nn as smooth_svm_modules
from softtopk.compat import smooth_topk as compat
from softtopk.losses import smooth_svm

SIGNATURES = {
    # the original's (name, default) pairs, in order
    "SmoothTop1SVM": [("n_classes", inspect.Parameter.empty), ("alpha", None), ("tau", 1.0)],
    "SmoothTopkSVM": [("n_classes", inspect.Parameter.empty), ("alpha", None), ("tau", 1.0), ("k", 5)],
    "MaxTop1SVM": [("n_classes", inspect.Parameter.empty), ("alpha", None)],
    "MaxTopkSVM": [("n_classes", inspect.Parameter.empty), ("alpha", None), ("k", 5)],
}


def _data(b: int, n: int, seed: int, scale: float = 2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(b, n, generator=g, dtype=torch.float64) * scale).to(dtype)
    y = torch.randint(0, n, (b,), generator=g)
    return x, y


def _value_and_grad(fn, x, y):
    x = x.detach().clone().requires_grad_()
    out = fn(x, y)
    out.backward()
    return out.detach(), x.grad


# ------------------------------------------------------------------------------------ brute force


def _brute_smooth(x: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """Per-sample L_{k,tau} as the log-sum-exp over all k-subsets (float64)."""
    out = []
    for s, label in zip(x.double().tolist(), y.tolist(), strict=True):
        every, with_y = [], []
        for subset in itertools.combinations(range(len(s)), k):
            mean = sum(s[j] for j in subset) / k
            delta = 0.0 if label in subset else alpha
            every.append((delta + mean) / tau)
            if label in subset:
                with_y.append(mean / tau)
        out.append(
            tau
            * (
                torch.tensor(every, dtype=torch.float64).logsumexp(0)
                - torch.tensor(with_y, dtype=torch.float64).logsumexp(0)
            )
        )
    return torch.stack(out).double()


def _brute_hard(x: torch.Tensor, y: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    """Per-sample hard top-k hinge: max over k-subsets of (Delta + mean) minus max over those with y."""
    out = []
    for s, label in zip(x.double().tolist(), y.tolist(), strict=True):
        every, with_y = [], []
        for subset in itertools.combinations(range(len(s)), k):
            mean = sum(s[j] for j in subset) / k
            every.append((0.0 if label in subset else alpha) + mean)
            if label in subset:
                with_y.append(mean)
        out.append(max(every) - max(with_y))
    return torch.tensor(out, dtype=torch.float64)


# --------------------------------------------------------------------------------- signatures


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_and_defaults_match_the_original(name):
    params = list(inspect.signature(getattr(compat, name)).parameters.values())
    assert [(p.name, p.default) for p in params] == SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def test_alpha_none_means_one():
    assert compat.DEFAULT_ALPHA == 1.0
    for module in (compat.SmoothTop1SVM(10), compat.SmoothTopkSVM(10), compat.MaxTop1SVM(10), compat.MaxTopkSVM(10)):
        assert module.alpha == 1.0
    assert compat.SmoothTopkSVM(10).k == 5 and compat.SmoothTopkSVM(10).tau == 1.0
    assert compat.MaxTopkSVM(10).k == 5 and compat.SmoothTop1SVM(10).tau == 1.0
    x, y = _data(6, 10, 0)
    torch.testing.assert_close(
        compat.SmoothTopkSVM(10)(x, y), compat.SmoothTopkSVM(10, alpha=1.0)(x, y), rtol=0, atol=0
    )


def test_positional_arguments_in_the_original_order():
    m = compat.SmoothTopkSVM(10, 0.5, 2.0, 3)
    assert (m.n_classes, m.alpha, m.tau, m.k) == (10, 0.5, 2.0, 3)
    m = compat.SmoothTop1SVM(7, 0.25, 0.1)
    assert (m.n_classes, m.alpha, m.tau) == (7, 0.25, 0.1)
    m = compat.MaxTopkSVM(8, 0.0, 2)
    assert (m.n_classes, m.alpha, m.k) == (8, 0.0, 2)
    m = compat.MaxTop1SVM(8, 2.0)
    assert (m.n_classes, m.alpha) == (8, 2.0)


def test_subclasses_of_softtopk_modules():
    assert isinstance(compat.SmoothTopkSVM(10), smooth_svm_modules.SmoothTopKSVM)
    assert isinstance(compat.SmoothTop1SVM(10), smooth_svm_modules.SmoothTop1SVM)
    assert isinstance(compat.MaxTopkSVM(10), smooth_svm_modules.TopKSVM)
    assert isinstance(compat.MaxTop1SVM(10), smooth_svm_modules.Top1SVM)


# ------------------------------------------------------------------------ delegation (exact)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "k, tau, alpha", [(1, 1.0, None), (2, 0.5, 1.0), (5, 1.0, None), (3, 0.1, 0.0), (4, 10.0, 2.0)]
)
def test_smooth_topk_equals_softtopk_loss(dtype, k, tau, alpha):
    x, y = _data(8, 12, k, dtype=dtype)
    ours = _value_and_grad(compat.SmoothTopkSVM(12, alpha, tau, k), x, y)
    ref = _value_and_grad(
        lambda s, t: smooth_svm.smooth_topk_svm(s, t, k=k, tau=tau, alpha=1.0 if alpha is None else alpha), x, y
    )
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ours[0].dtype == dtype


@pytest.mark.parametrize("tau, alpha", [(1.0, None), (0.1, 0.0), (5.0, 2.0)])
def test_smooth_top1_equals_softtopk_loss(tau, alpha):
    x, y = _data(8, 12, 1, dtype=torch.float32)
    ours = _value_and_grad(compat.SmoothTop1SVM(12, alpha, tau), x, y)
    ref = _value_and_grad(
        lambda s, t: smooth_svm.smooth_top1_svm(s, t, tau=tau, alpha=1.0 if alpha is None else alpha), x, y
    )
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("k, alpha", [(1, None), (2, 0.5), (5, None), (9, 3.0)])
def test_max_topk_equals_softtopk_loss(k, alpha):
    x, y = _data(8, 10, k, dtype=torch.float32)
    ours = _value_and_grad(compat.MaxTopkSVM(10, alpha, k), x, y)
    ref = _value_and_grad(lambda s, t: smooth_svm.topk_svm(s, t, k=k, alpha=1.0 if alpha is None else alpha), x, y)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("alpha", [None, 0.0, 2.5])
def test_max_top1_equals_softtopk_loss_and_crammer_singer(alpha):
    x, y = _data(8, 10, 3)
    a = 1.0 if alpha is None else alpha
    ours = _value_and_grad(compat.MaxTop1SVM(10, alpha), x, y)
    ref = _value_and_grad(lambda s, t: smooth_svm.top1_svm(s, t, alpha=a), x, y)
    for u, v in zip(ours, ref, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    # the original's Top1_Hard_SVM: max_j (x_j + alpha [j != y]) - x_y
    delta = torch.full_like(x, a).scatter(1, y[:, None], 0.0)
    naive = ((x + delta).amax(1) - x.gather(1, y[:, None]).squeeze(1)).mean()
    torch.testing.assert_close(ours[0], naive)


# --------------------------------------------------------------------------------- brute force


@pytest.mark.parametrize("n", [2, 4, 7, 10])
@pytest.mark.parametrize("tau", [0.1, 1.0, 2.0, 10.0])
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_smooth_topk_matches_brute_force(n, tau, alpha):
    for k in range(1, n):
        x, y = _data(5, n, 10 * n + k)
        ours = compat.SmoothTopkSVM(n, alpha, tau, k)(x, y)
        torch.testing.assert_close(ours, _brute_smooth(x, y, k, tau, alpha).mean(), rtol=1e-10, atol=1e-10)
        ours32 = compat.SmoothTopkSVM(n, alpha, tau, k)(x.float(), y)
        torch.testing.assert_close(ours32, _brute_smooth(x, y, k, tau, alpha).mean().float(), rtol=1e-5, atol=1e-5)


def _original_smooth_rows(x: torch.Tensor, y: torch.Tensor, k: int, tau: float, alpha: float):
    """The original's smooth path (REFERENCE §2.3) in ``x``'s dtype: the product of the polynomials
    ``e^{-z_i} + t`` of the non-label classes in log space, pairwise (divide and conquer), truncated
    at degree ``k + p - 1``; ``log e_m = coeff_m + sum z``; loss ``tau softplus(alpha/tau + log e_k -
    log e_{k-1} - z_y)``. Also returns its routing: a row is smooth iff ``s_[k] - s_[k+1] < k tau ln 1e3``."""
    degree = k + int(1 + 0.2 * k) - 1
    z = x / (k * tau)
    label = y.unsqueeze(1)
    others = z.scatter(1, label, math.nan)[~torch.zeros_like(z, dtype=torch.bool).scatter(1, label, True)]
    others = others.reshape(z.shape[0], -1)
    polys = [torch.stack([-others[:, i], torch.zeros_like(others[:, i])], -1) for i in range(others.shape[1])]
    while len(polys) > 1:
        merged = []
        for a, b in zip(polys[0::2], polys[1::2], strict=False):
            size = min(a.shape[1] + b.shape[1] - 1, degree + 1)
            terms = [
                [a[:, i] + b[:, m - i] for i in range(max(0, m - b.shape[1] + 1), min(m, a.shape[1] - 1) + 1)]
                for m in range(size)
            ]
            merged.append(torch.stack([torch.stack(t, -1).logsumexp(-1) for t in terms], -1))
        polys = merged + ([polys[-1]] if len(polys) % 2 else [])
    log_e = polys[0] + others.sum(1, keepdim=True)
    margin = alpha / tau + log_e[:, k] - log_e[:, k - 1] - z.gather(1, label).squeeze(1)
    top = x.topk(k + 1, dim=1).values
    smooth = top[:, k - 1] - top[:, k] < k * tau * math.log(1e3)
    return tau * torch.logaddexp(margin, torch.zeros_like(margin)), smooth


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n, k", [(10, 1), (10, 5), (30, 5), (100, 5), (100, 9)])
@pytest.mark.parametrize("tau", [0.1, 1.0, 10.0])
def test_smooth_topk_matches_the_original_smooth_path(dtype, n, k, tau):
    """On the rows the original routes to its smooth path, at scales where its float32 renormalisation
    is accurate (|s| of order 1), the per-sample losses agree to 1e-5 relative."""
    x, y = _data(64, n, n + k, scale=1.0, dtype=dtype)
    original, smooth = _original_smooth_rows(x, y, k, tau, 1.0)
    ours = smooth_svm.smooth_topk_svm(x, y, k=k, tau=tau, reduction="none")
    assert smooth.sum() >= 16
    torch.testing.assert_close(ours[smooth], original[smooth], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tau", [0.5, 1.0, 3.0])
def test_smooth_top1_matches_brute_force(tau):
    x, y = _data(6, 9, 4)
    torch.testing.assert_close(compat.SmoothTop1SVM(9, None, tau)(x, y), _brute_smooth(x, y, 1, tau, 1.0).mean())


@pytest.mark.parametrize("n", [3, 6, 10])
def test_max_topk_matches_brute_force(n):
    for k in range(1, n):
        x, y = _data(5, n, n + k)
        torch.testing.assert_close(compat.MaxTopkSVM(n, 0.7, k)(x, y), _brute_hard(x, y, k, 0.7).mean())
        # the original's Topk_Hard_SVM formula: mean(top-k(s_{\y} + alpha)) - (sum top-(k-1)(s_{\y}) + s_y) / k
        others = x.scatter(1, y[:, None], -math.inf)
        first = (others + 0.7).topk(k, 1).values.mean(1)
        second = (others.topk(k - 1, 1).values.sum(1) + x.gather(1, y[:, None]).squeeze(1)) / k
        torch.testing.assert_close(compat.MaxTopkSVM(n, 0.7, k)(x, y), torch.clamp(first - second, min=0).mean())


def test_smooth_tends_to_hard_as_tau_goes_to_zero():
    x, y = _data(6, 8, 5)
    for k in (1, 2, 4):
        torch.testing.assert_close(
            compat.SmoothTopkSVM(8, None, 1e-4, k)(x, y), compat.MaxTopkSVM(8, None, k)(x, y), rtol=0, atol=2e-3
        )


# --------------------------------------------------------------------------- intended differences


@pytest.mark.parametrize(
    "module",
    [compat.SmoothTopkSVM(10, k=3), compat.SmoothTop1SVM(10), compat.MaxTopkSVM(10, k=3), compat.MaxTop1SVM(10)],
)
def test_forward_is_a_0d_batch_mean(module):
    x, y = _data(7, 10, 1, dtype=torch.float32)
    out = module(x, y)
    assert out.dim() == 0 and out.dtype == torch.float32
    module.reduction = "none"
    per_sample = module(x, y)
    module.reduction = "mean"
    assert per_sample.shape == (7,)
    torch.testing.assert_close(out, per_sample.sum() / 7)


def test_k1_gradient_correct_and_equals_top1():
    x, y = _data(6, 9, 2)
    topk = _value_and_grad(compat.SmoothTopkSVM(9, None, 0.7, 1), x, y)
    top1 = _value_and_grad(compat.SmoothTop1SVM(9, None, 0.7), x, y)
    for a, b in zip(topk, top1, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_gradcheck_float64(k):
    x, y = _data(3, 7, k)
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda s: compat.SmoothTopkSVM(7, None, 0.5, k)(s, y), (x,))


def test_shift_invariant():
    x, y = _data(6, 10, 7, dtype=torch.float32)
    base = compat.SmoothTopkSVM(10, k=3)(x, y)
    torch.testing.assert_close(compat.SmoothTopkSVM(10, k=3)(x + 1000.0, y), base, rtol=0, atol=1e-4)


def test_finite_gradients_for_large_scores_float32():
    x, y = _data(8, 20, 3, scale=1e4, dtype=torch.float32)
    value, grad = _value_and_grad(compat.SmoothTopkSVM(20, None, 0.01, 5), x, y)
    assert torch.isfinite(value) and torch.isfinite(grad).all()


def test_n_classes_k_plus_one_suffices():
    # the original needs n >= k + 1 + k // 5 = 7 for k = 5
    x, y = _data(4, 6, 0)
    torch.testing.assert_close(compat.SmoothTopkSVM(6, k=5)(x, y), _brute_smooth(x, y, 5, 1.0, 1.0).mean())


def test_cpu_to_and_dtypes():
    m = compat.SmoothTopkSVM(10, k=3)
    assert m.cpu() is m  # the original's .cpu() raises TypeError
    x, y = _data(4, 10, 0, dtype=torch.float32)
    assert m.to(torch.float64)(x.double(), y).dtype == torch.float64
    half = m(x.to(torch.bfloat16), y)
    assert half.dtype == torch.bfloat16 and torch.isfinite(half)


def test_attributes_are_read_at_forward():
    x, y = _data(4, 10, 0)
    m = compat.SmoothTopkSVM(10, k=3)
    m.alpha, m.tau = 2.0, 0.5
    torch.testing.assert_close(m(x, y), compat.SmoothTopkSVM(10, 2.0, 0.5, 3)(x, y), rtol=0, atol=0)


def test_spatial_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 4, generator=g)
    y = torch.randint(0, 6, (2, 3, 4), generator=g)
    flat_x, flat_y = x.movedim(1, -1).reshape(-1, 6), y.reshape(-1)
    torch.testing.assert_close(compat.SmoothTopkSVM(6, k=2)(x, y), compat.SmoothTopkSVM(6, k=2)(flat_x, flat_y))


# ------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("cls", [compat.SmoothTopkSVM, compat.MaxTopkSVM])
def test_bad_k(cls):
    for k in (0, -1):
        with pytest.raises(ValueError, match="k must be >= 1"):
            cls(10, k=k)
    with pytest.raises(ValueError, match=r"k must satisfy 1 <= k <= 4 \(k < n_classes\), got 5"):
        cls(5, k=5)
    for k in (2.0, True, "3"):
        with pytest.raises(TypeError, match="k must be an int"):
            cls(10, k=k)


@pytest.mark.parametrize("cls", [compat.SmoothTopkSVM, compat.SmoothTop1SVM])
def test_bad_tau(cls):
    for tau in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="tau must be a positive finite number"):
            cls(10, tau=tau)
    with pytest.raises(TypeError, match="tau must be a real number"):
        cls(10, tau="1")


@pytest.mark.parametrize("cls", [compat.SmoothTopkSVM, compat.SmoothTop1SVM, compat.MaxTopkSVM, compat.MaxTop1SVM])
def test_bad_alpha_and_n_classes(cls):
    with pytest.raises(ValueError, match="alpha must be a finite number >= 0"):
        cls(10, alpha=-0.5)
    with pytest.raises(TypeError, match="n_classes must be an int"):
        cls(10.0)
    with pytest.raises(ValueError, match="n_classes must be >= 2"):
        cls(1) if cls in (compat.SmoothTop1SVM, compat.MaxTop1SVM) else cls(1, k=1)


@pytest.mark.parametrize(
    "module",
    [compat.SmoothTopkSVM(10, k=3), compat.SmoothTop1SVM(10), compat.MaxTopkSVM(10, k=3), compat.MaxTop1SVM(10)],
)
def test_n_classes_mismatch(module):
    x, y = _data(4, 9, 0)
    with pytest.raises(ValueError, match="but the loss was built with n_classes = 10"):
        module(x, y)
    with pytest.raises(ValueError, match=r"input must have shape \(N, C\)"):
        module(torch.randn(10), torch.tensor(1))
