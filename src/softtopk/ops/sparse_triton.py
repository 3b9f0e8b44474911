"""The sparse mask of :mod:`softtopk.ops.sparse` as Triton kernels (optional, CUDA).

The torch path sorts every row and solves the threshold from prefix moments and breakpoint
searches, tens of small ops. Here one ``torch.topk`` of ``k + 1`` values (``s_k`` and the next)
is followed by one program per row that

1. counts the row's ``+inf``, ``-inf`` and NaN entries (the degenerate rows of
   :mod:`softtopk._extended`, written by their rule as in the torch path) and, in the same pass,
   packs its candidates, the entries with ``v = (x - s_k)/λ > -1`` (the others are 0 for every
   threshold in the bracket), into a scratch row; a row of at most one tile (``block_for(n)``
   entries) keeps its ``v`` in registers instead, with no pass over memory per step,
2. solves ``Σ_i clip(v_i - a, 0, 1)^r = k`` for ``a`` in ``[-1, 0)`` over the candidates, in
   float64 by Newton's steps safeguarded by bisection (the sum is monotone in ``a``; rows whose
   ``k`` largest saturate before the next starts are the hard mask, as in the torch path), and
3. writes the mask ``clip(v - a, 0, 1)^r`` and ``d = r clip(v - a)^{r-1}/λ`` on the interior.

The backward is the Laplace mask's kernel (:class:`~softtopk.ops.lapsum_triton.ImplicitMask`,
``d ⊙ (g - Σ d g / Σ d)``): the same implicit derivative. The threshold agrees with the torch
path's exact solution to float64 rounding (the steps stop below ``1e-15`` in units of λ).

Scope: an int ``k``, a float ``λ`` and the exact mask (``solver='pav'``, or ``hard``);
:func:`softtopk.ops.sparse.sparse_mask_rows` keeps the torch path for a tensor ``λ``, Dykstra's
values, under ``torch.compile`` and ``vmap``, and off CUDA (:mod:`softtopk.ops.triton_gate`).
"""

from __future__ import annotations

import torch

from .lapsum_triton import ImplicitMask
from .triton_gate import block_for

MAX_STEPS = 200  # bisection alone reaches 1e-15 on [-1, 0) in 50 steps


class TritonSparseMask(ImplicitMask):
    """``(x (B, n), λ, k, r, hard)`` → the mask (B, n) and the kernel's ``d``, saved for the
    backward."""

    @staticmethod
    def forward(x: torch.Tensor, lam: float, k: int, r: int, hard: bool):
        from . import sparse_kernels  # imports triton: only once a kernel runs

        x = x.contiguous()
        rows, n = x.shape
        vals = x.topk(k + 1, -1).values.contiguous()
        # d = r z^{r-1}/λ reaches 3/λ: held in float32 at least, so a half-precision row cannot overflow it
        mask, d = torch.empty_like(x), torch.empty_like(x, dtype=torch.promote_types(x.dtype, torch.float32))
        if rows:
            block = block_for(n)
            scratch = x if n <= block else torch.empty_like(x)  # each row's candidates (a longer row's)
            sparse_kernels.mask_forward[(rows,)](
                x, vals, scratch, mask, d, n, k, lam, R=r, BLOCK=block, MAX_STEPS=MAX_STEPS, ONE_TILE=n <= block
            )
        if hard:
            mask = torch.zeros_like(x).scatter_(-1, x.topk(k, -1).indices, 1.0)
        return mask, d


def triton_mask(x: torch.Tensor, k: int, lam: float, r: int, *, hard: bool) -> torch.Tensor:
    """The sparse mask of rows ``x`` (B, n) for ``0 < k < n`` by the kernels."""
    return TritonSparseMask.apply(x, lam, k, r, hard)[0]
