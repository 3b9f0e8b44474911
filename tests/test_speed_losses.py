"""Class losses and ndcg_loss: no host reads of values, few launches, meta device, vmap, compile.

Launches and reads are counted with ``tests/dispatch_counter.py`` on one fwd+bwd at logits
``randn(64, 1000)``, targets ``randint(0, 1000, (64,))``. Value checks of arguments run only for
CPU tensors outside compile/vmap (``softtopk._validation.values_checked``): the counts below are
taken once with the checks (exactly the documented reads: one for the target) and once with the gate
off, as on an accelerator (no read at all).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402

C = 1000
TARGET = torch.randint(0, C, (64,), generator=torch.Generator().manual_seed(0))
LOGITS = torch.randn(64, C, generator=torch.Generator().manual_seed(1))
COUNTS = [float(c) for c in range(1, C + 1)]

LOSSES = {
    "topk_ce splitter": lambda s, y: softtopk.topk_cross_entropy(s, y, [0.2] * 5),
    "topk_ce bitonic": lambda s, y: softtopk.topk_cross_entropy(s, y, [0.2] * 5, method="bitonic"),
    "topk_ce neuralsort": lambda s, y: softtopk.topk_cross_entropy(s, y, [0.2] * 5, method="neuralsort"),
    "topk_ce softsort": lambda s, y: softtopk.topk_cross_entropy(s, y, [0.2] * 5, method="softsort"),
    "smooth_topk_svm": lambda s, y: softtopk.SmoothTopKSVM(k=5)(s, y),
    "smooth_top1_svm": lambda s, y: softtopk.SmoothTop1SVM()(s, y),
    "topk_svm": lambda s, y: softtopk.TopKSVM(k=5)(s, y),
    "bal_noised": lambda s, y: softtopk.BalNoisedTopK(5, epsilon=1.0)(s, y),
    "imbal_noised": lambda s, y: softtopk.ImbalNoisedTopK(5, epsilon=1.0, max_m=0.3, cls_num_list=COUNTS)(s, y),
}
# launches of one fwd+bwd with the value checks off (as on an accelerator); top-k CE's network
# sweep belongs to ops/sorting_networks.py and is counted apart (see test_topk_ce_outside_the_network)
# (the budgets: smooth top-k SVM <= 32, noised <= 24; these caps are what the torch path
# reaches; on CUDA the SVM's rows take two Triton kernels, within 32: tests/test_svm_triton.py; the
# noised hinge zeroes ignored rows itself, so relu's backward masks them; LDAM margins cost 4 more)
# (the SVMs' limits at +inf logits, their overflow-free gaps and NaN rows cost 20, 14 and 10 of theirs;
# a loss finite wherever it is representable, also when its margin overflows, 4 of each smooth one;
# a Toeplitz expansion that Inductor compiles, 1 of the subset kernel's)
BUDGETS = {
    "smooth_topk_svm": 95,
    "smooth_top1_svm": 66,
    "topk_svm": 57,
    "bal_noised": 24,
    "imbal_noised": 28,
    "topk_ce softsort": 66,
    "topk_ce neuralsort": 85,
}


@pytest.fixture
def unchecked(monkeypatch):
    """The value checks' device gate closed, as for a CUDA tensor."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)


def _count(name, target=TARGET):
    return count_call(lambda s: LOSSES[name](s, target), LOGITS)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_cpu_reads_are_exactly_the_target_check(name):
    expected = 1  # the target range check, one host read on CPU
    counts = _count(name)
    if name.startswith("topk_ce"):  # reads inside the rank operators are not the loss's own
        expected += _operator_reads(name)
    assert counts.reads == expected


def _operator_reads(name):
    from softtopk._registry import resolve

    method = {"splitter": "splitter_selection"}.get(name.split()[1], name.split()[1])
    spec, params = resolve(method, {}, "ranks")
    scores = torch.randn(64, 16).sort(-1).values
    position = torch.randint(0, 16, (64,))
    if spec.label_ranks is not None:
        return count_call(lambda s: spec.label_ranks(s, position, 5, **params), scores).reads
    return count_call(lambda s: spec.ranks(s, 5, **params), scores).reads


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_no_reads_from_the_loss_when_unchecked(name, unchecked):
    counts = _count(name)
    expected = _operator_reads(name) if name.startswith("topk_ce") else 0
    assert counts.reads == expected


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_launch_budget(name, unchecked):
    assert _count(name).launches <= BUDGETS[name]


def _network_launches(method="splitter_selection"):
    from softtopk._registry import resolve

    spec, params = resolve(method, {}, "ranks")
    position = torch.randint(0, 16, (64,))
    return count_call(lambda s: spec.label_ranks(s, position, 5, **params), torch.randn(64, 16).sort(-1).values)


def test_topk_ce_outside_the_network(unchecked):
    """Everything top-k CE (m=16) launches besides the network sweep: selection, head, pipeline."""
    assert _count("topk_ce splitter").launches - _network_launches().launches <= 50


def test_reduction_pipeline_is_a_handful(unchecked):
    base = count_call(lambda s: softtopk.SmoothTop1SVM(reduction="none")(s, TARGET).sum(), LOGITS)
    mean = count_call(lambda s: softtopk.SmoothTop1SVM()(s, TARGET), LOGITS)
    assert mean.launches - base.launches <= 6


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_forward_and_backward_on_meta(name):
    logits = torch.empty(4, C, device="meta", requires_grad=True)
    target = torch.zeros(4, dtype=torch.long, device="meta")
    loss = LOSSES[name](logits, target)
    loss.backward()
    assert logits.grad.shape == logits.shape


def test_ndcg_on_meta_and_without_reads_when_unchecked(unchecked):
    scores = torch.empty(3, 8, device="meta", requires_grad=True)
    softtopk.ndcg_loss(scores, torch.empty(3, 8, device="meta"), 3).backward()
    relevance = torch.randint(0, 3, (64, 50)).float()
    own = count_call(lambda s: softtopk.ndcg_loss(s, relevance, 10), LOGITS[:, :50]).reads
    ranks = count_call(lambda s: softtopk.soft_topk_ranks(s, 10, method="neuralsort").sum(-1), LOGITS[:, :50]).reads
    assert own == ranks


@pytest.mark.parametrize(
    "name", ["smooth_topk_svm", "smooth_top1_svm", "topk_svm", "topk_ce softsort", "topk_ce neuralsort"]
)
def test_vmap_over_a_class_loss(name):
    logits = torch.randn(3, 4, 12, dtype=torch.float64)
    target = torch.randint(0, 12, (3, 4))
    batched = torch.vmap(LOSSES[name])(logits, target)
    looped = torch.stack([LOSSES[name](logits[i], target[i]) for i in range(3)])
    torch.testing.assert_close(batched, looped)


def test_vmap_of_the_noised_losses():
    logits, target = torch.randn(3, 4, 12), torch.randint(0, 12, (3, 4))
    noise = torch.randn(3, 4, 12, 5)

    def loss(s, y, z):
        return softtopk.bal_noised_topk(s, y, k=2, epsilon=0.5, noise=z)

    torch.testing.assert_close(
        torch.vmap(loss)(logits, target, noise), torch.stack([loss(logits[i], target[i], noise[i]) for i in range(3)])
    )


def test_cpu_checks_still_raise():
    with pytest.raises(ValueError, match="target values must be in"):
        softtopk.SmoothTopKSVM(k=2)(torch.randn(2, 5), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="weight must hold finite values"):
        softtopk.smooth_topk_svm(torch.randn(2, 5), torch.tensor([0, 1]), k=2, weight=torch.tensor([1.0, -1, 1, 1, 1]))


def test_default_m_is_16_or_every_class():
    logits, target = torch.randn(5, 100, dtype=torch.float64), torch.randint(0, 100, (5,))
    params = {"method": "softsort", "reduction": "none"}
    torch.testing.assert_close(
        softtopk.topk_cross_entropy(logits, target, [0.5, 0.5], **params),
        softtopk.topk_cross_entropy(logits, target, [0.5, 0.5], m=16, **params),
    )
    small = logits[:, :12]
    torch.testing.assert_close(
        softtopk.topk_cross_entropy(small, target % 12, [0.5, 0.5], **params),
        softtopk.topk_cross_entropy(small, target % 12, [0.5, 0.5], m=None, **params),
    )
    long_p_k = [1.0 / 20] * 20
    torch.testing.assert_close(
        softtopk.topk_cross_entropy(logits, target, long_p_k, **params),
        softtopk.topk_cross_entropy(logits, target, long_p_k, m=21, **params),
    )
    assert softtopk.TopKCrossEntropyLoss([0.5, 0.5]).m == 16
    from softtopk.compat import difftopk

    assert difftopk.TopKCrossEntropyLoss("bitonic", 1.0, [0.5, 0.5], 100).m is None


def test_ndcg_empty_batch_nan_and_negative_relevance():
    empty = softtopk.ndcg_loss(torch.empty(0, 5), torch.empty(0, 5), 2)
    assert empty == 0 and softtopk.SmoothTopKSVM(k=2)(torch.empty(0, 5), torch.empty(0, dtype=torch.long)) == 0
    scores = torch.randn(2, 5)
    with pytest.raises(ValueError, match="relevance must hold finite values >= 0"):
        softtopk.ndcg_loss(scores, torch.tensor([[1.0, math.nan, 0, 0, 0], [1.0, 0, 0, 0, 0]]), 2)
    with pytest.raises(ValueError, match="relevance"):
        softtopk.ndcg_loss(scores, torch.tensor([[1.0, -1.0, 0, 0, 0], [1.0, 0, 0, 0, 0]]), 2)
    mask = torch.tensor([[True] * 4 + [False], [True] * 5])
    padded = torch.tensor([[1.0, 0, 0, 0, -1.0], [1.0, 0, 0, 0, 0]])  # padding may hold anything
    assert torch.isfinite(softtopk.ndcg_loss(scores, padded, 2, mask=mask))


def test_ndcg_nan_relevance_stays_in_its_row_when_unchecked(unchecked):
    relevance = torch.tensor([[1.0, math.nan, 0, 0, 0], [1.0, 0, 2, 0, 0]])
    loss = softtopk.ndcg_loss(torch.randn(2, 5), relevance, 2, reduction="none")
    assert math.isnan(loss[0]) and math.isfinite(loss[1])


@pytest.mark.parametrize(
    "loss",
    [
        softtopk.BalNoisedTopK(2, epsilon=0.0),
        softtopk.ImbalNoisedTopK(2, epsilon=0.0, max_m=0.3, cls_num_list=[3.0] * 8, scale=1.0),
    ],
)
def test_noised_fullgraph_matches_eager(loss):
    logits, target = torch.randn(4, 8), torch.randint(0, 8, (4,))
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    leaf = logits.clone().requires_grad_()
    value = compiled(leaf, target)
    value.backward()
    eager = logits.clone().requires_grad_()
    loss(eager, target).backward()
    torch.testing.assert_close(value, loss(logits, target))
    torch.testing.assert_close(leaf.grad, eager.grad)


@pytest.mark.parametrize("method", ["softsort", "neuralsort", "splitter_selection", "bitonic"])
def test_topk_ce_with_a_class_at_plus_inf_is_finite(method):
    logits = torch.tensor([[1.0, math.inf, 0.5, -1.0, 2.0, 0.0, 0.3, 0.1]]).repeat(2, 1).requires_grad_()
    loss = softtopk.topk_cross_entropy(logits, torch.tensor([0, 1]), [0.5, 0.5], m=4, method=method, reduction="none")
    loss.sum().backward()
    assert torch.isfinite(loss).all() and loss[1] < 1e-6 and torch.isfinite(logits.grad).all()
