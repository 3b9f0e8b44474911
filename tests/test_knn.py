"""DifferentiableKNN: relaxed neighbour weights, the kNN loss, the hard vote, errors, and a short
training run on sklearn's bundled digits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from softtopk.knn import DifferentiableKNN, KNNOutput

# (method, params) for the method matrix; bitonic needs no power-of-two n here (small N)
METHODS = [
    ("gumbel", {"tau": 1.0}),  # generator added per test
    ("neuralsort", {"tau": 1.0}),
    ("lapsum", {"tau": 1.0}),
    ("sparse", {"l": 1.0}),
    ("bitonic", {"steepness": 2.0}),
]


def _params(method: str, params: dict, seed: int = 0) -> dict:
    if method == "gumbel":
        return {**params, "generator": torch.Generator().manual_seed(seed)}
    return dict(params)


def _data(q: int = 5, n: int = 12, d: int = 3, classes: int = 3, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(q, d, generator=g, dtype=dtype)
    neighbors = torch.randn(n, d, generator=g, dtype=dtype)
    neighbor_labels = torch.randint(classes, (n,), generator=g)
    query_labels = torch.randint(classes, (q,), generator=g)
    return query, neighbors, neighbor_labels, query_labels


@pytest.mark.parametrize("method,params", METHODS)
def test_weights_shape_sum_and_gradients(method, params):
    query, neighbors, neighbor_labels, query_labels = _data()
    query.requires_grad_(True)
    neighbors.requires_grad_(True)
    knn = DifferentiableKNN(4, method=method, **_params(method, params))
    out = knn(query, neighbors, neighbor_labels, query_labels)
    assert isinstance(out, KNNOutput)
    assert out.weights.shape == (5, 12)
    torch.testing.assert_close(out.weights.sum(-1), torch.full((5,), 4.0, dtype=torch.float64), atol=1e-4, rtol=0)
    assert out.weights.min() >= -1e-6
    assert -1.0 - 1e-6 <= out.loss.item() <= 1e-6
    out.loss.backward()
    for tensor in (query, neighbors):
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all()
        assert tensor.grad.abs().sum() > 0


def test_without_query_labels_loss_is_none():
    query, neighbors, neighbor_labels, _ = _data()
    out = DifferentiableKNN(3, method="lapsum")(query, neighbors, neighbor_labels)
    assert out.loss is None and out.weights.shape == (5, 12)


def test_scores_are_negative_squared_distances():
    """With a sharp lapsum the weights are the hard top-k of -||q - c||^2, even far from the origin."""
    query, neighbors, neighbor_labels, _ = _data(q=6, n=20, d=4, seed=3)
    offset = 1e3  # translation: distances unchanged; the centring keeps the expansion accurate
    knn = DifferentiableKNN(5, method="lapsum", tau=1e-6)
    weights = knn(query + offset, neighbors + offset, neighbor_labels).weights
    distances = torch.cdist(query, neighbors) ** 2
    hard = torch.zeros_like(distances).scatter_(1, (-distances).topk(5, dim=-1).indices, 1.0)
    torch.testing.assert_close(weights, hard, atol=1e-6, rtol=0)


def test_loss_value_and_normalisation():
    """loss = -(1/(Q k)) sum_q sum_j 1[y_j = y_q] w_qj, checked against the returned weights; a
    perfectly separated set gives -1."""
    query, neighbors, neighbor_labels, query_labels = _data()
    knn = DifferentiableKNN(3, method="lapsum", tau=0.5)
    out = knn(query, neighbors, neighbor_labels, query_labels)
    same = (query_labels[:, None] == neighbor_labels[None, :]).double()
    torch.testing.assert_close(out.loss, -(same * out.weights).sum() / (5 * 3))

    centres = torch.tensor([[0.0, 0.0], [100.0, 0.0]], dtype=torch.float64)
    neighbors = centres.repeat_interleave(3, 0) + 0.01 * torch.randn(6, 2, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    out = DifferentiableKNN(3, method="lapsum", tau=0.1)(centres, neighbors, labels, torch.tensor([0, 1]))
    torch.testing.assert_close(out.loss, torch.tensor(-1.0, dtype=torch.float64), atol=1e-6, rtol=0)


def test_gumbel_generator_reproducible():
    query, neighbors, neighbor_labels, query_labels = _data()
    runs = [
        DifferentiableKNN(4, tau=0.5, generator=torch.Generator().manual_seed(7))(
            query, neighbors, neighbor_labels, query_labels
        )
        for _ in range(2)
    ]
    torch.testing.assert_close(runs[0].weights, runs[1].weights, rtol=0, atol=0)
    torch.testing.assert_close(runs[0].loss, runs[1].loss, rtol=0, atol=0)


def _numpy_vote(query, neighbors, labels, k):
    query, neighbors, labels = query.numpy(), neighbors.numpy(), labels.numpy()
    result = []
    for q in query:
        d = ((neighbors - q) ** 2).sum(-1)
        nearest = np.argsort(d, kind="stable")[:k]
        counts = np.bincount(labels[nearest], minlength=labels.max() + 1)
        result.append(int(np.flatnonzero(counts == counts.max())[0]))  # smallest class on ties
    return np.array(result)


@pytest.mark.parametrize("k", [1, 2, 5, 9])
def test_predict_matches_numpy_majority_vote(k):
    query, neighbors, neighbor_labels, _ = _data(q=40, n=60, d=4, classes=4, seed=k)
    query.requires_grad_(True)
    knn = DifferentiableKNN(k, method="neuralsort")
    predicted = knn.predict(query, neighbors, neighbor_labels)
    assert predicted.shape == (40,) and predicted.dtype == torch.int64
    assert not predicted.requires_grad
    np.testing.assert_array_equal(predicted.numpy(), _numpy_vote(query.detach(), neighbors, neighbor_labels, k))


def test_predict_tie_goes_to_smallest_class_and_num_classes():
    query = torch.zeros(1, 1)
    neighbors = torch.tensor([[1.0], [-2.0], [3.0], [-4.0], [50.0]])
    labels = torch.tensor([3, 1, 3, 1, 0])  # the 4 nearest: two votes each for 3 and 1
    assert DifferentiableKNN(4).predict(query, neighbors, labels).tolist() == [1]
    assert DifferentiableKNN(4).predict(query, neighbors, labels, num_classes=10).tolist() == [1]
    assert DifferentiableKNN(1).predict(query, neighbors, labels).tolist() == [3]


def test_extra_repr():
    text = repr(DifferentiableKNN(3, method="lapsum", tau=0.5))
    assert "k=3" in text and "method='lapsum'" in text and "tau=0.5" in text


def test_construction_errors():
    with pytest.raises(ValueError, match=r"k must be >= 1, got 0"):
        DifferentiableKNN(0)
    with pytest.raises(TypeError, match=r"k must be an int, got float 2.0"):
        DifferentiableKNN(2.0)
    with pytest.raises(TypeError, match=r"k must be an int, got bool"):
        DifferentiableKNN(True)
    with pytest.raises(ValueError, match=r"method must be one of"):
        DifferentiableKNN(2, method="nope")
    with pytest.raises(TypeError, match=r"unexpected parameter\(s\) \['steepness'\]"):
        DifferentiableKNN(2, method="lapsum", steepness=1.0)
    with pytest.raises(ValueError, match=r"tau"):
        DifferentiableKNN(2, method="neuralsort", tau=-1.0)


def test_method_without_mask_output(monkeypatch):
    """Every registered method gives a mask today; a ranks-only method must be refused by name."""
    from softtopk import _registry

    spec = _registry._REGISTRY["neuralsort"]
    info = spec.info.__class__(**{**spec.info.__dict__, "outputs": ("ranks",)})
    monkeypatch.setitem(_registry._REGISTRY, "neuralsort", spec.__class__(**{**spec.__dict__, "info": info}))
    with pytest.raises(ValueError, match=r"method 'neuralsort' gives \('ranks',\), not 'mask'"):
        DifferentiableKNN(2, method="neuralsort")


@pytest.mark.parametrize("call", ["forward", "predict"])
def test_input_errors(call):
    query, neighbors, neighbor_labels, _ = _data()
    knn = DifferentiableKNN(3, method="lapsum")
    run = knn if call == "forward" else knn.predict
    with pytest.raises(ValueError, match=r"k must satisfy k <= N = 12 \(the number of neighbors\), got k = 13"):
        (DifferentiableKNN(13, method="lapsum") if call == "forward" else DifferentiableKNN(13).predict)(
            query, neighbors, neighbor_labels
        )
    with pytest.raises(ValueError, match=r"query and neighbors must have the same feature size d"):
        run(query, neighbors[:, :2], neighbor_labels)
    with pytest.raises(ValueError, match=r"query must have shape \(Q, d\), got \(5,\)"):
        run(query[:, 0], neighbors, neighbor_labels)
    with pytest.raises(ValueError, match=r"neighbors must have shape \(N, d\), got \(12, 3, 1\)"):
        run(query, neighbors[..., None], neighbor_labels)
    with pytest.raises(TypeError, match=r"query must be a torch.Tensor, got list"):
        run(query.tolist(), neighbors, neighbor_labels)
    with pytest.raises(
        TypeError, match=r"neighbors must have a floating dtype \(float16/bfloat16/float32/float64\), got torch.int64"
    ):
        run(query, neighbors.long(), neighbor_labels)
    with pytest.raises(TypeError, match=r"neighbor_labels must have an integer dtype, got torch.float32"):
        run(query, neighbors, neighbor_labels.float())
    with pytest.raises(TypeError, match=r"neighbor_labels must have an integer dtype, got torch.bool"):
        run(query, neighbors, neighbor_labels.bool())
    with pytest.raises(TypeError, match=r"neighbor_labels must be a torch.Tensor, got list"):
        run(query, neighbors, neighbor_labels.tolist())
    with pytest.raises(ValueError, match=r"neighbor_labels must have shape \(12,\) to match neighbors, got \(11,\)"):
        run(query, neighbors, neighbor_labels[:11])
    with pytest.raises(ValueError, match=r"neighbor_labels must have shape \(12,\) to match neighbors, got \(12, 1\)"):
        run(query, neighbors, neighbor_labels[:, None])


def test_query_label_errors():
    query, neighbors, neighbor_labels, query_labels = _data()
    knn = DifferentiableKNN(3, method="lapsum")
    with pytest.raises(TypeError, match=r"query_labels must have an integer dtype, got torch.float64"):
        knn(query, neighbors, neighbor_labels, query_labels.double())
    with pytest.raises(ValueError, match=r"query_labels must have shape \(5,\) to match query, got \(4,\)"):
        knn(query, neighbors, neighbor_labels, query_labels[:4])
    with pytest.raises(TypeError, match=r"query_labels must be a torch.Tensor, got list"):
        knn(query, neighbors, neighbor_labels, query_labels.tolist())


def test_predict_label_errors():
    query, neighbors, neighbor_labels, _ = _data()
    knn = DifferentiableKNN(3)
    with pytest.raises(ValueError, match=r"neighbor_labels must be >= 0, got -1"):
        knn.predict(query, neighbors, torch.where(neighbor_labels == 0, -1, neighbor_labels))
    with pytest.raises(ValueError, match=r"num_classes must be >= 3 \(it must exceed every label\), got 2"):
        knn.predict(query, neighbors, torch.arange(12) % 3, num_classes=2)
    with pytest.raises(TypeError, match=r"num_classes must be an int, got float 3.0"):
        knn.predict(query, neighbors, neighbor_labels, num_classes=3.0)


def test_training_on_digits_improves_knn_accuracy():
    """A linear embedding 64 -> 16 trained with the kNN loss (Gumbel, k = 9) beats the untrained one
    on the hard-kNN test accuracy of sklearn's digits (neighbours = the train split)."""
    datasets = pytest.importorskip("sklearn.datasets")
    features, targets = datasets.load_digits(return_X_y=True)
    x = torch.tensor(features / 16.0, dtype=torch.float32)
    y = torch.tensor(targets)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    train, test = perm[:1200], perm[1200:]
    torch.manual_seed(0)
    embed = torch.nn.Linear(64, 16)
    knn = DifferentiableKNN(9, method="gumbel", tau=1.0, generator=torch.Generator().manual_seed(1))

    def accuracy() -> float:
        with torch.no_grad():
            predicted = knn.predict(embed(x[test]), embed(x[train]), y[train])
        return (predicted == y[test]).float().mean().item()

    before = accuracy()
    optimizer = torch.optim.Adam(embed.parameters(), lr=1e-2)
    for _ in range(300):
        queries = train[torch.randint(len(train), (64,), generator=g)]
        candidates = train[torch.randint(len(train), (256,), generator=g)]
        loss = knn(embed(x[queries]), embed(x[candidates]), y[candidates], y[queries]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = accuracy()
    print(f"digits hard-kNN (k=9) test accuracy: untrained {before:.4f}, trained {after:.4f}")
    assert after >= before + 0.025
    assert after >= 0.96


def test_no_query_gives_empty_weights_and_a_zero_loss():
    knn = DifferentiableKNN(2, method="lapsum")
    out = knn(torch.randn(0, 3), torch.randn(5, 3), torch.arange(5), query_labels=torch.zeros(0, dtype=torch.long))
    assert out.weights.shape == (0, 5) and out.loss.item() == 0.0 and not math.copysign(1.0, out.loss.item()) < 0
    assert knn.predict(torch.randn(0, 3), torch.randn(5, 3), torch.arange(5)).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_embeddings_far_apart_do_not_overflow(dtype):
    """Squared float16 distances overflow above 256: they are computed in float32."""
    g = torch.Generator().manual_seed(0)
    query = (300 * torch.randn(4, 3, generator=g)).to(dtype).requires_grad_()
    neighbors = (300 * torch.randn(6, 3, generator=g)).to(dtype)
    out = DifferentiableKNN(2, method="lapsum")(query, neighbors, torch.arange(6), query_labels=torch.arange(4))
    assert out.weights.dtype == dtype and out.loss.dtype == dtype
    torch.testing.assert_close(out.weights.float().sum(-1), torch.full((4,), 2.0), atol=2e-2, rtol=0)
    reference = DifferentiableKNN(2, method="lapsum")(query.detach().float(), neighbors.float(), torch.arange(6))
    torch.testing.assert_close(out.weights.float(), reference.weights, atol=1e-2, rtol=0)
    out.loss.backward()
    assert torch.isfinite(query.grad.float()).all()
