"""How the row kernels compute: the compute dtype of a score dtype, and whether a tensor's values
may be read on the host for an argument check."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores are computed in: float64 stays float64, every other float becomes float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def can_inspect(value: torch.Tensor) -> bool:
    """Whether an argument check may read a tensor's values: only for a CPU tensor (on an
    accelerator a read is a synchronisation), and not while compiling or inside vmap. The
    computation itself never reads values, on any device."""
    if value.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(value):  # e.g. vmap(grad(f)): a batch inside a grad level
        if functorch.is_batchedtensor(value):
            return False
        value = functorch.get_unwrapped(value)
    return True
