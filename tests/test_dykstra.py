"""Tests of the batched Dykstra isotonic solver and the Dykstra top-k rows (softtopk.ops.dykstra)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pav_reference import pav, pav_mag, pav_mask
from softtopk.ops.dykstra import dykstra_isotonic, dykstra_mag_rows, dykstra_mask_rows

README_X = [[-5.0, -2.0, 3.0, 1.0]]
README_BATCH = [
    [[-11, 1, 4, -7], [5, 1, 4, 1], [-10, -3, 4, -6]],
    [[7, -6, -8, -4], [-1, 9, 8, 4], [0, 0, -5, 5]],
]


def _rows(seed, b, n, dtype=torch.float64):
    return torch.randn(b, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _ref(fn, x, k, l):
    return torch.from_numpy(np.stack([fn(r, k, l, 2.0) for r in x.double().numpy()]))


def test_readme_single_vector_float32():
    """The original's printed float32 outputs (l = 1e-2, default 500 iterations)."""
    x = torch.tensor(README_X)
    mask = dykstra_mask_rows(x, 2, 1e-2, 500)
    mag = dykstra_mag_rows(x, 2, 1e-2, 500)
    assert mask.dtype == mag.dtype == torch.float32
    torch.testing.assert_close(mask, torch.tensor([[0.0, 0.0, 0.99999905, 0.99999905]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(mag, torch.tensor([[-4.9999804, -0.0, 2.999993, 0.0]]), atol=1e-5, rtol=0)


def test_readme_batched_100_iterations():
    x = torch.tensor(README_BATCH, dtype=torch.float32).reshape(-1, 4)
    mask = [
        [[0, 0.99999905, 0.99999905, 0], [1.0000229, 0, 0.99999905, 0], [0, 0.99999905, 0.99999905, 0]],
        [[1.0000229, 0, 0, 1.0000229], [0, 1.0000229, 1.0000229, 0], [0.5, 0.5, 0, 1.0000229]],
    ]
    mag = [
        [[-10.999967, 0, 0, -6.999992], [4.9999804, 0, 3.9999988, 0], [-9.999961, -0.0, 0, -5.999986]],
        [[6.999992, -0.0, -7.9999976, -0.0], [-0.0, 8.999955, 7.9999976, 0], [0, 0, -4.9999804, 4.9999804]],
    ]
    got_mask = dykstra_mask_rows(x, 2, 1e-2, 100).reshape(2, 3, 4)
    got_mag = dykstra_mag_rows(x, 2, 1e-2, 100).reshape(2, 3, 4)
    torch.testing.assert_close(got_mask, torch.tensor(mask), atol=1e-5, rtol=0)
    torch.testing.assert_close(got_mag, torch.tensor(mag), atol=1e-5, rtol=0)


@pytest.mark.parametrize("rows, ref_fn", [(dykstra_mask_rows, pav_mask), (dykstra_mag_rows, pav_mag)])
def test_converges_to_pav_p2(rows, ref_fn):
    """n = 100, l = 0.1, k = 10: the error to exact PAV (p = 2) shrinks and is ~0 at 500 iterations."""
    x = _rows(0, 8, 100)
    ref = _ref(ref_fn, x, 10, 0.1)
    errs = [(rows(x, 10, 0.1, it) - ref).abs().max().item() for it in (2, 10, 50, 100, 500, 2000)]
    assert all(b <= a * (1 + 1e-6) + 1e-14 for a, b in itertools.pairwise(errs)), errs
    assert errs[0] > 0.1 and errs[2] < 1e-3 and errs[3] < 1e-8 and errs[4] < 1e-12, errs
    err32 = (rows(x.float(), 10, 0.1, 500).double() - ref).abs().max().item()
    assert err32 < 1e-5


def test_larger_n_needs_more_iterations():
    """n = 1000: far from PAV at the default 500 iterations, converged at 2000 (as measured on JAX)."""
    x = _rows(1, 2, 1000)
    ref = _ref(pav_mask, x, 100, 0.1)
    err = [(dykstra_mask_rows(x, 100, 0.1, it) - ref).abs().max().item() for it in (100, 500, 2000)]
    assert err[0] > 1e-2 and err[1] > err[2] and err[2] < 1e-6, err


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.float64, 1e-11)])
@pytest.mark.parametrize("n", [1, 2, 5, 8, 31])
def test_mask_sums_to_k_at_every_iteration(dtype, tol, n):
    x = _rows(2, 4, n, dtype) * 3
    for k in sorted({0, 1, n // 2, n}):
        for it in list(range(0, 12)) + [37, 100, 500]:
            y = dykstra_mask_rows(x, k, 0.5, it)
            assert y.dtype == dtype and y.shape == x.shape
            assert (y.sum(-1) - k).abs().max().item() < tol, (k, it)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_are_independent_and_match_row_by_row(dtype):
    x = _rows(3, 5, 9, dtype)
    for rows in (dykstra_mask_rows, dykstra_mag_rows):
        batched = rows(x, 3, 0.2, 60)
        single = torch.cat([rows(x[i : i + 1], 3, 0.2, 60) for i in range(5)])
        torch.testing.assert_close(batched, single, rtol=0, atol=0)


def test_lambda_tensor_per_row():
    x = _rows(4, 3, 6)
    ls = torch.tensor([[0.1], [0.5], [2.0]], dtype=torch.float64)
    for rows in (dykstra_mask_rows, dykstra_mag_rows):
        got = rows(x, 2, ls, 200)
        want = torch.cat([rows(x[i : i + 1], 2, float(ls[i]), 200) for i in range(3)])
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 17])
def test_weighted_isotonic_matches_weighted_pav(n):
    g = torch.Generator().manual_seed(n)
    s = torch.randn(6, n, generator=g, dtype=torch.float64)
    u = 0.5 + torch.rand(6, n, generator=g, dtype=torch.float64)
    v = dykstra_isotonic(s, 4000, weights=u)
    for i in range(6):
        si, ui = s[i].numpy(), u[i].numpy()
        ref = pav(si, lambda idx, si=si, ui=ui: float(np.sum(ui[idx] * si[idx]) / np.sum(ui[idx])))
        np.testing.assert_allclose(v[i].numpy(), ref, atol=1e-9)
    unweighted = dykstra_isotonic(s, 4000)
    for i in range(6):
        si = s[i].numpy()
        np.testing.assert_allclose(unweighted[i].numpy(), pav(si, lambda idx, si=si: float(si[idx].mean())), atol=1e-9)


def test_isotonic_weights_shapes_and_zero_iterations():
    s = _rows(5, 4, 7)
    u = torch.linspace(1.0, 2.0, 7, dtype=torch.float64)
    torch.testing.assert_close(dykstra_isotonic(s, 50, weights=u), dykstra_isotonic(s, 50, weights=u.expand(4, 7)))
    torch.testing.assert_close(dykstra_isotonic(s, 0), s, rtol=0, atol=0)
    torch.testing.assert_close(dykstra_isotonic(s, 1), s, rtol=0, atol=0)  # 1 // 2 = 0 trips
    sorted_s = s.sort(dim=-1, descending=True).values
    torch.testing.assert_close(dykstra_isotonic(sorted_s, 10), sorted_s, rtol=0, atol=0)


def test_mag_keeps_kept_entries_and_zero_tail():
    x = torch.tensor([[10.0, -9.0, 0.5, 0.1, -0.2]], dtype=torch.float64)
    want = torch.tensor([[10.0, -9.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(dykstra_mag_rows(x, 2, 1e-2, 500), want)


def test_k_extremes():
    x = _rows(6, 3, 6)
    torch.testing.assert_close(dykstra_mask_rows(x, 0, 0.1, 100), torch.zeros_like(x), atol=1e-12, rtol=0)
    torch.testing.assert_close(dykstra_mask_rows(x, 6, 0.1, 100), torch.ones_like(x), atol=1e-12, rtol=0)


def test_gradient_flows_without_error():
    """The forward is plain autograd-able (the library wraps it with the exact Jacobian instead)."""
    x = _rows(7, 2, 6).requires_grad_()
    dykstra_mask_rows(x, 2, 0.5, 20).pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("rows", [dykstra_mask_rows, dykstra_mag_rows])
def test_compiles_fullgraph(rows):
    torch._dynamo.reset()
    x = _rows(8, 3, 6, torch.float32)
    compiled = torch.compile(rows, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, 2, 0.1, 8), rows(x, 2, 0.1, 8))


def test_infinite_entries_are_exact_and_the_rest_converges_as_without_them():
    """-inf entries have mask 0 and +inf entries 1 at every iteration (finite stand-ins beyond the
    row's spread), and the finite entries converge to the exact mask of the row (no NaN)."""
    x = torch.tensor(
        [[0.3, -torch.inf, 1.2, 0.5, -torch.inf, 0.9], [torch.inf, 0.1, -0.2, 0.4, 0.0, -1.0]], dtype=torch.float64
    )
    for n_iter in (1, 7, 2000):
        out = dykstra_mask_rows(x, 3, 0.5, n_iter)
        assert torch.isfinite(out).all() and (out[0, [1, 4]] == 0).all() and out[1, 0] == 1
        torch.testing.assert_close(out.sum(-1), torch.full((2,), 3.0, dtype=torch.float64), atol=1e-12, rtol=0)
    finite = dykstra_mask_rows(x[:1, [0, 2, 3, 5]], 3, 0.5, 2000)
    torch.testing.assert_close(out[0, [0, 2, 3, 5]], finite[0], atol=1e-9, rtol=0)
