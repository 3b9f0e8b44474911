"""The label sweep's backward (:class:`softtopk.ops.sorting_networks._LabelSweep`, what top-k
cross-entropy runs on its ``m`` selected scores) on CPU rows as one numba kernel (optional).

On a CPU the torch path's backward is about ten small tensor ops a layer of the network, each a
dispatch and a pass over a ``(wires, rows)`` slab; the kernel
(:mod:`softtopk.ops.networks_numba_kernels`) runs every layer in one call, from the forward's
saved differences and swap probabilities, with the same formulas in float64. Scope: the Cauchy
swap (the default) with a float steepness whose infinities saturate, float32 and float64 CPU
tensors whose values may be read (eager, outside the ``torch.func`` transforms), numba installed
(the scope of the Triton kernels, :mod:`softtopk.ops.networks_triton`, on the CPU). The forward
stays the torch path's: its ``atan`` is vectorised by torch, one by one in numba.
``triton_gate.torch_path()`` and ``SOFTTOPK_NUMBA=0`` turn it off; the tests hold it to the torch
path (``tests/test_networks_numba.py``).
"""

from __future__ import annotations

import torch

from . import compute, isotonic_numba, triton_gate
from .compute import can_inspect
from .isotonic_numba import numpy_rows

_DTYPES = (torch.float32, torch.float64)


def usable(wires: torch.Tensor, params: dict, mode: str) -> bool:
    """Whether the label sweep's backward through the saved ``wires`` (n, 2, B) runs on the kernel
    (decided by the forward, as the Triton kernels are)."""
    if params["distribution"] != "cauchy" or mode != "stand-in" or isinstance(params["steepness"], torch.Tensor):
        return False
    if not (wires.dtype in _DTYPES and compute.on_cpu(wires)) or torch.compiler.is_compiling():
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(wires):
        return False
    return triton_gate.KERNELS and can_inspect(wires) and isotonic_numba.available()


def label_backward(grad: torch.Tensor, plan: tuple, ctx, far: float) -> torch.Tensor:
    """The gradient of the scores (B, n) from that of the label's ranks ``grad`` (k, B), through the
    network ``plan`` (:func:`softtopk.ops.sorting_networks._plan`'s tuple) and the sweep saved in
    ``ctx`` (its wires, differences and swap probabilities; its steepness ``β``)."""
    from . import networks_numba_kernels as kernels  # imports numba: only once the kernel runs

    _, partner, sign, out_wires = plan[:4]
    wires, diffs, alphas = ctx.saved_tensors
    out = wires.new_empty((wires.shape[2], wires.shape[0]))
    arrays = (numpy_rows(grad), out_wires.numpy(), partner.numpy(), numpy_rows(sign[..., 0]), diffs.numpy())
    kernels.label_backward(*arrays, alphas.numpy(), numpy_rows(wires[:, 0]), far, ctx.params["steepness"], out.numpy())
    return out
