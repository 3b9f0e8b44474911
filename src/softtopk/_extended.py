r"""Scores on the extended real line: one meaning of ``±inf`` entries for every method.

For a row with ``p`` entries at ``+inf``, ``q`` at ``-inf`` and ``f`` finite ones, and ``k`` to select:

* ``p < k < p + f`` (the usual case, e.g. padding masked to ``-inf``): the ``+inf`` entries have
  mask 1, the ``-inf`` entries mask 0, both with gradient 0; the finite entries get the method's
  mask of the finite entries alone with ``k - p`` to select. Ranks put the ``+inf`` entries
  uniformly on ranks ``0..p-1``, then the finite entries' ranks, then the ``-inf`` entries uniformly.
* ``p >= k``: the ``+inf`` entries share ``k`` equally (``k/p`` each), everything else is 0.
* ``p + f <= k``: every entry above ``-inf`` has mask 1 and the ``-inf`` entries share the remaining
  ``k - p - f`` equally. These are the limits of the finite case (entries at ``±M``, ``M → ∞``);
  their gradients are 0.

NaN entries are not infinite: a row holding one gives NaN in that row only.

The kernels take care of the usual case themselves (an infinite entry is exactly saturated there,
with gradient 0); this module adds the two degenerate cases, which no kernel sees (their rows reach
it as zeros), and the rank shift by ``p``. It reads no value on the host: the counts and the
closed forms are computed for every row and selected with ``torch.where``, so a call costs the
same few extra element-wise passes with or without infinities, and never synchronises with an
accelerator. Kernels that recognise the degenerate rows themselves (from their top candidates)
need none of this.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Kernel = Callable[[torch.Tensor, "int | torch.Tensor"], torch.Tensor]


class _Counts:
    """Per-row counts ``p`` (+inf) and ``q`` (-inf), each (B, 1) in the rows' dtype (``f = n - p - q``
    entries are finite or NaN), and the degenerate cases ``full`` (``p >= k``: the ``+inf`` entries
    alone fill ``k``) and ``degenerate`` (``full``, or ``p + f <= k``: every entry above ``-inf`` is
    selected)."""

    def __init__(self, rows: torch.Tensor, k: int | torch.Tensor) -> None:
        n = rows.shape[-1]
        self.pos, self.neg = torch.isposinf(rows), torch.isneginf(rows)
        self.p = self.pos.sum(-1, keepdim=True, dtype=rows.dtype)
        self.q = self.neg.sum(-1, keepdim=True, dtype=rows.dtype)
        self.full = self.p >= k
        self.degenerate = self.full | (self.q >= n - k)

    def closed_mask(self, k: int | torch.Tensor) -> torch.Tensor:
        """The mask of the degenerate rows: ``k/p`` on the ``+inf`` entries of a ``full`` row,
        else 1 above ``-inf`` and ``(k - p - f)/q`` on the ``-inf`` entries; arbitrary on the
        other rows."""
        share_neg = (self.q + (k - self.pos.shape[-1])) / self.q.clamp_min(1)
        below = torch.where(self.neg, share_neg, 1.0)
        return torch.where(self.full, self.pos * (k / self.p.clamp_min(1)), below)


def extended_mask(rows: torch.Tensor, k: int | torch.Tensor, kernel: Kernel) -> torch.Tensor:
    """``kernel(rows, k)`` (B, n) extended to every row: ``kernel`` must be exact (0 and 1 with
    gradient 0 at the infinities) on rows with ``p < k < p + f``; the degenerate rows get their
    closed form (module docstring)."""
    c = _Counts(rows, k)
    body = kernel(torch.where(c.degenerate, 0.0, rows), k)
    return torch.where(c.degenerate, c.closed_mask(k), body)


def extended_ranks(rows: torch.Tensor, k: int, kernel: Kernel) -> torch.Tensor:
    """``kernel(rows, k)`` (B, n, k) extended to every row: ``kernel`` must be exact on the ranks
    ``r < f`` of rows holding ``-inf`` entries and finite (any value) on the others. The ``+inf``
    entries become ``-inf`` for the kernel and take the first ``p`` ranks; its ranks shift by ``p``."""
    return _general_ranks(rows, k, kernel, _Counts(rows, k))


def _general_ranks(rows: torch.Tensor, k: int, kernel: Kernel, c: _Counts) -> torch.Tensor:
    n = rows.shape[-1]
    idle = c.full | (c.p + c.q == n)  # no rank is the kernel's (f = 0): give it a harmless row
    clean = torch.where(idle, 0.0, torch.where(c.pos, float("-inf"), rows))
    body = kernel(clean, k)
    rank = torch.arange(k, device=rows.device)
    shift = (rank - c.p.long()).clamp(0, k - 1)  # (B, k): the kernel's rank r - p
    body = body.gather(-1, shift.unsqueeze(-2).expand(-1, n, -1))
    body = torch.where((c.pos | c.neg).unsqueeze(-1), 0.0, body)
    top = (c.pos / c.p.clamp_min(1)).unsqueeze(-1)
    bottom = (c.neg / c.q.clamp_min(1)).unsqueeze(-1)
    p, pf = c.p.unsqueeze(-1), (n - c.q).unsqueeze(-1)  # pf = p + f
    return torch.where(rank < p, top, torch.where(rank < pf, body, bottom))


def mask_from_ranks(rows: torch.Tensor, k: int, ranks: Kernel) -> torch.Tensor:
    """The mask ``Σ_r ranks[..., r]`` of a rank kernel, extended as :func:`extended_ranks`, with the
    degenerate rows' closed form (an item's weights over the ranks of a full soft permutation of
    the finite entries need not sum to 1). In a usual row the ``+inf`` entries have mask 1, the
    ``-inf`` entries 0, and a finite entry the sum of its first ``k - p`` kernel ranks (one masked
    sum, no shifted copy of the ranks)."""
    c = _Counts(rows, k)
    n = rows.shape[-1]
    idle = c.full | (c.p + c.q == n)  # no rank is the kernel's (f = 0): give it a harmless row
    body = ranks(torch.where(idle, 0.0, torch.where(c.pos, float("-inf"), rows)), k)
    first = torch.arange(k, device=rows.device) < k - c.p  # (B, k): the kernel's ranks r < k - p
    finite = torch.linalg.vecdot(body, first.unsqueeze(-2).to(body.dtype))
    mask = torch.where(c.pos, 1.0, torch.where(c.neg, 0.0, finite))
    return torch.where(c.degenerate, c.closed_mask(k), mask)
