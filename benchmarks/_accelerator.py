"""CPU tensors down a CUDA tensor's path, for the scripts that count or time that path without a GPU
(``count_launches.py``, ``bench_host.py --stubbed-kernels``)."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from unittest import mock


def kernels() -> Iterator[tuple[ModuleType, str]]:
    """``(module, name)`` of every launchable kernel: the public ``triton.jit`` functions of the
    imported softtopk's Triton modules (``ops/*_kernels.py`` importing triton; found by file, so that
    an older checkout on ``PYTHONPATH`` is timed with its own); importing them imports triton."""
    import softtopk.ops

    for path in sorted(Path(softtopk.ops.__file__).parent.glob("*_kernels.py")):
        if "import triton" not in path.read_text():
            continue
        module = importlib.import_module(f"softtopk.ops.{path.stem}")
        for name, value in vars(module).items():
            if hasattr(value, "fn") and not name.startswith("_"):
                yield module, name


@contextlib.contextmanager
def accelerator_path() -> Iterator[None]:
    """Run CPU tensors down the path a CUDA tensor takes: no value checks, no CPU shortcut."""
    with (
        mock.patch("softtopk.ops.sparse.can_inspect", lambda value: False),
        mock.patch("softtopk._validation.can_inspect", lambda value: False),
        mock.patch("softtopk.ops.isotonic.can_inspect", lambda value: False),
        mock.patch("softtopk.ops.permutahedron.can_inspect", lambda value: False),
        mock.patch("softtopk.ops.isotonic_small._cap", lambda device: 128),
    ):
        yield


class _Stub:
    """A kernel whose launch computes nothing; the selection's zeroes its classes and positions,
    which the backward scatters with (through NumPy: no aten op is dispatched)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, grid):
        def launch(*args, **kwargs) -> None:
            if self.name == "label_select":
                args[3].numpy().fill(0)
                args[4].numpy().fill(0)

        return launch


@contextlib.contextmanager
def stubbed_kernels() -> Iterator[None]:
    """The accelerator path with every Triton kernel routed in and stubbed: what a CUDA call costs
    its host (dispatch, allocation, Python), measured on a CPU, less the launches' own cost."""
    from softtopk.ops import compute, triton_gate

    with contextlib.ExitStack() as stack:
        stack.enter_context(accelerator_path())
        stack.enter_context(mock.patch.object(compute, "on_cpu", lambda x: False))  # and so no numba
        usable = lambda x, k=0, scale=0.0: isinstance(k, int) and isinstance(scale, float)  # noqa: E731
        stack.enter_context(mock.patch.object(triton_gate, "usable", usable))
        for module, name in list(kernels()):
            stack.enter_context(mock.patch.object(module, name, _Stub(name)))
        yield


def switched(loss, module: str, name: str, value):
    """``loss`` with ``softtopk.ops.<module>.<name>`` set to ``value`` for the call (a fast path
    switched off, to time it against the path it replaced in the same run); None for a checkout on
    ``PYTHONPATH`` from before that module."""
    try:
        ops = importlib.import_module(f"softtopk.ops.{module}")
    except ImportError:
        return None

    def call(logits, target):
        saved = getattr(ops, name)
        setattr(ops, name, value)
        try:
            return loss(logits, target)
        finally:
            setattr(ops, name, saved)

    return call


def three_nodes(loss):
    """A top-k cross-entropy ``loss`` with its kernels launched by three chained autograd
    Functions and its rows reduced by torch ops: the one-node path (``ops/topk_ce_triton.py``) off."""
    return switched(loss, "topk_ce_triton", "usable", lambda rows, m: False)


def reduced_by_torch(loss):
    """``loss`` with its rows reduced by torch ops (``_layout.reduce_loss``), not by the
    reduction's kernel in its kernels' node (``ops/reduce_triton.py``)."""
    return switched(loss, "reduce_triton", "kernel_reduction", lambda rows, reduction: "none")
