"""Routers' needs (issue 12, items 3-5): ``hard=True`` (exact k-hot forward, the soft method's
backward) and ``largest=False`` on every operator, ``softtopk.topk``, tensor parameters registered by
the Modules, and defaults that work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import softtopk

MASK_METHODS = sorted(softtopk.methods())
STOCHASTIC = {name for name, info in softtopk.methods().items() if info.stochastic}
PARAMS = {  # smooth enough that the soft mask differs from the k-hot one
    "bitonic": {"steepness": 2.0},
    "odd_even": {"steepness": 2.0},
    "splitter_selection": {"steepness": 2.0},
    "neuralsort": {"tau": 1.0},
    "softsort": {"tau": 1.0},
    "lapsum": {"tau": 1.0},
    "sparse": {"l": 2.0},
    "perturbed": {"sigma": 1.0, "n_samples": 50},
    "gumbel": {"tau": 1.0, "noise": False},
}


def _params(method: str) -> dict:
    params = dict(PARAMS[method])
    if method == "perturbed":
        params["generator"] = torch.Generator().manual_seed(0)
    return params


def _scores(*shape: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("method", MASK_METHODS)
@pytest.mark.parametrize("dim", [-1, 0])
def test_hard_forward_is_the_k_hot_and_backward_is_the_soft_gradient(method, dim):
    x = _scores(6, 9)
    g = _scores(6, 9, seed=1)
    k = 3
    grads = {}
    for hard in (False, True):
        leaf = x.clone().requires_grad_()
        mask = softtopk.soft_topk(leaf, k, method=method, dim=dim, hard=hard, **_params(method))
        if hard:
            assert torch.equal(mask.detach(), softtopk.hard_topk_mask(x, k, dim=dim)), "not the exact k-hot"
        (mask * g).sum().backward()
        grads[hard] = leaf.grad
    assert grads[False].abs().sum() > 0
    torch.testing.assert_close(grads[True], grads[False], rtol=0, atol=0)


@pytest.mark.parametrize("method", ["lapsum", "sparse", "bitonic", "neuralsort"])
def test_hard_forward_breaks_ties_as_torch_topk(method):
    x = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    mask = softtopk.soft_topk(x, 2, method=method, hard=True)
    expected = torch.zeros_like(x).scatter(-1, x.topk(2).indices, 1.0)
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("method", sorted(set(MASK_METHODS) - STOCHASTIC))
def test_largest_false_selects_the_smallest(method):
    x = _scores(4, 8, seed=3)
    torch.testing.assert_close(
        softtopk.soft_topk(x, 3, method=method, largest=False, **PARAMS[method]),
        softtopk.soft_topk(-x, 3, method=method, **PARAMS[method]),
        rtol=0,
        atol=0,
    )
    hard = softtopk.soft_topk(x, 3, method=method, largest=False, hard=True, **PARAMS[method])
    assert torch.equal(hard, torch.zeros_like(x).scatter(-1, x.topk(3, largest=False).indices, 1.0))


@pytest.mark.parametrize("method", ["bitonic", "neuralsort", "softsort"])
def test_largest_false_for_ranks_and_permutations(method):
    x = _scores(3, 7, seed=4)
    torch.testing.assert_close(
        softtopk.soft_topk_ranks(x, 2, method=method, largest=False), softtopk.soft_topk_ranks(-x, 2, method=method)
    )
    sharp = {"steepness": 1e7} if method == "bitonic" else {"tau": 1e-4}
    P = softtopk.soft_permutation(x, method=method, largest=False, **sharp)
    torch.testing.assert_close((x.unsqueeze(-1) * P).sum(-2), x.sort(-1).values, atol=1e-6, rtol=0)


def test_largest_false_for_the_other_operators():
    x = _scores(3, 7, seed=5)
    assert torch.equal(
        softtopk.hard_topk_mag(x, 2, largest=False), x * softtopk.hard_topk_mask(x.abs(), 2, largest=False)
    )
    torch.testing.assert_close(softtopk.sparse_topk_mask(x, 2, largest=False), softtopk.sparse_topk_mask(-x, 2))
    gen = lambda: torch.Generator().manual_seed(7)  # noqa: E731
    torch.testing.assert_close(
        softtopk.perturbed_topk(x, 2, largest=False, generator=gen()), softtopk.perturbed_topk(-x, 2, generator=gen())
    )
    torch.testing.assert_close(
        softtopk.gumbel_topk(x, 2, largest=False, generator=gen()), softtopk.gumbel_topk(-x, 2, generator=gen())
    )
    noise = _scores(3, 7, 5, seed=6)
    torch.testing.assert_close(
        softtopk.noised_kth_value(x, 2, noise=noise, largest=False), -softtopk.noised_kth_value(-x, 2, noise=-noise)
    )
    assert torch.equal(softtopk.noised_kth_value(x, 2, epsilon=0.0, largest=False), x.sort(-1).values[:, 1])


@pytest.mark.parametrize("method", ["lapsum", "sparse", "softsort", "bitonic"])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch_topk_and_gathers_the_soft_mask(method, largest):
    x = _scores(2, 10, 3, seed=8).requires_grad_()
    out = softtopk.topk(x, 4, method=method, dim=1, largest=largest)
    reference = torch.topk(x.detach(), 4, dim=1, largest=largest)
    assert torch.equal(out.values.detach(), reference.values) and torch.equal(out.indices, reference.indices)
    mask = softtopk.soft_topk(x.detach(), 4, method=method, dim=1, largest=largest)
    torch.testing.assert_close(out.weights.detach(), mask.gather(1, out.indices))
    hard = softtopk.topk(x, 4, method=method, dim=1, largest=largest, hard=True)
    assert torch.equal(hard.weights.detach(), torch.ones_like(hard.weights))
    hard.weights.sum().backward()  # a router's gradient: the soft mask's, at the selected experts
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_topk_router_trains_its_logits():
    """The router pattern of docs/methods/routing.md: a hard dispatch whose gate still learns."""
    router = nn.Linear(4, 6)
    tokens = _scores(5, 4, dtype=torch.float32)
    _, experts, weights = softtopk.topk(router(tokens), 2, hard=True, tau=0.5)
    assert experts.shape == (5, 2) and torch.equal(weights.detach(), torch.ones(5, 2))
    (weights * torch.arange(2.0)).sum().backward()
    assert router.weight.grad.abs().sum() > 0


def test_errors_of_hard_and_largest():
    x = _scores(2, 6)
    with pytest.raises(ValueError, match="hard=True needs an int k .* got a tensor k"):
        softtopk.soft_topk(x, torch.tensor([2.0, 3.0], dtype=torch.float64), hard=True)
    with pytest.raises(TypeError, match="largest must be a bool, got int 0"):
        softtopk.soft_topk(x, 2, largest=0)
    with pytest.raises(TypeError, match="largest must be a bool"):
        softtopk.SoftTopK(2, largest="no")
    with pytest.raises(TypeError, match="hard must be a bool, got int 1"):
        softtopk.soft_topk(x, 2, method="sparse", hard=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'hard'"):
        softtopk.sparse_topk_mag(x, 2, hard=True)  # a magnitude has no k-hot forward


def test_tensor_parameters_given_to_a_module_are_registered():
    tau = nn.Parameter(torch.tensor(0.5))
    layer = softtopk.SoftTopK(3, tau=tau)
    assert list(layer.parameters()) == [tau] and list(layer.state_dict()) == ["tau"]
    x = _scores(4, 7, dtype=torch.float32)
    (layer(x) * _scores(4, 7, seed=2, dtype=torch.float32)).sum().backward()
    assert tau.grad is not None and tau.grad != 0
    assert layer.double().tau.dtype == torch.float64  # follows .to()
    restored = softtopk.SoftTopK(3, tau=nn.Parameter(torch.tensor(2.0)))
    restored.load_state_dict(layer.state_dict())
    assert restored.tau.item() == pytest.approx(0.5)

    buffered = softtopk.SoftTopK(torch.tensor([2.0, 3.0]), tau=torch.tensor(0.25))
    assert not list(buffered.parameters()) and sorted(buffered.state_dict()) == ["k", "tau"]
    torch.testing.assert_close(buffered(x[:2]).sum(-1), torch.tensor([2.0, 3.0]))
    assert "tau=<Tensor>" in repr(buffered)

    knn = softtopk.DifferentiableKNN(2, method="lapsum", tau=nn.Parameter(torch.tensor(1.0)))
    assert [name for name, _ in knn.named_parameters()] == ["tau"]
    out = knn(x, x, torch.arange(4), query_labels=torch.arange(4))
    out.loss.backward()
    assert knn.tau.grad is not None


def test_defaults_that_work():
    x = _scores(2, 6)
    ranks = softtopk.SoftTopKRanks(2)(x)
    assert ranks.shape == (2, 6, 2) and softtopk.SoftTopKRanks(2).method == "softsort"
    torch.testing.assert_close(ranks.sum(-2), torch.ones(2, 2, dtype=torch.float64))
    assert softtopk.soft_permutation(x).shape == (2, 6, 6)


def test_many_classes_without_m_warns_once_with_the_fix():
    logits, target = torch.randn(4, 200), torch.randint(0, 200, (4,))
    with pytest.warns(UserWarning, match=r"relaxes all C = 200 classes .* m=16"):
        softtopk.topk_cross_entropy(logits, target, [0.5, 0.5], m=None)
    with pytest.warns(UserWarning, match="relaxes all C = 200 classes"):
        softtopk.TopKCrossEntropyLoss([0.5, 0.5], m=None)(logits, target)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        softtopk.topk_cross_entropy(logits, target, [0.5, 0.5])  # the default m=16
        softtopk.topk_cross_entropy(logits[:, :50], target % 50, [0.5, 0.5], m=None)


def test_hard_sorting_network_in_the_topk_loss():
    logits = _scores(8, 30, seed=9).requires_grad_()
    target = torch.randint(0, 30, (8,), generator=torch.Generator().manual_seed(0))
    loss = softtopk.topk_cross_entropy(logits, target, [0.5, 0.5], method="bitonic", m=8, hard=True)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
