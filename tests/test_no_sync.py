"""No host reads of tensor values, and a run on the ``meta`` device, for every public call.

On a GPU a value read (``.item()``, ``bool(t)``, ``nonzero``, ...) is a synchronisation that stalls
the CPU until the queued work is done and makes CUDA-graph capture impossible. Every operator,
loss, router and kNN call is counted here with a ``TorchDispatchMode`` on the CPU, forward and
backward, with rows holding ``±inf`` entries too: the computation reads nothing. The only reads
allowed are the documented argument checks on CPU tensors (class targets in range, for example),
which never run on an accelerator; the ``meta`` device, where no value exists, proves that. No call
makes a tensor from host data either (``torch.tensor``, ``new_tensor``): on a GPU that is a copy
from pageable memory, which waits for the host just the same.
"""

from __future__ import annotations

import pytest
import torch

import softtopk
from dispatch_counter import count_call
from softtopk import losses

INF = float("inf")
_METHODS = softtopk.methods()


def _rows(n: int = 12, device: str = "cpu") -> torch.Tensor:
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(0)).to(device)
    if device == "meta":
        return x
    x[1, 3] = -INF  # padding
    x[2, :] = -INF  # a short row: fewer than k entries above -inf
    x[2, :2] = torch.tensor([0.5, -0.3])
    x[3, 5] = INF  # a +inf entry
    return x


def _params(method: str) -> dict:
    params = {"tau": 0.5} if "tau" in _METHODS[method].params else {}
    if method == "perturbed":
        params = {"n_samples": 8}
    return params


def _calls():
    for method, info in _METHODS.items():
        if "mask" in info.outputs:
            yield f"mask-{method}", lambda x, m=method: softtopk.soft_topk(x, 3, method=m, **_params(m))
            if method not in ("gumbel",):
                yield f"hard-{method}", lambda x, m=method: softtopk.soft_topk(x, 3, method=m, hard=True, **_params(m))
        if "ranks" in info.outputs and (method != "gumbel"):
            yield f"ranks-{method}", lambda x, m=method: softtopk.soft_topk_ranks(x, 3, method=m, **_params(m))
        if "permutation" in info.outputs:
            yield f"perm-{method}", lambda x, m=method: softtopk.soft_permutation(x, method=m, **_params(m))
    yield "ranks-gumbel", lambda x: softtopk.soft_topk_ranks(x, 3, method="gumbel", relaxation="subsets")
    yield "sparse-p2", lambda x: softtopk.sparse_topk_mask(x, 3, p=2)
    yield "sparse-dykstra", lambda x: softtopk.sparse_topk_mask(x, 3, p=2, solver="dykstra", n_iter=5)
    yield "sparse-mag", lambda x: softtopk.sparse_topk_mag(x, 3)
    yield "sparse-mag-dykstra", lambda x: softtopk.sparse_topk_mag(x, 3, p=2, solver="dykstra", n_iter=5)
    # rows with k or more infinite magnitudes (the negative entries at -inf)
    yield "sparse-mag-infinite", lambda x: softtopk.sparse_topk_mag(x.where(x > 0, -INF), 3)
    yield "topk", lambda x: softtopk.topk(x, 3).weights
    yield "topk-hard", lambda x: softtopk.topk(x, 3, hard=True).weights
    yield "noised-kth", lambda x: softtopk.noised_kth_value(x, 3, epsilon=0.5)
    for method in ("lapsum", "neuralsort", "softsort", "bitonic", "sparse"):
        scale = {"sparse": "l", "bitonic": "steepness"}.get(method, "tau")
        yield (
            f"tensor-{scale}-{method}",
            lambda x, m=method, s=scale: softtopk.soft_topk(
                x, 3, method=m, **{s: torch.full((4,), 0.5, device=x.device)}
            ),
        )
    yield "tensor-k", lambda x: softtopk.soft_topk(x, K_TENSOR.to(x.device))


K_TENSOR = torch.tensor([1.0, 2.0, 2.5, 3.0])


CALLS = dict(_calls())
# the CPU-only checks of a tensor argument's values (positive, finite, in range): one read each
CHECKED_READS = {name: 2 if name.startswith("tensor-") else 0 for name in CALLS}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_operators_read_no_value(name):
    counts = count_call(CALLS[name], _rows())
    assert counts.reads <= CHECKED_READS[name], f"{name}: {counts.reads} host reads"
    assert counts.uploads == 0, f"{name}: {counts.uploads} tensors made from host data"


@pytest.mark.parametrize("name", sorted(CALLS))
def test_operators_run_on_meta(name):
    x = _rows(device="meta").requires_grad_()
    out = CALLS[name](x)
    assert out.device.type == "meta"
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def _class_losses():
    p_k = [0.5, 0.5]
    yield "topk-ce-splitter", losses.TopKCrossEntropyLoss(p_k, m=4, method="splitter_selection")
    yield "topk-ce-neuralsort", losses.TopKCrossEntropyLoss(p_k, m=4, method="neuralsort")
    yield "smooth-svm", losses.SmoothTopKSVM(k=2)
    yield "smooth-svm-1", losses.SmoothTop1SVM()
    yield "svm", losses.TopKSVM(k=2)
    yield "bal-noised", losses.BalNoisedTopK(k=2, epsilon=0.5)
    yield "imbal-noised", losses.ImbalNoisedTopK(k=2, epsilon=0.5, max_m=0.5, cls_num_list=[3.0] * 12)


LOSSES = dict(_class_losses())


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_class_losses_read_only_the_target_check(name):
    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0, 3, 7, 11])
    counts = count_call(lambda x: LOSSES[name](x, target), logits)
    assert counts.reads <= 1, f"{name}: {counts.reads} host reads (the CPU target check is one)"
    assert counts.uploads == 0, f"{name}: {counts.uploads} tensors made from host data"


@pytest.mark.parametrize("name", ["smooth-svm", "smooth-svm-1", "svm", "topk-ce-smce"])
def test_class_losses_at_plus_inf_read_only_the_target_check(name):
    """Rows with another class at +inf (one, and k of them) and with the label at +inf."""
    loss = LOSSES.get(name) or losses.TopKCrossEntropyLoss([0.5, 0.5], m=4, top1_mode="smce")
    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(1))
    logits[0, 5] = logits[1, 2] = logits[1, 4] = logits[2, 7] = logits[2, 8] = INF
    counts = count_call(lambda x: loss(x, torch.tensor([0, 3, 7, 11])), logits)
    assert counts.reads <= 1, f"{name}: {counts.reads} host reads (the CPU target check is one)"


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_class_losses_run_on_meta(name):
    logits = torch.randn(4, 12, device="meta", requires_grad=True)
    loss = LOSSES[name](logits, torch.zeros(4, dtype=torch.long, device="meta"))
    loss.backward()
    assert logits.grad is not None and logits.grad.shape == logits.shape


def _applications(device: str):
    def router(x):
        layer = softtopk.TopKRouter(12, 6, 2, method="hard").to(device)
        routing = layer(x)
        return routing.weights.sum() + layer.aux_loss

    def knn(x):
        labels = torch.arange(12, device=device) % 3
        out = softtopk.DifferentiableKNN(3, method="lapsum")(x[:2], x, labels, query_labels=labels[:2])
        return out.loss

    def ndcg(x):
        relevance = torch.arange(12.0, device=device).expand(4, 12) % 3
        return softtopk.ndcg_loss(x[:4], relevance, 5)

    return {"router": router, "knn": knn, "ndcg": ndcg}


@pytest.mark.parametrize("name, checked", [("router", 0), ("knn", 0), ("ndcg", 1)])
def test_applications_read_no_value(name, checked):
    # ndcg_loss checks its relevance (finite, >= 0) on CPU tensors: one read, never on a device
    torch.manual_seed(0)
    x = torch.randn(12, 12, generator=torch.Generator().manual_seed(2))
    counts = count_call(_applications("cpu")[name], x)
    assert counts.reads <= checked, f"{name}: {counts.reads} host reads"
    assert counts.uploads == 0, f"{name}: {counts.uploads} tensors made from host data"


@pytest.mark.parametrize("name", ["router", "knn", "ndcg"])
def test_applications_run_on_meta(name):
    x = torch.randn(12, 12, device="meta", requires_grad=True)
    _applications("meta")[name](x).backward()
    assert x.grad is not None


@pytest.mark.parametrize("method", ["lapsum", "sparse", "neuralsort", "softsort"])
def test_vmap_and_its_grad_do_not_warn(method, recwarn):
    # functorch warns ("performance drop") where an op has no batching rule: in-place ops on a
    # batched tensor fall back to a loop, and a library call should not warn about itself
    x = torch.randn(3, 4, 20, generator=torch.Generator().manual_seed(3))
    torch.vmap(lambda r: softtopk.soft_topk(r, 3, method=method))(x)
    torch.func.vmap(torch.func.grad(lambda r: softtopk.soft_topk(r, 3, method=method)[..., 0].sum()))(x)
    assert not [w for w in recwarn if "performance drop" in str(w.message)]


@pytest.mark.parametrize("name", ["smooth-svm", "topk-ce-neuralsort", "bal-noised"])
def test_class_losses_vmap_without_warnings(name, recwarn):
    x = torch.randn(3, 4, 12, generator=torch.Generator().manual_seed(4))
    target = torch.tensor([0, 3, 7, 11])
    torch.func.vmap(torch.func.grad(lambda r: LOSSES[name](r, target)), randomness="different")(x)
    assert not [w for w in recwarn if "performance drop" in str(w.message)]


@pytest.mark.parametrize("method", ["bitonic", "odd_even", "splitter_selection", "neuralsort", "softsort"])
@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (2, 0, 3)])
def test_empty_permutations(method, shape):
    x = torch.randn(*shape, requires_grad=True)
    out = softtopk.soft_permutation(x, method=method)
    out.sum().backward()
    assert out.shape == x.shape + (x.shape[-1],) and x.grad.shape == x.shape


@pytest.mark.parametrize("fn", [softtopk.sparse_topk_mask, softtopk.sparse_topk_mag])
def test_dykstra_on_an_empty_batch(fn):
    x = torch.randn(0, 5, requires_grad=True)
    out = fn(x, 2, p=2, solver="dykstra")
    out.sum().backward()
    assert out.shape == (0, 5) and x.grad.shape == (0, 5)


def test_the_functional_imbalanced_loss_keeps_its_margins_on_the_device():
    """``imbal_noised_topk`` built its LDAM margins from the counts and copied them to the device at
    every call (on a GPU, a copy that waits for the host); they are now made once per counts,
    device and dtype (here: made by a first fwd + bwd, then never again)."""
    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0, 3, 7, 11])
    counts = [float(c) for c in range(1, 13)]

    def loss(x):
        return losses.imbal_noised_topk(x, target, k=2, epsilon=0.5, max_m=0.5, cls_num_list=counts)

    loss(logits.clone().requires_grad_()).backward()
    calls = count_call(loss, logits)
    assert calls.uploads == 0 and calls.reads <= 1, (calls.uploads, calls.reads)
    module = losses.ImbalNoisedTopK(k=2, epsilon=0.5, max_m=0.5, cls_num_list=counts)
    torch.manual_seed(0)
    functional = loss(logits)
    torch.manual_seed(0)
    torch.testing.assert_close(functional, module(logits, target), rtol=0, atol=0)
