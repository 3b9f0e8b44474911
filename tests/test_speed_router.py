"""The router and the kNN on the fast path (issue 21): no host value reads in forward, backward or
``aux_loss`` (counted with tests/dispatch_counter.py on the CPU, where no tensor-argument check is
involved), ``method="hard"`` launching no more aten ops than a plain softmax+topk router with the
load-balancing loss, forward and backward on the ``meta`` device, ``torch.compile(fullgraph=True)``
agreeing with eager; and the hardening cases: empty batches give a zero loss, out-of-range indices
name ``indices``, embeddings of size 1e20 give finite kNN weights."""

from __future__ import annotations

import pytest
import torch

import softtopk
from dispatch_counter import count_call
from softtopk import DifferentiableKNN, TopKRouter, load_balancing_loss

METHODS = [("hard", {}), ("lapsum", {"hard": True}), ("lapsum", {}), ("sparse", {})]
IDS = ["hard", "lapsum-hard", "lapsum", "sparse"]
TOKENS, D_MODEL, EXPERTS, K = 1024, 32, 64, 2  # the 16384 x 64 routing structure at a smaller size


def _router(method: str, params: dict) -> TopKRouter:
    torch.manual_seed(0)
    return TopKRouter(D_MODEL, EXPERTS, K, method=method, **params)


def _loss_of(router: torch.nn.Module):
    def call(x):
        weights = router(x)[0]
        return weights.sum() + router.aux_loss

    return call


class _PlainRouter(torch.nn.Module):
    """Softmax, topk, gates renormalised over the k chosen, and the Switch loss counted by scatter_add."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(D_MODEL, EXPERTS)

    def forward(self, x):
        logits = self.gate(x)
        probs = logits.float().softmax(-1)
        top = probs.topk(K, dim=-1)
        ones = probs.new_ones(()).expand(top.indices.numel())
        counts = probs.new_zeros(EXPERTS).scatter_add_(0, top.indices.reshape(-1), ones) / ones.numel()
        self.aux_loss = EXPERTS * (counts * probs.mean(0)).sum()
        return top.values / top.values.sum(-1, keepdim=True), top.indices


@pytest.mark.parametrize("method, params", METHODS, ids=IDS)
def test_router_adds_no_value_reads(method, params):
    router = _router(method, params)
    x = torch.randn(TOKENS, D_MODEL)
    counts = count_call(_loss_of(router), x)
    if method == "hard":
        assert counts.reads == 0, counts
        return
    logits = router.gate(x).detach()
    gate = count_call(lambda z: softtopk.topk(z, K, method=method, **params).weights, logits)
    assert counts.reads <= gate.reads, (counts.reads, gate.reads)  # the soft gate's own reads, none added


def test_hard_router_launches_no_more_than_a_plain_router_with_aux_loss():
    x = torch.randn(TOKENS, D_MODEL)
    hard = count_call(_loss_of(_router("hard", {})), x)
    plain = count_call(_loss_of(_PlainRouter()), x)
    assert hard.launches <= plain.launches, (dict(hard.ops), dict(plain.ops))
    assert hard.reads == plain.reads == 0


def test_aux_loss_adds_a_handful_of_launches():
    logits = torch.randn(TOKENS, EXPERTS)
    indices = logits.topk(K).indices
    counts = count_call(lambda z: softtopk.routing._balance(z, indices), logits)
    assert counts.reads == 0 and counts.launches <= 10, dict(counts.ops)


def test_router_mask_adds_no_reads_off_the_cpu_check():
    """The mask's ``k available`` check is a CPU argument check; on meta (no values) the masked call reads nothing."""
    router = _router("hard", {}).to("meta")
    x = torch.randn(TOKENS, D_MODEL, device="meta")
    mask = torch.ones(EXPERTS, dtype=torch.bool, device="meta")
    counts = count_call(lambda z: router(z, mask)[0].sum() + router.aux_loss, x)
    assert counts.reads == 0


@pytest.mark.parametrize("method, params", METHODS, ids=IDS)
def test_router_forward_backward_on_meta(method, params):
    router = _router(method, params).to("meta")
    x = torch.randn(TOKENS, D_MODEL, device="meta", requires_grad=True)
    weights, indices = router(x)
    (weights.sum() + router.aux_loss).backward()
    assert weights.shape == indices.shape == (TOKENS, K) and x.grad.shape == x.shape
    assert router.gate.weight.grad.is_meta


@pytest.mark.parametrize("method, params", METHODS, ids=IDS)
def test_router_compiled_agrees_with_eager(method, params):
    router = _router(method, params)
    x = torch.randn(64, D_MODEL)
    mask = torch.rand(64, EXPERTS) > 0.3
    mask[:, :K] = True

    def run(call):
        router.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        weights, indices, aux = call(leaf)
        ((weights * torch.arange(K)).sum() + aux).backward()
        return weights.detach(), indices, aux.detach(), leaf.grad, router.gate.weight.grad

    def call(z):
        out = router(z, mask)
        return out.weights, out.indices, router.aux_loss

    eager = run(call)
    compiled = run(torch.compile(call, fullgraph=True, backend="aot_eager"))
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b)


def test_empty_batch_gives_zero_aux_loss():
    assert load_balancing_loss(torch.randn(0, 4), torch.zeros(0, 2, dtype=torch.long)).item() == 0.0
    router = TopKRouter(8, 4, 2, method="hard")
    x = torch.randn(0, 8, requires_grad=True)
    weights, _ = router(x)
    assert weights.shape == (0, 2) and router.aux_loss.item() == 0.0
    (weights.sum() + router.aux_loss).backward()
    assert torch.isfinite(router.gate.weight.grad).all()


@pytest.mark.parametrize(
    "indices, error",
    [
        (torch.tensor([[0], [4], [1]]), ValueError),
        (torch.tensor([[0], [-1], [1]]), ValueError),
        (torch.tensor([[True], [False], [True]]), TypeError),
        (torch.zeros(3, 1), TypeError),
    ],
    ids=["too-large", "negative", "bool", "float"],
)
def test_bad_indices_name_indices(indices, error):
    with pytest.raises(error, match="indices must"):
        load_balancing_loss(torch.randn(3, 4), indices)


def test_load_balancing_loss_on_meta_and_in_bfloat16():
    logits = torch.randn(6, 4, device="meta", requires_grad=True)
    load_balancing_loss(logits, torch.zeros(6, 2, dtype=torch.long, device="meta")).backward()
    assert logits.grad.shape == (6, 4)
    logits = torch.zeros(4, 3, dtype=torch.bfloat16)
    loss = load_balancing_loss(logits, torch.tensor([[0], [1], [2], [0]]))
    assert loss.dtype == torch.bfloat16 and loss.item() == 1.0


def test_router_names_x_on_another_device():
    with pytest.raises(ValueError, match=r"x must be on the router's device \(cpu\), got meta"):
        TopKRouter(8, 4, 2)(torch.randn(3, 8, device="meta"))


# ------------------------------------------------------------------------------------------- kNN

KNN_METHODS = ["neuralsort", "lapsum", "sparse"]


def _knn_inputs(device="cpu"):
    gen = torch.Generator().manual_seed(0)
    query, neighbors = torch.randn(8, 5, generator=gen), torch.randn(40, 5, generator=gen)
    labels, query_labels = torch.randint(0, 3, (40,), generator=gen), torch.randint(0, 3, (8,), generator=gen)
    return [t.to(device) for t in (query, neighbors, labels, query_labels)]


@pytest.mark.parametrize("method", KNN_METHODS)
def test_knn_adds_no_value_reads(method):
    knn = DifferentiableKNN(3, method=method)
    query, neighbors, labels, query_labels = _knn_inputs()
    counts = count_call(lambda q, c: knn(q, c, labels, query_labels).loss, query, neighbors)
    scores = -torch.cdist(query, neighbors).pow(2)
    gate = count_call(lambda s: softtopk.soft_topk(s, 3, method=method), scores)
    assert counts.reads <= gate.reads, (counts.reads, gate.reads)  # the relaxed top-k's own, none added
    distances = count_call(lambda q, c: softtopk.knn._neg_sq_distances(q, c), query, neighbors)
    assert distances.reads == 0


@pytest.mark.parametrize("method", KNN_METHODS)
def test_knn_forward_backward_on_meta(method):
    query, neighbors, labels, query_labels = _knn_inputs("meta")
    query.requires_grad_()
    out = DifferentiableKNN(3, method=method)(query, neighbors, labels, query_labels)
    out.loss.backward()
    assert out.weights.shape == (8, 40) and query.grad.shape == query.shape


@pytest.mark.parametrize("method", KNN_METHODS)
def test_knn_compiled_agrees_with_eager(method):
    knn = DifferentiableKNN(3, method=method)
    query, neighbors, labels, query_labels = _knn_inputs()

    def run(call):
        leaf = query.clone().requires_grad_()
        weights, loss = call(leaf)
        loss.backward()
        return weights.detach(), loss.detach(), leaf.grad

    def call(q):
        return tuple(knn(q, neighbors, labels, query_labels))

    for a, b in zip(run(torch.compile(call, fullgraph=True, backend="aot_eager")), run(call), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("method", KNN_METHODS)
@pytest.mark.parametrize("size", [1e20, 1e30])
def test_knn_huge_embeddings_give_the_nearest_neighbours(method, size):
    """Squared distances of 1e20-sized float32 embeddings overflow; the scores keep their order and
    stay finite, and a relaxed top-k of scores that far apart is the hard k nearest."""
    query, neighbors, labels, query_labels = _knn_inputs()
    query = (query * size).requires_grad_()
    knn = DifferentiableKNN(3, method=method)
    out = knn(query, neighbors * size, labels, query_labels)
    out.loss.backward()
    assert torch.isfinite(out.weights).all() and torch.isfinite(query.grad).all()
    nearest = torch.cdist(query.double(), (neighbors * size).double()).topk(3, largest=False).indices
    hard = torch.zeros(8, 40).scatter(-1, nearest, 1.0)
    torch.testing.assert_close(out.weights.detach(), hard, atol=1e-3, rtol=0)


def test_knn_distances_unchanged_for_ordinary_embeddings():
    """The power-of-two scaling is exact: the same distances as the plain centred expansion."""
    query, neighbors, _, _ = _knn_inputs()
    query, neighbors = query * 3 + 100, neighbors * 2 + 100
    centre = neighbors.mean(0, keepdim=True)
    q, c = query - centre, neighbors - centre
    plain = -(q.pow(2).sum(-1, keepdim=True) + c.pow(2).sum(-1) - 2.0 * (q @ c.T)).clamp_min(0.0)
    assert torch.equal(softtopk.knn._neg_sq_distances(query, neighbors), plain)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_knn_non_finite_query_stays_in_its_row(value):
    query, neighbors, _, _ = _knn_inputs()
    query[0, 1] = value
    centre = neighbors.mean(0, keepdim=True)
    q, c = query - centre, neighbors - centre
    plain = -(q.pow(2).sum(-1, keepdim=True) + c.pow(2).sum(-1) - 2.0 * (q @ c.T)).clamp_min(0.0)
    scores = softtopk.knn._neg_sq_distances(query, neighbors)
    torch.testing.assert_close(scores, plain, rtol=0, atol=0, equal_nan=True)
    assert torch.isfinite(scores[1:]).all()
