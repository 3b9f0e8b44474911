"""The registry of :mod:`softtopk.jax`'s methods (as :mod:`softtopk._registry`): the methods JAX
has, their default parameters and checks, and the row kernel of each. ``soft_topk(method=...)``
resolves its method here; the methods of the PyTorch API that JAX lacks are named in the error.

Every method works on rows: ``x`` of shape ``(B, n)`` in a floating compute dtype, ``k`` an int (or
a ``(B, 1)`` array where ``"k"`` is a tensor argument) and every scale parameter as ``(B, 1)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import jax
import jax.numpy as jnp

from .. import _checks as msg
from .._checks import P_VALUES, SOLVERS, check_bool, check_choice, check_int
from ._extended import extended_mask
from ._validation import check_positive_or_array
from .ops import dykstra, sparse
from .ops._straight_through import straight_through_mask
from .ops.lapsum import laplace_mask

Check = Callable[[str, Any], Any]
# softtopk.methods() of the PyTorch API that softtopk.jax does not have (tests/test_jax_mirror.py checks the list)
TORCH_ONLY = ("bitonic", "gumbel", "neuralsort", "odd_even", "perturbed", "softsort", "splitter_selection")


@dataclass(frozen=True)
class _Method:
    params: dict[str, Any]  # the parameters and their defaults (those of the PyTorch API)
    mask: Callable[..., jax.Array]
    checks: dict[str, Check]
    tensor_args: tuple[str, ...] = ()  # arguments that may be arrays, one value per row ("k", ...)
    # an int k reaches the kernel traced, with the static ``size`` (its candidate count) among the
    # parameters, except for ``hard=True`` and k >= n, which take k static
    traced_k: bool = False
    joint: Callable[[dict[str, Any]], None] | None = None  # a check of several parameters


def _lapsum(rows: jax.Array, k: int | jax.Array, *, tau: jax.Array, hard: bool) -> jax.Array:
    soft = laplace_mask(rows, tau, k)
    return straight_through_mask(rows, cast(int, k), soft) if hard else soft  # hard: an int k (checked)


def _sparse(
    rows: jax.Array,
    k: int | jax.Array,
    *,
    l: jax.Array,
    p: float,
    solver: str,
    n_iter: int,  # noqa: E741
    hard: bool,
    size: int | None = None,
) -> jax.Array:
    if size is None:  # k is a static int
        if cast(int, k) >= rows.shape[-1]:
            return jnp.ones_like(rows)
        size = sparse.candidates(rows.shape[-1], cast(int, k))
    if solver == "dykstra":
        soft = extended_mask(rows, k, lambda clean: dykstra.mask_rows(clean, l, k, n_iter, size))
    else:
        soft = extended_mask(rows, k, lambda clean: sparse.mask_rows(clean, l, k, sparse.exponent(p), size))
    return straight_through_mask(rows, cast(int, k), soft) if hard else soft  # hard: a static k


_REGISTRY: dict[str, _Method] = {
    "lapsum": _Method(
        {"tau": 1.0, "hard": False},
        _lapsum,
        {"tau": check_positive_or_array, "hard": check_bool},
        tensor_args=("k", "tau"),
    ),
    "sparse": _Method(
        {"l": 0.1, "p": 4.0 / 3.0, "solver": "pav", "n_iter": 500, "hard": False},
        _sparse,
        {
            "l": check_positive_or_array,
            "p": functools.partial(check_choice, options=P_VALUES),
            "solver": functools.partial(check_choice, options=SOLVERS),
            "n_iter": functools.partial(check_int, low=1),
            "hard": check_bool,
        },
        tensor_args=("l",),
        traced_k=True,
        joint=lambda params: msg.check_dykstra_p(params["solver"], params["p"]),
    ),
}


def resolve(method: Any, params: dict[str, Any]) -> tuple[_Method, dict[str, Any]]:
    """Look ``method`` up and return it with validated parameters (defaults filled in)."""
    spec = _REGISTRY[msg.check_method(method, tuple(_REGISTRY), TORCH_ONLY)]
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        raise TypeError(msg.unexpected_params(method, unknown, sorted(spec.params)))
    resolved = {name: spec.checks[name](name, value) for name, value in {**spec.params, **params}.items()}
    if spec.joint is not None:
        spec.joint(resolved)
    return spec, resolved


def lookup(method: str) -> _Method:
    """A method already checked by :func:`resolve`."""
    return _REGISTRY[method]
