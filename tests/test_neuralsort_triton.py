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
from softtopk.ops import neuralsort, neuralsort_kernels, neuralsort_triton

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from extended_rows import PERMUTATION_ROWS  # noqa: E402
from triton_kernels import (  # noqa: E402
    DEVICE,
    LAYOUTS,
    both_paths,
    count_kernels,
    count_loss_kernels,
    kernel_layout,
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
TILED = ("rank_parts", "entry_sums")


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts their launches."""
    return route_kernels(monkeypatch, neuralsort_kernels, *KERNELS)


@pytest.fixture(params=LAYOUTS)
def layout(request, monkeypatch):
    """Each test on the row kernels and on the tiled ones."""
    return kernel_layout(request, monkeypatch, neuralsort_triton, KERNELS, TILED)


def _close(x, k, layout=(KERNELS, 2), tau=1.0):
    """Both compute in float64 (the kernels' prefix sums add in another order: relative 1e-16 of
    the row's sums, which the logits' cancellation turns into about 1e-12 of the mask)."""
    tol = 1e-10 if x.dtype == torch.float64 else 2e-6
    return mask_close(neuralsort_kernels, layout[0], "neuralsort", x, k, tau, tol, layout[1])


_rows = seeded_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("rows", "n", "k", "tau"),
    [(5, 16, 5, 1.0), (3, 7, 6, 10.0), (2, 100, 10, 0.1), (2, 1000, 10, 1.0), (1, 2048, 3, 1.0), (3, 2, 1, 1.0)],
)
def test_the_kernels_equal_the_torch_path(layout, dtype, rows, n, k, tau):
    mask, _ = _close(_rows(rows, n, dtype, seed=n + k), k, layout, tau)
    torch.testing.assert_close(mask.sum(-1), torch.full_like(mask[:, 0], float(k)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("tau", [1e-4, 1.0, 1e4])
def test_scales_and_temperatures(layout, dtype, scale, tau):
    x = _rows(3, 40, dtype, seed=2) * scale
    mask, grad = _close(x, 4, layout, tau * scale)
    assert bool(mask.isfinite().all()) and bool(grad.isfinite().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(layout, dtype):
    """Ties; ``±inf`` as ``M`` and ``-M/2``; a row with at most k entries above ``-inf`` selects
    them with gradient 0; ``+inf`` entries share the first ranks; all-tied rows."""
    x = torch.tensor(PERMUTATION_ROWS, dtype=dtype).to(DEVICE)
    mask, grad = _close(x, 3, layout)
    assert bool(mask.isfinite().all()) and bool(grad.isfinite().all())
    assert bool((grad[x.isinf()] == 0).all())
    torch.testing.assert_close(mask[1, 6:], torch.ones(2, dtype=dtype).to(DEVICE))


def test_nan_makes_its_row_nan(layout):
    nan_row_stays_nan(lambda x, k: _close(x, k, layout))


def test_a_second_derivative_raises(kernel_launches):
    second_derivative_raises("neuralsort", kernel_launches)


def test_the_mask_runs_the_kernels_within_the_launch_budget(kernel_launches):
    mask_launches("neuralsort", kernel_launches, budget=24)  # issue 21's budget for NeuralSort


def test_the_torch_path_stays_outside_the_kernels_scope(kernel_launches):
    tiled = count_kernels(pytest.MonkeyPatch(), neuralsort_kernels, *TILED)
    softtopk.soft_topk(torch.randn(4, 50).to(DEVICE), 5, method="neuralsort", tau=torch.full((4,), 0.5).to(DEVICE))
    softtopk.soft_topk_ranks(torch.randn(4, 50).to(DEVICE), 5, method="neuralsort")
    position = torch.zeros(2, dtype=torch.long).to(DEVICE)  # the label's ranks of rows too long for one program
    neuralsort.neuralsort_label_ranks(
        torch.randn(2, neuralsort_triton.MAX_ENTRIES + 1).to(DEVICE), position, 3, tau=1.0
    )
    assert kernel_launches == [] and tiled == []


def test_long_rows_and_many_ranks_take_the_tiled_kernels(kernel_launches, monkeypatch):
    """Rows longer than one program holds, or ``n k`` above ``ROW_WORK``: the tiled kernels."""
    tiled = count_kernels(monkeypatch, neuralsort_kernels, *TILED)
    monkeypatch.setattr(neuralsort_triton, "MAX_ENTRIES", 64)
    monkeypatch.setattr(neuralsort_triton, "ROW_WORK", 1000)
    x = _rows(2, 64, torch.float32).requires_grad_()
    softtopk.soft_topk(x, 15, method="neuralsort").sum().backward()  # n k = 960: one program per row
    assert (len(kernel_launches), len(tiled)) == (2, 0)
    softtopk.soft_topk(x, 16, method="neuralsort").sum().backward()  # 1024
    softtopk.soft_topk(_rows(2, 65, torch.float32), 2, method="neuralsort")  # 65 entries
    assert (len(kernel_launches), len(tiled)) == (2, 6)


def test_the_tiled_kernels_read_no_value_and_launch_few_ops(monkeypatch):
    """At 1000 entries and k = 10 with the tiled kernels forced: no value read, and at most 36
    launches (issue 21's budget of 24 at this shape holds for the row kernels, which take it; the
    tiled ones add the torch ops of the logits' pieces and of the scores' gradient)."""
    tiled = route_kernels(monkeypatch, neuralsort_kernels, *TILED)
    monkeypatch.setattr(neuralsort_triton, "ROW_WORK", 0)
    counts = count_call(lambda v: softtopk.soft_topk(v, 10, method="neuralsort"), _rows(2, 1000, torch.float32))
    assert len(tiled) == 6 and counts.reads == 0  # a warm-up forward (2), then forward and backward
    assert counts.launches + 4 <= 36, counts.ops


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
    own = count_loss_kernels(monkeypatch)  # the selection's, the head's and the mean's kernels
    counts = count_call(lambda s: loss(s, target), logits)
    assert len(kernel_launches) - 1 == 2 and len(own) - 3 == 4 and counts.reads == 0
    assert counts.launches + 2 + 4 <= 32, counts.ops
    (v0, g0), (v1, g1) = both_paths(neuralsort_kernels, KERNELS, lambda s: loss(s, target), logits)
    torch.testing.assert_close(v1, v0, rtol=1e-6, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=1e-7)


def test_hard_label_ranks_take_the_straight_through_ranks(kernel_launches):
    """``hard=True`` needs every row of the ranks (straight-through): the torch path."""
    logits, target = _rows(4, 50, torch.float32), torch.tensor([0, 5, 9, 49]).to(DEVICE)
    softtopk.TopKCrossEntropyLoss([0.5, 0.5], method="neuralsort", hard=True)(logits, target)
    assert kernel_launches == []
