"""Count what one call dispatches: aten ops that launch work, value reads, and views.

On a GPU every dispatched op that computes something is a kernel launch, and every
``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``.tolist()``, ``nonzero``) is a host
synchronisation; on the CPU the same counts are the per-operator overhead. Views (``slice``,
``expand``, ``permute``, ``detach``, ...) only change metadata and launch nothing: they are counted
apart, so that the budget counts work, not bookkeeping. Uploads are tensors made from host data
(``torch.tensor``, ``new_tensor``: ``aten.lift_fresh``): on a GPU each is a copy from pageable host
memory, which waits for the host and cannot be captured in a CUDA graph.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from softtopk.ops import compute

_READ = torch.ops.aten._local_scalar_dense.default
_UPLOAD = torch.ops.aten.lift_fresh.default
# no-copy ops that are not marked as views in their schema
_METADATA = {torch.ops.aten._unsafe_view.default, torch.ops.aten.lift_fresh.default}


@dataclass
class Counts:
    launches: int = 0  # ops that compute (a kernel each on a GPU)
    views: int = 0
    reads: int = 0  # host reads of tensor values
    uploads: int = 0  # tensors made from host data (counted among the views too)
    ops: collections.Counter = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return self.launches + self.views


class _Counter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts = Counts()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counts = self.counts
        counts.uploads += func is _UPLOAD
        if func is _READ:
            counts.reads += 1
        elif func.is_view or func in _METADATA:
            counts.views += 1
        else:
            counts.launches += 1
            counts.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def count_call(
    fn: Callable[..., Any], *inputs: torch.Tensor, backward: bool = True, accelerator: bool = True
) -> Counts:
    """Counts of ``fn(*inputs)`` and, with ``backward``, of the backward of its output against a
    gradient made before counting starts (floating inputs require grad). With ``accelerator`` the
    kernels take the steps they take off the CPU (``softtopk.ops.compute.on_cpu`` false: the same
    values by other calls), so that the launches counted are a GPU's."""
    with accelerator_steps() if accelerator else contextlib.nullcontext():
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point() and backward) for t in inputs]
        out = fn(*leaves)  # a warm-up call: caches (e.g. network layouts) are filled outside the count
        grad = torch.ones_like(out) if backward else None
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point() and backward) for t in inputs]
        with _Counter() as counter:
            out = fn(*leaves)
            if backward:
                out.backward(grad)
    return counter.counts


@contextlib.contextmanager
def accelerator_steps():
    """Within the block the kernels take the steps they take off the CPU (``ops.compute.on_cpu``
    false): one ``topk``, ``sort``, ``bmm``, ``addcmul`` each, the same values by other calls."""
    saved = compute.on_cpu
    compute.on_cpu = lambda x: False
    try:
        yield
    finally:
        compute.on_cpu = saved
