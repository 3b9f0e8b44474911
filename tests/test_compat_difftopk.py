"""Oracle tests: ``softtopk.compat.difftopk`` against the installed difftopk 0.2.0 / diffsort 0.2.0.

Outputs and the input gradient of a random linear functional of the outputs are compared. float32
comparisons use atol = rtol = 1e-5; float64 comparisons (the originals run in float64 where their
code allows it) use 1e-7. difftopk's sparse paths need ``torch_sparse``; a pure-torch ``spmm`` stands
in for it. The last section checks the documented differences (bug fixes) against the originals.
"""

from __future__ import annotations

import copy
import functools
import itertools
import sys
import types

import pytest
import torch

_MISSING = "oracle package {}==0.2.0 is not installed (pip install --no-deps {}==0.2.0)"
difftopk = pytest.importorskip("difftopk", reason=_MISSING.format("difftopk", "difftopk"))
diffsort = pytest.importorskip("diffsort", reason=_MISSING.format("diffsort", "diffsort"))
import difftopk.functional as difftopk_functional  # noqa: E402

from softtopk.compat import difftopk as compat  # noqa: E402
from softtopk.ops import swaps  # noqa: E402
from softtopk.ops.swaps import DISTRIBUTIONS  # noqa: E402

# the originals' own warnings (torch deprecations inside difftopk) are not under test
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:difftopk", "ignore::DeprecationWarning:difftopk")

STEEPNESS = (1.0, 10.0)
# (network type, sparse, n, k) of DiffTopkNet
TOPK_CASES = (
    [("bitonic", sparse, n, 5) for sparse in (False, True) for n in (8, 16, 32)]
    + [("odd_even", False, 8, 5), ("odd_even", False, 13, 3)]
    + [("splitter_selection", True, n, k) for n in (16, 37, 100) for k in (1, 5)]
)
# float32 gradients here are 4e-5 to 2.5e-4 away from float64 in *both* implementations (measured,
# bitonic n = 32: steep comparators compound over the layers), and logistic_phi at β = 1 mixes wire
# values until they meet near d = 0, where the two ART formulas differ (swaps.ART_DELTA). These
# combinations are compared in float64 only (test_difftopknet_float64, test_diffsortnet).
FLOAT32_ILL_CONDITIONED = {("optimal", 10.0), ("gaussian", 10.0), ("logistic_phi", 1.0)}


def _spmm(index, value, m, n, matrix):
    """``torch_sparse.spmm``: the (m x n) COO matrix (index, value) times ``matrix``."""
    rows = matrix.index_select(0, index[1]) * value.unsqueeze(-1)
    return rows.new_zeros(m, matrix.shape[1]).index_add(0, index[0], rows)


@pytest.fixture
def torch_sparse_stub(monkeypatch):
    stub = types.ModuleType("torch_sparse")
    stub.spmm = _spmm
    monkeypatch.setitem(sys.modules, "torch_sparse", stub)
    monkeypatch.setattr(difftopk_functional, "torch_sparse", stub, raising=False)
    monkeypatch.setattr(difftopk_functional, "SPARSE_INSTALLED", True)


@pytest.fixture
def tiny_art_delta(monkeypatch):
    """softtopk's logistic_phi with δ → 0 is difftopk's formula (away from exact ties)."""
    monkeypatch.setattr(swaps, "ART_DELTA", 1e-12)


@functools.cache
def _original_topk_net(kind: str, n: int, k: int, sparse: bool, double: bool = False):
    net = difftopk.DiffTopkNet(kind, n, k, sparse=sparse)
    if double:  # the sparse path runs in float64 once its value matrices are float64
        net = copy.deepcopy(net)
        net.sorting_network = [
            [t.double() if i < 4 else t for i, t in enumerate(layer)] for layer in net.sorting_network
        ]
    return net


def _scores(n: int, distribution: str = "cauchy", batch: int = 4, seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    if distribution == "logistic_phi":  # inputs >= 0.48 apart (see swaps.ART_DELTA)
        ranks = torch.stack([torch.randperm(n, generator=g) for _ in range(batch)])
        return (ranks * 0.5 + 0.01 * torch.randn(batch, n, generator=g)).to(dtype)
    return torch.randn(batch, n, generator=g).to(dtype)


def _run(fn, x, cotangents=None):
    leaf = x.detach().clone().requires_grad_()
    result = fn(leaf)
    outputs = [o for o in (result if isinstance(result, tuple) else (result,)) if o is not None]
    if cotangents is None:
        g = torch.Generator().manual_seed(7)
        cotangents = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outputs]
    sum((o * c).sum() for o, c in zip(outputs, cotangents, strict=True)).backward()
    return [o.detach() for o in outputs], leaf.grad, cotangents


def _assert_close_normwise(a, b, tol):
    """``max |a - b| <= tol * max(1, max |b|)``: elementwise float32 agreement of two different
    summation orders is rounding luck on gradients of magnitude >> 1 (odd-even DiffSortNet at
    steepness 10: gradients up to 15, both implementations 1e-5..6e-5 from the float64 value)."""
    error = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
    assert error <= tol * max(1.0, b.abs().max().item() if b.numel() else 0.0), (error, tol)


def _assert_match(ours, original, x, tol):
    """Same outputs, and the same input gradient of the same random functional of the outputs:
    elementwise in float64, normwise relative in float32 (see ``_assert_close_normwise``)."""
    theirs, their_grad, cotangents = _run(original, x)
    mine, my_grad, _ = _run(ours, x, cotangents)
    assert len(mine) == len(theirs)
    for a, b in list(zip(mine, theirs, strict=True)) + [(my_grad, their_grad)]:
        if x.dtype == torch.float64:
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)
        else:
            _assert_close_normwise(a, b, tol)


# ---------------------------------------------------------------------------------------------------
# Operators
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "distribution,steepness",
    [c for c in itertools.product(DISTRIBUTIONS, STEEPNESS) if c not in FLOAT32_ILL_CONDITIONED],
)
@pytest.mark.parametrize("kind,sparse,n,k", TOPK_CASES)
def test_difftopknet_float32(torch_sparse_stub, kind, sparse, n, k, distribution, steepness):
    original = _original_topk_net(kind, n, k, sparse)
    original.distribution, original.steepness = distribution, steepness
    ours = compat.DiffTopkNet(kind, n, k, sparse=sparse, steepness=steepness, distribution=distribution)
    # n = 100: each float32 implementation is up to ~7e-6 from float64 (measured), so up to 2e-5 apart
    _assert_match(ours, original, _scores(n, distribution), 2e-5 if n == 100 else 1e-5)


@pytest.mark.parametrize("distribution,steepness", list(itertools.product(DISTRIBUTIONS, STEEPNESS)))
@pytest.mark.parametrize("kind,sparse,n,k", TOPK_CASES)
def test_difftopknet_float64(torch_sparse_stub, tiny_art_delta, kind, sparse, n, k, distribution, steepness):
    """difftopk's dense top-k path is float32-only: its float64 oracle is diffsort's full sort (same
    network), whose last k columns are difftopk's dense P_topk."""
    if sparse:
        original = _original_topk_net(kind, n, k, sparse, double=True)
        original.distribution, original.steepness = distribution, steepness
    else:
        sorter = diffsort.DiffSortNet(kind, n, steepness=steepness, distribution=distribution)

        def original(x):
            return sorter(x)[1][:, :, -k:]

    ours = compat.DiffTopkNet(kind, n, k, sparse=sparse, steepness=steepness, distribution=distribution)
    # difftopk's gaussian backward builds σ = 1/β as a float32 tensor: ~2e-7 off in float64
    tol = 1e-6 if distribution == "gaussian" else 1e-7
    _assert_match(ours, original, _scores(n, distribution, dtype=torch.float64), tol)


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("kind,n", [("bitonic", 8), ("bitonic", 16), ("odd_even", 7), ("odd_even", 16)])
def test_diffsortnet(tiny_art_delta, kind, n, distribution):
    for steepness in STEEPNESS:
        original = diffsort.DiffSortNet(kind, n, steepness=steepness, distribution=distribution)
        ours = compat.DiffSortNet(kind, n, steepness=steepness, distribution=distribution)
        x = _scores(n, distribution, dtype=torch.float64)
        _assert_match(ours, original, x, 1e-6 if distribution == "gaussian" else 1e-7)
        if (distribution, steepness) not in FLOAT32_ILL_CONDITIONED:
            _assert_match(ours, original, x.float(), 1e-5)


@pytest.mark.parametrize("tau", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("n", [5, 16])
def test_neuralsort(n, tau):
    _assert_match(compat.NeuralSort(tau), difftopk.NeuralSort(tau), _scores(n, seed=n), 1e-5)


@pytest.mark.parametrize("tau", [0.3, 1.0, 2.0])
def test_neuralsort_hard_gradient(tau):
    """hard=True: the straight-through gradient agrees everywhere; the forward agrees where
    difftopk's per-input argmax happens to be a permutation (small τ, separated scores)."""
    x = _scores(12, seed=3)
    mine, my_grad, cot = _run(compat.NeuralSort(tau, hard=True), x)
    _, their_grad, _ = _run(difftopk.NeuralSort(tau, hard=True), x, cot)
    torch.testing.assert_close(my_grad, their_grad, atol=1e-5, rtol=1e-5)
    # at a small τ the logits are hundreds of times the scores, and difftopk's float32 gradient
    # carries their rounding, larger or smaller as the machine's BLAS orders its sums; ours is the
    # float64 value to float32 rounding, so each is held to the float64 value with its own bound
    separated = _scores(12, "logistic_phi", seed=3)
    theirs, their_grad, cot = _run(difftopk.NeuralSort(0.05, hard=True), separated)
    mine, my_grad, _ = _run(compat.NeuralSort(0.05, hard=True), separated, cot)
    _, exact, _ = _run(compat.NeuralSort(0.05, hard=True), separated.double(), [c.double() for c in cot])
    for a, b in zip(mine, theirs, strict=True):
        _assert_close_normwise(a, b, 1e-5)
    _assert_close_normwise(my_grad, exact, 1e-7)
    _assert_close_normwise(their_grad, exact, 5e-5)


@pytest.mark.parametrize("pow", [1.0, 2.0])
@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("tau", [0.3, 1.0, 2.0])
def test_softsort(tau, hard, pow):
    _assert_match(compat.SoftSort(tau, hard, pow), difftopk.SoftSort(tau, hard, pow), _scores(16, seed=1), 1e-5)


# ---------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------


def _labels(batch: int, classes: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, classes, (batch,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("m", [None, 16])
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_topk_cross_entropy_equivariant_methods(method, top1_mode, m):
    """NeuralSort/SoftSort are permutation equivariant, so difftopk's wire order (label first after
    m pre-selection) does not matter and the losses agree, m included."""
    p_k = [0.4, 0.3, 0.2, 0.1]
    args = (method, 2.0, p_k, 40)
    ours = compat.TopKCrossEntropyLoss(*args, m=m, top1_mode=top1_mode)
    original = difftopk.TopKCrossEntropyLoss(*args, m=m, top1_mode=top1_mode)
    y = _labels(8, 40)
    _assert_match(lambda x: ours(x, y), lambda x: original(x, y), _scores(40, batch=8) * 2, 1e-5)


@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("method", ["bitonic", "splitter_selection", "bitonic__non_sparse", "odd_even"])
def test_topk_cross_entropy_networks(torch_sparse_stub, method, top1_mode):
    """Network losses differ from difftopk's by design: difftopk feeds the classes to the network in
    class order, softtopk in ascending score order, each score on the wire of its rank (networks are
    not permutation equivariant, and odd-even networks are strongly position biased). So softtopk's
    loss on ``x`` must equal difftopk's loss on the classes of ``x`` sorted ascending (m = None)."""
    p_k = [0.5, 0.25, 0.25]
    args = (method, 2.0, p_k, 16)
    ours = compat.TopKCrossEntropyLoss(*args, distribution="logistic", top1_mode=top1_mode)
    original = difftopk.TopKCrossEntropyLoss(*args, distribution="logistic", top1_mode=top1_mode)
    x, y = _scores(16, batch=8) * 2, _labels(8, 16)
    order = x.argsort(dim=-1)
    sorted_label = (order == y.unsqueeze(-1)).long().argmax(-1)

    def original_on_sorted(x):
        return original(x.gather(-1, order), sorted_label)

    _assert_match(lambda x: ours(x, y), original_on_sorted, x, 1e-5)


SMOOTH_CASES = [(10, 2, 1.0, 1.0), (10, 5, 1.0, 3.0), (100, 3, 1.0, 10.0), (100, 5, 1.0, 1.0), (1000, 5, 1.0, 1.0)]


@pytest.mark.parametrize("name", ["SmoothTopKLoss", "SmoothHardTopKLoss"])
@pytest.mark.parametrize("classes,k,tau,scale", SMOOTH_CASES)
def test_smooth_topk_losses(name, classes, k, tau, scale):
    ours, original = getattr(compat, name)(classes, k, tau), getattr(difftopk, name)(classes, k, tau)
    y = _labels(16, classes, seed=classes)
    x = _scores(classes, batch=16, seed=k) * scale
    _assert_match(lambda s: ours(s, y), lambda s: original(s, y), x, 1e-5)


def test_smooth_hard_topk_loss_switches_like_difftopk():
    """Rows whose top-k gap is >= kτ log 1000 take the hard hinge, in both; there the hard loss (0
    for these rows) differs from the smooth one (~0.05 with 98 competitors; k = 2, τ = 1)."""
    x, y = _scores(100, batch=16, seed=5), torch.zeros(16, dtype=torch.long)
    rest = x[::2, 2:].max(-1).values
    x[::2, 0], x[::2, 1] = rest + 15.0, rest + 14.5  # s_[2] - s_[3] = 14.5 > 2 log(1000) = 13.8
    ours, original = compat.SmoothHardTopKLoss(100, 2, 1.0), difftopk.SmoothHardTopKLoss(100, 2, 1.0)
    _assert_match(lambda s: ours(s, y), lambda s: original(s, y), x, 1e-5)
    assert (compat.SmoothTopKLoss(100, 2, 1.0)(x, y) - ours(x, y)).abs() > 1e-2


# ---------------------------------------------------------------------------------------------------
# Intended differences (bug fixes)
# ---------------------------------------------------------------------------------------------------


def test_bitonic_non_power_of_two_selects_the_top_k():
    """diffsort's bitonic rule for n = 22 does not sort: at β = 1e4, difftopk's top-5 order is wrong
    on some random permutations (≈13-15 % per REFERENCE §7.1), softtopk's never."""
    n, k, trials = 22, 5, 200
    g = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randperm(n, generator=g) for _ in range(trials)]).float()
    truth = x.topk(k, dim=-1).indices.flip(-1)  # ascending: the last column is the top-1
    _, theirs = difftopk.DiffTopkNet("bitonic", n, k, steepness=1e4)(x)
    _, mine = compat.DiffTopkNet("bitonic", n, k, steepness=1e4)(x)
    assert (theirs.argmax(dim=-2) != truth).any(-1).sum() > 0
    assert torch.equal(mine.argmax(dim=-2), truth)


def test_distribution_none_works():
    x, y = _scores(10, batch=4), _labels(4, 10)
    with pytest.raises(NotImplementedError):
        difftopk.TopKCrossEntropyLoss("odd_even", 1.0, [0.5, 0.5], 10)(x, y)
    ours = compat.TopKCrossEntropyLoss("odd_even", 1.0, [0.5, 0.5], 10)
    explicit = compat.TopKCrossEntropyLoss("odd_even", 1.0, [0.5, 0.5], 10, distribution="cauchy")
    assert ours.params["distribution"] == "cauchy"
    torch.testing.assert_close(ours(x, y), explicit(x, y))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_dtypes(dtype):
    x = _scores(16, batch=3)
    with pytest.raises(RuntimeError):
        difftopk.DiffTopkNet("bitonic", 16, 5)(x.to(torch.float64))
    _, reference = compat.DiffTopkNet("bitonic", 16, 5)(x)
    _, ranks = compat.DiffTopkNet("bitonic", 16, 5)(x.to(dtype))
    assert ranks.dtype == dtype
    tol = 1e-6 if dtype == torch.float64 else 2e-2
    torch.testing.assert_close(ranks.float(), reference, atol=tol, rtol=tol)
    loss = compat.SmoothTopKLoss(16, 3)(x.to(dtype), _labels(3, 16))
    assert loss.dtype == dtype and torch.isfinite(loss)


def test_to_moves_label_buffers():
    assert difftopk.SmoothTopKLoss(10, 2).to("meta").labels.device.type == "cpu"
    for cls in (compat.SmoothTopKLoss, compat.SmoothHardTopKLoss):
        moved = cls(10, 2).to("meta")
        assert moved.labels.device.type == "meta"
        assert "labels" in dict(moved.named_buffers())


def test_neuralsort_hard_is_a_permutation():
    """difftopk's hard NeuralSort takes an argmax over ranks per input: often not a permutation."""
    x = _scores(8, batch=200)
    theirs = difftopk.NeuralSort(1.0, hard=True)(x)
    mine = compat.NeuralSort(1.0, hard=True)(x)
    assert (theirs.sum(-2) != 1).any(-1).float().mean() > 0.5
    assert torch.equal(mine.sum(-2), torch.ones(200, 8)) and torch.equal(mine.sum(-1), torch.ones(200, 8))
    torch.testing.assert_close(x.unsqueeze(-2) @ mine, x.sort(-1).values.unsqueeze(-2))


def test_smooth_topk_k1_gradient():
    """difftopk's hand-written ESF backward is wrong for k = 1 (Berrada's defect); ours is autograd
    of the exact loss, checked against float64."""
    x, y = _scores(10, batch=16, seed=2), _labels(16, 10)
    _, theirs, cot = _run(lambda s: difftopk.SmoothTopKLoss(10, 1)(s, y), x)
    _, mine, _ = _run(lambda s: compat.SmoothTopKLoss(10, 1)(s, y), x, cot)
    _, reference, _ = _run(lambda s: compat.SmoothTopKLoss(10, 1)(s, y), x.double(), [c.double() for c in cot])
    torch.testing.assert_close(mine.double(), reference, atol=1e-6, rtol=1e-6)
    assert (theirs.double() - reference).abs().max() > 1e-3  # 9e-3 measured here, 6e-2 on other seeds


# ---------------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build,error",
    [
        (lambda: compat.DiffTopkNet("quick", 8, 2), ValueError),
        (lambda: compat.DiffTopkNet("bitonic", 8, 9), ValueError),
        (lambda: compat.DiffTopkNet("bitonic", 8.0, 2), TypeError),
        (lambda: compat.DiffTopkNet("bitonic", 8, 2, distribution="uniform"), ValueError),
        (
            lambda: compat.DiffTopkNet("bitonic", 8, 2, distribution="logistic", interpolation_type="optimal"),
            ValueError,
        ),
        (lambda: compat.DiffSortNet("splitter_selection", 8), ValueError),
        (lambda: compat.DiffSortNet("bitonic", 8, steepness=-1.0), ValueError),
        (lambda: compat.NeuralSort(tau=0.0), ValueError),
        (lambda: compat.SoftSort(hard=1), TypeError),
        (lambda: compat.TopKCrossEntropyLoss("sinkhorn_sort", 1.0, [1.0], 10), ValueError),
        (lambda: compat.TopKCrossEntropyLoss("softsort", 0.0, [1.0], 10), ValueError),
        (lambda: compat.TopKCrossEntropyLoss("bitonic", 1.0, [0.5, 0.6], 10), ValueError),
        (lambda: compat.TopKCrossEntropyLoss("bitonic", 1.0, [0.5, 0.5], 10, m=10), ValueError),
        (lambda: compat.TopKCrossEntropyLoss("bitonic", 1.0, [1.0], 10, top1_mode="ce"), ValueError),
        (lambda: compat.SmoothTopKLoss(5, 5), ValueError),
        (lambda: compat.SmoothHardTopKLoss(5, 2, tau="1"), TypeError),
    ],
)
def test_bad_arguments_raise(build, error):
    with pytest.raises(error):
        build()


@pytest.mark.parametrize(
    "module,args",
    [
        (compat.DiffTopkNet("bitonic", 8, 2), (torch.randn(3, 7),)),
        (compat.DiffTopkNet("bitonic", 8, 2), (torch.randn(2, 3, 8),)),
        (compat.DiffSortNet("odd_even", 8), (torch.arange(8).view(1, 8),)),
        (compat.NeuralSort(), (torch.randn(8),)),
        (compat.TopKCrossEntropyLoss("softsort", 1.0, [1.0], 10), (torch.randn(4, 9), torch.zeros(4).long())),
        (compat.SmoothTopKLoss(10, 2), (torch.randn(4, 10), torch.full((4,), 10))),
    ],
)
def test_bad_inputs_raise(module, args):
    with pytest.raises((ValueError, TypeError)):
        module(*args)


def test_interpolation_type_alias_warns():
    with pytest.warns(DeprecationWarning):
        net = compat.DiffTopkNet("bitonic", 8, 2, interpolation_type="logistic")
    assert net.params["distribution"] == "logistic"
