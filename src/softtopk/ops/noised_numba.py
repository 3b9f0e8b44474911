"""The noised losses' Monte-Carlo ``(k+1)``-th largest score
(:class:`~softtopk.ops.noised_hinge.NoisedHinge`) on CPU rows as one numba kernel (optional).

The torch path adds the scores into the ``(R, C, S)`` noise and takes ``topk`` along the classes,
a strided axis: two passes over the draws and a partial sort of each draw's column. Where numba is
installed, float32 and float64 CPU tensors whose values may be read (eager, outside the
``torch.func`` transforms) take one pass instead (:mod:`softtopk.ops.noised_numba_kernels`): the
same float sums, each draw's ``k + 1`` largest kept in a sorted buffer. The values are the torch
path's bit for bit (pytopk's too); among equal sums it keeps the first class, where ``topk``'s
choice is unspecified. ``triton_gate.torch_path()`` and ``SOFTTOPK_NUMBA=0`` turn it off; the
tests hold it to the torch path (``tests/test_noised_numba.py``).
"""

from __future__ import annotations

import torch

from . import isotonic_numba
from .isotonic_numba import numpy_rows


def usable(logits: torch.Tensor, noise: torch.Tensor) -> bool:
    """Whether the ``(k+1)``-th largest of ``logits`` (R, C) plus ``noise`` (R, C, S) runs on the kernel."""
    return noise.dtype == logits.dtype and isotonic_numba.usable_rows(logits) and isotonic_numba.usable_rows(noise)


def kth_of_draws(logits: torch.Tensor, noise: torch.Tensor, kth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``kth``-largest of ``logits + noise[..., s]`` along the classes for each draw ``s``, and
    its class: ``(R, S)`` each, as ``compute.kth_largest(logits.unsqueeze(-1) + noise, kth, 1)``."""
    from . import noised_numba_kernels as kernels  # imports numba: only once the kernel runs

    rows, _, samples = noise.shape
    draws = logits.new_empty((rows, samples))
    index = torch.empty((rows, samples), dtype=torch.int64)
    kernels.kth_of_draws(numpy_rows(logits), numpy_rows(noise), kth, draws.numpy(), index.numpy())
    return draws, index
