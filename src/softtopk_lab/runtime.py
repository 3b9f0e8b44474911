"""Where and in what order a run trains, and what it records of its environment: the device
(``--device``, ``torchrun``'s local rank), the seeded data order of each epoch, the git commit and
JSON-safe values for ``config.json``."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import torch

from .errors import UsageError


def resolve_device(text: str, local_rank: int | None = None) -> torch.device:
    """``--device`` as a ``torch.device``: ``cpu``, ``cuda`` (``cuda:LOCAL_RANK`` under torchrun) or ``cuda:N``.

    Raises:
        UsageError: an unknown device string, or CUDA requested but not available.
    """
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {text!r}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {text!r}")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {text}: CUDA is not available on this machine (use --device cpu)")
    index = device.index if device.index is not None else (local_rank or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The training order of epoch ``epoch``: a function of ``(seed, epoch)`` only, so replays are exact."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator)


def git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            check=False,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
