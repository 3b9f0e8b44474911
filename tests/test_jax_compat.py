"""softtopk.jax.compat.sparse_soft_topk against the seed README's printed outputs and signatures.

The README's 1-D, batched and ``vmap`` outputs are doctests of the module; here: its ``jax.grad``
example (inputs from the pre-0.5 random numbers, ``jax_threefry_partitionable=False``), the
signatures and defaults, the intended differences (exact values, any batch shape, float64, no
recompilation for a new ``l``), and the original's float32 PAV values within its own rounding.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
import jax.numpy as jnp  # noqa: E402

import softtopk.jax.compat.sparse_soft_topk as sst  # noqa: E402

README_GRAD = [0.0, 0.09063217, 0.2323066, 0.0, 0.12527105, 0.05957882, -0.13923873, 0.05559958, 0.0, -0.09306791]


def test_the_readme_grad_example():
    k, lam = 4, 0.5

    @jax.jit
    def sparse_soft_f(x):
        out = sst.sparse_soft_topk_mask_pav(x, k=k, l=lam) + sst.sparse_soft_topk_mask_pav(x**2, k=k, l=lam)
        return (out**2).mean()

    @jax.jit
    def hard_f(x):
        out = sst.hard_topk_mask(x, k=k) + sst.hard_topk_mask(x**2, k=k)
        return (out**2).mean()

    with jax.threefry_partitionable(False):
        x = jax.random.normal(jax.random.PRNGKey(2), (10,))
    assert not np.asarray(jax.grad(hard_f)(x)).any()
    # the original's float32 PAV: agreement to its rounding (exact zeros where it has them)
    grad = np.asarray(jax.grad(sparse_soft_f)(x))
    np.testing.assert_allclose(grad, README_GRAD, rtol=0, atol=5e-7)
    assert (grad[np.asarray(README_GRAD) == 0] == 0).all()


def test_the_readme_batched_input_comes_from_the_old_random_numbers():
    with jax.threefry_partitionable(False):
        values = (5 * jax.random.normal(jax.random.PRNGKey(2), (2, 3, 4))).astype(jnp.int32)
    assert values.tolist() == [
        [[-11, 1, 4, -7], [5, 1, 4, 1], [-10, -3, 4, -6]],
        [[7, -6, -8, -4], [-1, 9, 8, 4], [0, 0, -5, 5]],
    ]


def test_the_original_pav_outputs_within_its_float32_error():
    """README: mask [0, 0, 0.99999714, 0.99999714], magnitude [-5.000036, -0, 2.9999416, 0]: the
    exact values are 1 and (-5, 3); the original's float32 PAV was 1e-4 off."""
    values = jnp.array([-5.0, -2.0, 3.0, 1.0])
    np.testing.assert_allclose(
        np.asarray(sst.sparse_soft_topk_mask_pav(values, k=2, l=1e-2)), [0, 0, 0.99999714, 0.99999714], atol=3e-6
    )
    np.testing.assert_allclose(
        np.asarray(sst.sparse_soft_topk_mag_pav(values, k=2, l=1e-2)), [-5.000036, 0, 2.9999416, 0], atol=1e-4
    )


def test_signatures_and_defaults_are_the_originals():
    expected = {
        "sparse_soft_topk_mask_pav": [("x", None), ("k", None), ("l", 0.1), ("p", 4 / 3), ("bisect_max_iter", 50)],
        "sparse_soft_topk_mag_pav": [("x", None), ("k", None), ("l", 0.1), ("p", 4 / 3), ("bisect_max_iter", 50)],
        "sparse_soft_topk_mask_dykstra": [("x", None), ("k", None), ("l", 0.1), ("num_iter", 500)],
        "sparse_soft_topk_mag_dykstra": [("x", None), ("k", None), ("l", 0.1), ("num_iter", 500)],
        "hard_topk_mask": [("x", None), ("k", None)],
        "hard_topk_mag": [("x", None), ("k", None)],
    }
    assert sorted(sst.__all__) == sorted(expected)
    for name, parameters in expected.items():
        found = inspect.signature(getattr(sst, name)).parameters.values()
        empty = inspect.Parameter.empty
        assert [(q.name, None if q.default is empty else q.default) for q in found] == parameters


def test_intended_differences():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 7)), jnp.float32)
    # batched hard top-k: (B, n), where the original returned (k, n)
    assert sst.hard_topk_mask(x, 2).shape == (3, 7) and (np.asarray(sst.hard_topk_mask(x, 2)).sum(-1) == 2).all()
    # Dykstra on a batch equals Dykstra row by row
    rows = np.stack([np.asarray(sst.sparse_soft_topk_mask_dykstra(x[i], 2, 0.5)) for i in range(3)])
    np.testing.assert_allclose(np.asarray(sst.sparse_soft_topk_mask_dykstra(x, 2, 0.5)), rows, atol=1e-6)
    # float64 is accepted (the original raised TypeError), the magnitude's gradient is finite at 0
    with jax.enable_x64(True):
        x64 = jnp.asarray([0.0, 1.0, -2.0, 0.5], jnp.float64)
        assert sst.sparse_soft_topk_mask_pav(x64, 2).dtype == jnp.float64
        grad = jax.grad(lambda v: sst.sparse_soft_topk_mag_pav(v, 2, 0.3).sum())(x64)
        assert np.isfinite(np.asarray(grad)).all()
    # a traced l under jit (the original's l was static: a new l recompiled)
    f = jax.jit(lambda v, lam: sst.sparse_soft_topk_mask_pav(v, 2, lam))
    np.testing.assert_allclose(np.asarray(f(x, 0.3)), np.asarray(sst.sparse_soft_topk_mask_pav(x, 2, 0.3)), atol=1e-6)
    # integer input is computed in the default float dtype, as the original's float32 (the shape of
    # the README's 4 values above: compiled once)
    assert sst.sparse_soft_topk_mask_pav(jnp.arange(4), 2).dtype == jnp.float32
