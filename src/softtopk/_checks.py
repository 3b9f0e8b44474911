"""The framework-free half of softtopk's argument checks, shared by the torch API
(:mod:`softtopk._validation`) and :mod:`softtopk.jax` (``softtopk/jax/_validation.py``), so that
each message is written once.

Checks of Python values (``check_*(name, value, ...)`` returns the value, normalised, or raises a
``TypeError``/``ValueError`` naming the argument, the expectation and the value received) and the
message templates of the checks that need an array's dtype, shape or values, which each framework
reads its own way. The frameworks' words differ only where their objects do: ``dim`` and ``axis``,
"tensor" and "array", ``torch.float32`` and ``float32``; ``tests/test_jax_mirror.py`` compares the
two sides' messages through exactly that vocabulary. Pure Python: importing it loads no framework.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

FLOATS = "float16/bfloat16/float32/float64"
P_VALUES = (2.0, 4.0 / 3.0)  # the sparse method's p
SOLVERS = ("exact", "pav", "dykstra")  # the sparse method's solvers ("exact" and "pav" name one solver)
SCALES = ("tau", "l", "steepness", "sigma")  # the methods' positive scale (temperature) parameters
REGULARIZATIONS = ("l2", "kl")  # soft_sort and soft_rank's geometries
HARD_NEEDS_INT_K = "hard=True needs an int k (its forward is the k-hot mask), got a tensor k"
MAG_L_IS_FLOAT = "l must be a float for sparse_topk_mag (a per-row tensor l is the mask's), got a tensor"
MAG_L_MAX = 1e30  # sparse_topk_mag with p = 4/3: θ ~ Σ|x|³/(k l³), whose gradient is NaN from ~1e36 on


# ------------------------------------------------------------------------------- Python values


def check_int(name: str, value: Any, *, low: int | None = None, high: int | None = None, why: str = "") -> int:
    """``value`` as an int in ``[low, high]`` (either bound optional; bools refused); ``why`` explains
    the bound."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None or low is None:
            bound = f"be >= {low}" if high is None else f"be <= {high}"
        else:
            bound = f"satisfy {low} <= {name} <= {high}"
        raise ValueError(f"{name} must {bound}{why}, got {value}")
    return value


def check_number(name: str, value: Any) -> float:
    """``value`` as a float; TypeError for anything but a real number (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_real(
    name: str, value: Any, *, positive: bool = False, low: float | None = None, below: float | None = None
) -> float:
    """``value`` as a finite float; ``positive``: ``> 0``; ``low``: ``>= low``; ``below``: ``< below``."""
    number = check_number(name, value)
    if positive:
        expected, ok = "a positive finite number", number > 0
    elif below is not None:
        expected, ok = f"in [{low:g}, {below:g})", (low is None or number >= low) and number < below
    elif low is not None:
        expected, ok = f"a finite number >= {low:g}", number >= low
    else:
        expected, ok = "a finite number", True
    if not (math.isfinite(number) and ok):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """A bool (ints refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_choice(name: str, value: Any, options: Sequence[Any]) -> Any:
    """``value`` if it equals one of ``options`` (a bool never equals a number here)."""
    if not any(value == option and type(value) is not bool for option in options):
        raise ValueError(f"{name} must be one of {tuple(options)}, got {value!r}")
    return value


def check_axis(name: str, value: Any, ndim: int) -> int:
    """The axis ``value`` (named ``name``: ``dim`` or ``axis``) of an ``ndim``-d input, non-negative."""
    axis = check_int(name, value)
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name} must be in [{-ndim}, {ndim - 1}] for a {ndim}-d input, got {axis}")
    return axis % ndim


def check_k(k: Any, n: int, axis: int, axis_name: str = "dim") -> int:
    """``k`` as an int with ``1 <= k <= n`` (``n`` the size of axis ``axis``)."""
    k = check_int("k", k)
    if not 1 <= k <= n:
        raise ValueError(f"k must satisfy 1 <= k <= n = {n} (the size of {axis_name} {axis}), got {k}")
    return k


def check_method(method: Any, available: Sequence[str], elsewhere: Sequence[str] = ()) -> str:
    """A method name among ``available`` (the methods a framework has); ``elsewhere``: the methods
    only the other framework has, which the error names as such."""
    if isinstance(method, str) and method in elsewhere:
        raise ValueError(f"method {method!r} is in softtopk's PyTorch API only; softtopk.jax has {sorted(available)}")
    if not isinstance(method, str) or method not in available:
        raise ValueError(f"method must be one of {sorted(available)}, got {method!r}")
    return method


def check_dykstra_p(solver: str, p: float) -> None:
    """Dykstra's projections solve the sparse problem for ``p = 2`` only."""
    if solver == "dykstra" and p != 2:
        raise ValueError(f"solver='dykstra' solves p=2 only, got p={p!r}; use solver='pav' for p=4/3")


def check_mag_l(l: float, p: float) -> None:  # noqa: E741
    """The magnitude's ``l`` for ``p = 4/3`` at most :data:`MAG_L_MAX`."""
    if p != 2 and l > MAG_L_MAX:
        raise ValueError(f"l must be at most {MAG_L_MAX:g} for sparse_topk_mag with p=4/3, got {l!r}")


# --------------------------------------------------------------------- messages of array checks


def not_an_array(name: str, kind: str, value: Any) -> str:
    """``value`` is no array of the framework (``kind``: ``torch.Tensor``, ``JAX array``)."""
    return f"{name} must be a {kind}, got {type(value).__name__}"


def not_floating(name: str, dtype: Any) -> str:
    return f"{name} must have a floating dtype ({FLOATS}), got {dtype}"


def zero_dim(name: str, noun: str) -> str:
    """A 0-d input (``noun``: ``tensor``, ``array``)."""
    return f"{name} must have at least one dimension, got a 0-d {noun}"


def k_dtype(dtype: Any) -> str:
    return f"k must be an int or a real tensor of per-row counts, got a tensor of dtype {dtype}"


def k_out_of_range(n: int, bad: float) -> str:
    return f"k must lie in (0, n = {n}] in every row, got {bad}"


def scale_not_floating(name: str, dtype: Any) -> str:
    return f"{name} must be a floating tensor when given as a tensor, got {dtype}"


def scale_not_positive(name: str, lowest: float) -> str:
    return f"{name} must be positive and finite, got a tensor with min {lowest!r}"


def scale_out_of_range(name: str, low: float, high: float, scores: Any, computed: Any, value: float) -> str:
    """A scale outside ``[low, high]`` = ``[tiny, 1/tiny]`` of the compute dtype ``computed`` of the
    ``scores`` dtype."""
    return f"{name} must lie in [{low:.3g}, {high:.3g}] for {scores} scores (computed in {computed}), got {value!r}"


def not_broadcastable(name: str, batch: tuple[int, ...], axis_name: str, shape: tuple[int, ...]) -> str:
    return (
        f"{name} must be a scalar or broadcastable to the batch shape {batch} (x without {axis_name}), "
        f"got shape {shape}"
    )


def unexpected_params(method: str, unknown: list[str], takes: list[str]) -> str:
    return f"method {method!r} got unexpected parameter(s) {unknown}; it takes {takes}"
