"""The registry of soft top-k methods: what each computes, its parameters and their checks.

Every method works on rows: ``x`` of shape ``(B, n)`` in a floating compute dtype. The operators
(:mod:`softtopk.operators`) validate, reshape and dispatch here; adding a method is one row kernel
in ``ops/`` plus one entry below.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from ._checks import P_VALUES, SOLVERS
from ._extended import Kernel, extended_mask, extended_ranks, mask_from_ranks
from ._validation import (
    check_bool,
    check_choice,
    check_generator,
    check_int,
    check_positive_or_tensor,
    check_real,
)
from .ops._straight_through import straight_through_mask, straight_through_ranks
from .ops.compute import label_row
from .ops.gumbel import RELAXATIONS, gumbel_keys, gumbel_ranks_rows
from .ops.lapsum import lapsum_mask
from .ops.networks import NETWORK_TYPES
from .ops.neuralsort import neuralsort_label_ranks, neuralsort_label_stage, neuralsort_mask, neuralsort_ranks
from .ops.perturbed import NOISE_KINDS, perturbed_topk_rows
from .ops.softsort import softsort_mask, softsort_ranks
from .ops.sorting_networks import network_label_ranks, network_label_stage, network_mask, network_ranks
from .ops.sparse import sparse_mask_rows
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


Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class _Method:
    info: MethodInfo
    ranks: Callable[..., torch.Tensor] | None
    mask: Callable[..., torch.Tensor] | None = None
    label_ranks: Callable[..., torch.Tensor] | None = None
    checks: dict[str, Check] = field(default_factory=dict)
    tensor_args: tuple[str, ...] = ()  # arguments that may be tensors, one value per row ("k", ...)
    joint: Callable[[dict[str, Any], str], None] | None = None  # a check of several parameters
    label_stage: Callable[..., Any] | None = None  # the label's ranks as kernels (ops/topk_ce_triton.py)

    def rank_kernel(self) -> Callable[..., torch.Tensor]:
        """``ranks`` (:func:`resolve` gives the ranks and permutation outputs only to methods with one)."""
        if self.ranks is None:
            raise ValueError(f"method {self.info.name!r} has no ranks kernel")
        return self.ranks

    def mask_kernel(self) -> Callable[..., torch.Tensor]:
        """``mask``, or the sum of the ranks where a method has no mask kernel of its own."""
        if self.mask is not None:
            return self.mask
        ranks = self.rank_kernel()
        return lambda rows, k, **params: ranks(rows, k, **params).sum(-1)


def _positive(name: str, value: Any) -> float:
    return check_real(name, value, positive=True)


def _choice(options: tuple) -> Check:
    return functools.partial(check_choice, options=options)


def _count(name: str, value: Any) -> int:
    return check_int(name, value, low=1)


def _with_hard(mask: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A mask kernel (exact on rows with ±inf entries but no degenerate case) extended to every row
    (:mod:`softtopk._extended`), with the ``hard`` option: the exact k-hot forward, the soft mask's
    gradient backward."""

    def hard_or_soft(x: torch.Tensor, k: int, *, hard: bool, **params: Any) -> torch.Tensor:
        soft = extended_mask(x, k, lambda rows, kk: mask(rows, kk, **params))
        return straight_through_mask(x, k, soft) if hard else soft

    return hard_or_soft


def _ranks_with_hard(ranks: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A rank kernel (exact on the ranks of the finite entries of rows with ``-inf`` entries)
    extended to every row, with the straight-through ``hard`` option."""

    def hard_or_soft(x: torch.Tensor, k: int, *, hard: bool, **params: Any) -> torch.Tensor:
        soft = extended_ranks(x, k, lambda rows, kk: ranks(rows, kk, **params))
        return straight_through_ranks(x, soft) if hard else soft

    return hard_or_soft


def _label_with_hard(
    ranks: Callable[..., torch.Tensor], label: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    """``P[b, position[b], :k]`` by ``label`` (one row of the ranks), or from the ranks of every row
    with ``hard`` (the straight-through ranks need them all)."""

    def hard_or_soft(x: torch.Tensor, position: torch.Tensor, k: int, *, hard: bool, **params: Any) -> torch.Tensor:
        if hard:
            return label_row(ranks(x, k, hard=True, **params), position)
        return label(x, position, k, **params)

    return hard_or_soft


def _exact_with_hard(kernel: Callable[..., torch.Tensor], *, ranks: bool) -> Callable[..., torch.Tensor]:
    """A mask (``ranks=False``) or rank kernel that is exact on every row itself (the ``±inf``
    semantics of :mod:`softtopk._extended` inside the kernel, no value read), with the
    straight-through ``hard`` option."""

    def hard_or_soft(x: torch.Tensor, k: int, *, hard: bool, **params: Any) -> torch.Tensor:
        soft = kernel(x, k, **params)
        if not hard:
            return soft
        return straight_through_ranks(x, soft) if ranks else straight_through_mask(x, k, soft)

    return hard_or_soft


def _dykstra_solves_p2(params: dict[str, Any], output: str) -> None:
    if params["solver"] == "dykstra" and params["p"] != 2:
        raise ValueError(f"solver='dykstra' solves p=2 only, got p={params['p']!r}; use solver='pav' for p=4/3")


def _ranks_need_subsets(params: dict[str, Any], output: str) -> None:
    if output != "mask" and params["relaxation"] != "subsets":
        raise ValueError(f"relaxation {params['relaxation']!r} gives a mask only; ranks need relaxation='subsets'")


_NETWORK_COST = {
    "bitonic": "O(n k log^2 n) time, O(n k log^2 n) memory per row (log^2 n layers)",
    "odd_even": "O(n^2 k) time and memory per row (n layers); use small n",
    "splitter_selection": "O(n k log n) time and memory per row for small k; as a full sorter "
    "(soft_permutation) it is deeper than bitonic",
}


def _network_mask(kind: str) -> Callable[..., torch.Tensor]:
    """The network mask, exact on every row of the extended reals by itself (no value read; it
    bypasses :mod:`softtopk._extended`), with the ``hard`` option."""

    def hard_or_soft(x: torch.Tensor, k: int, *, hard: bool, **params: Any) -> torch.Tensor:
        soft = network_mask(x, k, network=kind, **params)
        return straight_through_mask(x, k, soft) if hard else soft

    return hard_or_soft


def _network_method(kind: str) -> _Method:
    ranks = _ranks_with_hard(functools.partial(network_ranks, network=kind))
    label_ranks = _label_with_hard(ranks, functools.partial(network_label_ranks, network=kind))
    stage = functools.partial(network_label_stage, network=kind)

    info = MethodInfo(
        name=kind,
        outputs=("mask", "ranks", "permutation"),
        stochastic=False,
        cost=_NETWORK_COST[kind],
        params={"distribution": "cauchy", "steepness": 10.0, "art_lambda": 0.25, "hard": False},
        summary=f"relaxed {kind} network (Petersen et al. 2021/2022); masks in [0, 1], doubly "
        "stochastic ranks; not exactly permutation equivariant; steepness may be a per-row tensor "
        "(with gradients)",
    )
    checks: dict[str, Check] = {
        "distribution": _choice(DISTRIBUTIONS),
        "steepness": check_positive_or_tensor,
        "art_lambda": functools.partial(check_real, low=0.0, below=1.0),
        "hard": check_bool,
    }
    return _Method(info, ranks, _network_mask(kind), label_ranks, checks, ("steepness",), label_stage=stage)


_REGISTRY: dict[str, _Method] = {kind: _network_method(kind) for kind in NETWORK_TYPES}


def _permutation_method(
    name: str, paper: str, cost: str, ranks, mask, label=None, stage=None, **extra: tuple[Any, Callable]
) -> _Method:
    """NeuralSort and SoftSort: exact on every row, ``tau`` a float or per-row tensor; ``label``
    the label's row of the ranks where the method has its own (``stage``: by kernels); ``extra``
    maps further parameters to ``(default, check)``."""
    rank_kernel = _exact_with_hard(ranks, ranks=True)
    return _Method(
        MethodInfo(
            name=name,
            outputs=("mask", "ranks", "permutation"),
            stochastic=False,
            cost=cost,
            params={"tau": 1.0, "hard": False, **{key: default for key, (default, _) in extra.items()}},
            summary=f"{paper}; permutation equivariant; rank columns sum to 1, an item's mask may exceed 1; "
            "tau may be a per-row tensor (with gradients)",
        ),
        rank_kernel,
        _exact_with_hard(mask, ranks=False),
        None if label is None else _label_with_hard(rank_kernel, label),
        checks={
            "tau": check_positive_or_tensor,
            "hard": check_bool,
            **{key: check for key, (_, check) in extra.items()},
        },
        tensor_args=("tau",),
        label_stage=stage,
    )


_REGISTRY["neuralsort"] = _permutation_method(
    "neuralsort",
    "NeuralSort (Grover et al. 2019)",
    "O(n log n + n k) time, O(n k) memory per row",
    neuralsort_ranks,
    neuralsort_mask,
    neuralsort_label_ranks,
    neuralsort_label_stage,
)
_REGISTRY["softsort"] = _permutation_method(
    "softsort",
    "SoftSort (Prillo & Eisenschlos 2020)",
    "O(n k) time and memory per row (plus a top-k)",
    softsort_ranks,
    softsort_mask,
    power=(1.0, functools.partial(check_real, low=1.0)),
)


def _mask_method(
    name: str,
    mask: Callable[..., torch.Tensor],
    *,
    stochastic: bool,
    cost: str,
    params: dict[str, Any],
    summary: str,
    **options: Any,
) -> _Method:
    """A mask-only method (no rank kernel); ``options``: its ``_Method``'s ``checks``, ``tensor_args``, ``joint``."""
    info = MethodInfo(name, ("mask",), stochastic, cost, params, summary)
    return _Method(info, None, mask, **options)


_REGISTRY["lapsum"] = _mask_method(
    "lapsum",
    # ±inf and hard=True inside the kernel: one topk and no value read
    lambda x, k, *, hard, tau: lapsum_mask(x, k, tau, hard=hard),
    stochastic=False,
    cost="O(n) time and memory per row plus a topk of 2k (a sort for a per-row tensor k)",
    params={"tau": 1.0, "hard": False},
    summary="closed-form Laplace-CDF mask F((x - t)/tau), t solved exactly so the mask sums to k; "
    "smooth, dense, in (0, 1); tau and a per-row k may be tensors (with gradients)",
    checks={"tau": check_positive_or_tensor, "hard": check_bool},
    tensor_args=("k", "tau"),
)
_REGISTRY["sparse"] = _mask_method(
    "sparse",
    sparse_mask_rows,  # ±inf and ``hard`` inside the kernel (no value read)
    stochastic=False,
    cost="'pav': O(n) memory; a topk of a few more than k on CPU tensors (a sort when many entries "
    "lie near the threshold), a sort of each row on accelerators; 'dykstra': O(n_iter n) after a sort",
    params={"l": 0.1, "p": 4.0 / 3.0, "solver": "pav", "n_iter": 500, "hard": False},
    summary="sparse soft top-k (Sander et al. 2023): p-norm regularised, exact zeros, in [0, 1], "
    "sums to k; p = 2 piecewise linear, p = 4/3 smooth where entries leave 0; l may be a per-row "
    "tensor (with gradients)",
    checks={
        "l": check_positive_or_tensor,
        "p": _choice(P_VALUES),
        "solver": _choice(SOLVERS),
        "n_iter": _count,
        "hard": check_bool,
    },
    tensor_args=("l",),
    joint=_dykstra_solves_p2,
)
_REGISTRY["perturbed"] = _mask_method(
    "perturbed",
    _exact_with_hard(perturbed_topk_rows, ranks=False),
    stochastic=True,
    cost="O(n_samples n) time and memory per row",
    params={"sigma": 1.0, "n_samples": 100, "noise": "gaussian", "generator": None, "hard": False},
    summary="Monte-Carlo mean of hard k-hot masks of x + sigma Z (Berthet et al. 2020); sums to k, "
    "values multiples of 1/n_samples; perturbed-optimiser gradient estimator",
    checks={
        "sigma": _positive,
        "n_samples": _count,
        "noise": _choice(NOISE_KINDS),
        "generator": check_generator,
        "hard": check_bool,
    },
)


def _gumbel_rows(params: dict[str, Any]) -> Kernel:
    # gumbel takes an int k only ("k" is not in its tensor_args), so the kernel's k is an int; the
    # relaxation is "subsets" here (the lapsum relaxation has no ranks)
    tau, hard, noise, generator = params["tau"], params["hard"], params["noise"], params["generator"]
    return lambda rows, k: gumbel_ranks_rows(rows, cast(int, k), tau=tau, hard=hard, noise=noise, generator=generator)


def _gumbel_ranks(x: torch.Tensor, k: int, **params: Any) -> torch.Tensor:
    # ``hard`` forwards the sampled subset (the top-k of the keys), so it stays inside the kernel
    return extended_ranks(x, k, _gumbel_rows(params))


def _gumbel_mask(x: torch.Tensor, k: int, **params: Any) -> torch.Tensor:
    if params["relaxation"] == "subsets":
        return mask_from_ranks(x, k, _gumbel_rows(params))
    # the lapsum mask of the keys (finite noise keeps every ±inf where it is), by lapsum's own
    # entry: its ±inf handling, and its hard=True (the k-hot of the keys, a sample)
    keys = gumbel_keys(x, params["noise"], params["generator"])
    return _REGISTRY["lapsum"].mask_kernel()(keys, k, hard=params["hard"], tau=params["tau"])


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
    _gumbel_ranks,
    _gumbel_mask,
    checks={
        "tau": _positive,
        "hard": check_bool,
        "relaxation": _choice(RELAXATIONS),
        "noise": check_bool,
        "generator": check_generator,
    },
    joint=_ranks_need_subsets,
)


def register_tensor_params(module: torch.nn.Module, params: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Register a method's tensor parameters on ``module`` (an ``nn.Parameter`` as a parameter, any
    other tensor as a buffer), so that they appear in ``parameters()``/``state_dict()`` and follow
    ``.to()``; return the other parameters and the registered names (read back at every forward)."""
    plain, names = {}, []
    for name, value in params.items():
        if isinstance(value, torch.nn.Parameter):
            module.register_parameter(name, value)
        elif isinstance(value, torch.Tensor):
            module.register_buffer(name, value)
        else:
            plain[name] = value
            continue
        names.append(name)
    return plain, tuple(names)


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
        raise TypeError(f"method {method!r} got unexpected parameter(s) {unknown}; it takes {sorted(spec.info.params)}")
    resolved = {name: spec.checks[name](name, value) for name, value in {**spec.info.params, **params}.items()}
    if spec.joint is not None:
        spec.joint(resolved, output)
    return spec, resolved
