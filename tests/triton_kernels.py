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
        if name not in parameters:  # a launch option (num_warps)
            continue
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


def count_loss_kernels(monkeypatch, launched: list | None = None) -> list:
    """Counts the launches of top-k cross-entropy's own kernels (the selection, the head and the
    reduction), so that a test of another kernel family can route the whole loss to its kernels
    and still count aten ops only (a counted kernel's interpreter data moves are hidden)."""
    from softtopk.ops import ce_head_kernels, reduce_kernels, select_kernels

    launched = count_kernels(monkeypatch, select_kernels, "label_select", launched=launched)
    count_kernels(monkeypatch, reduce_kernels, "reduce_rows", launched=launched)
    return count_kernels(monkeypatch, ce_head_kernels, "head_forward", "head_backward", launched=launched)


def usable_on_any_device(x, k=0, scale=0.0):
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


def both_paths(module, names, call, x, launches: int = 2) -> list:
    """``[(value, grad)]`` of ``call(x)`` by the torch path, then by ``module``'s kernels ``names``
    (which must launch ``launches`` times forward and backward together: once each by default),
    for one seeded upstream gradient."""
    from softtopk.ops import triton_gate

    out = []
    for kernels in (False, True):
        leaf = x.detach().clone().requires_grad_()
        with pytest.MonkeyPatch.context() as patch:
            launched = count_kernels(patch, module, *names)
            patch.setattr(triton_gate, "usable", usable_on_any_device if kernels else lambda *args: False)
            patch.setattr(triton_gate, "KERNELS", kernels)  # the reference: no CPU numba kernel either
            value = call(leaf)
            g = torch.randn(value.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype).to(x.device)
            (value * g).sum().backward()
        assert len(launched) == (launches if kernels else 0)
        out.append((value.detach(), leaf.grad))
    return out


def second_derivative_raises(method: str, launched: list) -> None:
    """``soft_topk(x, 5, method=method)`` on its kernels (two launches, forward and backward)
    refuses a second derivative instead of returning a wrong one."""
    import softtopk

    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(DEVICE)
    x.requires_grad_()
    mask = softtopk.soft_topk(x, 5, method=method)
    w = torch.randn(mask.shape, dtype=mask.dtype).to(DEVICE).requires_grad_()
    (grad,) = torch.autograd.grad((mask * w).sum(), x, create_graph=True)
    assert len(launched) == 2
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def mask_launches(method: str, launched: list, budget: int) -> None:
    """``soft_topk(x, 10, method=method)`` on rows of 1000 runs its two kernels, reads no value and
    launches at most ``budget`` ops with them (issue 21's budgets at 64 x 1000: the call launches
    the same ops at any row count, and the interpreter runs each row's program in turn)."""
    import softtopk
    from dispatch_counter import count_call

    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    counts = count_call(lambda v: softtopk.soft_topk(v, 10, method=method), x)
    kernels = len(launched) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0
    assert counts.launches + kernels <= budget, counts.ops


LAYOUTS = ["row kernels", "tiled kernels"]


def kernel_layout(request, monkeypatch, launcher, names: tuple, tiled: tuple) -> tuple:
    """The kernels of layout ``request.param`` (one of :data:`LAYOUTS`) and their launches in one
    forward and backward: the row kernels ``names`` (one each way), or the tiled kernels ``tiled``
    (two each way), forced on every row by ``launcher`` (the kernels' module) in chunks of 64
    entries, so that even short rows are split."""
    if request.param == "tiled kernels":
        monkeypatch.setattr(launcher, "ROW_WORK", 0)
        monkeypatch.setattr(launcher, "CHUNK", 64)
        return tiled, 4
    return names, 2


def seeded_rows(rows: int, n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Standard normal rows ``(rows, n)`` on the kernels' device, from a seeded CPU generator."""
    return torch.randn(rows, n, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(DEVICE)


def mask_close(module, names, method: str, x, k: int, tau, tol: float, launches: int = 2) -> tuple:
    """``soft_topk(x, k, method=method, tau=tau)``'s mask and gradient on ``module``'s kernels
    ``names`` (``launches`` of them), equal to the torch path's within ``tol`` (the gradient's
    relative to its largest entry); NaN where the torch path has NaN."""
    import softtopk

    def call(v):
        return softtopk.soft_topk(v, k, method=method, tau=tau)

    (m0, g0), (m1, g1) = both_paths(module, names, call, x, launches)
    torch.testing.assert_close(m1, m0, rtol=0, atol=tol, equal_nan=True)
    scale = max(1.0, float(g0.nan_to_num().abs().max()))
    torch.testing.assert_close(g1, g0, rtol=0, atol=tol * scale, equal_nan=True)
    return m1, g1


def nan_row_stays_nan(close) -> None:
    """A NaN makes its row's mask NaN and leaves the other rows finite (``close(x, k)`` compares the
    kernels with the torch path and returns the mask and gradient)."""
    x = seeded_rows(3, 16, torch.float32)
    x[1, 4] = float("nan")
    mask, _ = close(x, 5)
    assert bool(mask[1].isnan().all()) and bool(mask[[0, 2]].isfinite().all())
