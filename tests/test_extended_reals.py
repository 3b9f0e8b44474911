"""Scores on the extended real line (issue 12, item 1): one semantics of ``±inf`` for every method
and output, with values and gradients, on rows with 0, 1, k-1, k, ... n entries at ``-inf`` and
with ``+inf`` entries (the semantics are written in ``softtopk/_extended.py`` and the README)."""

from __future__ import annotations

import pytest
import torch

import softtopk

F64 = torch.float64
INF = float("inf")
N, K = 8, 3

MASK_METHODS = {
    "lapsum": {"tau": 0.7},
    "sparse": {"l": 0.5},
    "sparse_p2": {"l": 0.5, "p": 2.0},
    "neuralsort": {"tau": 0.7},
    "softsort": {"tau": 0.7, "power": 2.0},
    "bitonic": {"steepness": 2.0},
    "odd_even": {"steepness": 2.0, "distribution": "logistic"},
    "splitter_selection": {"steepness": 2.0, "distribution": "reciprocal"},
    "gumbel": {"tau": 0.7, "noise": False},
    "gumbel_subsets": {"tau": 0.7, "noise": False, "relaxation": "subsets"},
    "perturbed": {"sigma": 0.5, "n_samples": 4000},
}
RANK_METHODS = ["neuralsort", "softsort", "bitonic", "odd_even", "splitter_selection", "gumbel_subsets"]
NETWORKS = ("bitonic", "odd_even", "splitter_selection")


def _method(name: str) -> tuple[str, dict]:
    params = dict(MASK_METHODS[name])
    if name == "perturbed":
        params["generator"] = torch.Generator().manual_seed(0)
    return name.split("_")[0] if name.startswith(("sparse", "gumbel")) else name, params


def _row(n_neg: int, n_pos: int = 0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A row of N scores with ``n_neg`` entries at -inf and ``n_pos`` at +inf at random places; also
    the positions of the finite entries and the finite values, in order."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, generator=gen, dtype=F64)
    places = torch.randperm(N, generator=gen)
    x[places[:n_neg]] = -INF
    x[places[n_neg : n_neg + n_pos]] = INF
    finite = torch.isfinite(x).nonzero().squeeze(-1)
    return x, finite, x[finite]


def _mask_and_grad(x: torch.Tensor, k: int, name: str, **extra) -> tuple[torch.Tensor, torch.Tensor]:
    method, params = _method(name)
    leaf = x.clone().requires_grad_()
    mask = softtopk.soft_topk(leaf, k, method=method, **params, **extra)
    weights = torch.linspace(-1.0, 2.0, x.shape[-1], dtype=F64)
    (grad,) = torch.autograd.grad((mask * weights).sum(), leaf)
    return mask.detach(), grad


def _far_below(x: torch.Tensor) -> torch.Tensor:
    """-inf replaced by a finite value so far below that every logistic comparison with it is exact."""
    return torch.where(x == -INF, -1e6, x)


def _same_as_finite_alone(name: str, x: torch.Tensor, k: int, got: torch.Tensor, finite: torch.Tensor) -> None:
    method, params = _method(name)
    if name in NETWORKS:  # a network of the full size, -inf entries exact at the bottom
        params["distribution"] = "logistic"
        got = softtopk.soft_topk(x, k, method=method, **params)
        want = softtopk.soft_topk(_far_below(x), k, method=method, **params)
        torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
        return
    want = softtopk.soft_topk(x[finite], k, method=method, **params)
    # the perturbed mask draws other noise for the shorter row: equal in distribution only
    atol = 0.05 if name == "perturbed" else 1e-10
    torch.testing.assert_close(got[finite], want, atol=atol, rtol=0)


@pytest.mark.parametrize("name", sorted(MASK_METHODS))
@pytest.mark.parametrize("n_neg", [0, 1, K - 1, K, N - K, N - K + 1, N - 1, N])
def test_mask_with_minus_inf(name, n_neg):
    x, finite, _ = _row(n_neg, seed=n_neg)
    mask, grad = _mask_and_grad(x, K, name)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(mask.sum(), torch.tensor(float(K), dtype=F64), atol=1e-9, rtol=0)
    neg = x == -INF
    f = N - n_neg
    if f > K:
        assert (mask[neg] == 0).all() and (grad[neg] == 0).all()
        _same_as_finite_alone(name, x, K, mask, finite)
    else:  # fewer than k entries above -inf: all selected, the rest shared by the -inf entries
        assert (mask[finite] == 1).all()
        torch.testing.assert_close(mask[neg], torch.full((n_neg,), (K - f) / n_neg, dtype=F64))
        assert (grad == 0).all()


@pytest.mark.parametrize("name", sorted(MASK_METHODS))
@pytest.mark.parametrize(
    ("n_pos", "n_neg"), [(1, 0), (K - 1, 0), (K - 1, 2), (K, 0), (K, 3), (K + 2, 1), (N, 0), (1, N - K)]
)
def test_mask_with_plus_inf(name, n_pos, n_neg):
    x, finite, _ = _row(n_neg, n_pos, seed=10 * n_pos + n_neg)
    mask, grad = _mask_and_grad(x, K, name)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(mask.sum(), torch.tensor(float(K), dtype=F64), atol=1e-9, rtol=0)
    pos, neg = x == INF, x == -INF
    assert (grad[pos] == 0).all() and (grad[neg] == 0).all()
    if n_pos >= K:  # more +inf entries than k share k equally
        torch.testing.assert_close(mask[pos], torch.full((n_pos,), K / n_pos, dtype=F64))
        assert (mask[~pos] == 0).all() and (grad == 0).all()
        return
    assert (mask[pos] == 1).all()
    f = N - n_pos - n_neg
    if f > K - n_pos:
        assert (mask[neg] == 0).all()
        method, params = _method(name)
        if name in NETWORKS:  # +inf exact at the top, -inf at the bottom of the full-size network
            params["distribution"] = "logistic"
            got = softtopk.soft_topk(x, K, method=method, **params)
            want = softtopk.soft_topk(torch.where(x == INF, 1e6, _far_below(x)), K, method=method, **params)
            torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
        else:
            want = softtopk.soft_topk(x[finite], K - n_pos, method=method, **params)
            torch.testing.assert_close(mask[finite], want, atol=0.05 if name == "perturbed" else 1e-10, rtol=0)
    else:
        assert (mask[finite] == 1).all()


def _ranks(name: str, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    method, params = _method(name)
    leaf = x.clone().requires_grad_()
    ranks = softtopk.soft_topk_ranks(leaf, k, method=method, **params)
    weights = torch.randn(ranks.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    (grad,) = torch.autograd.grad((ranks * weights).sum(), leaf)
    return ranks.detach(), grad


@pytest.mark.parametrize("name", RANK_METHODS)
@pytest.mark.parametrize(
    ("n_pos", "n_neg"), [(0, 1), (0, K - 1), (0, N - K), (0, N - 2), (0, N), (1, 2), (K - 1, 1), (K + 1, 0)]
)
def test_ranks_with_infinities(name, n_pos, n_neg):
    x, finite, _ = _row(n_neg, n_pos, seed=100 + 10 * n_pos + n_neg)
    ranks, grad = _ranks(name, x, K)
    assert torch.isfinite(ranks).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(ranks.sum(0), torch.ones(K, dtype=F64))  # every rank is taken once
    pos, neg = x == INF, x == -INF
    assert (grad[pos | neg] == 0).all()
    f = N - n_pos - n_neg
    first = min(n_pos, K)
    # +inf entries share the first ranks, -inf entries the ranks after the finite ones
    torch.testing.assert_close(ranks[pos][:, :first], torch.full((n_pos, first), 1 / max(n_pos, 1), dtype=F64))
    assert (ranks[pos][:, first:] == 0).all()
    assert (ranks[neg][:, : n_pos + f] == 0).all()
    if n_pos + f < K:
        tail = K - n_pos - f
        torch.testing.assert_close(ranks[neg][:, n_pos + f :], torch.full((n_neg, tail), 1 / n_neg, dtype=F64))
    middle = min(K, n_pos + f) - n_pos
    if middle > 0:
        method, params = _method(name)
        if name in NETWORKS:
            params["distribution"] = "logistic"
            far = torch.where(x == INF, -1e6, _far_below(x))  # +inf leaves the kernel's row as -inf
            want = softtopk.soft_topk_ranks(far, K, method=method, **params)[finite][:, :middle]
            got = softtopk.soft_topk_ranks(x, K, method=method, **params)[finite][:, n_pos : n_pos + middle]
            torch.testing.assert_close(got, want, atol=1e-9, rtol=0)
        else:
            want = softtopk.soft_topk_ranks(x[finite], middle, method=method, **params)
            torch.testing.assert_close(ranks[finite][:, n_pos : n_pos + middle], want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("method", ["neuralsort", "softsort", "bitonic", "odd_even", "splitter_selection"])
def test_permutation_with_infinities(method):
    x = torch.tensor([0.5, -INF, 2.0, INF, -1.0, -INF], dtype=F64, requires_grad=True)
    perm = softtopk.soft_permutation(x, method=method)
    (grad,) = torch.autograd.grad((perm * torch.arange(36.0, dtype=F64).view(6, 6)).sum(), x)
    assert torch.isfinite(perm).all() and torch.isfinite(grad).all()
    torch.testing.assert_close(perm.sum(0), torch.ones(6, dtype=F64))
    assert perm[3, 0] == 1 and (perm[[1, 5]][:, 4:] == 0.5).all() and (perm[[1, 5]][:, :4] == 0).all()
    assert (grad[[1, 3, 5]] == 0).all()


@pytest.mark.parametrize("name", [m for m in sorted(MASK_METHODS) if not m.startswith("gumbel")])
@pytest.mark.parametrize(("n_pos", "n_neg"), [(0, 2), (1, 2), (0, N - 2), (K + 1, 0)])
def test_hard_forward_with_infinities_is_the_topk_k_hot(name, n_pos, n_neg):
    x, _, _ = _row(n_neg, n_pos, seed=7 + n_pos + n_neg)
    mask, grad = _mask_and_grad(x, K, name, hard=True)
    want = torch.zeros(N, dtype=F64).scatter(-1, x.topk(K).indices, 1.0)
    assert torch.equal(mask, want)
    assert torch.isfinite(grad).all() and (grad[x.isinf()] == 0).all()


def test_hard_operators_give_zero_not_nan_at_unselected_infinities():
    x = torch.tensor([[-INF, 1.0, INF, -2.0, INF, INF]])
    assert torch.equal(softtopk.hard_topk_mask(x, 2), torch.tensor([[0.0, 0, 1, 0, 1, 0]]))
    assert torch.equal(softtopk.hard_topk_mask(x, 2, largest=False), torch.tensor([[1.0, 0, 0, 1, 0, 0]]))
    mag = softtopk.hard_topk_mag(torch.tensor([-INF, 1.0, 3.0, -2.0]), 2)
    assert torch.equal(mag, torch.tensor([-INF, 0.0, 3.0, 0.0]))
    mag = softtopk.hard_topk_mag(torch.tensor([-INF, 1.0, INF, INF]), 2)
    assert not mag.isnan().any() and mag[0] == 0 and mag[1] == 0


def test_nan_stays_in_its_row():
    x = torch.tensor([[0.0, float("nan"), 1.0, 2.0], [0.0, -INF, 1.0, 2.0]])
    for method in ("lapsum", "neuralsort", "softsort", "bitonic", "sparse"):
        mask = softtopk.soft_topk(x, 2, method=method)
        assert mask[0].isnan().any(), method
        assert torch.isfinite(mask[1]).all() and mask[1, 1] == 0, method


def test_largest_false_selects_minus_inf_first():
    x = torch.tensor([0.3, -INF, 1.0, INF, -0.5], dtype=F64)
    mask = softtopk.soft_topk(x, 2, largest=False, tau=0.5)
    assert mask[1] == 1 and mask[3] == 0
    torch.testing.assert_close(
        mask[[0, 2, 4]], softtopk.soft_topk(torch.tensor([0.3, 1.0, -0.5], dtype=F64), 1, largest=False, tau=0.5)
    )


def test_tensor_k_and_tau_with_infinities():
    x = torch.tensor([[0.3, -INF, 1.0, 2.0, INF], [INF, INF, 1.0, -INF, 0.0], [-INF, -INF, -INF, 1.0, 0.0]], dtype=F64)
    k = torch.tensor([2.5, 1.5, 3.0], dtype=F64, requires_grad=True)
    tau = torch.tensor([0.5, 1.0, 2.0], dtype=F64, requires_grad=True)
    mask = softtopk.soft_topk(x, k, tau=tau)
    torch.testing.assert_close(mask.sum(-1), k.detach())
    (mask * torch.arange(5.0, dtype=F64)).sum().backward()
    assert torch.isfinite(k.grad).all() and torch.isfinite(tau.grad).all()
    torch.testing.assert_close(mask[1], torch.tensor([0.75, 0.75, 0, 0, 0], dtype=F64))  # 2 +inf share 1.5
    torch.testing.assert_close(mask[2], torch.tensor([1 / 3, 1 / 3, 1 / 3, 1, 1], dtype=F64))
    finite_alone = softtopk.soft_topk(torch.tensor([0.3, 1.0, 2.0], dtype=F64), torch.tensor(1.5, dtype=F64), tau=0.5)
    torch.testing.assert_close(mask[0, [0, 2, 3]], finite_alone)


@pytest.mark.parametrize("method", ["lapsum", "neuralsort", "softsort", "bitonic", "splitter_selection", "sparse"])
def test_gradcheck_with_infinities(method):
    x = torch.tensor([[0.3, -INF, 1.1, -0.4, INF, 0.8], [2.0, 0.1, -INF, -INF, -1.0, 0.5]], dtype=F64)
    finite = torch.isfinite(x)
    params = {"l": 2.0, "p": 2.0} if method == "sparse" else {}

    def on_finite(values):
        return softtopk.soft_topk(x.masked_scatter(finite, values), 3, method=method, **params)

    assert torch.autograd.gradcheck(on_finite, (x[finite].clone().requires_grad_(),))


def test_topk_router_with_masked_experts():
    logits = torch.tensor([[1.0, -INF, 0.5, 2.0], [-INF, -INF, 0.3, -INF]], requires_grad=True)
    out = softtopk.topk(logits, 2, tau=0.5, hard=True)
    assert torch.equal(out.weights, torch.ones(2, 2))
    out.weights.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1] == 0


def test_compiled_mask_with_minus_inf_matches_eager():
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(3))
    x[0, :3] = -INF
    x[1, :7] = -INF  # fewer than k entries above -inf
    compiled = torch.compile(lambda t: softtopk.soft_topk(t, 3, tau=0.5), fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x), softtopk.soft_topk(x, 3, tau=0.5))


@pytest.mark.parametrize("distribution", ["cauchy", "logistic", "gaussian", "reciprocal", "optimal", "logistic_phi"])
def test_network_stand_in_and_explicit_infinities_agree(distribution, monkeypatch):
    # eager sweeps replace ±inf by a far finite stand-in where that is exact in the dtype; the
    # explicit per-layer treatment (torch.compile, vmap, logistic_phi) must give the same numbers
    from softtopk.ops import sorting_networks

    x = torch.randn(3, 9, generator=torch.Generator().manual_seed(9), dtype=F64)
    x[0, [1, 4]] = -INF
    x[1, 2] = INF
    x[2, :5] = -INF

    def run():
        leaf = x.clone().requires_grad_()
        ranks = softtopk.soft_topk_ranks(leaf, 3, method="bitonic", distribution=distribution, steepness=3.0)
        (grad,) = torch.autograd.grad((ranks * torch.arange(27.0, dtype=F64).view(9, 3)).sum(), leaf)
        return ranks.detach(), grad

    first = run()
    monkeypatch.setattr(sorting_networks, "_infinities", lambda values, params: "exact")
    second = run()
    for a, b in zip(first, second, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
