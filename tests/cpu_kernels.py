"""What the tests of the CPU (numba) kernels share."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def recorded(patch: pytest.MonkeyPatch, module: Any) -> list[bool]:
    """The answers of ``module.usable`` (a kernel's gate) from here on, in a list that grows."""
    seen: list[bool] = []
    usable = module.usable

    def spy(*args: Any) -> bool:
        seen.append(usable(*args))
        return seen[-1]

    patch.setattr(module, "usable", spy)
    return seen


def topk_ce_paths(x: torch.Tensor, target: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(loss, grad)]`` of ``TopKCrossEntropyLoss([0.2] * 5)`` at ``x``, forward and backward with the
    CPU kernels, then on the torch path (``triton_gate.torch_path()``)."""
    import softtopk
    from softtopk.ops import triton_gate

    results = []
    for kernels in (True, False):
        leaf = x.clone().requires_grad_()
        with torch.enable_grad() if kernels else triton_gate.torch_path():
            loss = softtopk.TopKCrossEntropyLoss([0.2] * 5)(leaf, target)
            loss.backward()
        results.append((loss.detach(), leaf.grad))
    return results


def by_value(x: torch.Tensor, grad: torch.Tensor) -> list[dict[float, float]]:
    """Each row's gradient summed over the classes of equal score: the same whichever of two tied
    classes a selection keeps."""
    rows = []
    for xs, gs in zip(x.tolist(), grad.tolist(), strict=True):
        sums: dict[float, float] = {}
        for v, g in zip(xs, gs, strict=True):
            key = "nan" if v != v else v
            sums[key] = sums.get(key, 0.0) + g
        rows.append(sums)
    return rows
