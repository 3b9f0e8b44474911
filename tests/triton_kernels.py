"""What the tests of the Triton kernels share: where the kernels run, and a count of their launches.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set by conftest.py)
on CPU tensors; on a CUDA machine they run compiled on the device."""

from __future__ import annotations

import importlib.util
import inspect

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
            if not isinstance(self.kernel, Counted):  # else the inner one checks
                assert_floats_are_float64(self.kernel, args, kwargs)
            with _disable_current_modes():
                return self.kernel[grid](*args, **kwargs)

        return launch


def assert_floats_are_float64(kernel, args, kwargs) -> None:
    """Every Python float a launch passes lands in a parameter annotated ``tl.float64`` (or a
    ``constexpr``): compiled Triton types an unannotated float as float32, which the interpreter
    does not (τ = 0.1 would lose its low bits on a GPU only, and ``2^600`` would become ``inf``)."""
    import triton.language as tl

    parameters = inspect.signature(kernel.fn).parameters
    bound = dict(zip(parameters, args, strict=False)) | kwargs  # defaults may stay unpassed
    for name, value in bound.items():
        annotation = parameters[name].annotation
        if isinstance(value, float) and annotation is not tl.constexpr:
            assert annotation is tl.float64, f"{kernel.fn.__name__}({name}=float) needs `{name}: tl.float64`"


def count_kernels(monkeypatch, module, *names: str, launched: list | None = None) -> list:
    """Replaces ``module``'s kernels ``names`` by counted ones; returns the list of their launches
    (``launched``, if given, to count several modules' kernels in one)."""
    launched = [] if launched is None else launched
    for name in names:
        monkeypatch.setattr(module, name, Counted(getattr(module, name), launched))
    return launched


def usable_on_any_device(x, k, scale):
    """``triton_gate.usable`` without its device test: the same scope (an int ``k``, a float
    scale), compile and vmap excluded; patched in, it routes CPU rows to the kernels."""
    if torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(x):
        return False
    return isinstance(k, int) and isinstance(scale, float)


def route_kernels(monkeypatch, module, *names: str) -> list:
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts the launches of
    ``module``'s kernels ``names``."""
    from softtopk.ops import triton_gate

    launched = count_kernels(monkeypatch, module, *names)
    monkeypatch.setattr(triton_gate, "usable", usable_on_any_device)
    return launched


def both_paths(module, names, call, x) -> list:
    """``[(value, grad)]`` of ``call(x)`` by the torch path, then by ``module``'s kernels ``names``
    (which must run once forward and once backward), for one seeded upstream gradient."""
    from softtopk.ops import triton_gate

    out = []
    for kernels in (False, True):
        leaf = x.detach().clone().requires_grad_()
        with pytest.MonkeyPatch.context() as patch:
            launched = count_kernels(patch, module, *names)
            patch.setattr(triton_gate, "usable", usable_on_any_device if kernels else lambda *args: False)
            value = call(leaf)
            g = torch.randn(value.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype).to(x.device)
            (value * g).sum().backward()
        assert len(launched) == (2 if kernels else 0)
        out.append((value.detach(), leaf.grad))
    return out
