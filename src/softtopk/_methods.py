"""The registry of soft top-k methods: what each computes, its parameters and their checks.

Every method works on rows: ``x`` of shape ``(B, n)`` in a floating compute dtype. The functional
API (:mod:`softtopk.functional`) validates, reshapes and dispatches here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ._validation import can_inspect, check_number, check_real
from .ops.gumbel import RELAXATIONS, check_hard, check_noise_flag, check_relaxation, gumbel_mask_rows, gumbel_ranks_rows
from .ops.lapsum import lapsum_mask
from .ops.networks import NETWORK_TYPES
from .ops.neuralsort import neuralsort_ranks
from .ops.perturbed import check_generator, check_n_samples, check_noise_kind, perturbed_topk_rows
from .ops.softsort import softsort_ranks
from .ops.sparse import P_VALUES, SOLVERS, sparse_mask_rows
from .ops.sorting_networks import network_label_ranks, network_mask, network_ranks
from .ops.swaps import DISTRIBUTIONS


@dataclass(frozen=True)
class MethodInfo:
    """Public description of a registered method (see :func:`softtopk.methods`)."""

    name: str
    outputs: tuple[str, ...]
    stochastic: bool
    cost: str
    params: dict[str, Any]
    summary: str


@dataclass(frozen=True)
class _Method:
    info: MethodInfo
    ranks: Callable[..., torch.Tensor] | None
    mask: Callable[..., torch.Tensor] | None = None
    label_ranks: Callable[..., torch.Tensor] | None = None
    checks: dict[str, Callable[[str, Any], None]] = field(default_factory=dict)
    tensor_args: tuple[str, ...] = ()  # arguments that may be tensors, one value per row ("k", ...)


def _positive(name: str, value: Any) -> None:
    check_real(name, value, positive=True)


def _positive_or_tensor(name: str, value: Any) -> None:
    """A positive finite number, or a floating tensor of positive values (one per row or one)."""
    if not isinstance(value, torch.Tensor):
        check_real(name, value, positive=True)
        return
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor when given as a tensor, got {value.dtype}")
    if can_inspect(value) and value.numel() and not bool(
        ((value > 0) & torch.isfinite(value)).all()
    ):
        raise ValueError(f"{name} must be positive and finite, got a tensor with min {value.min().item()!r}")


def _choice(options: tuple) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if not any(value == option and type(value) is not bool for option in options):
            raise ValueError(f"{name} must be one of {options}, got {value!r}")

    return check


def _at_least_one(name: str, value: Any) -> None:
    if not 1 <= check_number(name, value) < math.inf:
        raise ValueError(f"{name} must be a finite number >= 1, got {value!r}")


def _unit_interval(name: str, value: Any) -> None:
    if not 0 <= check_number(name, value) < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


def _boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _distribution(name: str, value: Any) -> None:
    if value not in DISTRIBUTIONS:
        raise ValueError(f"{name} must be one of {DISTRIBUTIONS}, got {value!r}")


_NETWORK_COST = {
    "bitonic": "O(n k log^2 n) time, O(n k log^2 n) memory per row (log^2 n layers)",
    "odd_even": "O(n^2 k) time and memory per row (n layers); use small n",
    "splitter_selection": "O(n k log n) time and memory per row for small k; as a full sorter "
    "(soft_permutation) it is deeper than bitonic",
}


def _network_method(kind: str) -> _Method:
    def ranks(x: torch.Tensor, k: int, **params: Any) -> torch.Tensor:
        return network_ranks(x, k, network=kind, **params)

    def mask(x: torch.Tensor, k: int, **params: Any) -> torch.Tensor:
        return network_mask(x, k, network=kind, **params)

    def label_ranks(x: torch.Tensor, position: torch.Tensor, k: int, **params: Any) -> torch.Tensor:
        return network_label_ranks(x, position, k, network=kind, **params)

    info = MethodInfo(
        name=kind,
        outputs=("mask", "ranks", "permutation"),
        stochastic=False,
        cost=_NETWORK_COST[kind],
        params={"distribution": "cauchy", "steepness": 10.0, "art_lambda": 0.25},
        summary=f"relaxed {kind} network (Petersen et al. 2021/2022); masks in [0, 1], doubly "
        "stochastic ranks; not exactly permutation equivariant",
    )
    checks = {"distribution": _distribution, "steepness": _positive, "art_lambda": _unit_interval}
    return _Method(info, ranks, mask, label_ranks, checks)


_REGISTRY: dict[str, _Method] = {kind: _network_method(kind) for kind in NETWORK_TYPES}
_REGISTRY["neuralsort"] = _Method(
    MethodInfo(
        name="neuralsort",
        outputs=("mask", "ranks", "permutation"),
        stochastic=False,
        cost="O(n log n + n k) time, O(n k) memory per row",
        params={"tau": 1.0, "hard": False},
        summary="NeuralSort (Grover et al. 2019); permutation equivariant; rank columns sum to 1, "
        "an item's mask may exceed 1",
    ),
    neuralsort_ranks,
    checks={"tau": _positive, "hard": _boolean},
)
_REGISTRY["softsort"] = _Method(
    MethodInfo(
        name="softsort",
        outputs=("mask", "ranks", "permutation"),
        stochastic=False,
        cost="O(n k) time and memory per row (plus a top-k)",
        params={"tau": 1.0, "hard": False, "power": 1.0},
        summary="SoftSort (Prillo & Eisenschlos 2020); permutation equivariant; rank columns sum "
        "to 1, an item's mask may exceed 1",
    ),
    softsort_ranks,
    checks={"tau": _positive, "hard": _boolean, "power": _at_least_one},
)


_REGISTRY["lapsum"] = _Method(
    MethodInfo(
        name="lapsum",
        outputs=("mask",),
        stochastic=False,
        cost="O(n) time and memory per row plus a topk of 2k (a sort for a per-row tensor k)",
        params={"tau": 1.0},
        summary="closed-form Laplace-CDF mask F((x - t)/tau), t solved exactly so the mask sums to k; "
        "smooth, dense, in (0, 1); tau and a per-row k may be tensors (with gradients)",
    ),
    None,
    lambda x, k, tau: lapsum_mask(x, k, tau),
    checks={"tau": _positive_or_tensor},
    tensor_args=("k", "tau"),
)
_REGISTRY["sparse"] = _Method(
    MethodInfo(
        name="sparse",
        outputs=("mask",),
        stochastic=False,
        cost="'pav': O(n) memory, a topk of a few more than k (sort when many entries tie near the "
        "threshold); 'dykstra': O(n_iter n) after a sort",
        params={"l": 0.1, "p": 4.0 / 3.0, "solver": "pav", "n_iter": 500},
        summary="sparse soft top-k (Sander et al. 2023): p-norm regularised, exact zeros, in [0, 1], "
        "sums to k; p = 2 piecewise linear, p = 4/3 continuously differentiable",
    ),
    None,
    sparse_mask_rows,
    checks={"l": _positive, "p": _choice(P_VALUES), "solver": _choice(SOLVERS), "n_iter": check_n_samples},
)
_REGISTRY["perturbed"] = _Method(
    MethodInfo(
        name="perturbed",
        outputs=("mask",),
        stochastic=True,
        cost="O(n_samples n) time and memory per row",
        params={"sigma": 1.0, "n_samples": 100, "noise": "gaussian", "generator": None},
        summary="Monte-Carlo mean of hard k-hot masks of x + sigma Z (Berthet et al. 2020); sums to k, "
        "values multiples of 1/n_samples; perturbed-optimiser gradient estimator",
    ),
    None,
    perturbed_topk_rows,
    checks={"sigma": _positive, "n_samples": check_n_samples, "noise": check_noise_kind, "generator": check_generator},
)
_REGISTRY["gumbel"] = _Method(
    MethodInfo(
        name="gumbel",
        outputs=("mask", "ranks"),
        stochastic=True,
        cost="relaxation 'lapsum': O(n) plus a topk of 2k; 'subsets': O(k n) (k sequential softmaxes)",
        params={"tau": 1.0, "hard": False, "relaxation": "lapsum", "noise": True, "generator": None},
        summary="Gumbel top-k subset sampling (Xie & Ermon 2019): a relaxed sample of k items without "
        f"replacement, relaxations {RELAXATIONS}; ranks (the k successive softmaxes) need "
        "relaxation='subsets'",
    ),
    gumbel_ranks_rows,
    gumbel_mask_rows,
    checks={
        "tau": _positive,
        "hard": check_hard,
        "relaxation": check_relaxation,
        "noise": check_noise_flag,
        "generator": check_generator,
    },
)


def methods() -> dict[str, MethodInfo]:
    """All registered methods: what each returns, whether it is stochastic, its cost and defaults.

    Example:
        >>> import softtopk
        >>> info = softtopk.methods()["bitonic"]
        >>> info.outputs, info.stochastic
        (('mask', 'ranks', 'permutation'), False)
    """
    return {name: method.info for name, method in _REGISTRY.items()}


def resolve(method: Any, params: dict[str, Any], output: str) -> tuple[_Method, dict[str, Any]]:
    """Look ``method`` up, check it can give ``output``, and return it with validated parameters."""
    if not isinstance(method, str) or method not in _REGISTRY:
        raise ValueError(f"method must be one of {sorted(_REGISTRY)}, got {method!r}")
    spec = _REGISTRY[method]
    if output not in spec.info.outputs:
        raise ValueError(f"method {method!r} gives {spec.info.outputs}, not {output!r}")
    unknown = sorted(set(params) - set(spec.info.params))
    if unknown:
        raise TypeError(
            f"method {method!r} got unexpected parameter(s) {unknown}; it takes {sorted(spec.info.params)}"
        )
    resolved = {**spec.info.params, **params}
    for name, value in resolved.items():
        spec.checks[name](name, value)
    return spec, resolved
