"""The Triton kernels of the soft rank and soft sort, l2 and kl (one forward, one backward), against
the torch path that a GPU takes without them (in Triton's interpreter without a GPU:
``triton_kernels.py``)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import softtopk
from softtopk.ops import isotonic, permutahedron, permutahedron_kernels, permutahedron_triton

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import by_value  # noqa: E402
from dispatch_counter import count_call  # noqa: E402
from triton_kernels import DEVICE, both_paths, needs_triton, route_kernels, seeded_rows  # noqa: E402

pytestmark = needs_triton

INF, NAN = float("inf"), float("nan")
KERNELS = ("project_rows", "project_grad")


@pytest.fixture(autouse=True)
def gpu_path(monkeypatch):
    """CPU rows take a GPU's path: no value read, no numba kernel, no CPU shortcut."""
    monkeypatch.setattr(isotonic, "can_inspect", lambda value: False)
    monkeypatch.setattr(permutahedron, "can_inspect", lambda value: False)


def _fn(call: str, **kwargs):
    op = softtopk.soft_rank if call == "rank" else softtopk.soft_sort
    return lambda t: op(t, **kwargs)


def _same(call: str, x: torch.Tensor, **kwargs) -> None:
    """Values and gradients of the kernels equal the torch path's, to rounding (PAV and the level
    merges sum in other orders); NaN where the torch path has NaN."""
    (v0, g0), (v1, g1) = both_paths(permutahedron_kernels, KERNELS, _fn(call, **kwargs), x)
    tol = {torch.float64: 1e-9, torch.float32: 1e-4}.get(x.dtype, 2e-2)
    scale = max(1.0, float(v0.abs().nan_to_num(0.0, 0.0, 0.0).max())) if v0.numel() else 1.0
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol * scale, equal_nan=True)
    if all(len(set(row)) == len(row) for row in x.tolist()):
        torch.testing.assert_close(g1, g0, rtol=tol, atol=tol, equal_nan=True)
    else:  # which of two tied entries takes a sorted slot is the sort's choice: sums over ties agree
        for a, b in zip(by_value(x.cpu(), g1.cpu()), by_value(x.cpu(), g0.cpu()), strict=True):
            assert a.keys() == b.keys()
            assert all(a[k] == pytest.approx(b[k], rel=tol, abs=tol, nan_ok=True) for k in a)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("call", ["rank", "sort"])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize(("rows", "n"), [(3, 1), (2, 2), (4, 37), (2, 300)])
@pytest.mark.parametrize("regularization", ["l2", "kl"])
def test_the_kernels_equal_the_torch_path(dtype, call, descending, rows, n, regularization):
    x = (seeded_rows(rows, n, torch.float64, seed=n) * 3.0).to(dtype)
    _same(call, x, strength=0.5, descending=descending, regularization=regularization)


@pytest.mark.parametrize("call", ["rank", "sort"])
@pytest.mark.parametrize("regularization", ["l2", "kl"])
def test_infinities_nan_and_ties(call, regularization):
    """``+inf`` entries share the top ranks, ``-inf`` the bottom ones, and take gradient 0; a row
    with a NaN is NaN; ties pool; an all-infinite row has no finite entry to fit."""
    x = seeded_rows(6, 20, torch.float64, seed=3)
    x[0, 4], x[0, 9], x[0, 11] = INF, INF, -INF
    x[1, 2] = NAN
    x[2, :] = torch.tensor([1.0, 2.0] * 10, dtype=torch.float64)
    x[3, :] = INF
    x[4, :10], x[4, 10:] = -INF, INF
    x[5, 5:8] = 0.25
    for strength in (1e-3, 1.0, 1e3):
        _same(call, x, strength=strength, regularization=regularization)


@pytest.mark.parametrize("call", ["rank", "sort"])
@pytest.mark.parametrize("magnitude", [1e-6, 1e6, 1e300])
@pytest.mark.parametrize("regularization", ["l2", "kl"])
def test_extreme_scales(call, magnitude, regularization):
    """Finite in, finite out: the ranks' clamped gaps keep ``θ`` finite for ``1e300`` entries."""
    x = seeded_rows(3, 50, torch.float64, seed=5) * magnitude
    _same(call, x, strength=1.0, regularization=regularization)
    value, grad = both_paths(permutahedron_kernels, KERNELS, _fn(call, regularization=regularization), x)[1]
    assert bool(grad.isfinite().all()) and bool(value.isfinite().all())


def test_ranks_sum_and_order(monkeypatch):
    """The ranks of a row sum to ``n (n + 1) / 2`` and follow the entries' order."""
    launched = route_kernels(monkeypatch, permutahedron_kernels, *KERNELS)
    x = seeded_rows(4, 64, torch.float64, seed=7)
    r = softtopk.soft_rank(x, strength=0.3)
    assert len(launched) == 1
    torch.testing.assert_close(r.sum(-1), torch.full((4,), 64 * 65 / 2, dtype=torch.float64).to(DEVICE))
    order = x.argsort(-1)
    assert bool((r.gather(-1, order).diff(dim=-1) >= -1e-12).all())


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40),
    st.sampled_from(["rank", "sort"]),
    st.sampled_from(["l2", "kl"]),
)
@example([0.0, 0.0, 433.0, -282.0, -283.0], "sort", "kl")  # the torch path's merges overflowed exp (fixed)
def test_any_row(values, call, regularization):
    _same(call, torch.tensor([values], dtype=torch.float64).to(DEVICE), strength=0.7, regularization=regularization)


def test_scope():
    """A tensor strength and rows longer than ``MAX_N`` keep the torch path; a backward that records
    its graph (a second derivative) takes the torch backward after the kernel's forward."""
    x = seeded_rows(2, 30, torch.float64, seed=1)
    with pytest.MonkeyPatch.context() as patch:
        launched = route_kernels(patch, permutahedron_kernels, *KERNELS)
        softtopk.soft_rank(x, strength=torch.full((2,), 0.5, dtype=torch.float64).to(DEVICE))
        patch.setattr(permutahedron_triton, "MAX_N", 29)
        softtopk.soft_rank(x)
        softtopk.soft_sort(x)
        assert launched == []
    for call, regularization in itertools.product(("rank", "sort"), ("l2", "kl")):
        ref, kernel = [], []
        for out, kernels in ((ref, False), (kernel, True)):
            with pytest.MonkeyPatch.context() as patch:
                launched = route_kernels(patch, permutahedron_kernels, *KERNELS) if kernels else []
                leaf = x.clone().requires_grad_()
                value = _fn(call, strength=0.5, regularization=regularization)(leaf)
                (grad,) = torch.autograd.grad((value * value).sum(), leaf, create_graph=True)
                (second,) = torch.autograd.grad(grad.sum(), leaf)
                out += [grad.detach(), second]
                # the forward, and the second pass's backward of `value` (no graph recorded); the
                # first pass records its graph, so it takes the torch backward
                assert len(launched) == (2 if kernels else 0)
        torch.testing.assert_close(kernel, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("regularization", ["l2", "kl"])
def test_a_call_launches_few_ops(regularization):
    """One fwd+bwd: the sort, the two kernels and their buffers, no value read."""
    with pytest.MonkeyPatch.context() as patch:
        launched = route_kernels(patch, permutahedron_kernels, *KERNELS)
        rank = lambda v: softtopk.soft_rank(v, strength=0.1, regularization=regularization)  # noqa: E731
        counts = count_call(rank, seeded_rows(2, 1000, torch.float32))
    assert counts.reads == 0 and len(launched) == 3  # a warm-up forward, then the counted forward and backward
    assert counts.launches + 2 <= 16, counts.ops
