"""The label sweep (:class:`softtopk.ops.sorting_networks._LabelSweep`, what top-k cross-entropy
runs on its ``m`` selected scores) on CPU rows as two numba kernels (optional).

On a CPU the torch path is about ten small tensor ops a layer of the network each way, each a
dispatch and a pass over a ``(wires, rows)`` slab; the kernels
(:mod:`softtopk.ops.networks_numba_kernels`) run every layer in one call each way, forward saving
the torch path's differences and swap probabilities (in the same layout: either backward can read
them), with the same formulas (``atan`` and the lerps in float64). Scope: the Cauchy swap (the
default) with a float steepness whose infinities saturate, float32 and float64 CPU tensors whose
values may be read (eager, outside the ``torch.func`` transforms), numba installed (the scope of
the Triton kernels, :mod:`softtopk.ops.networks_triton`, on the CPU). ``triton_gate.torch_path()``
and ``SOFTTOPK_NUMBA=0`` turn them off; the tests hold them to the torch path
(``tests/test_networks_numba.py``).
"""

from __future__ import annotations

import torch

from . import isotonic_numba
from .isotonic_numba import numpy_rows


def usable(wires: torch.Tensor, params: dict, mode: str) -> bool:
    """Whether the label sweep of ``wires`` (n, 2, B) runs on the kernels, forward and backward (the
    forward decides, as for the Triton kernels)."""
    if params["distribution"] != "cauchy" or mode != "stand-in" or isinstance(params["steepness"], torch.Tensor):
        return False
    return isotonic_numba.usable_rows(wires)


def label_forward(wires: torch.Tensor, plan: tuple, far: float) -> tuple:
    """The label sweep's forward outputs (:class:`~softtopk.ops.sorting_networks._LabelSweep`'s: the
    label's ranks (k, B), ``wires`` and the saved differences and swap probabilities) of the
    wires ``wires`` (n, 2, B: the values and the label's one-hot row) through the network ``plan``."""
    from . import networks_numba_kernels as kernels  # imports numba: only once the kernel runs

    depth, partner, sign, out_wires = plan[:4]
    n, _, rows = wires.shape
    diffs, alphas = wires.new_empty((depth, n, 2, rows)), wires.new_empty((depth, n, rows))
    out = wires.new_empty((out_wires.shape[0], rows))
    arrays = (numpy_rows(wires), partner.numpy(), numpy_rows(sign[..., 0]), out_wires.numpy())
    kernels.label_forward(*arrays, far, diffs.numpy(), alphas.numpy(), out.numpy())
    return out, wires, diffs, alphas


def label_backward(grad: torch.Tensor, plan: tuple, ctx, far: float) -> torch.Tensor:
    """The gradient of the scores (B, n) from that of the label's ranks ``grad`` (k, B), through the
    network ``plan`` (:func:`softtopk.ops.networks.network_plan`'s tuple) and the sweep saved in
    ``ctx`` (its wires, differences and swap probabilities; its steepness ``β``)."""
    from . import networks_numba_kernels as kernels

    _, partner, sign, out_wires = plan[:4]
    wires, diffs, alphas = ctx.saved_tensors
    out = wires.new_empty((wires.shape[2], wires.shape[0]))
    arrays = (numpy_rows(grad), out_wires.numpy(), partner.numpy(), numpy_rows(sign[..., 0]), diffs.numpy())
    kernels.label_backward(*arrays, alphas.numpy(), numpy_rows(wires), far, ctx.params["steepness"], out.numpy())
    return out
