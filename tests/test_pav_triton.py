"""The Triton kernels of Pool-Adjacent-Violators (the l2 and kl isotonic fits off the CPU) against
the numba kernels and the fixed-shape level merges, and the soft rank and sort on them against the
torch path (in Triton's interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from softtopk import _validation
from softtopk.ops import isotonic, isotonic_numba, pav_kernels, pav_triton, permutahedron

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from triton_kernels import DEVICE, both_paths, needs_triton, route_kernels, seeded_rows  # noqa: E402

pytestmark = needs_triton


@pytest.fixture
def kernel_launches(monkeypatch):
    """CPU rows routed to the kernel, as CUDA rows go (no CPU shortcut: the numba solver, the
    rounds of pooling), with its launches counted."""
    monkeypatch.setattr(isotonic, "can_inspect", lambda value: False)
    monkeypatch.setattr(permutahedron, "can_inspect", lambda value: False)
    return route_kernels(monkeypatch, pav_kernels, "pav_l2", "pav_kl")


def _check(y: torch.Tensor, launched: list) -> torch.Tensor:
    """The kernel's fit of rows ``y`` equals the level merges' (to rounding: they sum in another
    order) and, in float64, numba's PAV."""
    v = isotonic.isotonic_l2(y)
    assert len(launched) == 1 and v.dtype == y.dtype
    tol = 1e-12 if y.dtype == torch.float64 else 1e-6
    scale = max(1.0, float(y.abs().max())) if y.numel() else 1.0
    torch.testing.assert_close(v, isotonic.levels_l2(y), rtol=0, atol=tol * scale)
    if y.dtype == torch.float64 and isotonic_numba.available() and y.numel():
        torch.testing.assert_close(v.cpu(), isotonic_numba.pav_l2(y.cpu()), rtol=0, atol=tol * scale)
    assert bool((v[..., 1:] <= v[..., :-1]).all())  # decreasing
    return v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("rows", "n"), [(3, 1), (2, 2), (4, 17), (2, 300), (1, 700)])
def test_the_kernel_equals_the_other_solvers(kernel_launches, dtype, rows, n):
    _check(seeded_rows(rows, n, dtype, seed=n), kernel_launches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("rows", "n", "spread"), [(3, 1, 1.0), (2, 2, 1.0), (4, 17, 3.0), (2, 300, 1.0), (2, 200, 400.0)]
)
def test_the_kl_kernel_equals_the_other_solvers(kernel_launches, dtype, rows, n, spread):
    """The soft rank's log weights ``log(n..1)``; a spread of 400 takes the numba kernel's
    log-sum-exp blocks, smaller ones its linear sums (the Triton kernel always takes the former)."""
    y = seeded_rows(rows, n, dtype, seed=n) * spread
    lw = torch.arange(n, 0, -1, dtype=dtype).log().to(DEVICE).expand_as(y)
    v = isotonic.isotonic_kl(y, lw)
    assert len(kernel_launches) == 1 and v.dtype == y.dtype
    tol = (1e-12 if dtype == torch.float64 else 1e-6) * max(1.0, float(y.abs().max()))
    torch.testing.assert_close(v, isotonic.levels_kl(y, lw), rtol=0, atol=tol)
    if dtype == torch.float64 and isotonic_numba.available():
        torch.testing.assert_close(v.cpu(), isotonic_numba.pav_kl(y.cpu(), lw.cpu()), rtol=0, atol=tol)
    assert bool((v[..., 1:] <= v[..., :-1]).all())


def test_pooling_extremes(kernel_launches):
    """An increasing row pools into one block (its mean), a decreasing one keeps every point, ties
    and a constant row stay, a last point above them all pools a stack of single points read back
    one by one, and the blocks longer than a write pass's width are written whole."""
    n = 3 * pav_triton.BLOCK + 5
    up = torch.arange(n, dtype=torch.float64).to(DEVICE)
    last = torch.where(up == n - 1, float(n * n), -up)
    rows = torch.stack([up, -up, torch.zeros_like(up), (up // 7).flip(-1), up % 5, last])
    v = _check(rows, kernel_launches)
    for pooled in (0, 5):
        torch.testing.assert_close(v[pooled], torch.full_like(up, float(rows[pooled].mean())))
    assert torch.equal(v[1], -up) and torch.equal(v[2], torch.zeros_like(up)) and torch.equal(v[3], rows[3])


def test_empty_rows_and_empty_batches(kernel_launches):
    assert isotonic.isotonic_l2(torch.zeros(0, 5, dtype=torch.float64).to(DEVICE)).shape == (0, 5)
    assert kernel_launches == []  # no row: no launch
    assert isotonic.isotonic_l2(torch.zeros(3, 0, dtype=torch.float64).to(DEVICE)).shape == (3, 0)
    assert len(kernel_launches) == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), st.integers(0, 3))
def test_the_fit_is_the_projection(values, power):
    """The fit is the l2 projection onto decreasing rows: ``y - v`` sums to 0 on each block, and
    its running sums within a block are at most 0 from the block's start (the KKT conditions)."""
    with pytest.MonkeyPatch.context() as patch:
        launched = route_kernels(patch, pav_kernels, "pav_l2")
        patch.setattr(isotonic, "can_inspect", lambda value: False)
        y = torch.tensor(values, dtype=torch.float64).to(DEVICE).unsqueeze(0) * 10.0**-power
        v = _check(y, launched)[0]
    residual, tol = (y[0] - v), 1e-9 * max(1.0, float(y.abs().sum()))
    start = 0
    for end in range(1, v.shape[0] + 1):
        if end == v.shape[0] or v[end] != v[start]:
            block = residual[start:end]
            assert abs(float(block.sum())) <= tol
            assert bool((block.cumsum(0)[:-1] <= tol).all())
            start = end


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("regularization", ["l2", "kl"])
@pytest.mark.parametrize("call", ["rank", "sort"])
def test_soft_rank_and_sort_on_the_kernel_equal_the_torch_path(monkeypatch, dtype, regularization, call):
    """One launch each (their backward uses the fit's blocks, not the kernel); values and
    gradients as the level merges give them, ``±inf`` included. A tensor strength: a float one
    takes the sort's and rank's own kernels (``test_permutahedron_triton.py``)."""
    monkeypatch.setattr(isotonic, "can_inspect", lambda value: False)
    monkeypatch.setattr(permutahedron, "can_inspect", lambda value: False)
    fn = softtopk.soft_rank if call == "rank" else softtopk.soft_sort
    x = seeded_rows(3, 50, dtype, seed=4) * 3.0
    x[1, 7], x[2, 3] = float("inf"), float("-inf")
    kernel = "pav_" + regularization
    (v0, g0), (v1, g1) = both_paths(
        pav_kernels, (kernel,), lambda t: fn(t, regularization=regularization, strength=torch.tensor(0.5)), x, 1
    )
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol)
    torch.testing.assert_close(g1, g0, rtol=tol, atol=tol)


def test_soft_rank_launches_fewer_ops_on_the_kernel(kernel_launches, monkeypatch):
    """At 64 x 1000 the level merges launch 365 ops (``launches.md``); with the kernel the soft
    rank's forward and backward read no value and launch at most 110 (the general path's handling
    of ``±inf`` and NaN, which the CPU skips for rows it can read, is most of them). A tensor
    strength keeps this path (a float one takes fewer: ``test_permutahedron_triton.py``)."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)  # a GPU's: no check of the strength
    strength = torch.tensor(0.1)
    counts = count_call(lambda v: softtopk.soft_rank(v, strength=strength), seeded_rows(2, 1000, torch.float32))
    assert counts.reads == 0 and len(kernel_launches) == 2  # a warm-up forward, then the counted one
    assert counts.launches + 1 <= 110, counts.ops
