"""Class losses with masked (-inf) logits, as ``nn.CrossEntropyLoss`` takes them (issue 12, item 1):
``-inf`` on non-label classes gives the loss of the row without those classes, a label at ``-inf``
gives ``inf``, and nothing is NaN."""

from __future__ import annotations

import math

import pytest
import torch

import softtopk

INF = math.inf
NOISE_SAMPLES = 5


def _noise(shape, seed=0):
    return torch.randn(*shape, NOISE_SAMPLES, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# each loss as (logits, target, noise) -> per-row losses; noise is used by the noised losses only
LOSSES = {
    "smooth_topk_svm": lambda s, y, z: softtopk.smooth_topk_svm(s, y, k=2, tau=0.5, reduction="none"),
    "smooth_top1_svm": lambda s, y, z: softtopk.smooth_top1_svm(s, y, reduction="none"),
    "topk_svm": lambda s, y, z: softtopk.topk_svm(s, y, k=2, reduction="none"),
    "top1_svm": lambda s, y, z: softtopk.top1_svm(s, y, reduction="none"),
    "bal_noised_topk": lambda s, y, z: softtopk.bal_noised_topk(s, y, k=2, epsilon=0.5, noise=z, reduction="none"),
    "imbal_noised_topk": lambda s, y, z: softtopk.imbal_noised_topk(
        s, y, k=2, epsilon=0.5, max_m=0.3, cls_num_list=[5.0] * s.shape[1], scale=1.0, noise=z, reduction="none"
    ),
    "topk_ce softsort m=4": lambda s, y, z: softtopk.topk_cross_entropy(
        s, y, [0.5, 0.5], method="softsort", m=4, reduction="none"
    ),
    "topk_ce neuralsort m=4": lambda s, y, z: softtopk.topk_cross_entropy(
        s, y, [0.5, 0.5], method="neuralsort", m=4, reduction="none"
    ),
    "topk_ce splitter m=4": lambda s, y, z: softtopk.topk_cross_entropy(
        s, y, [0.5, 0.5], method="splitter_selection", m=4, steepness=2.0, reduction="none"
    ),
    "topk_ce softsort m=None": lambda s, y, z: softtopk.topk_cross_entropy(
        s, y, [0.5, 0.5], method="softsort", reduction="none"
    ),
    "topk_ce neuralsort m=None": lambda s, y, z: softtopk.topk_cross_entropy(
        s, y, [0.5, 0.5], method="neuralsort", reduction="none"
    ),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_masked_classes_are_left_out(name):
    loss = LOSSES[name]
    g = torch.Generator().manual_seed(1)
    finite = torch.randn(3, 6, generator=g, dtype=torch.float64)
    target = torch.tensor([0, 3, 5])
    keep = [0, 2, 3, 5, 6, 8]  # the classes of the masked call that stay finite
    masked = torch.full((3, 9), -INF, dtype=torch.float64)
    masked[:, keep] = finite
    masked_target = torch.tensor([keep[t] for t in target.tolist()])
    noise = _noise((3, 9))
    left, right = masked.clone().requires_grad_(), finite.clone().requires_grad_()
    value = loss(left, masked_target, noise)
    # the masked classes' noise is never used: their scores stay -inf
    expected = loss(right, target, noise[:, keep])
    torch.testing.assert_close(value, expected)
    (value * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    (expected * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    assert torch.isfinite(left.grad).all()
    torch.testing.assert_close(left.grad[:, keep], right.grad)
    dropped = [c for c in range(9) if c not in keep]
    assert torch.equal(left.grad[:, dropped], torch.zeros(3, len(dropped), dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_a_label_at_minus_inf_gives_inf_and_stays_in_its_row(name):
    logits = torch.randn(2, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    logits[0, 4] = -INF
    logits.requires_grad_()
    value = LOSSES[name](logits, torch.tensor([4, 1]), _noise((2, 6)))
    assert value[0] == INF and torch.isfinite(value[1])
    assert torch.nn.functional.cross_entropy(logits.detach(), torch.tensor([4, 1]), reduction="none")[0] == INF
    value[1].backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("name", ["smooth_topk_svm", "smooth_top1_svm", "topk_svm", "top1_svm"])
def test_a_label_among_fewer_than_k_finite_classes_has_loss_zero(name):
    """With fewer than k other classes above -inf the label is surely in the top k: the loss is its
    limit 0 (for k = 1, a single finite class)."""
    logits = torch.tensor(
        [[1.0, -INF, -INF, -INF, -INF], [0.5, 2.0, -INF, -INF, -INF]], dtype=torch.float64, requires_grad=True
    )
    k1 = name.endswith("top1_svm")
    value = LOSSES[name](logits, torch.tensor([0, 1]), None)
    assert value[0] == 0 and (k1 or value[1] == 0)
    value.sum().backward()
    assert torch.isfinite(logits.grad).all() and torch.equal(logits.grad[0], torch.zeros(5, dtype=torch.float64))


@pytest.mark.parametrize("method", ["bitonic", "odd_even", "splitter_selection"])
def test_topk_cross_entropy_over_all_classes_of_a_network_with_masked_classes(method):
    # m=None ranks every class with the full-size network: the masked classes sit exactly at its
    # bottom (a network of another size than the finite classes', so no equality with that call)
    logits = torch.randn(4, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    logits[:, 7:] = -INF
    leaf = logits.clone().requires_grad_()
    loss = softtopk.topk_cross_entropy(leaf, torch.tensor([0, 1, 2, 3]), [0.5, 0.5], method=method, steepness=2.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(leaf.grad).all() and (leaf.grad[:, 7:] == 0).all()


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_ignored_rows_never_reach_the_loss_or_its_gradient(name):
    """A row whose target is ``ignore_index`` adds nothing, not even ``0 * inf`` or NaN: its logits
    may be +-inf, huge or NaN; the loss and the kept rows' gradients are those of the call without
    it, and a non-NaN ignored row's gradient is 0. (An ignored row holding a NaN may get a NaN
    gradient, as it does from ``nn.CrossEntropyLoss``.)"""
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    logits[1] = torch.tensor([INF, -INF, 1e308, -1e308, 0.0, INF], dtype=torch.float64)
    logits[3, 2] = math.nan
    target, kept = torch.tensor([2, -100, 0, -100]), [0, 2]
    noise = _noise((4, 6))

    left = logits.clone().requires_grad_()
    right = logits[kept].clone().requires_grad_()
    value = LOSSES[name](left, target, noise)
    expected = LOSSES[name](right, target[kept], noise[kept])
    assert torch.equal(value[[1, 3]], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(value[kept], expected)
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    (value * weights).sum().backward()
    (expected * weights[kept]).sum().backward()
    assert torch.equal(left.grad[1], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(left.grad[kept], right.grad)
