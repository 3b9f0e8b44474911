"""Atomic checkpoints and the complete random state of a training process.

A checkpoint written by :func:`save_atomic` is either the old file or the new one, never a torn
write: the data goes to a temporary file in the same directory, is fsynced, and replaces the target
with ``os.replace`` (atomic on POSIX), after which the directory entry is fsynced too.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Every random state a training loop may consume.

    Args:
        generators: the loop's own ``torch.Generator`` objects, by name.

    Returns:
        A dict with torch's CPU state, python ``random``, numpy, CUDA (all devices, when CUDA is
        initialised) and each generator's state; :func:`set_rng_state` restores it.
    """
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "generators": {name: gen.get_state() for name, gen in generators.items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Restore a state of :func:`rng_state` (the generators are updated in place)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    for name, gen in generators.items():
        gen.set_state(state["generators"][name])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save(obj, path)`` via a temporary file in the same directory, fsync and ``os.replace``.

    Args:
        obj: anything ``torch.save`` accepts.
        path: the final file name.
    """
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint of :func:`save_atomic` on the CPU.

    It holds our own training state (python and numpy random states included), so it is loaded with
    ``weights_only=False``: only resume from run directories you created.
    """
    return torch.load(path, map_location="cpu", weights_only=False)
