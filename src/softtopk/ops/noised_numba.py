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

Where the losses draw the noise themselves, no ``(R, C, S)`` draw is needed at all
(:func:`kth_of_fresh_draws`): the kernel draws each row's Gaussians from a stream seeded by one
integer taken from the caller's generator, and on rows of finite scores only those that can reach
the ``k + 1`` largest sums; the rest it accounts for exactly in law, by the chance that any of
them gets there (:func:`softtopk.ops.noised_numba_kernels.kth_of_fresh_draws`). The estimator is the same, its
draws are not pytopk's (``tests/test_noised_draws.py`` holds the law to the torch path's).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import isotonic_numba
from .isotonic_numba import numpy_rows

WIDTH = 32  # at least this many top classes of a row, about, get drawn exactly (the rest by chance)


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


class FreshDraws(NamedTuple):
    """The noise of a call the kernel draws itself: ``samples`` draws of scale ``epsilon > 0``
    from the streams of ``seed``."""

    epsilon: float
    samples: int
    seed: int


def fresh(logits: torch.Tensor, epsilon: float, samples: int, generator: torch.Generator | None) -> FreshDraws | None:
    """The call's :class:`FreshDraws`, its seed taken from ``generator`` (the global one if
    ``None``), where the kernel may draw the noise of rows ``logits`` (R, C) itself: ``epsilon > 0``
    and rows the kernels may take; ``None`` elsewhere."""
    if not (epsilon > 0 and isotonic_numba.usable_rows(logits)):
        return None
    seed = int(torch.randint(2**63 - 1, (), generator=generator))
    return FreshDraws(epsilon, samples, seed)


def kth_of_fresh_draws(logits: torch.Tensor, noise: FreshDraws, kth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``kth``-largest of ``logits + noise.epsilon * Z_s`` along the classes for each draw ``s``
    (``Z_s`` standard Gaussian, drawn by the kernel), and its class: ``(R, S)`` each."""
    from . import noised_numba_kernels as kernels  # imports numba: only once the kernel runs

    draws = logits.new_empty((logits.shape[0], noise.samples))
    index = torch.empty(draws.shape, dtype=torch.int64)
    width = max(WIDTH, 2 * kth)
    kernels.kth_of_fresh_draws(numpy_rows(logits), noise.epsilon, kth, width, noise.seed, draws.numpy(), index.numpy())
    return draws, index
