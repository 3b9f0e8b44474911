"""What the tests of the CPU (numba) kernels share."""

from __future__ import annotations

import torch


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
