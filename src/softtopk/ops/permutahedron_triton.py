"""The soft rank and soft sort (l2 and kl) as one Triton kernel forward and one backward (optional, CUDA).

Off the CPU the torch path of :mod:`softtopk.ops.permutahedron` around PAV's kernel
(:mod:`softtopk.ops.pav_triton`) is about a hundred small ops per forward and backward: the
relative ``θ``, the ``±inf`` and NaN handling that a GPU cannot skip without reading values, the
ranks, the block means of the backward. On short rows the host's launches are the whole cost
(``benchmarks/results/soft_sort_cuda.md``). Here, after ``torch.sort``, one program per row does
the forward in its lanes with PAV's stack walk in between (l2's or kl's,
:mod:`softtopk.ops.triton_steps`), and writes what the torch backward reads (the fit, the sorted
ranks or values, ``θ``, the NaN rows), so that a backward that records its graph (a second
derivative) still takes the torch backward; the backward kernel takes the blocks' sums by
segmented scans.

Scope: a float strength, rows of at most :data:`MAX_N` entries on CUDA with triton
(:mod:`softtopk.ops.triton_gate`); the backward kernel where no graph is recorded. Values and
gradients are the torch path's to rounding (PAV sums in another order than the level merges),
``±inf`` and NaN included (``tests/test_permutahedron_triton.py``).
"""

from __future__ import annotations

import torch

from . import triton_gate
from .compute import sort_rows

MAX_N = 16384  # a row lives in one program's lanes (rows of 10^4 among them)


def usable(x: torch.Tensor, eps: object) -> bool:
    """Whether the soft rank or sort of rows ``x`` (B, n) with strength ``eps`` runs on the kernels."""
    return 0 < x.shape[-1] <= MAX_N and triton_gate.usable(x, 0, eps)


def _warps(n: int) -> int:
    """One warp up to 1024 entries (32 a thread), then as many warps as keep 32 entries a thread (the
    vector steps' registers); every thread runs PAV's walk, whose barriers (l2: where a pool
    reaches below the top block; kl: at every point) wait for them all."""
    return max(1, triton_gate.lanes(n) // 1024)


def forward(x: torch.Tensor, eps: float | torch.Tensor, sign: float, rank: bool, kl: bool):
    """``SoftRankFn``'s outputs ``(out, v, r, θ, perm, nan)`` (``rank``) or ``SoftSortFn``'s ``(h, v,
    s, perm, nan)`` for rows ``x`` (B, n), the first in ``x``'s dtype, with the l2 or ``kl``
    regularisation; ``eps`` is a float where :func:`usable`."""
    from . import permutahedron_kernels as kernels  # imports triton: only once a kernel runs

    rows, n = x.shape
    ordered, perm = sort_rows(x, descending=sign == 1)
    ordered, perm = ordered.contiguous(), perm.contiguous()
    out = torch.empty_like(x)
    v = x.new_empty((rows, n), dtype=torch.float64)
    r = torch.empty_like(v)
    theta = torch.empty_like(v) if rank else r
    nan = x.new_empty((rows, 1), dtype=torch.bool)
    sums = x.new_empty((rows, 5 if kl else 1, n), dtype=torch.float64)  # kl: pav_kl_walk's planes
    starts = x.new_empty((rows, n), dtype=torch.int64)
    if rows:
        kernels.project_rows[(rows,)](
            ordered, perm, out, v, r, theta, nan, sums, starts, n, float(eps), float(sign),
            RANK=rank, KL=kl, BLOCK=triton_gate.lanes(n), num_warps=_warps(n),
        )  # fmt: skip
    return (out, v, r, theta, perm, nan) if rank else (out, v, r, perm, nan)


def backward(grad: torch.Tensor, perm, v, finite, r, nan, scale: float, rank: bool, kl: bool) -> torch.Tensor:
    """The rows' gradient, in ``grad``'s dtype, from the outputs' ``grad`` (B, n) and what
    :func:`forward` saved (``finite``: ``θ`` for ranks, ``s`` for sorts; ``r``: the sorted ranks,
    read by the kl rank); ``scale = sign/ε``."""
    from . import permutahedron_kernels as kernels

    rows, n = grad.shape
    grad, perm, v, finite, r, nan = (t.contiguous() for t in (grad, perm, v, finite, r, nan))
    out = torch.empty_like(grad)
    if rows:
        runs = v.new_empty((rows, 2 if kl else 1, n))
        kernels.project_grad[(rows,)](
            grad, perm, v, finite, r, nan, out, runs, n, float(scale),
            RANK=rank, KL=kl, BLOCK=triton_gate.lanes(n), num_warps=_warps(n),
        )  # fmt: skip
    return out
