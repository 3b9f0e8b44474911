"""The Triton kernels of top-k cross-entropy's head against the torch path, values and gradients
(in Triton's interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import ce_head_kernels, ce_head_triton

sys.path.insert(0, str(Path(__file__).parent))
from extended_rows import LOSS_ROWS, LOSS_TARGETS  # noqa: E402
from triton_kernels import DEVICE, both_paths, needs_triton, route_kernels, seeded_rows  # noqa: E402

pytestmark = needs_triton

KERNELS = ("head_forward", "head_backward")


def _close(x, target, tol: float, **kwargs) -> None:
    """Loss and gradient of ``topk_cross_entropy(x, target, **kwargs)`` on the head's kernels equal
    the torch path's, NaN and ``inf`` where it has them."""

    def loss(s):
        return softtopk.topk_cross_entropy(s, target, **kwargs)

    (v0, g0), (v1, g1) = both_paths(ce_head_kernels, KERNELS, loss, x)
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol, equal_nan=True)


def _target(rows: int, classes: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("method", ["softsort", "splitter_selection"])
def test_the_kernels_equal_the_torch_path(dtype, top1_mode, method):
    x = seeded_rows(6, 40, dtype, seed=1) * 3
    target = _target(6, 40)
    target[2] = -100  # an ignored row: loss and gradient 0
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    for reduction in ("none", "mean"):
        _close(x, target, tol, p_k=[0.4, 0.3, 0.3], method=method, top1_mode=top1_mode, m=8, reduction=reduction)


def test_weights_and_every_class_relaxed():
    """``weight`` and ``m=None`` (every class, here 12: a program's rows of 16 columns)."""
    x = seeded_rows(5, 12, torch.float64, seed=2)
    weight = torch.linspace(0.5, 2.0, 12, dtype=torch.float64).to(DEVICE)
    _close(x, _target(5, 12, 1), 1e-12, p_k=[0.5, 0.5], method="softsort", m=None, weight=weight)


def test_infinities_and_nan():
    """The label at ``-inf`` gives ``inf`` (gradient 0), ``+inf`` entries their stand-in, a NaN row
    NaN; the rows of an ignored target 0 whatever they hold."""
    x = torch.tensor(LOSS_ROWS, dtype=torch.float64).to(DEVICE)
    target = torch.tensor(LOSS_TARGETS).to(DEVICE)
    for top1_mode in ("sm", "smce"):
        _close(x, target, 1e-12, p_k=[0.5, 0.5], method="softsort", m=4, top1_mode=top1_mode, reduction="none")


def test_rows_of_any_layout(monkeypatch):
    """Non-contiguous ranks (a method's torch path may return a view) give the contiguous
    rows' loss and gradients."""
    launched = route_kernels(monkeypatch, ce_head_kernels, *KERNELS)
    gen = torch.Generator().manual_seed(6)
    scores = torch.randn(5, 8, generator=gen, dtype=torch.float64).to(DEVICE)
    ranks = torch.rand(3, 5, generator=gen, dtype=torch.float64).to(DEVICE).t()  # (5, 3), transposed
    position = torch.tensor([0, 7, 3, 3, 5]).to(DEVICE)
    masked = torch.tensor([False, False, True, False, False]).to(DEVICE)
    kept = torch.tensor([True, True, True, False, True]).to(DEVICE)
    results = []
    for layout in (lambda t: t, torch.Tensor.contiguous):
        leaves = [scores.clone().requires_grad_(), layout(ranks.clone()).requires_grad_()]
        loss = ce_head_triton.head(*leaves, position, masked, kept, (1.0, 0.5, 0.25), 0.5, "sm")
        loss.sum().backward()
        results.append((loss.detach(), leaves[0].grad, leaves[1].grad))
    assert not ranks.is_contiguous() and len(launched) == 4
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_long_selections_keep_the_torch_path(monkeypatch):
    monkeypatch.setattr(ce_head_triton, "MAX_M", 8)
    launched = route_kernels(monkeypatch, ce_head_kernels, *KERNELS)
    x = seeded_rows(2, 12, torch.float32, seed=3).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 12 classes: no warning for m=None
        softtopk.topk_cross_entropy(x, _target(2, 12), [0.5, 0.5], method="softsort", m=None).backward()
    assert launched == []


def test_a_second_derivative_raises(monkeypatch):
    route_kernels(monkeypatch, ce_head_kernels, *KERNELS)
    x = seeded_rows(2, 20, torch.float64, seed=4).requires_grad_()
    loss = softtopk.topk_cross_entropy(x, _target(2, 20), [0.5, 0.5], method="softsort", m=8, reduction="none")
    w = torch.ones_like(loss).requires_grad_()  # an upstream gradient with a graph of its own
    (grad,) = torch.autograd.grad((loss * w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()
