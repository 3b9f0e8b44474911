"""Scale parameters outside the range the computation can use raise ``ValueError`` instead of giving
NaN (issue 12, item 2): below the smallest normal number of the compute dtype, or above its
reciprocal. Inside, at 1e-30 and 1e30 in float32, every method stays finite."""

from __future__ import annotations

import math

import pytest
import torch

import softtopk

SCALE_OF = {
    "lapsum": "tau",
    "neuralsort": "tau",
    "softsort": "tau",
    "gumbel": "tau",
    "sparse": "l",
    "bitonic": "steepness",
    "odd_even": "steepness",
    "splitter_selection": "steepness",
    "perturbed": "sigma",
}


def _call(method: str, value: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    x = (1e3 * torch.randn(3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)).to(dtype)
    x.requires_grad_()
    extra = {"noise": False} if method == "gumbel" else {}
    if method == "perturbed":
        extra = {"generator": torch.Generator().manual_seed(0)}
    mask = softtopk.soft_topk(x, 2, method=method, **{SCALE_OF[method]: value}, **extra)
    (mask * torch.arange(8.0, dtype=dtype)).sum().backward()
    return mask, x.grad


@pytest.mark.parametrize("method", sorted(SCALE_OF))
@pytest.mark.parametrize("value", [1e-40, 1e-300, 1e39, 1e300])
def test_scales_outside_the_float32_range_raise(method, value):
    name = SCALE_OF[method]
    with pytest.raises(ValueError, match=rf"{name} must lie in \[1.18e-38, 8.51e\+37\] for torch.float32 scores"):
        _call(method, value, torch.float32)
    with pytest.raises(ValueError, match=rf"{name} must lie in"):
        softtopk.SoftTopK(2, method=method, **{name: value})(torch.randn(2, 5))


@pytest.mark.parametrize("method", sorted(SCALE_OF))
@pytest.mark.parametrize("value", [1e-30, 1e30])
def test_scales_inside_the_range_stay_finite(method, value):
    mask, grad = _call(method, value, torch.float32)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize("method", sorted(SCALE_OF))
def test_masks_sum_to_k_at_tiny_scales(method):
    mask, _ = _call(method, 1e-30, torch.float32)
    torch.testing.assert_close(mask.sum(-1), torch.full((3,), 2.0), atol=1e-3, rtol=0)


def test_float64_scores_accept_float64_scales():
    mask, grad = _call("lapsum", 1e-40, torch.float64)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()
    with pytest.raises(ValueError, match=r"tau must lie in \[2.23e-308, 4.49e\+307\] for torch.float64 scores"):
        _call("lapsum", 1e-310, torch.float64)
    tau = torch.tensor([1.0, 1e-40])
    with pytest.raises(ValueError, match=r"tau must lie in .* got 1e-40|tau must lie in .* got 9.99"):
        softtopk.soft_topk(torch.randn(2, 5), 2, tau=tau)


def test_loss_scales():
    logits, target = torch.randn(4, 6), torch.arange(4)
    with pytest.raises(ValueError, match="tau must lie in"):
        softtopk.smooth_topk_svm(logits, target, k=2, tau=1e-40)
    with pytest.raises(ValueError, match="tau must lie in"):
        softtopk.SmoothTop1SVM(tau=1e-40)(logits, target)
    with pytest.raises(ValueError, match=r"scale must lie in .* got 1e\+300"):
        softtopk.imbal_noised_topk(logits, target, k=2, epsilon=1.0, max_m=0.5, cls_num_list=[1.0] * 6, scale=1e300)
    with pytest.raises(ValueError, match=r"epsilon must lie in .* got 1e\+300"):
        softtopk.bal_noised_topk(logits, target, k=2, epsilon=1e300)
    with pytest.raises(ValueError, match=r"epsilon must lie in .* got 1e\+300"):
        softtopk.noised_kth_value(logits, 2, epsilon=1e300)
    with pytest.raises(ValueError, match="steepness must lie in"):
        softtopk.topk_cross_entropy(logits, target, [0.5, 0.5], method="bitonic", steepness=1e-300)
    assert softtopk.noised_kth_value(logits, 2, epsilon=0.0).shape == (4,)  # 0 is the exact value
    assert math.isfinite(softtopk.smooth_topk_svm(logits.double(), target, k=2, tau=1e-40).item())


def test_per_row_tensor_k_equal_to_n_has_finite_gradients():
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    tau = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    k = torch.tensor([6.0, 2.0, 6.0], dtype=torch.float64, requires_grad=True)
    mask = softtopk.soft_topk(x, k, tau=tau)
    (mask * torch.randn(3, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)).sum().backward()
    assert (mask[[0, 2]] == 1).all()
    for grad in (x.grad, tau.grad, k.grad):
        assert torch.isfinite(grad).all()
    assert (x.grad[[0, 2]] == 0).all() and (k.grad[[0, 2]] == 0).all()


@pytest.mark.parametrize("method", sorted(SCALE_OF))
@pytest.mark.parametrize("value", [2.3e-308, 4.4e307])
def test_float64_scales_at_the_ends_of_the_range_stay_finite(method, value):
    mask, grad = _call(method, value, torch.float64)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(mask.sum(-1), torch.full((3,), 2.0, dtype=torch.float64))


def test_neuralsort_float32_matches_float64_at_n_1e5():
    x = torch.randn(2, 100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for tau in (1.0, 0.1):
        single = softtopk.soft_topk_ranks(x.float(), 5, method="neuralsort", tau=tau)
        double = softtopk.soft_topk_ranks(x, 5, method="neuralsort", tau=tau)
        assert (single.double() - double).abs().max() < 1e-3


def test_neuralsort_is_exact_in_the_hard_limit_at_n_1e6():
    x = torch.randn(1, 1_000_000, generator=torch.Generator().manual_seed(0))
    ranks = softtopk.soft_topk_ranks(x, 4, method="neuralsort", tau=1e-6)
    assert torch.equal(ranks[0].argmax(0), x[0].topk(4).indices)
    assert (ranks.amax(1) == 1).all()


def _neuralsort_by_pairs(x: torch.Tensor, k: int, tau: float) -> torch.Tensor:
    """NeuralSort's O(n^2) formula with torch.abs (sign(0) = 0 at ties), as the original writes it."""
    n = x.shape[-1]
    pairwise = (x.unsqueeze(-1) - x.unsqueeze(-2)).abs().sum(-1)
    coefficient = n - 1 - 2 * torch.arange(k, dtype=x.dtype)
    return torch.softmax((x.unsqueeze(-1) * coefficient - pairwise.unsqueeze(-1)) / tau, dim=-2)


def test_neuralsort_gradient_at_ties_is_symmetric_and_that_of_the_pairwise_formula():
    x = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.5, -1.0, 0.5, 2.0]], dtype=torch.float64)
    weights = torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grads = []
    for fn in (
        lambda t: softtopk.soft_permutation(t, method="neuralsort", tau=0.7),
        lambda t: _neuralsort_by_pairs(t, 4, 0.7),
    ):
        leaf = x.clone().requires_grad_()
        (fn(leaf) * weights).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)
    # a zero-initialised head: every logit tied; the loss of a symmetric functional moves them alike
    leaf = torch.zeros(1, 5, dtype=torch.float64, requires_grad=True)
    softtopk.soft_topk(leaf, 2, method="neuralsort").square().sum().backward()
    torch.testing.assert_close(leaf.grad, leaf.grad[:, :1].expand(1, 5))


@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_per_row_tensor_tau_with_gradients(method):
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    tau = torch.tensor([0.3, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    ranks = softtopk.soft_topk_ranks(x, 2, method=method, tau=tau)
    for i in range(3):
        torch.testing.assert_close(
            ranks[i], softtopk.soft_topk_ranks(x[i], 2, method=method, tau=float(tau.detach()[i]))
        )
    assert torch.autograd.gradcheck(lambda t: softtopk.soft_topk(x, 2, method=method, tau=t), (tau,))
    layer = softtopk.SoftTopKRanks(2, method=method, tau=torch.nn.Parameter(torch.tensor(0.5, dtype=torch.float64)))
    assert [name for name, _ in layer.named_parameters()] == ["tau"]
    layer(x).sum().backward()
    assert torch.isfinite(layer.tau.grad)
    assert softtopk.soft_permutation(x, method=method, tau=tau).shape == (3, 6, 6)
    with pytest.raises(ValueError, match="tau must be a scalar or broadcastable"):
        softtopk.soft_topk(x, 2, method=method, tau=torch.ones(4))


@pytest.mark.parametrize("method", ["bitonic", "odd_even", "splitter_selection"])
@pytest.mark.parametrize("distribution", ["cauchy", "logistic_phi", "optimal"])
def test_per_row_tensor_steepness_with_gradients(method, distribution):
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    beta = torch.tensor([0.7, 2.0, 5.0], dtype=torch.float64, requires_grad=True)
    mask = softtopk.soft_topk(x, 3, method=method, steepness=beta, distribution=distribution)
    for i in range(3):
        want = softtopk.soft_topk(x[i], 3, method=method, steepness=float(beta.detach()[i]), distribution=distribution)
        torch.testing.assert_close(mask[i], want, atol=1e-14, rtol=0)
    assert torch.autograd.gradcheck(
        lambda b, t: softtopk.soft_topk_ranks(t, 3, method=method, steepness=b, distribution=distribution),
        (beta, x.clone().requires_grad_()),
    )
    assert torch.autograd.gradcheck(
        lambda b: softtopk.soft_topk(x, 3, method=method, steepness=b, distribution=distribution), (beta,)
    )
    # vmap over rows and a learnable steepness in the Module twin
    got = torch.vmap(lambda r, b: softtopk.soft_topk(r, 3, method=method, steepness=b, distribution=distribution))(
        x, beta.detach()
    )
    torch.testing.assert_close(got, mask.detach(), atol=1e-14, rtol=0)
    layer = softtopk.SoftTopK(3, method=method, steepness=torch.nn.Parameter(torch.tensor(2.0, dtype=torch.float64)))
    layer(x).pow(2).sum().backward()
    assert torch.isfinite(layer.steepness.grad) and layer.steepness.grad != 0


@pytest.mark.parametrize("p", [2.0, 4 / 3])
def test_per_row_tensor_l_with_gradients(p):
    x = torch.randn(3, 9, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    x[1, 2] = x[1, 5]  # a tie
    lam = torch.tensor([0.3, 1.0, 5.0], dtype=torch.float64, requires_grad=True)
    mask = softtopk.sparse_topk_mask(x, 3, l=lam, p=p)
    for i in range(3):
        want = softtopk.sparse_topk_mask(x[i], 3, l=float(lam.detach()[i]), p=p)
        torch.testing.assert_close(mask[i], want, atol=1e-14, rtol=0)
    assert torch.autograd.gradcheck(
        lambda t, v: softtopk.sparse_topk_mask(v, 3, l=t, p=p), (lam, x.clone().requires_grad_())
    )
    # a hard row (tiny l) and a huge l have finite gradients (0 for the hard row)
    extreme = torch.tensor([1e-8, 1e200, 0.5], dtype=torch.float64, requires_grad=True)
    mask = softtopk.soft_topk(x, 3, method="sparse", l=extreme, p=p)
    mask.pow(2).sum().backward()
    torch.testing.assert_close(mask.sum(-1), torch.full((3,), 3.0, dtype=torch.float64))
    assert torch.isfinite(extreme.grad).all() and extreme.grad[0] == 0
    layer = softtopk.SoftTopK(3, method="sparse", l=torch.nn.Parameter(torch.tensor(0.5, dtype=torch.float64)), p=p)
    layer(x).pow(2).sum().backward()
    assert torch.isfinite(layer.l.grad) and layer.l.grad != 0
    with pytest.raises(TypeError, match="l must be a float for sparse_topk_mag"):
        softtopk.sparse_topk_mag(x, 3, l=lam)


def test_per_row_tensor_l_with_dykstra_uses_the_exact_gradient():
    x = torch.randn(3, 9, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    lam = torch.tensor([0.3, 1.0, 5.0], dtype=torch.float64)
    dykstra = softtopk.sparse_topk_mask(x, 3, l=lam, p=2.0, solver="dykstra", n_iter=2000)
    torch.testing.assert_close(dykstra, softtopk.sparse_topk_mask(x, 3, l=lam, p=2.0), atol=1e-8, rtol=0)


def test_sparse_magnitude_with_p_4_3_refuses_an_l_whose_threshold_underflows():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    out = softtopk.sparse_topk_mag(x, 5, l=1e30)
    (grad,) = torch.autograd.grad((out * torch.arange(50.0, dtype=torch.float64)).sum(), x)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    with pytest.raises(ValueError, match=r"l must be at most 1e\+30 for sparse_topk_mag with p=4/3, got 1e\+36"):
        softtopk.sparse_topk_mag(x, 5, l=1e36)
    assert torch.isfinite(softtopk.sparse_topk_mag(x, 5, l=4.4e307, p=2.0)).all()
