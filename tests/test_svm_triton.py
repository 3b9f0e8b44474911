"""The Triton kernels of the smooth top-k SVM's rows against the torch path, values and gradients
(in Triton's interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation
from softtopk.ops import svm_kernels

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from triton_kernels import DEVICE, both_paths, needs_triton, route_kernels  # noqa: E402

pytestmark = needs_triton

INF, NAN = float("inf"), float("nan")
KERNELS = ("forward", "backward")


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts their launches."""
    return route_kernels(monkeypatch, svm_kernels, *KERNELS)


def _loss(k, tau=1.0, alpha=1.0):
    return lambda target: lambda s: softtopk.smooth_topk_svm(s, target, k=k, tau=tau, alpha=alpha, reduction="none")


def _both(x, target, loss):
    """(loss, grad) of the torch path and of the kernels."""
    return both_paths(svm_kernels, KERNELS, loss(target), x)


def _close(x, target, loss):
    """In float64 both paths give the exact loss to rounding (the kernels add in another order); in
    float32 the kernels round a float64 result once, so they are compared with the torch path in
    float64 on the same inputs, within float32's rounding (the torch path's own float32 error is
    larger)."""
    (v0, g0), (v1, g1) = _both(x, target, loss)
    if x.dtype != torch.float64:
        (v0, g0), _ = _both(x.double(), target, loss)
        v0, g0 = v0.to(x.dtype), g0.to(x.dtype)
    tol = 1e-12 if x.dtype == torch.float64 else 4e-7
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol, equal_nan=True)
    scale = max(1.0, float(g0.nan_to_num().abs().max()))
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol * scale, equal_nan=True)
    return v1, g1


def _rows(rows, n, dtype, seed=0):
    return torch.randn(rows, n, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(DEVICE)


def _labels(rows, n, seed=0):
    return torch.randint(0, n, (rows,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("rows", "n", "k", "tau", "alpha"),
    [
        (5, 12, 5, 1.0, 1.0),
        (3, 7, 6, 0.3, 0.0),
        (4, 9, 8, 2.0, 1.0),
        (2, 100, 3, 0.1, 1.0),
        (2, 1000, 5, 1.0, 1.0),
        (4, 2, 1, 1.0, 1.0),
        (1, 4096, 2, 1.0, 0.5),
    ],
)
def test_the_kernels_equal_the_torch_path(dtype, rows, n, k, tau, alpha):
    loss, grad = _close(_rows(rows, n, dtype, seed=n + k), _labels(rows, n, seed=k), _loss(k, tau, alpha))
    assert bool((loss > 0).all())
    torch.testing.assert_close(grad.sum(-1), torch.zeros_like(loss), rtol=0, atol=1e-5)  # shift invariance


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("tau", [1e-3, 1.0, 1e3])
def test_scales_and_temperatures(dtype, scale, tau):
    x = _rows(3, 40, dtype, seed=2) * scale
    loss, grad = _close(x, _labels(3, 40, seed=1), _loss(5, tau * scale, 1.0))
    assert bool(loss.isfinite().all()) and bool(grad.isfinite().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(dtype):
    """Ties; ``+inf`` scores as the limits of large ones (fewer than ``k`` of them: a finite loss;
    ``k``: ``inf`` unless the label is there too, then the tied limit, finite, with gradient 0); a
    label at ``-inf`` (``inf``); fewer than ``k`` other classes above ``-inf`` (0); the dtype's
    largest values; a NaN row."""
    big = torch.finfo(dtype).max
    x = torch.tensor(
        [
            [0.0, 1.0, 2.0, 3.0, INF, -INF, 0.5, 0.5],
            [INF, INF, INF, 0.0, 1.0, 2.0, -1.0, 0.0],
            [INF, 1.0, INF, 0.0, 0.0, 0.0, 0.0, 0.0],
            [1.0, -INF, -INF, -INF, -INF, -INF, -INF, 2.0],
            [0.0] * 8,
            [big, -big, big, 0.0, 1.0, -1.0, big, 3.0],
            [1.0, NAN, 0.5, 0.2, -1.0, 2.0, 0.0, 0.0],
            [-INF, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
            [INF, INF, INF, 0.0, 1.0, 2.0, -1.0, 0.0],  # the label at +inf with k others: the tied limit
            [INF] * 8,
        ],
        dtype=dtype,
    ).to(DEVICE)
    target = torch.tensor([5, 4, 0, 0, 3, 1, 0, 0, 0, 3]).to(DEVICE)
    loss, grad = _close(x, target, _loss(2))
    assert loss[1] == INF and loss[7] == INF and loss[3] == 0 and bool(loss[6].isnan())
    assert bool(loss[8:].isfinite().all()) and bool((grad[8:] == 0).all())
    assert bool(grad[[0, 1, 2, 3, 4, 5, 7]].isfinite().all()) and bool(grad[6].isnan().all())
    assert grad[0, 4] == 0 and bool((grad[1] == 0).all())  # +inf scores have gradient 0


def test_a_second_derivative_raises(kernel_launches):
    x = _rows(2, 16, torch.float64).requires_grad_()
    loss = softtopk.smooth_topk_svm(x, _labels(2, 16), k=3, reduction="none")
    w = torch.randn(2, dtype=torch.float64).to(DEVICE).requires_grad_()
    (grad,) = torch.autograd.grad((loss * w).sum(), x, create_graph=True)
    assert len(kernel_launches) == 2
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_the_loss_runs_the_kernels_within_the_launch_budget(kernel_launches, monkeypatch):
    """``SmoothTopKSVM(k=5)`` at 1000 classes: the class-loss reduction and the two kernels (issue
    21's budget at 64 rows x 1000 classes: 32; this call launches the same ops at any row count,
    and the interpreter runs each row's program in turn); the same loss and gradient."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    logits, target = _rows(2, 1000, torch.float32, seed=3), _labels(2, 1000, seed=3)
    loss = softtopk.SmoothTopKSVM(k=5)
    counts = count_call(lambda s: loss(s, target), logits)
    kernels = len(kernel_launches) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0
    assert counts.launches + kernels <= 32, counts.ops


@pytest.mark.parametrize(
    ("n", "k", "call"),
    [
        (5000, 5, lambda s, t: softtopk.smooth_topk_svm(s, t, k=5)),
        (50, 9, lambda s, t: softtopk.smooth_topk_svm(s, t, k=9)),
        (50, 1, softtopk.smooth_top1_svm),
        (50, 5, lambda s, t: softtopk.topk_svm(s, t, k=5)),
    ],
    ids=["5000 classes", "k = 9", "top-1 loss", "hard loss"],
)
def test_the_torch_path_stays_outside_the_kernels_scope(kernel_launches, n, k, call):
    call(torch.randn(4, n).to(DEVICE), torch.zeros(4, dtype=torch.long).to(DEVICE))
    assert kernel_launches == []


def test_vmap_keeps_the_torch_path(kernel_launches):
    logits, target = _rows(3, 4, torch.float64).unsqueeze(-1).expand(3, 4, 12).contiguous(), _labels(3, 4)
    torch.func.vmap(lambda s: softtopk.smooth_topk_svm(s, target, k=2), in_dims=2)(logits)
    assert kernel_launches == []
