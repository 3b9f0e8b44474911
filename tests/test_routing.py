"""TopKRouter and load_balancing_loss (issue 15, item 1): shapes, the hard dispatch equals
``torch.topk``, gradients reach the router, masking of unavailable experts, the auxiliary loss
against its formula, and the error messages."""

from __future__ import annotations

import pytest
import torch

import softtopk
from softtopk import TopKRouter, load_balancing_loss

METHODS = [
    ("hard", {}),
    ("lapsum", {"tau": 0.5}),
    ("sparse", {"l": 0.5}),
    ("lapsum", {"tau": 0.5, "hard": True}),
    ("neuralsort", {"tau": 0.5}),
]


def _tokens(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("method, params", METHODS, ids=lambda v: str(v))
def test_shapes_dispatch_and_gradients(method, params):
    torch.manual_seed(0)
    router = TopKRouter(16, 8, 2, method=method, **params)
    x = _tokens(3, 5, 16)
    weights, indices = router(x)
    assert weights.shape == indices.shape == (3, 5, 2) and indices.dtype == torch.long
    # the dispatch is torch.topk of the logits
    assert torch.equal(indices, router.gate(x).topk(2, dim=-1).indices)
    if params.get("hard"):
        assert bool((weights == 1).all())
    else:
        assert bool(((weights > 0) & (weights <= 1)).all())
    if method == "hard":
        torch.testing.assert_close(weights.sum(-1), torch.ones(3, 5))
    (weights * torch.arange(2.0)).sum().backward()
    assert router.gate.weight.grad is not None and bool(router.gate.weight.grad.abs().sum() > 0)


def test_masked_experts_are_never_chosen_and_get_no_gradient():
    torch.manual_seed(1)
    router = TopKRouter(8, 6, 2, method="lapsum", tau=0.3)
    x = _tokens(40, 8, seed=1)
    mask = torch.ones(40, 6, dtype=torch.bool)
    mask[:, 0] = False  # expert 0 unavailable everywhere
    mask[::2, 3] = False  # expert 3 unavailable to every other token
    weights, indices = router(x, mask)
    assert not bool((indices == 0).any()) and not bool((indices[::2] == 3).any())
    assert bool(torch.isfinite(weights).all())
    weights.sum().backward()
    assert bool(torch.isfinite(router.gate.weight.grad).all())
    assert router.gate.weight.grad[0].abs().sum() == 0 and router.gate.bias.grad[0] == 0
    # a mask over experts only broadcasts to every token
    _, indices = router(x, torch.tensor([True, True, False, True, True, True]))
    assert not bool((indices == 2).any())


def test_aux_loss_equals_its_formula():
    logits = _tokens(10, 4, seed=2).requires_grad_()
    indices = logits.topk(2, dim=-1).indices
    expected = 4 * sum((indices == e).sum().item() / 20 * logits.softmax(-1)[:, e].mean() for e in range(4))
    loss = load_balancing_loss(logits, indices)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert bool(logits.grad.abs().sum() > 0)
    # uniform dispatch and probabilities: 1; everything on one expert: E
    torch.testing.assert_close(load_balancing_loss(torch.zeros(4, 4), torch.arange(4).reshape(4, 1)), torch.tensor(1.0))
    peaked = torch.tensor([[50.0, 0, 0, 0]]).expand(6, 4)
    torch.testing.assert_close(load_balancing_loss(peaked, torch.zeros(6, 1, dtype=torch.long)), torch.tensor(4.0))


def test_router_sets_aux_loss_and_it_trains_the_gate():
    torch.manual_seed(3)
    router = TopKRouter(8, 4, 1, method="hard")
    x = _tokens(64, 8, seed=3)
    router(x)
    router.aux_loss.backward()
    assert router.gate.weight.grad.abs().sum() > 0
    torch.testing.assert_close(router.aux_loss, load_balancing_loss(router.gate(x), router.gate(x).topk(1).indices))


ERRORS = [
    (lambda: TopKRouter(0, 4, 1), ValueError, "d_model must be >= 1, got 0"),
    (lambda: TopKRouter(8, 4, 5), ValueError, r"k must satisfy 1 <= k <= 4 \(the number of experts\), got 5"),
    (lambda: TopKRouter(8, 4, 2, method="nope"), ValueError, "method must be one of"),
    (
        lambda: TopKRouter(8, 4, 2, method="hard", tau=1.0),
        TypeError,
        r"method 'hard' takes no parameters, got \['tau'\]",
    ),
    (lambda: TopKRouter(8, 4, 2, method="lapsum", l=1.0), TypeError, "method 'lapsum' got unexpected parameter"),
    (
        lambda: TopKRouter(8, 4, 2)(torch.randn(3, 7)),
        ValueError,
        r"x must have shape \(\*, d_model = 8\), got \(3, 7\)",
    ),
    (
        lambda: TopKRouter(8, 4, 2)(torch.randn(3, 8), torch.ones(3, 4)),
        TypeError,
        "mask must be a bool tensor, got torch.float32",
    ),
    (
        lambda: TopKRouter(8, 4, 2)(torch.randn(3, 8), torch.ones(3, 5, dtype=torch.bool)),
        ValueError,
        r"mask must be broadcastable to \(3, 4\)",
    ),
    (
        lambda: TopKRouter(8, 4, 2)(torch.randn(3, 8), torch.tensor([True, False, False, False])),
        ValueError,
        "mask must leave at least k = 2 experts available to every token, got a token with 1",
    ),
    (
        lambda: load_balancing_loss(torch.randn(3, 4), torch.zeros(2, 1, dtype=torch.long)),
        ValueError,
        r"indices must be an integer tensor of shape \(3,\) \+ \(k,\), got torch.int64 \(2, 1\)",
    ),
]


@pytest.mark.parametrize("call, error, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_error_messages(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_repr_and_exports():
    assert "method='sparse', l=0.5" in repr(TopKRouter(4, 3, 1, method="sparse", l=0.5))
    assert softtopk.nn.TopKRouter is TopKRouter and softtopk.functional.load_balancing_loss is load_balancing_loss
