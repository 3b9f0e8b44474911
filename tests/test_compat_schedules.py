"""Compat defects found by the originals' own tests and examples (issue 12, item 6), each checked
against the installed original: ``art_lambda=None``, diffsort's bitonic layout for ``n`` that is not
a power of two, NeuralSort's gradient at ties, hyper-parameters as assignable attributes
(steepness/temperature schedules), the smooth-topk ``forward(x, y)`` names and numpy ``p_k``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from softtopk.compat import difftopk as compat
from softtopk.compat import smooth_topk as compat_smooth

_MISSING = "oracle package {}==0.2.0 is not installed (pip install --no-deps {}==0.2.0)"
difftopk = pytest.importorskip("difftopk", reason=_MISSING.format("difftopk", "difftopk"))
diffsort = pytest.importorskip("diffsort", reason=_MISSING.format("diffsort", "diffsort"))

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:difftopk", "ignore::DeprecationWarning:difftopk")
F64 = torch.float64


def _rows(n: int, batch: int = 4, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(batch, n, generator=torch.Generator().manual_seed(n), dtype=F64).to(dtype)


@pytest.mark.parametrize("distribution", ["cauchy", "logistic", "optimal"])
def test_art_lambda_none_as_in_the_originals(distribution):
    x = _rows(8, dtype=F64)
    want = diffsort.DiffSortNet("odd_even", 8, steepness=5.0, art_lambda=None, distribution=distribution)(x)
    got = compat.DiffSortNet("odd_even", 8, steepness=5.0, art_lambda=None, distribution=distribution)(x)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-7)
    net = compat.DiffTopkNet("bitonic", 8, 3, art_lambda=None, distribution=distribution)
    assert net(x)[1].shape == (4, 8, 3)
    loss = compat.TopKCrossEntropyLoss("odd_even", 5.0, [0.5, 0.5], 8, art_lambda=None, distribution=distribution)
    assert torch.isfinite(loss(x, torch.tensor([0, 1, 2, 3])))


def test_art_lambda_none_with_logistic_phi_is_a_clear_error():
    with pytest.raises(ValueError, match="art_lambda must be a float for distribution='logistic_phi', got None"):
        compat.DiffSortNet("bitonic", 8, art_lambda=None, distribution="logistic_phi")
    with pytest.raises(TypeError):  # the originals fail too, later, in pow(None)
        diffsort.DiffSortNet("bitonic", 8, art_lambda=None, distribution="logistic_phi")(_rows(8))


def _diffsort_sorts(n: int) -> bool:
    """Whether diffsort's own bitonic layout sorts: its outputs at a steepness that makes every
    comparator exact on these rows are the sorted rows."""
    x = _rows(n, batch=256, dtype=F64)
    out, _ = diffsort.DiffSortNet("bitonic", n, steepness=1e12, distribution="logistic")(x)
    return torch.equal(out, x.sort(-1).values)


@pytest.mark.parametrize("n", [n for n in range(3, 70) if n & (n - 1)])
def test_bitonic_gives_diffsorts_numbers_wherever_its_layout_sorts(n):
    x = _rows(n, dtype=F64)
    ours_sorted, ours = compat.DiffSortNet("bitonic", n, steepness=10.0)(x)
    if _diffsort_sorts(n):
        want_sorted, want = diffsort.DiffSortNet("bitonic", n, steepness=10.0)(x)
        torch.testing.assert_close(ours, want, atol=1e-7, rtol=1e-7)
        torch.testing.assert_close(ours_sorted, want_sorted, atol=1e-7, rtol=1e-7)
    else:  # n = 22, 38, 42-46, 54: softtopk's layout, which sorts
        assert n in (22, 38, 42, 43, 44, 45, 46, 54)
        hard_sorted, _ = compat.DiffSortNet("bitonic", n, steepness=1e12, distribution="logistic")(x)
        assert torch.equal(hard_sorted, x.sort(-1).values)


def test_bitonic_topk_gives_difftopks_numbers_for_three_wires():
    x = _rows(3)
    _, want = difftopk.DiffTopkNet("bitonic", 3, 2, steepness=10.0)(x)
    _, got = compat.DiffTopkNet("bitonic", 3, 2, steepness=10.0)(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def _same_gradients(original: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor) -> None:
    """The input gradients of a random linear functional of both permutation matrices agree."""
    weights = torch.randn(*x.shape, x.shape[-1], generator=torch.Generator().manual_seed(3))
    grads = []
    for module in (original, ours):
        leaf = x.clone().requires_grad_()
        (module(leaf) * weights).sum().backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-6, rtol=1e-5)


def test_neuralsort_gradient_at_ties_equals_difftopks():
    # a zero-initialised head: every score tied, then a few ties among distinct scores
    for x in (torch.zeros(2, 6), torch.tensor([[0.5, -1.0, 0.5, 2.0, 2.0, 0.0]])):
        _same_gradients(difftopk.NeuralSort(tau=0.7), compat.NeuralSort(tau=0.7), x)
    leaf = torch.zeros(1, 5, requires_grad=True)
    compat.NeuralSort(tau=1.0)(leaf)[..., -2:].sum(-1).square().sum().backward()
    torch.testing.assert_close(leaf.grad, leaf.grad[:, :1].expand(1, 5))  # symmetric in the tied entries


def test_network_hyper_parameters_are_assignable_as_in_the_originals():
    x = _rows(8)
    ours, theirs = (
        compat.DiffTopkNet("odd_even", 8, 3, steepness=2.0),
        difftopk.DiffTopkNet("odd_even", 8, 3, steepness=2.0),
    )
    for module in (ours, theirs):  # a steepness schedule
        module.steepness, module.distribution = 20.0, "logistic"
    torch.testing.assert_close(ours(x)[1], theirs(x)[1], atol=1e-5, rtol=1e-5)
    fresh = compat.DiffTopkNet("odd_even", 8, 3, steepness=20.0, distribution="logistic")
    assert torch.equal(ours(x)[1], fresh(x)[1])
    sorter = compat.DiffSortNet("bitonic", 8, steepness=1.0)
    sorter.steepness, sorter.art_lambda, sorter.distribution = 3.0, 0.5, "logistic_phi"
    want = diffsort.DiffSortNet("bitonic", 8, steepness=3.0, art_lambda=0.5, distribution="logistic_phi")(x.double())
    torch.testing.assert_close(sorter(x.double())[1], want[1], atol=1e-3, rtol=0)  # ART near ties, docs/compat.md
    sorter.steepness = -1.0
    with pytest.raises(ValueError, match="steepness"):
        sorter(x)


def test_relaxation_hyper_parameters_are_assignable_as_in_the_originals():
    x = _rows(7)
    ours, theirs = compat.NeuralSort(tau=1.0), difftopk.NeuralSort(tau=1.0)
    for module in (ours, theirs):
        module.tau = 0.2
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    ours.hard = True
    assert set(ours(x).unique().tolist()) == {0.0, 1.0}
    ours, theirs = compat.SoftSort(tau=1.0), difftopk.SoftSort(tau=1.0)
    for module in (ours, theirs):
        module.tau, module.pow = 0.3, 2.0
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    ours.pow = 0.5
    with pytest.raises(ValueError, match="pow must be a finite number >= 1, got 0.5"):
        ours(x)
    ours.pow, ours.tau = 1.0, 0.0
    with pytest.raises(ValueError, match="tau"):
        ours(x)


@pytest.mark.parametrize("name", ["SmoothTopkSVM", "SmoothTop1SVM", "MaxTopkSVM", "MaxTop1SVM"])
def test_smooth_topk_forward_takes_the_originals_keywords(name):
    x, y = _rows(6, dtype=F64), torch.tensor([0, 1, 2, 3])
    loss = getattr(compat_smooth, name)(6)
    assert torch.equal(loss(x=x, y=y), loss(x, y))


def test_p_k_may_be_a_numpy_array():
    x, y = _rows(6), torch.tensor([0, 1, 2, 3])
    array = compat.TopKCrossEntropyLoss("neuralsort", 2.0, np.array([0.5, 0.5]), 6)
    listed = compat.TopKCrossEntropyLoss("neuralsort", 2.0, [0.5, 0.5], 6)
    original = difftopk.TopKCrossEntropyLoss("neuralsort", 2.0, np.array([0.5, 0.5]), 6)
    assert torch.equal(array(x, y), listed(x, y))
    torch.testing.assert_close(array(x, y), original(x, y), atol=1e-5, rtol=1e-5)


def test_softsort_splits_ties_as_the_original():
    x = torch.tensor([[0.5, 0.5, 1.0, -1.0, 1.0, 0.0, 0.0, 2.0]])
    _same_gradients(difftopk.SoftSort(tau=0.5), compat.SoftSort(tau=0.5), x)


def test_state_dicts_have_the_originals_keys():
    assert list(compat.DiffTopkNet("bitonic", 8, 3).state_dict()) == list(
        difftopk.DiffTopkNet("bitonic", 8, 3).state_dict()
    )
    assert list(compat.NeuralSort().state_dict()) == list(difftopk.NeuralSort().state_dict()) == []
    for name in ("SmoothTopkSVM", "SmoothTop1SVM", "MaxTopkSVM", "MaxTop1SVM"):  # topk.svm's labels buffer
        loss = getattr(compat_smooth, name)(6)
        assert list(loss.state_dict()) == ["labels"]
        loss.load_state_dict({"labels": torch.arange(6)})
