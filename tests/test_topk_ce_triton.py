"""Top-k cross-entropy in one autograd node (``ops/topk_ce_triton.py``): where it is taken, and
that its values and gradients are the chained Functions' bit for bit and the torch path's within
rounding (in Triton's interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation
from softtopk.ops import label_select, reduce_kernels, reduce_triton, topk_ce_triton, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from extended_rows import LOSS_ROWS, LOSS_TARGETS  # noqa: E402
from triton_kernels import (  # noqa: E402
    DEVICE,
    count_kernels,
    count_loss_kernels,
    needs_triton,
    seeded_rows,
    usable_on_any_device,
)

pytestmark = needs_triton

INF = float("inf")


def _run(x, target, path: str, **kwargs) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(loss, gradient, whether one node ran)`` of ``topk_cross_entropy(x, target, **kwargs)`` by
    ``path``: ``'kernels'`` (in one node where it may), ``'chained'`` (the same kernels, as three
    Functions) or ``'torch'``, for one seeded upstream gradient."""
    leaf = x.detach().clone().requires_grad_()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_gate, "usable", (lambda *args: False) if path == "torch" else usable_on_any_device)
        patch.setattr(triton_gate, "KERNELS", path != "torch")  # no CPU numba kernel on the reference
        patch.setattr(label_select, "pays", lambda classes, m: False)  # the selection's Triton kernel
        if path == "chained":
            patch.setattr(topk_ce_triton, "usable", lambda logits, m: False)
        taken: list = []
        apply = topk_ce_triton.TopKCERows.apply
        patch.setattr(topk_ce_triton.TopKCERows, "apply", lambda *args: taken.append(args) or apply(*args))
        loss = softtopk.topk_cross_entropy(leaf, target, **kwargs)
        g = torch.randn(loss.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype).to(x.device)
        (loss * g).sum().backward()
    return loss.detach(), leaf.grad, bool(taken)


def _target(rows: int, classes: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def _agree(x, target, tol: float, **kwargs) -> None:
    """One node gives the chained Functions' loss and gradient, exactly for the rows' losses and
    within the last bits reduced (a sum in another order, a division by the count as a product
    with its inverse), and the torch path's within ``tol``."""
    (v1, g1, one), (v2, g2, _) = _run(x, target, "kernels", **kwargs), _run(x, target, "chained", **kwargs)
    assert one
    bits = 0.0 if kwargs.get("reduction") == "none" else 4 * torch.finfo(x.dtype).eps
    torch.testing.assert_close(v1, v2, rtol=bits, atol=bits, equal_nan=True)
    torch.testing.assert_close(g1, g2, rtol=bits, atol=bits, equal_nan=True)
    v0, g0, _ = _run(x, target, "torch", **kwargs)
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("method", ["splitter_selection", "bitonic", "neuralsort"])
def test_one_node_equals_the_chained_functions_and_the_torch_path(dtype, top1_mode, method):
    x = seeded_rows(6, 40, dtype, seed=1) * 3
    target = _target(6, 40)
    target[2] = -100  # an ignored row: loss and gradient 0
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for reduction in ("none", "mean", "sum"):
        _agree(x, target, tol, p_k=[0.4, 0.3, 0.3], method=method, top1_mode=top1_mode, m=8, reduction=reduction)


def test_weights_every_class_and_half_precision():
    """``weight``, ``m=None`` (all 12 classes) and a bfloat16 input (rows computed in float32)."""
    x = seeded_rows(5, 12, torch.float64, seed=2)
    weight = torch.linspace(0.5, 2.0, 12, dtype=torch.float64).to(DEVICE)
    _agree(x, _target(5, 12, 1), 1e-12, p_k=[0.5, 0.5], m=None, weight=weight)
    _agree(x.to(torch.bfloat16), _target(5, 12, 1), 1e-2, p_k=[0.5, 0.5], method="neuralsort", m=6)


def test_infinities_and_nan():
    """The label at ``-inf`` gives ``inf`` (gradient 0), ``+inf`` entries their stand-in (``'smce'``:
    ``inf`` where another class is at ``+inf``), a NaN row NaN; an ignored row 0 whatever it holds
    (its gradient, as ``F.cross_entropy``'s, NaN where it holds a NaN)."""
    x = torch.tensor(LOSS_ROWS, dtype=torch.float64).to(DEVICE)
    target = torch.tensor(LOSS_TARGETS).to(DEVICE)
    for method in ("splitter_selection", "neuralsort"):
        for top1_mode in ("sm", "smce"):
            kwargs = {"p_k": [0.5, 0.5], "method": method, "m": 4, "top1_mode": top1_mode, "reduction": "none"}
            _agree(x, target, 1e-12, **kwargs)
            loss, grad, _ = _run(x, target, "kernels", **kwargs)
            assert loss[0] == INF and bool(grad[0].eq(0).all()) and bool(loss[2].isnan()) and loss[3] == 0


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_every_row_ignored_or_none_at_all(reduction):
    """The reduction over no kept row is 0 with gradient 0, as the torch path's (not PyTorch's NaN
    for the mean); over no row at all too."""
    x = seeded_rows(4, 30, torch.float32, seed=7)
    for target in (torch.full((4,), -100).to(DEVICE), None):
        rows = x if target is not None else x[:0]
        target = target if target is not None else _target(0, 30)
        loss, grad, one = _run(rows, target, "kernels", p_k=[0.5, 0.5], m=8, reduction=reduction)
        assert one and loss.item() == 0.0 and bool(grad.eq(0).all())
        _agree(rows, target, 0.0, p_k=[0.5, 0.5], m=8, reduction=reduction)


def test_more_rows_than_the_reduction_kernel_takes(monkeypatch):
    """Above ``reduce_triton.MAX_ROWS`` rows the node returns the rows and the torch ops reduce
    them: the chained Functions' mean bit for bit."""
    monkeypatch.setattr(reduce_triton, "MAX_ROWS", 5)
    launched = count_kernels(monkeypatch, reduce_kernels, "reduce_rows")
    x, target = seeded_rows(6, 30, torch.float64, seed=9), _target(6, 30, 3)
    (v1, g1, one), (v2, g2, _) = (_run(x, target, path, p_k=[0.5, 0.5], m=8) for path in ("kernels", "chained"))
    assert one and launched == []
    torch.testing.assert_close(v1, v2, rtol=0, atol=0)
    torch.testing.assert_close(g1, g2, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("splitter_selection", {"hard": True}),
        ("splitter_selection", {"distribution": "logistic"}),
        ("splitter_selection", {"steepness": torch.tensor(5.0)}),
        ("neuralsort", {"tau": torch.tensor(0.5)}),
        ("neuralsort", {"hard": True}),
        ("softsort", {}),
    ],
)
def test_methods_without_a_kernel_stage_chain_the_functions(method, params):
    """A method or setting whose label ranks have no kernels chains the Functions."""
    x = seeded_rows(4, 30, torch.float64, seed=3)
    kwargs = {"p_k": [0.5, 0.5], "method": method, "m": 8, **params}
    loss, grad, one = _run(x, _target(4, 30, 2), "kernels", **kwargs)
    assert not one and bool(loss.isfinite()) and bool(grad.isfinite().all())


def test_long_selections_and_rows_chain_the_functions(monkeypatch):
    """More selected scores than the selection's kernel holds (or more classes) keep the chain."""
    x = seeded_rows(3, 40, torch.float32, seed=4)
    monkeypatch.setattr(triton_gate, "usable", usable_on_any_device)
    monkeypatch.setattr(label_select, "pays", lambda classes, m: False)
    assert topk_ce_triton.usable(x, 8)
    monkeypatch.setattr(label_select, "MAX_M", 4)
    assert not topk_ce_triton.usable(x, 8)
    monkeypatch.setattr(label_select, "MAX_M", 64)
    monkeypatch.setattr(label_select, "MAX_CLASSES", 32)
    assert not topk_ce_triton.usable(x, 8)


def test_a_second_derivative_raises():
    x = seeded_rows(2, 20, torch.float64, seed=5).requires_grad_()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_gate, "usable", usable_on_any_device)
        patch.setattr(label_select, "pays", lambda classes, m: False)
        loss = softtopk.topk_cross_entropy(x, _target(2, 20), [0.5, 0.5], m=8, reduction="none")
    assert "TopKCERowsBackward" in _nodes(loss)
    w = torch.ones_like(loss).requires_grad_()  # an upstream gradient with a graph of its own
    (grad,) = torch.autograd.grad((loss * w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


@pytest.mark.parametrize("method", ["splitter_selection", "neuralsort"])
def test_the_default_loss_takes_one_node_within_the_launch_budget(monkeypatch, method):
    """One fwd+bwd at 64 rows x 1000 classes, m = 16: the six kernels (four forward: the selection,
    the ranks, the head, the mean; two backward) and a few more ops (issue 21's budget: 96), no
    value read; fewer than the chained Functions with the reduction's ops, in one autograd node
    where they take five (the three Functions, the sum and the division)."""
    from softtopk.ops import networks_kernels, neuralsort_kernels

    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    monkeypatch.setattr(triton_gate, "usable", usable_on_any_device)
    monkeypatch.setattr(label_select, "pays", lambda classes, m: False)
    launched = count_loss_kernels(monkeypatch)
    count_kernels(monkeypatch, networks_kernels, "label_forward", "label_backward", launched=launched)
    count_kernels(monkeypatch, neuralsort_kernels, "label_forward", "backward", launched=launched)
    logits = seeded_rows(64, 1000, torch.float32, seed=6)
    target = _target(64, 1000, 2)
    loss = softtopk.TopKCrossEntropyLoss([0.2] * 5, method=method)
    counts = count_call(lambda s: loss(s, target), logits)
    assert len(launched) - 4 == 6 and counts.reads == 0  # count_call runs a warm-up forward first
    assert counts.launches + 6 <= 96, counts.ops
    nodes = _nodes(loss(logits.requires_grad_(), target))
    assert sorted(nodes) == ["AccumulateGrad", "TopKCERowsBackward"]
    monkeypatch.setattr(topk_ce_triton, "usable", lambda logits, m: False)
    chained = count_call(lambda s: loss(s, target), logits)
    assert counts.launches + 6 < chained.launches + 5, (counts.ops, chained.ops)
    assert len(_nodes(loss(logits, target))) == len(nodes) + 4


def _nodes(output: torch.Tensor) -> list[str]:
    """The names of the autograd nodes behind ``output``, each once."""
    seen, todo = {}, [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen[node] = type(node).__name__
            todo.extend(next_node for next_node, _ in node.next_functions)
    return list(seen.values())
