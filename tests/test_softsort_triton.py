"""The Triton kernels of the SoftSort mask against the torch path, values and gradients (in Triton's
interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import softsort_kernels, softsort_triton

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from extended_rows import PERMUTATION_ROWS  # noqa: E402
from triton_kernels import (  # noqa: E402
    DEVICE,
    LAYOUTS,
    count_kernels,
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
KERNELS = ("mask_forward", "mask_backward")
TILED = ("rank_parts", "mask_entries", "grad_entries")


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts their launches."""
    return route_kernels(monkeypatch, softsort_kernels, *KERNELS)


@pytest.fixture(params=LAYOUTS)
def layout(request, monkeypatch):
    """Each test on the row kernels and on the tiled ones."""
    return kernel_layout(request, monkeypatch, softsort_triton, KERNELS, TILED)


def _close(x, k, layout, tau=1.0):
    """The kernels sum the softmaxes and the gradient's terms in another order than the torch path:
    float64 to rounding of the row's sums, float32 to a few of its ulps."""
    tol = (1e-12 if x.dtype == torch.float64 else 2e-6) * k
    return mask_close(softsort_kernels, layout[0], "softsort", x, k, tau, tol, layout[1])


_rows = seeded_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("rows", "n", "k", "tau"),
    # 40 ranks: three blocks of 16; 3000 entries: several tiles; k = 1 and n = 2: the smallest
    [(5, 16, 5, 1.0), (3, 7, 6, 10.0), (2, 100, 10, 0.1), (2, 300, 40, 0.5), (1, 3000, 3, 1.0), (3, 2, 1, 1.0)],
)
def test_the_kernels_equal_the_torch_path(layout, dtype, rows, n, k, tau):
    mask, _ = _close(_rows(rows, n, dtype, seed=n + k), k, layout, tau)
    assert bool((mask >= 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("tau", [1e-4, 1.0, 1e4])
def test_scales_and_temperatures(layout, dtype, scale, tau):
    mask, grad = _close(_rows(3, 40, dtype, seed=2) * scale, 4, layout, tau * scale)
    assert bool(mask.isfinite().all()) and bool(grad.isfinite().all())


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # ±max - ∓max: inf, as in the torch path
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(layout, dtype):
    """Ties; ``+inf`` entries share the first ranks; a row with at most k entries above ``-inf``
    selects them with gradient 0; all-tied and all ``-inf`` rows."""
    x = torch.tensor(PERMUTATION_ROWS, dtype=dtype).to(DEVICE)
    mask, grad = _close(x, 3, layout)
    assert bool(mask.isfinite().all()) and bool(grad.isfinite().all())
    torch.testing.assert_close(mask[1, 6:], torch.ones(2, dtype=dtype).to(DEVICE))
    assert bool((grad[1] == 0).all())


def test_nan_makes_its_row_nan(layout):
    nan_row_stays_nan(lambda x, k: _close(x, k, layout))


def test_a_second_derivative_raises(kernel_launches):
    second_derivative_raises("softsort", kernel_launches)


def test_the_mask_runs_the_kernels_within_the_launch_budget(kernel_launches):
    mask_launches("softsort", kernel_launches, budget=24)  # issue 21's budget for SoftSort


@pytest.mark.parametrize(
    "call",
    [
        lambda x: softtopk.soft_topk(x, 5, method="softsort", tau=torch.full((4,), 0.5).to(DEVICE)),
        lambda x: softtopk.soft_topk(x, 5, method="softsort", power=2.0),
        lambda x: softtopk.soft_topk_ranks(x, 5, method="softsort"),
        lambda x: torch.func.vmap(lambda row: softtopk.soft_topk(row, 5, method="softsort"))(x),
    ],
    ids=["tensor tau", "power 2", "ranks", "vmap"],
)
def test_the_torch_path_stays_outside_the_kernels_scope(kernel_launches, call):
    call(_rows(4, 50, torch.float32))
    assert kernel_launches == []


def test_rows_of_much_work_take_the_tiled_kernels(monkeypatch):
    """``n k`` above ``ROW_WORK`` (long rows, or many ranks) takes the tiled kernels; at most it,
    one program per row."""
    by_row = route_kernels(monkeypatch, softsort_kernels, *KERNELS)
    tiled = count_kernels(monkeypatch, softsort_kernels, *TILED)
    monkeypatch.setattr(softsort_triton, "ROW_WORK", 1000)
    x = _rows(2, 100, torch.float32).requires_grad_()
    softtopk.soft_topk(x, 10, method="softsort").sum().backward()  # n k = 1000
    assert (len(by_row), len(tiled)) == (2, 0)
    softtopk.soft_topk(x, 11, method="softsort").sum().backward()  # 1100
    assert (len(by_row), len(tiled)) == (2, 4)


def test_the_tiled_kernels_stay_within_the_launch_budget(monkeypatch):
    """At 1000 entries and k = 10 with the tiled kernels forced: no value read, and the aten ops
    and the four kernels within issue 21's budget for SoftSort."""
    tiled = route_kernels(monkeypatch, softsort_kernels, *TILED)
    monkeypatch.setattr(softsort_triton, "ROW_WORK", 0)
    x = _rows(2, 1000, torch.float32)
    counts = count_call(lambda v: softtopk.soft_topk(v, 10, method="softsort"), x)
    assert len(tiled) == 6 and counts.reads == 0  # a warm-up forward (2), then forward and backward
    assert counts.launches + 4 <= 24, counts.ops
