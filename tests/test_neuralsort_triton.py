"""The Triton kernels of the NeuralSort mask and of the label's ranks (top-k cross-entropy's
NeuralSort) against the torch path, values and gradients (in Triton's interpreter without a GPU:
``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation
from softtopk.ops import neuralsort, neuralsort_kernels

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from extended_rows import PERMUTATION_ROWS  # noqa: E402
from triton_kernels import (  # noqa: E402
    DEVICE,
    both_paths,
    mask_close,
    mask_launches,
    nan_row_stays_nan,
    needs_triton,
    route_kernels,
    second_derivative_raises,
    seeded_rows,
)

pytestmark = needs_triton

INF = float("inf")
KERNELS = ("mask_forward", "label_forward", "backward")


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts their launches."""
    return route_kernels(monkeypatch, neuralsort_kernels, *KERNELS)


def _close(x, k, tau=1.0):
    """Both compute in float64 (the kernels' prefix sums add in another order: relative 1e-16 of
    the row's sums, which the logits' cancellation turns into about 1e-12 of the mask)."""
    tol = 1e-10 if x.dtype == torch.float64 else 2e-6
    return mask_close(neuralsort_kernels, KERNELS, "neuralsort", x, k, tau, tol)


_rows = seeded_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("rows", "n", "k", "tau"),
    [(5, 16, 5, 1.0), (3, 7, 6, 10.0), (2, 100, 10, 0.1), (2, 1000, 10, 1.0), (1, 2048, 3, 1.0), (3, 2, 1, 1.0)],
)
def test_the_kernels_equal_the_torch_path(dtype, rows, n, k, tau):
    mask, _ = _close(_rows(rows, n, dtype, seed=n + k), k, tau)
    torch.testing.assert_close(mask.sum(-1), torch.full_like(mask[:, 0], float(k)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("tau", [1e-4, 1.0, 1e4])
def test_scales_and_temperatures(dtype, scale, tau):
    x = _rows(3, 40, dtype, seed=2) * scale
    mask, grad = _close(x, 4, tau * scale)
    assert bool(mask.isfinite().all()) and bool(grad.isfinite().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(dtype):
    """Ties; ``±inf`` as ``M`` and ``-M/2``; a row with at most k entries above ``-inf`` selects
    them with gradient 0; ``+inf`` entries share the first ranks; all-tied rows."""
    x = torch.tensor(PERMUTATION_ROWS, dtype=dtype).to(DEVICE)
    mask, grad = _close(x, 3)
    assert bool(mask.isfinite().all()) and bool(grad.isfinite().all())
    assert bool((grad[x.isinf()] == 0).all())
    torch.testing.assert_close(mask[1, 6:], torch.ones(2, dtype=dtype).to(DEVICE))


def test_nan_makes_its_row_nan():
    nan_row_stays_nan(_close)


def test_a_second_derivative_raises(kernel_launches):
    second_derivative_raises("neuralsort", kernel_launches)


def test_the_mask_runs_the_kernels_within_the_launch_budget(kernel_launches):
    mask_launches("neuralsort", kernel_launches, budget=24)  # issue 21's budget for NeuralSort


@pytest.mark.parametrize(("n", "tau"), [(3000, 1.0), (50, torch.full((4,), 0.5))], ids=["3000 entries", "tensor tau"])
def test_the_torch_path_stays_outside_the_kernels_scope(kernel_launches, n, tau):
    tau = tau.to(DEVICE) if isinstance(tau, torch.Tensor) else tau
    softtopk.soft_topk(torch.randn(4, n).to(DEVICE), 5, method="neuralsort", tau=tau)
    softtopk.soft_topk_ranks(torch.randn(4, 50).to(DEVICE), 5, method="neuralsort")
    assert kernel_launches == []


def test_vmap_keeps_the_torch_path(kernel_launches):
    torch.func.vmap(lambda row: softtopk.soft_topk(row, 5, method="neuralsort"))(_rows(4, 16, torch.float32))
    assert kernel_launches == []


def _label_close(x, position, k, tau):
    (r0, g0), (r1, g1) = both_paths(
        neuralsort_kernels, KERNELS, lambda v: neuralsort.neuralsort_label_ranks(v, position, k, tau=tau), x
    )
    tol = 1e-10 if x.dtype == torch.float64 else 2e-6
    torch.testing.assert_close(r1, r0, rtol=0, atol=tol)
    torch.testing.assert_close(g1, g0, rtol=0, atol=tol * max(1.0, float(g0.abs().max())))
    return r1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("rows", "n", "k", "tau"), [(6, 16, 5, 1.0), (3, 7, 6, 10.0), (2, 100, 10, 0.1)])
def test_the_label_kernels_equal_the_torch_path(dtype, rows, n, k, tau):
    """Top-k CE feeds its m selected scores sorted; any order works (the kernels sort)."""
    x = _rows(rows, n, dtype, seed=n)
    position = torch.randint(0, n, (rows,), generator=torch.Generator().manual_seed(n)).to(DEVICE)
    ranks = _label_close(x.sort(-1).values, position, k, tau)
    assert bool((ranks >= 0).all()) and bool((ranks <= 1).all())  # an item's ranks may sum past 1
    _label_close(x, position, k, tau)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_label_kernels_with_ties_and_infinities(dtype):
    x = torch.tensor(
        [[-INF, -1.0, 0.0, 0.0, 2.0, INF, 3.0, 3.0], [0.0] * 8, [INF, INF, 1.0, 2.0, -INF, 0.0, 0.0, 5.0]],
        dtype=dtype,
    ).to(DEVICE)
    _label_close(x, torch.tensor([2, 5, 0]).to(DEVICE), 3, 1.0)


def test_topk_cross_entropy_neuralsort_runs_the_label_kernels(kernel_launches, monkeypatch):
    """One fwd+bwd at 64 rows x 1000 classes, m = 16: the selection, the head, the reduction and
    the two kernels (85 launches on the torch path, ``launches.md``); the same loss and gradient."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    logits = _rows(64, 1000, torch.float32, seed=1)
    target = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    loss = softtopk.TopKCrossEntropyLoss([0.2] * 5, method="neuralsort")
    counts = count_call(lambda s: loss(s, target), logits)
    assert len(kernel_launches) - 1 == 2 and counts.reads == 0
    assert counts.launches + 2 <= 60, counts.ops
    (v0, g0), (v1, g1) = both_paths(neuralsort_kernels, KERNELS, lambda s: loss(s, target), logits)
    torch.testing.assert_close(v1, v0, rtol=1e-6, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=1e-7)


def test_hard_label_ranks_take_the_straight_through_ranks(kernel_launches):
    """``hard=True`` needs every row of the ranks (straight-through): the torch path."""
    logits, target = _rows(4, 50, torch.float32), torch.tensor([0, 5, 9, 49]).to(DEVICE)
    softtopk.TopKCrossEntropyLoss([0.5, 0.5], method="neuralsort", hard=True)(logits, target)
    assert kernel_launches == []
