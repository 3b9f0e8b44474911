"""One table, two frameworks: every row calls the torch API and :mod:`softtopk.jax` with the same
arguments. A good call gives the same values (1e-6 in float32, 1e-12 in float64, relative to the
largest finite output where it exceeds 1: soft ranks reach n); a bad call raises the same error
type with the same message, up to the frameworks' own words (:data:`WORDS`). No message is written
here: each side is the other's reference (both build theirs from :mod:`softtopk._checks`). The
gradients' agreement is tests/test_jax_torch.py's and tests/test_jax_sorting.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import softtopk  # noqa: E402
import softtopk.jax as sj  # noqa: E402
from softtopk.jax import _registry  # noqa: E402

# torch's word -> JAX's word, the only differences allowed between the two sides' messages
WORDS = (
    (r"torch\.Tensor", "JAX array"),
    (r"0-d tensor", "0-d array"),
    (r"\bdim\b", "axis"),
    (r"torch\.(?=float|bfloat|int|bool)", ""),
)  # dtype names: torch.float32 -> float32


def jax_words(message: str) -> str:
    for torch_word, jax_word in WORDS:
        message = re.sub(torch_word, jax_word, message)
    return message


class Side:
    """One framework: its functions, arrays (``array(values, dtype)``) and axis keyword."""

    def __init__(self, module: Any, array: Callable[..., Any], axis: str) -> None:
        self.module, self.array, self.axis = module, array, axis

    def __call__(self, name: str, *args: Any, axis: Any = None, **kwargs: Any) -> Any:
        if axis is not None:
            kwargs[self.axis] = axis
        return getattr(self.module, name)(*args, **kwargs)


TORCH = Side(softtopk, lambda v, dtype="float32": torch.tensor(np.asarray(v, dtype)), "dim")
JAX = Side(sj, lambda v, dtype="float32": jnp.asarray(np.asarray(v, dtype)), "axis")

X = np.random.default_rng(0).standard_normal((3, 8))
X_INF = np.where(np.arange(8) % 3 == 1, -np.inf, X)  # -inf padding: 5 finite entries per row
ROWS = [0.05, 0.3, 2.0]
AXIS0 = X[0] ** 2 + 0.1  # a strength per row of X along axis 0

# (id, call of one side f, dtype); each runs on both sides and is compared
GOOD = [
    ("lapsum", lambda f, d: f("soft_topk", f.array(X, d), 3, tau=0.5)),
    ("lapsum axis 0 smallest", lambda f, d: f("soft_topk", f.array(X, d), 2, axis=0, largest=False, tau=0.3)),
    ("lapsum k > n/2", lambda f, d: f("soft_topk", f.array(X, d), 6)),
    ("lapsum -inf", lambda f, d: f("soft_topk", f.array(X_INF, d), 3, tau=0.5)),
    (
        "lapsum per-row tau and k",
        lambda f, d: f("soft_topk", f.array(X, d), f.array([1.5, 3.0, 7.25], d), tau=f.array(ROWS, d)),
    ),
    ("lapsum hard", lambda f, d: f("soft_topk", f.array(X, d), 3, hard=True)),
    ("sparse", lambda f, d: f("soft_topk", f.array(X, d), 3, method="sparse", l=0.5)),
    ("sparse p=2 per-row l", lambda f, d: f("soft_topk", f.array(X, d), 3, method="sparse", p=2, l=f.array(ROWS, d))),
    ("sparse -inf", lambda f, d: f("sparse_topk_mask", f.array(X_INF, d), 2, l=0.5, p=2)),
    ("sparse hard smallest", lambda f, d: f("sparse_topk_mask", f.array(X, d), 3, hard=True, largest=False)),
    ("sparse exact", lambda f, d: f("sparse_topk_mask", f.array(X, d), 4, solver="exact", l=2.0)),
    ("dykstra", lambda f, d: f("sparse_topk_mask", f.array(X, d), 3, l=0.5, p=2, solver="dykstra", n_iter=300)),
    ("mag", lambda f, d: f("sparse_topk_mag", f.array(X, d), 3, l=0.2)),
    ("mag p=2 axis 0", lambda f, d: f("sparse_topk_mag", f.array(X, d), 2, l=0.2, p=2, axis=0)),
    ("mag dykstra", lambda f, d: f("sparse_topk_mag", f.array(X, d), 3, l=0.5, p=2, solver="dykstra", n_iter=300)),
    ("hard mask", lambda f, d: f("hard_topk_mask", f.array(X, d), 3)),
    ("hard mag smallest", lambda f, d: f("hard_topk_mag", f.array(X_INF, d), 2, largest=False)),
    (
        "soft rank kl axis 0 descending per-row strength",
        lambda f, d: f(
            "soft_rank", f.array(X, d), axis=0, regularization="kl", descending=True, strength=f.array(AXIS0, d)
        ),
    ),
    ("soft sort -inf", lambda f, d: f("soft_sort", f.array(X_INF, d), strength=0.5)),
]

ONES, PAIR = np.ones(3), np.ones((2, 3))
BAD = [
    ("x list", lambda f: f("soft_topk", [1.0, 2.0], 1)),
    ("x int", lambda f: f("sparse_topk_mask", f.array([1, 2, 3], "int32"), 1)),
    ("x 0-d", lambda f: f("hard_topk_mask", f.array(1.0), 1)),
    ("axis float", lambda f: f("soft_topk", f.array(ONES), 1, axis=1.0)),
    ("axis range", lambda f: f("sparse_topk_mask", f.array(ONES), 1, axis=2)),
    ("k float", lambda f: f("sparse_topk_mag", f.array(ONES), 2.0)),
    ("k range", lambda f: f("soft_topk", f.array(PAIR), 4)),
    ("k 0 hard", lambda f: f("hard_topk_mag", f.array(PAIR), 0)),
    ("k bool array", lambda f: f("soft_topk", f.array(PAIR), f.array([True, False], "bool"))),
    ("k array range", lambda f: f("soft_topk", f.array(PAIR), f.array([1.0, 3.5]))),
    ("k array hard", lambda f: f("soft_topk", f.array(PAIR), f.array([1.0, 2.0]), hard=True)),
    ("l negative", lambda f: f("sparse_topk_mask", f.array(ONES), 1, l=-1.0)),
    ("l tiny", lambda f: f("sparse_topk_mask", f.array(ONES), 1, l=1e-40)),
    ("l huge", lambda f: f("soft_topk", f.array(ONES), 1, method="sparse", l=1e300)),
    ("l int array", lambda f: f("sparse_topk_mask", f.array(PAIR), 1, l=f.array([1, 2], "int32"))),
    ("l negative array", lambda f: f("sparse_topk_mask", f.array(PAIR), 1, l=f.array([1.0, -2.0]))),
    ("l huge array", lambda f: f("sparse_topk_mask", f.array(PAIR), 1, l=f.array([1.0, 1e38]))),
    ("l shape", lambda f: f("sparse_topk_mask", f.array(PAIR), 1, l=f.array(ONES))),
    ("p", lambda f: f("sparse_topk_mask", f.array(ONES), 1, p=3)),
    ("solver", lambda f: f("sparse_topk_mask", f.array(ONES), 1, solver="bisect")),
    ("n_iter", lambda f: f("sparse_topk_mask", f.array(ONES), 1, n_iter=0)),
    ("dykstra p", lambda f: f("sparse_topk_mask", f.array(ONES), 1, solver="dykstra")),
    ("mag l array", lambda f: f("sparse_topk_mag", f.array(ONES), 1, l=f.array(0.5))),
    ("mag l huge", lambda f: f("sparse_topk_mag", f.array(ONES), 1, l=1e31)),
    ("tau zero", lambda f: f("soft_topk", f.array(ONES), 1, tau=0.0)),
    ("tau shape", lambda f: f("soft_topk", f.array(PAIR), 1, tau=f.array([[1.0, 2.0, 3.0]]))),
    ("hard int", lambda f: f("soft_topk", f.array(ONES), 1, hard=1)),
    ("largest str", lambda f: f("hard_topk_mask", f.array(ONES), 1, largest="yes")),
    ("unknown parameter", lambda f: f("soft_topk", f.array(ONES), 1, method="sparse", tau=1.0)),
    ("bool p", lambda f: f("soft_topk", f.array(ONES), 1, method="sparse", p=True)),
    ("rank x int", lambda f: f("soft_rank", f.array([1, 2, 3], "int32"))),
    ("sort axis range", lambda f: f("soft_sort", f.array(ONES), axis=1)),
    ("regularization", lambda f: f("soft_rank", f.array(ONES), regularization="l1")),
    ("strength zero", lambda f: f("soft_sort", f.array(ONES), strength=0.0)),
    ("strength bool", lambda f: f("soft_rank", f.array(ONES), strength=True)),
    ("strength tiny", lambda f: f("soft_rank", f.array(ONES), strength=1e-300)),
    ("strength int array", lambda f: f("soft_sort", f.array(PAIR), strength=f.array([1, 2], "int32"))),
    ("strength negative array", lambda f: f("soft_rank", f.array(PAIR), strength=f.array([1.0, -2.0]))),
    ("strength huge array", lambda f: f("soft_sort", f.array(PAIR), strength=f.array([1.0, 1e38]))),
    ("strength shape", lambda f: f("soft_sort", f.array(PAIR), strength=f.array(ONES))),
    ("descending int", lambda f: f("soft_rank", f.array(ONES), descending=1)),
]


def _values(side: Side, call: Callable[..., Any], dtype: str) -> np.ndarray:
    return np.asarray(call(side, dtype), dtype)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("float64", 1e-12)])
def test_good_calls_agree(dtype, tol):
    for name, call in GOOD:
        with jax.enable_x64(dtype == "float64"):
            theirs = _values(JAX, call, dtype)
        ours = call(TORCH, dtype).numpy()
        assert ours.dtype == theirs.dtype == np.dtype(dtype), name
        scale = max(1.0, float(np.abs(ours[np.isfinite(ours)]).max(initial=0.0)))
        np.testing.assert_allclose(theirs, ours, rtol=0, atol=tol * scale, err_msg=name)


def _error(side: Side, call: Callable[..., Any]) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as caught:
        call(side)
    return caught.type, str(caught.value)


@pytest.mark.parametrize("name, call", BAD, ids=[row[0] for row in BAD])
def test_bad_calls_raise_the_same_error(name, call):
    torch_type, torch_message = _error(TORCH, call)
    jax_type, jax_message = _error(JAX, call)
    assert (jax_type, jax_message) == (torch_type, jax_words(torch_message))


def test_a_method_jax_lacks_is_named_with_those_it_has():
    """softtopk.jax has a subset of the torch methods; the others are refused by name."""
    jax_methods = set(_registry._REGISTRY)
    assert jax_methods < set(softtopk.methods()) and set(_registry.TORCH_ONLY) == set(softtopk.methods()) - jax_methods
    for method in _registry.TORCH_ONLY:
        softtopk.soft_topk(torch.ones(4), 2, method=method)  # torch has it
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"method {method!r} is in softtopk's PyTorch API only; softtopk.jax has {sorted(jax_methods)}"
            ),
        ):
            sj.soft_topk(jnp.ones(4), 2, method=method)
    _, torch_message = _error(TORCH, lambda f: f("soft_topk", f.array(ONES), 1, method="bisect"))
    _, jax_message = _error(JAX, lambda f: f("soft_topk", f.array(ONES), 1, method="bisect"))
    assert jax_message == torch_message.replace(str(sorted(softtopk.methods())), str(sorted(jax_methods)))


def test_default_parameters_are_the_torch_ones():
    for method, spec in _registry._REGISTRY.items():
        assert spec.params == softtopk.methods()[method].params, method
