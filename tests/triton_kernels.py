"""What the tests of the Triton kernels share: where the kernels run, and a count of their launches.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py)
on CPU tensors; on a CUDA machine they run compiled on the device."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed (it comes with the test extra on Linux)"
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Counted:
    """A kernel whose launches are recorded (their grids) in ``launched``; a launch dispatches no
    aten op on a GPU, so the interpreter's own data moves are hidden from the dispatch counter."""

    def __init__(self, kernel, launched: list) -> None:
        self.kernel, self.launched = kernel, launched

    def __getitem__(self, grid):
        self.launched.append(grid)

        def launch(*args, **kwargs):
            with _disable_current_modes():
                return self.kernel[grid](*args, **kwargs)

        return launch


def count_kernels(monkeypatch, module, *names: str, launched: list | None = None) -> list:
    """Replaces ``module``'s kernels ``names`` by counted ones; returns the list of their launches
    (``launched``, if given, to count several modules' kernels in one)."""
    launched = [] if launched is None else launched
    for name in names:
        monkeypatch.setattr(module, name, Counted(getattr(module, name), launched))
    return launched
