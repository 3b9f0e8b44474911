"""ndcg_loss (issue 15, item 2): the hard limit equals 1 - NDCG@k, a brute force over small lists,
padding masks, gradcheck, the Module twin and the error messages."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from softtopk.losses import NDCGLoss, ndcg_loss

F64 = torch.float64


def exact_ndcg_loss(scores, relevance, k: int) -> float:
    """1 - NDCG@k of one list by sorting (ties broken by position)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    gains = [2.0**r - 1 for r in relevance]
    dcg = sum(gains[i] / math.log2(rank + 2) for rank, i in enumerate(order[:k]))
    ideal = sum(g / math.log2(rank + 2) for rank, g in enumerate(sorted(gains, reverse=True)[:k]))
    return 0.0 if ideal == 0 else 1 - dcg / ideal


@pytest.mark.parametrize(
    "method, params",
    [
        ("neuralsort", {"tau": 1e-4}),
        ("softsort", {"tau": 1e-4}),
        ("bitonic", {"steepness": 1e6, "distribution": "logistic"}),
    ],
)
def test_hard_limit_equals_the_brute_force(method, params):
    """Every permutation of 4 distinct scores, relevances with ties, every k: the sharp relaxation is
    the exact 1 - NDCG@k."""
    relevance = [2.0, 0.0, 1.0, 1.0]
    for perm in itertools.permutations([0.0, 1.0, 2.0, 3.0]):
        scores = torch.tensor([perm], dtype=F64)
        for k in range(1, 5):
            got = ndcg_loss(scores, torch.tensor([relevance], dtype=F64), k, method=method, **params)
            assert abs(float(got) - exact_ndcg_loss(perm, relevance, k)) < 1e-6, (perm, k)


def test_padding_mask_equals_the_shorter_list():
    scores = torch.tensor([[0.3, 2.0, 1.0, 5.0, -1.0]], dtype=F64)
    relevance = torch.tensor([[1.0, 2.0, 0.0, 3.0, 1.0]], dtype=F64)
    mask = torch.tensor([[True, True, True, False, False]])
    padded = ndcg_loss(scores, relevance, 2, mask=mask, tau=0.5)
    short = ndcg_loss(scores[:, :3], relevance[:, :3], 2, tau=0.5)
    torch.testing.assert_close(padded, short)
    grad = torch.autograd.grad(ndcg_loss(scores.requires_grad_(), relevance, 2, mask=mask, tau=0.5), scores)[0]
    assert torch.isfinite(grad).all() and (grad[0, 3:] == 0).all()


def test_reductions_lists_without_relevance_and_gradcheck():
    scores = torch.randn(3, 6, dtype=F64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    relevance = torch.tensor([[0, 1, 2, 0, 0, 1], [0] * 6, [3, 0, 0, 1, 0, 0]], dtype=F64)
    per_list = ndcg_loss(scores, relevance, 3, tau=0.7, reduction="none")
    assert per_list.shape == (3,) and per_list[1] == 0 and bool(((per_list >= 0) & (per_list <= 1)).all())
    torch.testing.assert_close(ndcg_loss(scores, relevance, 3, tau=0.7), per_list.mean())
    torch.testing.assert_close(ndcg_loss(scores, relevance, 3, tau=0.7, reduction="sum"), per_list.sum())
    assert torch.autograd.gradcheck(lambda s: ndcg_loss(s, relevance, 3, tau=0.7), (scores,))
    module = NDCGLoss(3, tau=0.7, reduction="none")
    torch.testing.assert_close(module(scores, relevance), per_list)
    assert "k=3, method='neuralsort', reduction='none', tau=0.7" in repr(module)


def test_training_signal_improves_ndcg():
    """A few gradient steps on the scores lower the loss."""
    scores = torch.zeros(1, 8, dtype=F64, requires_grad=True)
    relevance = torch.tensor([[0, 3, 0, 1, 2, 0, 0, 1]], dtype=F64)
    first = float(ndcg_loss(scores.detach(), relevance, 4, tau=0.5))
    optimizer = torch.optim.SGD([scores], lr=1.0)
    for _ in range(30):
        optimizer.zero_grad()
        ndcg_loss(scores, relevance, 4, tau=0.5).backward()
        optimizer.step()
    assert float(ndcg_loss(scores.detach(), relevance, 4, tau=0.5)) < first / 2


ERRORS = [
    (
        lambda: ndcg_loss(torch.zeros(2, 3), torch.zeros(2, 4), 1),
        ValueError,
        r"relevance must have the shape of scores \(2, 3\), got \(2, 4\)",
    ),
    (
        lambda: ndcg_loss(torch.zeros(2, 3), torch.zeros(2, 3), 4),
        ValueError,
        r"k must satisfy 1 <= k <= 3 \(the list length n\), got 4",
    ),
    (
        lambda: ndcg_loss(torch.zeros(2, 3), torch.zeros(2, 3), 1, reduction="avg"),
        ValueError,
        "reduction must be one of",
    ),
    (
        lambda: ndcg_loss(torch.zeros(2, 3), torch.zeros(2, 3), 1, mask=torch.ones(2, 3)),
        ValueError,
        r"mask must be a bool tensor of shape \(2, 3\), got torch.float32 \(2, 3\)",
    ),
    (
        lambda: ndcg_loss(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), 1),
        TypeError,
        "relevance must have a floating dtype",
    ),
]


@pytest.mark.parametrize("call, error, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_error_messages(call, error, message):
    with pytest.raises(error, match=message):
        call()
