"""How the row kernels compute: the compute dtype of a score dtype, and whether a tensor's values
may be read (for a data-dependent branch or check) in the current trace."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores are computed in: float64 stays float64, every other float becomes float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def can_inspect(value: torch.Tensor) -> bool:
    """Whether a tensor's values may be read (a check, a data-dependent branch): not while compiling,
    inside vmap, or of a meta tensor."""
    if torch.compiler.is_compiling() or value.is_meta:
        return False
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(value):  # e.g. vmap(grad(f)): a batch inside a grad level
        if functorch.is_batchedtensor(value):
            return False
        value = functorch.get_unwrapped(value)
    return True
