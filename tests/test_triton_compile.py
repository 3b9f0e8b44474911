"""Every Triton kernel compiles for a Hopper GPU (sm_90), on a machine without one.

The interpreter tests (``test_*_triton.py``) hold the kernels' values to the torch path, but the
interpreter runs them as Python: a kernel that it runs and the compiler refuses (a type that
changes in a loop, a branch of the wrong type; run 10 of ``benchmarks/results/gpu_runs.md``)
passes them. Here the public operators run on CPU rows routed to the kernels in the interpreter,
with every launch's signature recorded (pointer dtypes, scalar types, constexpr values), and a
process outside the interpreter compiles each distinct one to a cubin for sm_90
(``compile_kernels.py``). Every public kernel of the Triton modules must be launched by the calls
below at least once."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from triton_kernels import needs_triton, seeded_rows, usable_on_any_device  # noqa: E402

pytestmark = needs_triton

MODULES = triton_gate.KERNEL_MODULES
POINTERS = {
    torch.float32: "*fp32",
    torch.float64: "*fp64",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.int8: "*i8",
    torch.bool: "*i1",
}


def _kernels(module) -> dict:
    """The module's launchable kernels: its public ``triton.jit`` functions (helpers are private)."""
    return {name: value for name, value in vars(module).items() if hasattr(value, "fn") and not name.startswith("_")}


def _signature(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """Triton's ``(signature, constexprs)`` of one launch."""
    import triton.language as tl

    parameters = inspect.signature(kernel.fn).parameters
    bound = dict(zip(parameters, args, strict=False)) | kwargs
    names = list(parameters)
    do_not_specialize = {names[i] if isinstance(i, int) else i for i in getattr(kernel, "do_not_specialize", ())}
    signature, constexprs = {}, {}
    for name, parameter in parameters.items():
        value = bound.get(name, parameter.default)
        if parameter.annotation is tl.constexpr or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = POINTERS[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int) and value == 1 and name not in do_not_specialize:
            signature[name], constexprs[name] = "constexpr", 1  # as Triton's JIT specialises a 1
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        else:
            signature[name] = "fp64" if parameter.annotation is tl.float64 else "fp32"
    return signature, constexprs


class _Recorded:
    """A kernel whose launches are recorded, then run (in the interpreter)."""

    def __init__(self, module: str, name: str, kernel, launches: dict) -> None:
        self.module, self.name, self.kernel, self.launches = module, name, kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            signature, constexprs = _signature(self.kernel, args, kwargs)
            options = {name: value for name, value in kwargs.items() if name not in signature}  # num_warps
            key = json.dumps([self.module, self.name, signature, constexprs, options], sort_keys=True, default=str)
            self.launches[key] = {
                "module": self.module,
                "kernel": self.name,
                "signature": signature,
                "constexprs": constexprs,
                "options": options,
            }
            return self.kernel[grid](*args, **kwargs)

        return launch


def _calls():
    """Public calls that reach every kernel, in float32, float64 and bfloat16 where the kernels take them."""
    target = torch.tensor([3, 0])
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = seeded_rows(2, 40, torch.float32, seed=1).to(dtype).requires_grad_()
        yield lambda x=x: softtopk.soft_topk(x, 5)
        yield lambda x=x: softtopk.soft_topk(x, 5, hard=True)
        yield lambda x=x: softtopk.topk(x, 5).values
        for p in (4.0 / 3.0, 2.0):
            yield lambda x=x, p=p: softtopk.sparse_topk_mask(x, 5, l=0.1, p=p)
        for method in ("neuralsort", "softsort", "splitter_selection", "bitonic"):
            yield lambda x=x, method=method: softtopk.soft_topk(x, 5, method=method)
        for method in ("splitter_selection", "neuralsort"):
            yield lambda x=x, method=method: softtopk.TopKCrossEntropyLoss([0.5, 0.5], method=method, m=8)(x, target)
        for mode in ("smce", "sort"):  # the head's other variants
            yield lambda x=x, mode=mode: softtopk.TopKCrossEntropyLoss([0.5, 0.5], m=8, top1_mode=mode)(x, target)
        yield lambda x=x: softtopk.TopKCrossEntropyLoss([0.5, 0.5], m=8, reduction="sum")(x, target)
        yield lambda x=x: softtopk.SmoothTopKSVM(k=3)(x, target)
        for epsilon in (1.0, 0.0):
            yield lambda x=x, epsilon=epsilon: softtopk.BalNoisedTopK(3, epsilon=epsilon)(x, target)
        yield lambda x=x: softtopk.ImbalNoisedTopK(3, epsilon=0.5, max_m=0.3, cls_num_list=range(1, 41))(x, target)
        yield lambda x=x: softtopk.soft_rank(x)
        yield lambda x=x: softtopk.soft_sort(x)
        yield lambda x=x: softtopk.soft_rank(x[:, :1])  # n = 1, which Triton's JIT passes as a constexpr
        yield lambda x=x: softtopk.soft_rank(x, strength=torch.tensor(0.5))  # a tensor strength: PAV's kernel
        yield lambda x=x: softtopk.soft_rank(x, regularization="kl")
        yield lambda x=x: softtopk.soft_sort(x, regularization="kl")
        yield lambda x=x: softtopk.soft_sort(x, regularization="kl", strength=torch.tensor(0.5))  # PAV's kl kernel
    long = seeded_rows(2, 1500, torch.float32, seed=2).requires_grad_()  # longer than one tile
    for p in (4.0 / 3.0, 2.0):
        yield lambda p=p: softtopk.sparse_topk_mask(long, 5, l=0.1, p=p)


@pytest.fixture(scope="module")
def launches():
    """The distinct launches of the calls, with the tiled NeuralSort and SoftSort kernels too."""
    from softtopk.ops import (
        isotonic,
        label_select,
        neuralsort_triton,
        noised_numba,
        permutahedron,
        softsort_triton,
        triton_gate,
    )

    recorded: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(triton_gate, "usable", usable_on_any_device)
        patch.setattr(isotonic, "can_inspect", lambda value: False)  # CPU rows as CUDA ones go: no numba PAV
        patch.setattr(permutahedron, "can_inspect", lambda value: False)
        patch.setattr(label_select, "usable", lambda logits, m: False)  # top-k CE's selection: no numba kernel
        patch.setattr(noised_numba, "fresh", lambda *args: None)  # the noised losses draw with torch.randn
        for name in MODULES:
            module = importlib.import_module(f"softtopk.ops.{name}")
            for kernel_name, kernel in _kernels(module).items():
                patch.setattr(module, kernel_name, _Recorded(name, kernel_name, kernel, recorded))
        for tiled in (False, True):
            if tiled:
                patch.setattr(neuralsort_triton, "ROW_WORK", 0)
                patch.setattr(softsort_triton, "ROW_WORK", 0)
            for call in _calls():
                out = call()
                out.float().sum().backward()
    return list(recorded.values())


def test_every_kernel_is_launched(launches):
    expected = {
        (name, kernel) for name in MODULES for kernel in _kernels(importlib.import_module(f"softtopk.ops.{name}"))
    }
    assert {(launch["module"], launch["kernel"]) for launch in launches} == expected


def test_every_launch_compiles_for_sm90(launches, tmp_path):
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(launches, default=str))
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton's default, said explicitly (it warns otherwise)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "compile_kernels.py"), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert failures == [], "\n\n".join(f"{f['module']}.{f['kernel']}: {f['error']}" for f in failures)
