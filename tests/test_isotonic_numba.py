"""The optional numba kernels of the isotonic solver (softtopk.ops.isotonic_numba): PAV against the
NumPy oracles (ties, one-point rows, scales 1e-6 to 1e6), the radix sort against torch.sort, the
runs' sums against a scatter-add,
the lazy import, and the fallback to the torch solver where numba is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import permutahedron_reference as R
import softtopk
from softtopk.ops import isotonic, isotonic_numba

needs_numba = pytest.mark.skipif(
    not isotonic_numba.available(), reason="numba is not installed, so there are no kernels to test (pip install numba)"
)
rows = st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40)


@needs_numba
@settings(max_examples=80, deadline=None)
@given(rows, st.sampled_from([1e-6, 1.0, 1e6]), st.booleans())
def test_pav_matches_the_oracles(row, scale, tied):
    y = np.array(row) * scale
    if tied:
        y = np.round(y / scale) * scale  # many equal values
    lw = np.random.default_rng(len(row)).normal(size=len(row))
    got = isotonic_numba.pav_l2(torch.tensor(y)[None])[0].numpy()
    np.testing.assert_allclose(got, R.isotonic_l2(y), rtol=1e-12, atol=1e-12 * np.abs(y).max())
    np.testing.assert_allclose(got, R.isotonic_l2_minmax(y), rtol=1e-12, atol=1e-12 * np.abs(y).max())
    got = isotonic_numba.pav_kl(torch.tensor(y / scale)[None], torch.tensor(lw)[None])[0].numpy()
    np.testing.assert_allclose(got, R.isotonic_kl(y / scale, lw), rtol=1e-12, atol=1e-9)


@needs_numba
def test_pav_matches_the_fixed_shape_solver_on_batches():
    g = torch.Generator().manual_seed(0)
    n = 1000  # soft-rank rows: long cascades
    y = torch.randn(8, n, dtype=torch.float64, generator=g).sort(-1, descending=True).values - torch.arange(n, 0, -1)
    lw = torch.arange(n, 0, -1, dtype=torch.float64).log().expand(8, n)  # an expanded (strided) argument
    torch.testing.assert_close(isotonic_numba.pav_l2(y), isotonic.levels_l2(y), rtol=1e-12, atol=1e-9)
    for scale in (1.0, 0.01):  # kl: rows spanning more than 600 (log-sum-exps), less (linear sums)
        want = isotonic.levels_kl(y * scale, lw)
        torch.testing.assert_close(isotonic_numba.pav_kl(y * scale, lw), want, rtol=1e-12, atol=1e-9)
    assert isotonic_numba.pav_l2(y[:, :0]).shape == (8, 0)


@needs_numba
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_radix_sorted_rows_are_torch_sort(dtype, sign, n):
    """``sorted_rows`` is ``(sign * x).sort(descending=True, stable=True)`` (values in float64):
    ties (``-0`` with ``+0`` too) in their order in the row, ``±inf`` at the ends, NaN first."""
    x = torch.randn(8, n, dtype=dtype, generator=torch.Generator().manual_seed(n)).round(decimals=1)
    if n >= 10:
        x[0, :5], x[0, 5:10] = 0.0, -0.0
        x[1, :3], x[1, 3:6] = float("inf"), -float("inf")
        x[2, :4], x[3, 2] = float("nan"), -float("nan")
        x[4] = torch.finfo(dtype).tiny * torch.randn(n, dtype=dtype)  # subnormals and tiny normals
        x[5] = torch.finfo(dtype).max * torch.rand(n, dtype=dtype).sub(0.5)
    s, perm = isotonic_numba.sorted_rows(x, sign)
    want, want_perm = (x * sign).sort(dim=-1, descending=True, stable=True)
    assert s.dtype == torch.float64 and torch.equal(s.isnan(), want.isnan())
    assert torch.equal(s.nan_to_num(0.5), want.double().nan_to_num(0.5))
    assert torch.equal(perm, want_perm)


@needs_numba
@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=50), st.sampled_from([1.0, -1.0]))
def test_radix_sorted_rows_order_any_floats(row, sign):
    x = torch.tensor([row], dtype=torch.float32)
    s, perm = isotonic_numba.sorted_rows(x, sign)
    want, want_perm = (x * sign).sort(dim=-1, descending=True, stable=True)
    assert torch.equal(s, want.double()) and torch.equal(perm, want_perm)


@needs_numba
def test_run_sums_match_a_scatter_add():
    g = torch.Generator().manual_seed(1)
    ids = (torch.rand(5, 60, generator=g) < 0.4).long().cumsum(-1)  # runs of equal ids, some of one point
    values = torch.randn(5, 60, dtype=torch.float64, generator=g)
    want = torch.zeros_like(values).scatter_add(-1, ids, values).gather(-1, ids)
    torch.testing.assert_close(isotonic_numba.run_sums(values, ids), want, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(isotonic.block_sum(values, ids), want, rtol=1e-14, atol=1e-14)


def test_numba_is_imported_at_the_first_cpu_call_unless_switched_off():
    """The first CPU call that has numba kernels (the default mask, ``ops.lapsum_numba``, or a soft
    sort) imports numba; importing softtopk does not."""
    code = (
        "import sys, torch, softtopk; from softtopk.ops import isotonic_numba as N;"
        "print('numba' in sys.modules); softtopk.soft_topk(torch.randn(3, 5), 2); print('numba' in sys.modules);"
        "softtopk.soft_rank(torch.randn(3, 5)); print('numba' in sys.modules, N.available())"
    )
    for setting, used in ((None, isotonic_numba.available()), ("0", False)):
        env = {k: v for k, v in os.environ.items() if k != "SOFTTOPK_NUMBA"} | (
            {} if setting is None else {"SOFTTOPK_NUMBA": setting}
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        assert done.stdout.split() == ["False", str(used), str(used), str(used)]


@pytest.mark.parametrize(
    "error",
    [
        ImportError("Numba needs NumPy 2.3 or less"),
        RuntimeError("cannot cache function 'pav_l2': no locator available"),
    ],
)
def test_without_a_working_numba_the_torch_solver_runs(monkeypatch, error):
    x = torch.randn(4, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    want = softtopk.soft_rank(x, strength=0.1)
    want_grad = torch.autograd.grad(want.square().sum(), x)[0]

    def broken():
        raise error

    monkeypatch.setattr(isotonic_numba, "_load", broken)
    monkeypatch.setattr(isotonic_numba.importlib.util, "find_spec", lambda name: object())  # "installed"
    isotonic_numba._kernels.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match=f"numba is installed but its kernels could not be loaded.*{error}"):
            assert not isotonic_numba.available()
        got = softtopk.soft_rank(x, strength=0.1)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.autograd.grad(got.square().sum(), x)[0], want_grad, rtol=1e-10, atol=1e-10)
    finally:
        monkeypatch.undo()
        isotonic_numba._kernels.cache_clear()


@pytest.mark.parametrize("name", ["soft_rank", "soft_sort"])
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_batched_backward_reads_no_values(name, reg):
    """``jacobian(vectorize=True)`` runs the backward under autograd's own vmap, whose batched
    gradients have no values to hand to a kernel: the block sums take the tensor path there."""
    fn = getattr(softtopk, name)
    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = torch.autograd.functional.jacobian(lambda a: fn(a, regularization=reg), x)
    got = torch.autograd.functional.jacobian(lambda a: fn(a, regularization=reg), x, vectorize=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["soft_rank", "soft_sort"])
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_second_derivatives(name, reg):
    """With ``create_graph`` the backward records its graph: the one-pass kernels step aside, and
    what the backward reads from saved outputs (the sorted row, ``θ``, the kl ranks) is recomputed
    from ``x`` so that the graph sees it; in ``x`` and a tensor strength, with ``±inf`` entries."""
    fn = getattr(softtopk, name)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    eps = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda a, e: fn(a, regularization=reg, strength=e), (x, eps))
    infinite = torch.zeros(3, 6, dtype=torch.float64)
    infinite[1, 2], infinite[2, 0] = float("inf"), -float("inf")
    with_inf = lambda a: fn(torch.where(infinite != 0, infinite, a), regularization=reg, strength=0.7)  # noqa: E731
    assert torch.autograd.gradgradcheck(with_inf, (x,))
