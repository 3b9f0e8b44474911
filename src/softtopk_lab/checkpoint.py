"""Atomic, code-free checkpoints and the complete random state of a training process.

A checkpoint written by :func:`save_atomic` is either the old file or the new one, never a torn
write (:func:`softtopk_lab.files.replace_atomic`). It holds tensors, numbers, strings and
containers only (numpy's random state is stored as a tensor), so :func:`load_checkpoint` reads it
with ``torch.load(..., weights_only=True)``: a planted file cannot run code, and a file that is not
a checkpoint of this format is a one-line error.
"""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import UsageError
from .files import replace_atomic

#: the ``format`` entry of every checkpoint this version writes and reads
FORMAT = "softtopk-lab-checkpoint/3"
#: the entries of every tool's checkpoint (:mod:`softtopk_lab.loop`, ``Run.save_checkpoint``)
ENTRIES = (
    "model",
    "optimizer",
    "epoch",
    "step",
    "best",
    "last_evaluation",
    "losses_since_evaluation",
    "correct_since_evaluation",
    "train_seconds",
    "rng",
    "elapsed",
)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: what the checked entries must hold (numbers; per-step losses as one-element tensors; hits and rows as ints)
_CHECKS = {
    "epoch": is_number,
    "step": is_number,
    "elapsed": is_number,
    "train_seconds": is_number,
    "losses_since_evaluation": lambda value: (
        isinstance(value, (list, tuple)) and all(isinstance(loss, torch.Tensor) and loss.numel() == 1 for loss in value)
    ),
    "correct_since_evaluation": lambda value: (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(count, int) and not isinstance(count, bool) and count >= 0 for count in value)
    ),
}


def malformed_entries(state: dict[str, Any]) -> list[str]:
    """The entries of :data:`ENTRIES` that ``state`` lacks or that do not hold what a run writes."""
    return [key for key in ENTRIES if key not in state or not _CHECKS.get(key, lambda value: True)(state[key])]


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random state a training loop may consume.

    Args:
        generators: the loop's own ``torch.Generator`` objects, by name.

    Returns:
        A dict with torch's CPU state, python ``random``, numpy, CUDA (all devices, when CUDA is
        initialised) and each generator's state; :func:`set_rng_state` restores it.
    """
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "generators": {name: gen.get_state() for name, gen in generators.items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Restore a state of :func:`rng_state` (the generators are updated in place)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    for name, gen in generators.items():
        gen.set_state(state["generators"][name])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(obj: dict[str, Any], path: Path) -> None:
    """``torch.save({**obj, "format": FORMAT}, path)``, atomically.

    Raises:
        UsageError: the disk is full or the directory cannot be written (the old checkpoint stays).
    """
    replace_atomic(Path(path), lambda stream: torch.save({**obj, "format": FORMAT}, stream))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint of :func:`save_atomic` on the CPU with ``weights_only=True``.

    Raises:
        UsageError: the file is damaged, from another format, or not a checkpoint (no code runs).
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(
            f"{path} is not a softtopk checkpoint (refused by torch.load(weights_only=True): {reason[:160]})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise UsageError(
            f"{path} is not a checkpoint of this softtopk version (format {found!r}, expected "
            f"{FORMAT!r}); start a new run with --out"
        )
    return state
