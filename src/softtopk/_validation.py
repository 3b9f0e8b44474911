"""The argument checks of softtopk, in one place: ``check_*(name, value, ...)`` returns the value,
normalised, or raises a ``TypeError``/``ValueError`` whose message names the argument, what was
expected and what was received. Families, compat adapters and Modules compose these; ``ops/``
never validates. The checks of Python values and the messages of the tensor checks come from
:mod:`softtopk._checks`, which :mod:`softtopk.jax` shares (each message is written once)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from . import _checks as msg

# the checks of Python values, re-exported (``as``: explicitly): families and compat take every check from here
from ._checks import SCALES as SCALES
from ._checks import check_bool as check_bool
from ._checks import check_choice as check_choice
from ._checks import check_int as check_int
from ._checks import check_k as check_k
from ._checks import check_number as check_number
from ._checks import check_real as check_real
from .ops.compute import can_inspect, compute_dtype

REDUCTIONS = ("mean", "sum", "none")


# ------------------------------------------------------------------------------------ scalars


def values_checked(value: torch.Tensor) -> bool:
    """Whether an argument's values are checked: only for CPU tensors outside ``torch.compile`` and
    ``vmap`` (as PyTorch's own losses do), where a check costs no device synchronisation; on an
    accelerator it would stall the host until the device catches up, so values there go unchecked."""
    return value.numel() > 0 and can_inspect(value)


def check_generator(name: str, value: Any, device: torch.device | None = None) -> torch.Generator | None:
    """``None`` or a :class:`torch.Generator` (on ``device``'s type when given)."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(value).__name__} {value!r}")
    if value is not None and device is not None and value.device.type != device.type:
        raise ValueError(
            f"{name} must be on the input's device type ({device.type}), got a {value.device.type} generator"
        )
    return value


def check_positive_or_tensor(name: str, value: Any) -> float | torch.Tensor:
    """A positive finite number, or a floating tensor of positive finite values (one per row or one)."""
    if not isinstance(value, torch.Tensor):
        return check_real(name, value, positive=True)
    if not value.is_floating_point():
        raise TypeError(msg.scale_not_floating(name, value.dtype))
    if values_checked(value) and not bool(((value > 0) & torch.isfinite(value)).all()):
        raise ValueError(msg.scale_not_positive(name, value.min().item()))
    return value


def _reals(name: str, value: Any) -> tuple[float, ...]:
    """A non-empty sequence (or 1-d tensor/array) of real numbers, as a tuple of floats."""
    if hasattr(value, "tolist"):  # torch tensors, numpy arrays
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise TypeError(f"{name} must be a non-empty sequence of floats, got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, numbers.Real) for v in value):
        raise TypeError(f"{name} must hold real numbers, got {list(value)!r}")
    return tuple(float(v) for v in value)


def check_p_k(name: str, value: Any) -> tuple[float, ...]:
    """``P_K``: finite weights ``>= 0`` summing to 1 (within 1e-4, as difftopk)."""
    values = _reals(name, value)
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"{name} entries must be finite and >= 0, got {list(values)}")
    if abs(sum(values) - 1.0) > 1e-4:
        raise ValueError(f"{name} must sum to 1, got {list(values)} summing to {sum(values)}")
    return values


def check_class_counts(name: str, value: Any, classes: int | None = None) -> tuple[float, ...]:
    """Per-class training counts: positive and finite (a zero count has no LDAM margin), ``classes`` of them."""
    counts = _reals(name, value)
    bad = [(c, n) for c, n in enumerate(counts) if not (math.isfinite(n) and n > 0)]
    if bad:
        c, n = bad[0]
        raise ValueError(
            f"{name} must hold positive finite class counts, got {n!r} for class {c} "
            "(a class without training examples has no LDAM margin)"
        )
    if classes is not None:
        check_count_length(name, len(counts), classes)
    return counts


def check_count_length(name: str, length: int, classes: int) -> None:
    """One class count per class: the functions check the list, the Modules their margins at call."""
    if length != classes:
        raise ValueError(f"{name} must have one count per class, C = {classes}, got length {length}")


def check_scale(name: str, value: Any, dtype: torch.dtype, *, zero: bool = False) -> Any:
    """A positive scale parameter (a float or tensor values) that the computation can use for
    scores of ``dtype``: between the smallest normal number of the compute dtype and its
    reciprocal (``zero``: 0 allowed too). Outside that range scores and gradients overflow or
    vanish to NaN, so it is an error."""
    info = torch.finfo(compute_dtype(dtype))
    low, high = info.tiny, 1.0 / info.tiny
    if isinstance(value, torch.Tensor):
        if not values_checked(value):
            return value
        ok = ((value >= low) | ((value == 0) if zero else False)) & (value <= high)
        if bool(ok.all()):
            return value
        value = value[~ok][0].item()
    elif (low <= value or (zero and value == 0)) and value <= high:
        return value
    raise ValueError(msg.scale_out_of_range(name, low, high, dtype, compute_dtype(dtype), value))


def check_scales(params: dict[str, Any], dtype: torch.dtype) -> None:
    """:func:`check_scale` for every scale parameter of a method's ``params``."""
    for name in SCALES:
        if name in params:
            check_scale(name, params[name], dtype)


# ------------------------------------------------------------------------------------ tensors


def check_scores(name: str, value: Any, *, dims: int | None = None, shape: str = "") -> torch.Tensor:
    """A floating tensor with at least one dimension (exactly ``dims`` when given; ``shape`` names it)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(msg.not_an_array(name, "torch.Tensor", value))
    if not value.is_floating_point():
        raise TypeError(msg.not_floating(name, value.dtype))
    if value.dim() == 0:
        raise ValueError(msg.zero_dim(name, "tensor"))
    if dims is not None and value.dim() != dims:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    return value


def check_neighbors(query: Any, neighbors: Any, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kNN embeddings: ``query (Q, d)`` and ``neighbors (N, d)`` with the same ``d`` and ``N >= k``."""
    query = check_scores("query", query, dims=2, shape="(Q, d)")
    neighbors = check_scores("neighbors", neighbors, dims=2, shape="(N, d)")
    if query.shape[1] != neighbors.shape[1]:
        raise ValueError(
            f"query and neighbors must have the same feature size d, got query {tuple(query.shape)} "
            f"and neighbors {tuple(neighbors.shape)}"
        )
    if k > neighbors.shape[0]:
        raise ValueError(f"k must satisfy k <= N = {neighbors.shape[0]} (the number of neighbors), got k = {k}")
    return query, neighbors


def check_labels(name: str, value: Any, rows: int, rows_name: str) -> torch.Tensor:
    """Integer labels of shape ``(rows,)``, one per row of ``rows_name``."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}")
    if value.shape != (rows,):
        raise ValueError(f"{name} must have shape ({rows},) to match {rows_name}, got {tuple(value.shape)}")
    return value


def check_noise(name: str, value: Any, shape: torch.Size, *, samples: int | None = None) -> torch.Tensor:
    """Given noise: a floating tensor of ``shape`` (``samples=None``) or ``shape + (S,)`` with
    ``S = samples`` (``samples=0``: any ``S >= 1``)."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise TypeError(
            f"{name} must be a floating torch.Tensor, got {type(value).__name__} {getattr(value, 'dtype', value)!r}"
        )
    if samples is None:
        if value.shape != shape:
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
        return value
    if (
        value.shape[:-1] != shape
        or value.dim() != len(shape) + 1
        or value.shape[-1] < 1
        or (samples and value.shape[-1] != samples)
    ):
        want = ", ".join(str(s) for s in (*shape, samples or "S"))
        raise ValueError(
            f"{name} must have shape ({want}): one noise draw per entry and sample, S >= 1, got {tuple(value.shape)}"
        )
    return value


def check_dim(x: torch.Tensor, dim: Any) -> int:
    """``dim`` as a non-negative axis of ``x``."""
    return msg.check_axis("dim", dim, x.dim())


def check_topk_args(x: Any, k: Any, dim: Any) -> tuple[torch.Tensor, int, int]:
    """An operator's scores ``x``, its axis ``dim`` (non-negative) and an int ``k`` in ``[1, n]``."""
    x = check_scores("x", x)
    dim = check_dim(x, dim)
    return x, dim, check_k(k, x.shape[dim], dim)


def check_k_tensor(k: torch.Tensor, n: int) -> torch.Tensor:
    """A tensor ``k`` of per-row values in ``(0, n]``, floating or integer (counts; returned as
    float32), values checked on CPU tensors only (unchecked on accelerators, under compile/vmap)."""
    if k.dtype == torch.bool or k.is_complex():
        raise TypeError(msg.k_dtype(k.dtype))
    if not k.is_floating_point():
        k = k.to(torch.float32)
    if values_checked(k) and not bool(((k > 0) & (k <= n)).all()):
        bad = k[~((k > 0) & (k <= n))][0].item()
        raise ValueError(msg.k_out_of_range(n, bad))
    return k


# ------------------------------------------------------------------------------- class losses


def check_class_input(input: Any) -> torch.Tensor:
    """Loss scores of shape ``(N, C)`` or ``(N, C, d1, ...)``."""
    input = check_scores("input", input)
    if input.dim() < 2:
        raise ValueError(f"input must have shape (N, C) or (N, C, d1, ...), got {tuple(input.shape)}")
    return input


def check_classes_match(input: Any, n_classes: int) -> torch.Tensor:
    """Class-loss ``input`` whose class axis (dim 1) has the ``n_classes`` a loss was built with."""
    input = check_class_input(input)
    if input.shape[1] != n_classes:
        raise ValueError(
            f"input has {input.shape[1]} classes (dim 1 of shape {tuple(input.shape)}), "
            f"but the loss was built with n_classes = {n_classes}"
        )
    return input


def check_class_target(input: torch.Tensor, target: Any, ignore_index: int) -> torch.Tensor:
    """Class-index targets of shape ``(N, d1, ...)`` for ``input`` of shape ``(N, C, d1, ...)``; their
    values (in ``[0, C)`` or ``ignore_index``) are checked where :func:`values_checked` allows (one
    host read)."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor of class indices, got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"target must hold integer class indices, got dtype {target.dtype}")
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"target must have shape {expected} for input of shape {tuple(input.shape)}, got {tuple(target.shape)}"
        )
    if values_checked(target):
        classes = input.shape[1]
        bad = (target != ignore_index) & ((target < 0) | (target >= classes))
        if bool(bad.any()):
            raise ValueError(
                f"target values must be in [0, {classes - 1}] (or ignore_index={ignore_index}), "
                f"got {target[bad][0].item()}"
            )
    return target


def check_class_weight(weight: Any, classes: int | None) -> torch.Tensor | None:
    """Per-class weights ``(C,)``; ``classes=None`` accepts any length (checked again at forward). Their
    values (finite, ``>= 0``) are checked where :func:`values_checked` allows (one host read)."""
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight must be a floating torch.Tensor of shape (C,) or None, got {weight!r}")
    if weight.dim() != 1 or (classes is not None and weight.shape[0] != classes):
        expected = "(C,)" if classes is None else f"({classes},)"
        raise ValueError(f"weight must have shape {expected}, got {tuple(weight.shape)}")
    if values_checked(weight) and not bool(((weight >= 0) & torch.isfinite(weight)).all()):
        bad = weight[~((weight >= 0) & torch.isfinite(weight))][0].item()
        raise ValueError(f"weight must hold finite values >= 0 (class weights), got {bad!r}")
    return weight


def check_relevance(relevance: Any, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Graded relevance of ``scores``' shape; its values where ``mask`` is ``True`` (all without a
    mask) must be finite and ``>= 0``, checked where :func:`values_checked` allows (one host read)."""
    relevance = check_scores("relevance", relevance)
    if relevance.shape != scores.shape:
        raise ValueError(f"relevance must have the shape of scores {tuple(scores.shape)}, got {tuple(relevance.shape)}")
    if values_checked(relevance):
        bad = ~((relevance >= 0) & torch.isfinite(relevance))
        if mask is not None:
            bad &= mask
        if bool(bad.any()):
            raise ValueError(
                f"relevance must hold finite values >= 0 (graded relevance), got {relevance[bad][0].item()!r}"
            )
    return relevance


def check_reduction(reduction: Any) -> str:
    """One of ``'mean'``, ``'sum'``, ``'none'``."""
    return check_choice("reduction", reduction, REDUCTIONS)


def check_ignore_index(ignore_index: Any) -> int:
    """The target value that contributes nothing (an int, any sign)."""
    return check_int("ignore_index", ignore_index)
