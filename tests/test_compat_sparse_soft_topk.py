"""The sparse_soft_topk drop-in adapter: the original README's outputs and the intended differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pav_reference import hard_mag, hard_mask, pav_mag, pav_mask
from softtopk.compat.sparse_soft_topk import (
    hard_topk_mag,
    hard_topk_mask,
    sparse_soft_topk_mag_dykstra,
    sparse_soft_topk_mag_pav,
    sparse_soft_topk_mask_dykstra,
    sparse_soft_topk_mask_pav,
)

X = torch.tensor([-5.0, -2.0, 3.0, 1.0])
# the README's (5 * normal(PRNGKey(2), (2, 3, 4))).astype(int32)
BATCH = torch.tensor(
    [[[-11, 1, 4, -7], [5, 1, 4, 1], [-10, -3, 4, -6]], [[7, -6, -8, -4], [-1, 9, 8, 4], [0, 0, -5, 5]]],
    dtype=torch.int32,
)
PAV, DYK = {"atol": 1e-4, "rtol": 1e-4}, {"atol": 1e-5, "rtol": 0.0}


def _close(got, want, tol):
    torch.testing.assert_close(got, torch.tensor(want, dtype=got.dtype), **tol)


def test_readme_single_vector():
    _close(sparse_soft_topk_mask_pav(X, k=2, l=1e-2), [0, 0, 0.99999714, 0.99999714], PAV)
    _close(sparse_soft_topk_mag_pav(X, k=2, l=1e-2), [-5.000036, -0.0, 2.9999416, 0.0], PAV)
    _close(sparse_soft_topk_mask_dykstra(X, k=2, l=1e-2), [0, 0, 0.99999905, 0.99999905], DYK)
    _close(sparse_soft_topk_mag_dykstra(X, k=2, l=1e-2), [-4.9999804, -0.0, 2.999993, 0.0], DYK)
    _close(hard_topk_mask(X, k=2), [0, 0, 1, 1], {"atol": 0, "rtol": 0})
    _close(hard_topk_mag(X, k=2), [-5, -0.0, 3, 0], {"atol": 0, "rtol": 0})


def test_readme_batched_pav():
    """(2, 3, 4) int32 input, l = 1e-2: float32 outputs (the original's float32 noise is ~1e-4)."""
    mask = [
        [[0, 0.99999714, 0.99999714, 0], [1.0000687, 0, 0.99999714, 0], [0, 0.99999714, 0.99999714, 0]],
        [[1.0000687, 0, 0, 1.0000687], [0, 1.0000687, 1.0000687, 0], [0.49999988, 0.49999988, 0, 1.0000687]],
    ]
    mag = [
        [[-10.999428, 0, 0, -7.0002456], [5.000036, 0, 3.9999368, 0], [-10.000449, -0.0, 0, -5.999853]],
        [[7.0002456, -0.0, -7.99995, -0.0], [-0.0, 8.999435, 7.99995, 0], [0, 0, -5.000036, 5.000036]],
    ]
    got_mask = sparse_soft_topk_mask_pav(BATCH, k=2, l=1e-2)
    got_mag = sparse_soft_topk_mag_pav(BATCH, k=2, l=1e-2)
    assert got_mask.dtype == got_mag.dtype == torch.float32 and got_mask.shape == (2, 3, 4)
    _close(got_mask, mask, PAV)
    _close(got_mag, mag, PAV)


def test_readme_batched_dykstra_without_vmap():
    """The README vmapped the 1-D original twice (num_iter=100); the adapter takes (2, 3, 4) directly."""
    mask = [
        [[0, 0.99999905, 0.99999905, 0], [1.0000229, 0, 0.99999905, 0], [0, 0.99999905, 0.99999905, 0]],
        [[1.0000229, 0, 0, 1.0000229], [0, 1.0000229, 1.0000229, 0], [0.5, 0.5, 0, 1.0000229]],
    ]
    mag = [
        [[-10.999967, 0, 0, -6.999992], [4.9999804, 0, 3.9999988, 0], [-9.999961, -0.0, 0, -5.999986]],
        [[6.999992, -0.0, -7.9999976, -0.0], [-0.0, 8.999955, 7.9999976, 0], [0, 0, -4.9999804, 4.9999804]],
    ]
    _close(sparse_soft_topk_mask_dykstra(BATCH, k=2, num_iter=100, l=1e-2), mask, DYK)
    _close(sparse_soft_topk_mag_dykstra(BATCH, k=2, num_iter=100, l=1e-2), mag, DYK)


def test_hard_batched_matches_reference():
    x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    np.testing.assert_array_equal(hard_topk_mask(x, 2).numpy(), hard_mask(x.numpy(), 2))
    np.testing.assert_array_equal(hard_topk_mag(x, 2).numpy(), hard_mag(x.numpy(), 2))
    # the README batch has ties at the k-th value: check the selected values, not the tie order
    y = hard_topk_mask(BATCH, 2)
    assert y.shape == (2, 3, 4) and y.dtype == torch.float32
    torch.testing.assert_close(y.sum(-1), torch.full((2, 3), 2.0))
    picked = (BATCH.float() * y).sum(-1)
    torch.testing.assert_close(picked, BATCH.float().topk(2, dim=-1).values.sum(-1))
    torch.testing.assert_close(hard_topk_mag(BATCH, 2).abs().sum(-1), BATCH.abs().float().topk(2).values.sum(-1))


def test_hard_mask_keeps_batch_shape():
    """The original returned a (k, n) array for a (B, n) input; the adapter returns (B, n)."""
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    y = hard_topk_mask(x, 3)
    assert y.shape == (5, 7)
    torch.testing.assert_close(y.sum(-1), torch.full((5,), 3.0))
    assert y.gather(-1, x.topk(3, dim=-1).indices).eq(1).all()


@pytest.mark.parametrize("p", [2.0, 4 / 3])
def test_float64_works_and_matches_reference(p):
    """The original raised TypeError on float64 (float32-only numba kernels)."""
    x = torch.randn(3, 4, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for l in (0.05, 0.5, 5.0):
        mask = sparse_soft_topk_mask_pav(x, 3, l=l, p=p)
        mag = sparse_soft_topk_mag_pav(x, 3, l=l, p=p)
        assert mask.dtype == mag.dtype == torch.float64
        np.testing.assert_allclose(mask.numpy(), pav_mask(x.numpy(), 3, l, p), atol=1e-9)
        np.testing.assert_allclose(mag.numpy(), pav_mag(x.numpy(), 3, l, p), atol=1e-9)


def test_dykstra_float64_converges_to_pav_p2():
    x = torch.randn(4, 30, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mask = sparse_soft_topk_mask_dykstra(x, 5, l=0.1, num_iter=2000)
    mag = sparse_soft_topk_mag_dykstra(x, 5, l=0.1, num_iter=2000)
    np.testing.assert_allclose(mask.numpy(), pav_mask(x.numpy(), 5, 0.1, 2.0), atol=1e-9)
    np.testing.assert_allclose(mag.numpy(), pav_mag(x.numpy(), 5, 0.1, 2.0), atol=1e-9)


def test_defaults_and_positional_order():
    x = torch.randn(2, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(sparse_soft_topk_mask_pav(x, 4), sparse_soft_topk_mask_pav(x, 4, 0.1, 4 / 3, 50))
    torch.testing.assert_close(sparse_soft_topk_mag_pav(x, 4), sparse_soft_topk_mag_pav(x, 4, 0.1, 4 / 3))
    torch.testing.assert_close(sparse_soft_topk_mask_dykstra(x, 4), sparse_soft_topk_mask_dykstra(x, 4, 0.1, 500))
    torch.testing.assert_close(sparse_soft_topk_mag_dykstra(x, 4), sparse_soft_topk_mag_dykstra(x, 4, 0.1, 500))
    np.testing.assert_allclose(sparse_soft_topk_mask_pav(x, 4).numpy(), pav_mask(x.numpy(), 4), atol=1e-9)


def test_gradients_flow():
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64, requires_grad=True)
    for fn in (sparse_soft_topk_mask_pav, sparse_soft_topk_mag_pav, sparse_soft_topk_mask_dykstra):
        (grad,) = torch.autograd.grad(fn(x, 3, l=0.5).pow(2).sum(), x)
        assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_large_rows_without_dense_permutation():
    """n = 10000, B = 4: the original built a (B, n, n) one-hot (1.6 GB); nothing here is O(n^2)."""
    n, b = 10_000, 4
    x = torch.randn(b, n, generator=torch.Generator().manual_seed(5))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        outs = [
            sparse_soft_topk_mask_pav(x, 100),
            sparse_soft_topk_mag_pav(x, 100),
            sparse_soft_topk_mask_dykstra(x, 100, num_iter=20),
            sparse_soft_topk_mag_dykstra(x, 100, num_iter=20),
            hard_topk_mask(x, 100),
            hard_topk_mag(x, 100),
        ]
    for out in outs:
        assert out.shape == (b, n) and torch.isfinite(out).all()
    biggest = max(max(e.self_cpu_memory_usage, 0) for e in prof.events())
    assert biggest < n * n, biggest  # far below one n x n float32 matrix (4 n^2 bytes)
    torch.testing.assert_close(outs[0].sum(-1), torch.full((b,), 100.0), atol=1e-2, rtol=0)
