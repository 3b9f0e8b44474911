"""The l2 and kl isotonic fits of :mod:`softtopk.ops.isotonic` as Triton kernels (optional, CUDA).

Off the CPU the torch path solves a row by fixed-shape level merges: ``⌈log2 n⌉`` levels of
dozens of small ops each, whatever the values, which is what made the soft sort and rank slower
than torchsort's CUDA kernel on an H200 (``benchmarks/results/soft_sort_cuda.md``). Here one
program per row runs Pool-Adjacent-Violators, as torchsort's kernel and softtopk's numba kernel on
the CPU do: a pass over the row that pushes each point as a block and pools it with the blocks
below while their value is at most its own (in float64, the blocks in scratch rows of the
device's memory: for l2 their sums and first points, a value the mean; for kl the maxima and relative
sums of ``exp(y)`` and ``exp(lw)``, a value ``logsumexp(y_B) - logsumexp(lw_B)``, as the numba
kernel's log-sum-exp blocks), then a pass that writes each block's value over its points. One
launch, O(n) work and memory per row; rows run in parallel, each sequential.

Scope: rows on CUDA with triton (:mod:`softtopk.ops.triton_gate`);
:func:`~softtopk.ops.isotonic.isotonic_l2` and :func:`~softtopk.ops.isotonic.isotonic_kl` keep
the level merges under ``torch.compile`` and ``vmap``. The tests run the kernels under
``TRITON_INTERPRET=1`` on the CPU against the numba kernels and the level merges, and compile them
for sm_90 (``tests/test_triton_compile.py``). The l2 soft rank and sort of float strengths run
whole on :mod:`softtopk.ops.permutahedron_triton`'s kernels instead.
"""

from __future__ import annotations

import torch

from . import triton_gate

BLOCK = 128  # points the pass that writes the blocks' values takes at once


def usable(y: torch.Tensor) -> bool:
    """Whether the fits of rows ``y`` run on the kernels (the gate's device and context)."""
    return triton_gate.usable(y)


def pav_l2(y: torch.Tensor) -> torch.Tensor:
    """``argmin_{v_1 >= ... >= v_n} ½ ||v - y||²`` of rows ``y`` (B, n) by the kernel, in y's dtype."""
    return _solve("pav_l2", y, None, planes=1)


def pav_kl(y: torch.Tensor, lw: torch.Tensor) -> torch.Tensor:
    """``argmin_{v_1 >= ... >= v_n} <exp(y - v), 1> + <exp(lw), v>`` of rows ``y``, ``lw`` (B, n) by
    the kernel, in y's dtype."""
    return _solve("pav_kl", y, lw, planes=5)


def _solve(name: str, y: torch.Tensor, lw: torch.Tensor | None, planes: int) -> torch.Tensor:
    """One program per row of kernel ``name``, with ``planes`` float64 scratch rows per row (the
    blocks' numbers) and one int64 (their first points)."""
    from . import pav_kernels  # imports triton: only once a kernel runs

    y = y.contiguous()
    out = torch.empty_like(y)
    if y.shape[0]:
        scratch = y.new_empty((y.shape[0], planes, y.shape[-1]), dtype=torch.float64)
        starts = y.new_empty(y.shape, dtype=torch.int64)
        rows = (y,) if lw is None else (y, lw.expand_as(y).contiguous())
        kernel = getattr(pav_kernels, name)
        kernel[(y.shape[0],)](*rows, out, scratch, starts, y.shape[-1], BLOCK=BLOCK, num_warps=1)
    return out
