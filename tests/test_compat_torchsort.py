"""softtopk.compat.torchsort: torchsort's names, argument order and defaults.

The first tests are those of torchsort's own ``tests/test_ops.py`` (gradcheck with its tolerances,
agreement with the reference implementation, half precision), with google-research/fast-soft-sort
replaced by the NumPy oracle of ``permutahedron_reference`` (the same algorithm). torchsort itself
is the oracle where it is installed (it compiles a C++ extension: ``pip install
--no-build-isolation torchsort``); those tests are skipped otherwise.
"""

from __future__ import annotations

import inspect
from functools import partial

import numpy as np
import pytest
import torch

import permutahedron_reference as R
from softtopk.compat import torchsort

REGULARIZATION = ["l2", "kl"]
REGULARIZATION_STRENGTH = [1e-1, 1e0, 1e1]
FUNCTIONS = {"soft_rank": (torchsort.soft_rank, R.soft_rank_1d), "soft_sort": (torchsort.soft_sort, R.soft_sort_1d)}


def _x(dtype=torch.float64) -> torch.Tensor:
    return torch.randn(8, 10, dtype=dtype, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("regularization", REGULARIZATION)
@pytest.mark.parametrize("regularization_strength", REGULARIZATION_STRENGTH)
def test_gradcheck(name, regularization, regularization_strength):
    f = partial(FUNCTIONS[name][0], regularization=regularization, regularization_strength=regularization_strength)
    assert torch.autograd.gradcheck(f, [_x().requires_grad_()], eps=1e-5, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("regularization", REGULARIZATION)
@pytest.mark.parametrize("regularization_strength", REGULARIZATION_STRENGTH)
def test_vs_original(name, regularization, regularization_strength):
    fn, ref = FUNCTIONS[name]
    x = _x()
    want = R.rows(ref, x.numpy(), strength=regularization_strength, regularization=regularization)
    got = fn(x, regularization=regularization, regularization_strength=regularization_strength)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("regularization", REGULARIZATION)
@pytest.mark.parametrize("regularization_strength", REGULARIZATION_STRENGTH)
def test_half(name, regularization, regularization_strength):
    f = partial(FUNCTIONS[name][0], regularization=regularization, regularization_strength=regularization_strength)
    x = _x(torch.float32)
    assert torch.allclose(f(x.half()), f(x).half(), atol=1e-1)


def test_signatures_and_defaults():
    for name in FUNCTIONS:
        params = inspect.signature(getattr(torchsort, name)).parameters
        assert list(params) == ["values", "regularization", "regularization_strength"]
        assert params["regularization"].default == "l2" and params["regularization_strength"].default == 1.0


def test_readme_examples_with_integer_values():
    x = torch.tensor([[8, 0, 5, 3, 2, 1, 6, 7, 9]])
    want = torch.tensor([[0.5556, 1.5556, 2.5556, 3.5556, 4.5556, 5.5556, 6.5556, 7.5556, 8.5556]])
    torch.testing.assert_close(torchsort.soft_sort(x, regularization_strength=1.0), want, atol=1e-4, rtol=0)
    torch.testing.assert_close(
        torchsort.soft_sort(x, regularization_strength=0.1), torch.tensor([[0.0, 1, 2, 3, 5, 6, 7, 8, 9]])
    )
    torch.testing.assert_close(torchsort.soft_rank(x), torch.tensor([[8.0, 1, 5, 4, 3, 2, 6, 7, 9]]))


def test_positional_arguments_and_errors():
    x = _x()
    torch.testing.assert_close(
        torchsort.soft_rank(x, "kl", 0.5), torchsort.soft_rank(x, regularization="kl", regularization_strength=0.5)
    )
    with pytest.raises(ValueError, match="regularization must be one of"):
        torchsort.soft_sort(x, "l1")
    with pytest.raises(ValueError, match="strength must be a positive finite number"):
        torchsort.soft_rank(x, "l2", -1.0)


def test_beyond_the_original_any_leading_shape():
    x = torch.randn(2, 3, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torchsort.soft_rank(x), torchsort.soft_rank(x.reshape(6, 10)).reshape(2, 3, 10))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("regularization", REGULARIZATION)
@pytest.mark.parametrize("regularization_strength", REGULARIZATION_STRENGTH)
def test_matches_torchsort_when_installed(name, regularization, regularization_strength):
    original = pytest.importorskip("torchsort", reason="torchsort is not installed (it needs a C++ build)")
    kwargs = {"regularization": regularization, "regularization_strength": regularization_strength}
    x = torch.randn(8, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(8, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    results = []
    for fn in (getattr(torchsort, name), getattr(original, name)):
        leaf = x.clone().requires_grad_()
        out = fn(leaf, **kwargs)
        out.backward(upstream)
        results.append((out.detach(), leaf.grad))
    for got, want in zip(*results, strict=False):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
