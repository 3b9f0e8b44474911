"""Argument checks with messages that name the argument, the expectation and the value received."""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

REDUCTIONS = ("mean", "sum", "none")


def check_scores(x: Any, name: str = "x") -> torch.Tensor:
    """A floating-point tensor with at least one dimension."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype (float16/bfloat16/float32/float64), got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d tensor")
    return x


def check_number(name: str, value: Any) -> float:
    """``value`` as a float; TypeError for anything but a real number (bools included)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_real(name: str, value: Any, *, positive: bool) -> float:
    """``value`` as a finite float (``positive``: also ``> 0``); TypeError/ValueError otherwise."""
    if not math.isfinite(check_number(name, value)) or (positive and value <= 0):
        kind = "a positive finite" if positive else "a finite"
        raise ValueError(f"{name} must be {kind} number, got {value!r}")
    return float(value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores are computed in: float64 stays float64, every other float becomes float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_class_input(input: Any) -> torch.Tensor:
    """Loss scores of shape ``(N, C)`` or ``(N, C, d1, ...)``."""
    input = check_scores(input, "input")
    if input.dim() < 2:
        raise ValueError(f"input must have shape (N, C) or (N, C, d1, ...), got {tuple(input.shape)}")
    return input


def check_dim(x: torch.Tensor, dim: Any) -> int:
    """``dim`` as a non-negative axis of ``x``."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int, got {type(dim).__name__} {dim!r}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be in [{-x.dim()}, {x.dim() - 1}] for a {x.dim()}-d input, got {dim}")
    return int(dim) % x.dim()


def check_k(k: Any, n: int, dim: int) -> int:
    """``k`` as an int with ``1 <= k <= n``."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
    if not 1 <= k <= n:
        raise ValueError(f"k must satisfy 1 <= k <= n = {n} (the size of dim {dim}), got {k}")
    return int(k)


def can_inspect(value: torch.Tensor) -> bool:
    """Whether a tensor's values may be read (a check, a data-dependent branch): not while compiling
    or inside vmap."""
    return not torch.compiler.is_compiling() and not torch._C._functorch.is_batchedtensor(value)


def check_k_tensor(k: torch.Tensor, n: int) -> torch.Tensor:
    """A floating tensor ``k`` of per-row values in ``(0, n]`` (values unchecked under compile/vmap)."""
    if not k.is_floating_point():
        raise TypeError(f"k must be an int or a floating tensor, got a tensor of dtype {k.dtype}")
    if can_inspect(k) and k.numel() and not bool(((k > 0) & (k <= n)).all()):
        bad = k[~((k > 0) & (k <= n))][0].item()
        raise ValueError(f"k must lie in (0, n = {n}] in every row, got {bad}")
    return k


def check_reduction(reduction: Any) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def check_class_target(input: torch.Tensor, target: Any, ignore_index: int) -> torch.Tensor:
    """Class-index targets of shape ``(N, d1, ...)`` for ``input`` of shape ``(N, C, d1, ...)``."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor of class indices, got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"target must hold integer class indices, got dtype {target.dtype}")
    expected = (input.shape[0],) + tuple(input.shape[2:])
    if tuple(target.shape) != expected:
        raise ValueError(
            f"target must have shape {expected} for input of shape {tuple(input.shape)}, "
            f"got {tuple(target.shape)}"
        )
    if not torch.compiler.is_compiling() and target.numel():
        classes = input.shape[1]
        bad = (target != ignore_index) & ((target < 0) | (target >= classes))
        if bool(bad.any()):
            raise ValueError(
                f"target values must be in [0, {classes - 1}] (or ignore_index={ignore_index}), "
                f"got {target[bad][0].item()}"
            )
    return target


def check_class_weight(weight: Any, classes: int | None) -> torch.Tensor | None:
    """Per-class weights ``(C,)``; ``classes=None`` accepts any length (checked again at forward)."""
    if weight is None:
        return None
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise TypeError(f"weight must be a floating torch.Tensor of shape (C,) or None, got {weight!r}")
    if weight.dim() != 1 or (classes is not None and weight.shape[0] != classes):
        expected = "(C,)" if classes is None else f"({classes},)"
        raise ValueError(f"weight must have shape {expected}, got {tuple(weight.shape)}")
    return weight
