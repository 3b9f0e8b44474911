"""The Spearman loss: ``1 - ρ`` of soft ranks against exact (average) ranks, against scipy's
``spearmanr`` in the hard limit, gradients, shapes, reductions, degenerate lists and bad input."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import softtopk
from softtopk.losses.spearman import average_ranks

scipy_stats = pytest.importorskip("scipy.stats", reason="scipy (installed with scikit-learn, the test extra)")


def test_average_ranks_are_scipy_rankdata():
    x = torch.tensor([[3.0, 1.0, 3.0, 2.0, 1.0, 5.0]])
    assert average_ranks(x).tolist() == [scipy_stats.rankdata(x[0].numpy()).tolist()]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=3, max_size=12), st.integers(0, 2**31 - 1))
def test_hard_limit_is_one_minus_spearman(values, seed):
    """With a small strength the soft ranks are the hard ranks: the loss is 1 - scipy's ρ_S (the
    predictions tie-free, the targets with ties)."""
    target = torch.tensor([values], dtype=torch.float64)
    pred = torch.randn(1, len(values), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    loss = softtopk.spearman_loss(pred, target, strength=1e-9)
    if target.unique().numel() == 1:  # no spread: ρ is undefined (scipy warns), 0 here
        assert loss.item() == 1.0
    else:
        expected = scipy_stats.spearmanr(pred[0].numpy(), target[0].numpy()).statistic
        assert loss.item() == pytest.approx(1 - expected, abs=1e-9)


def test_gradcheck_float64():
    pred = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    target = torch.randn(3, 7, dtype=torch.float64)
    for regularization in ("l2", "kl"):
        assert torch.autograd.gradcheck(
            lambda p, regularization=regularization: softtopk.spearman_loss(
                p, target, regularization=regularization, strength=0.5, reduction="none"
            ),
            (pred,),
        )


def test_training_reaches_the_targets_order():
    """A few steps of gradient descent on the loss order the scores like the targets."""
    target = torch.randn(4, 30, generator=torch.Generator().manual_seed(0))
    pred = torch.zeros(4, 30).normal_(generator=torch.Generator().manual_seed(1)).requires_grad_()
    opt = torch.optim.Adam([pred], lr=0.1)
    start = softtopk.spearman_loss(pred.detach(), target, strength=1e-6)
    for _ in range(200):
        opt.zero_grad()
        softtopk.spearman_loss(pred, target, strength=1.0).backward()
        opt.step()
    hard = softtopk.spearman_loss(pred.detach(), target, strength=1e-6)
    assert start > 0.5 and hard < 1e-6


def test_dim_reduction_dtype_and_module():
    pred, target = torch.randn(5, 2, 9), torch.randn(5, 2, 9)
    per_list = softtopk.spearman_loss(pred, target, reduction="none", strength=0.3)
    assert per_list.shape == (5, 2)
    moved = softtopk.spearman_loss(pred.movedim(-1, 0), target.movedim(-1, 0), dim=0, reduction="none", strength=0.3)
    torch.testing.assert_close(moved, per_list)
    assert softtopk.spearman_loss(pred, target, strength=0.3, reduction="sum") == pytest.approx(per_list.sum().item())
    module = softtopk.SpearmanLoss(strength=0.3)
    torch.testing.assert_close(module(pred, target), per_list.mean())
    assert "strength=0.3" in repr(module)
    half = softtopk.spearman_loss(pred.to(torch.bfloat16), target, strength=0.3, reduction="none")
    assert half.dtype == torch.float32 and torch.allclose(half, per_list, atol=0.05)
    assert softtopk.spearman_loss(torch.empty(0, 4), torch.empty(0, 4)) == 0


def test_degenerate_and_nan_lists():
    pred = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, float("nan"), 3.0]], requires_grad=True)
    target = torch.tensor([[5.0, 5.0, 5.0], [1.0, float("nan"), 2.0], [1.0, 2.0, 3.0]])
    loss = softtopk.spearman_loss(pred, target, reduction="none")
    assert loss[0] == 1.0 and loss[1].isnan() and loss[2].isnan()
    softtopk.spearman_loss(pred[:1], target[:1]).backward()
    assert torch.isfinite(pred.grad).all()


def test_no_value_reads_on_the_accelerator_path(monkeypatch):
    """The path an accelerator, ``torch.compile`` or ``vmap`` takes (a CPU tensor may read values in
    the soft ranks' solver: :mod:`softtopk.ops.isotonic`)."""
    import sys
    from pathlib import Path

    from softtopk.ops import isotonic, permutahedron

    sys.path.insert(0, str(Path(__file__).parent))
    from dispatch_counter import count_call

    for module in (isotonic, permutahedron):
        monkeypatch.setattr(module, "can_inspect", lambda value: False)
    target = torch.randn(64, 100)
    counts = count_call(lambda p: softtopk.spearman_loss(p, target, strength=0.5), torch.randn(64, 100))
    assert counts.reads == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"target": torch.randn(2, 4)}, ValueError, "target must be a tensor of input's shape (2, 5), got (2, 4)"),
        ({"target": [1, 2]}, ValueError, "target must be a tensor of input's shape (2, 5), got list"),
        ({"target": torch.ones(2, 5, dtype=torch.bool)}, TypeError, "target must hold real numbers, got torch.bool"),
        ({"reduction": "max"}, ValueError, "reduction"),
        ({"strength": -1.0}, ValueError, "strength"),
        ({"regularization": "l1"}, ValueError, "regularization"),
    ],
)
def test_bad_input_names_the_argument(kwargs, error, message):
    args = {"target": torch.randn(2, 5), **kwargs}
    target = args.pop("target")
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        softtopk.spearman_loss(torch.randn(2, 5), target, **args)
