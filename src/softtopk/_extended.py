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
it as zeros), and the rank shift by ``p``. In eager mode a batch that needs neither (no infinite
entry, or only ``-inf`` entries in rows with enough finite ones: the masking of padded batches and
routers) goes straight to the kernel after one or two ``any()`` checks; inside ``torch.compile``
or ``vmap`` the general path always runs.
"""

from __future__ import annotations

from typing import Callable

import torch

from .ops.compute import can_inspect

Kernel = Callable[[torch.Tensor, "int | torch.Tensor"], torch.Tensor]


class _Counts:
    """Per-row counts ``p`` (+inf), ``q`` (-inf), ``f`` (finite or NaN), each (B, 1), and the cases."""

    def __init__(self, rows: torch.Tensor, k: int | torch.Tensor) -> None:
        self.pos, self.neg = rows == float("inf"), rows == float("-inf")
        self.p = self.pos.sum(-1, keepdim=True)
        self.q = self.neg.sum(-1, keepdim=True)
        self.f = rows.shape[-1] - self.p - self.q
        self.full = self.p >= k  # the +inf entries alone fill k
        self.short = (self.p + self.f <= k) & ~self.full  # every entry above -inf is selected

    def closed_mask(self, k: int | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The mask of the degenerate rows (``full`` or ``short``); arbitrary on the other rows."""
        p, q, f = (count.to(dtype) for count in (self.p, self.q, self.f))
        share_pos = k / p.clamp_min(1)
        share_neg = (k - p - f) / q.clamp_min(1)
        above = torch.where(self.pos, torch.where(self.full, share_pos, 1.0), torch.where(self.full, 0.0, 1.0))
        return torch.where(self.neg, torch.where(self.full, 0.0, share_neg), above)


def _counts(rows: torch.Tensor, k: int | torch.Tensor, more_than_k: bool) -> _Counts | None:
    """The counts of the rows, or None where the kernel alone is exact for every row: no ``+inf``
    entry and more than ``k`` (``more_than_k``; else at least ``k``) entries above ``-inf`` in each
    row. Eager only (it reads the values), in three passes: a finite sum rules out infinities."""
    if not can_inspect(rows):
        return _Counts(rows, k)
    if bool(rows.sum().isfinite()):
        return None
    if bool(rows.amax() == float("inf")):
        return _Counts(rows, k)
    above = rows.shape[-1] - torch.isneginf(rows).sum(-1, keepdim=True, dtype=torch.int32)
    enough = above > k if more_than_k else above >= k
    return None if bool(enough.all()) else _Counts(rows, k)


def extended_mask(rows: torch.Tensor, k: int | torch.Tensor, kernel: Kernel) -> torch.Tensor:
    """``kernel(rows, k)`` (B, n) extended to every row: ``kernel`` must be exact (0 and 1 with
    gradient 0 at the infinities) on rows with ``p < k < p + f``; the degenerate rows get their
    closed form (module docstring)."""
    c = _counts(rows, k, more_than_k=True)
    if c is None:
        return kernel(rows, k)
    degenerate = c.full | c.short
    body = kernel(torch.where(degenerate, 0.0, rows), k)
    return torch.where(degenerate, c.closed_mask(k, rows.dtype), body)


def extended_ranks(rows: torch.Tensor, k: int, kernel: Kernel) -> torch.Tensor:
    """``kernel(rows, k)`` (B, n, k) extended to every row: ``kernel`` must be exact on the ranks
    ``r < f`` of rows holding ``-inf`` entries and finite (any value) on the others. The ``+inf``
    entries become ``-inf`` for the kernel and take the first ``p`` ranks; its ranks shift by ``p``."""
    c = _counts(rows, k, more_than_k=False)
    return kernel(rows, k) if c is None else _general_ranks(rows, k, kernel, c)


def _general_ranks(rows: torch.Tensor, k: int, kernel: Kernel, c: _Counts) -> torch.Tensor:
    n = rows.shape[-1]
    idle = c.full | (c.f == 0)  # no rank is the kernel's: give it a harmless row
    clean = torch.where(idle, 0.0, torch.where(c.pos, float("-inf"), rows))
    body = kernel(clean, k)
    rank = torch.arange(k, device=rows.device)
    shift = (rank - c.p).clamp(0, k - 1)  # (B, k): the kernel's rank r - p
    body = body.gather(-1, shift.unsqueeze(-2).expand(-1, n, -1))
    body = torch.where((c.pos | c.neg).unsqueeze(-1), 0.0, body)
    top = (c.pos.to(rows.dtype) / c.p.clamp_min(1).to(rows.dtype)).unsqueeze(-1)
    bottom = (c.neg.to(rows.dtype) / c.q.clamp_min(1).to(rows.dtype)).unsqueeze(-1)
    p, pf = c.p.unsqueeze(-1), (c.p + c.f).unsqueeze(-1)
    return torch.where(rank < p, top, torch.where(rank < pf, body, bottom))


def mask_from_ranks(rows: torch.Tensor, k: int, ranks: Kernel) -> torch.Tensor:
    """The mask ``Σ_r ranks[..., r]`` of a rank kernel, extended as :func:`extended_ranks`, with the
    degenerate rows' closed form (an item's weights over the ranks of a full soft permutation of
    the finite entries need not sum to 1)."""
    c = _counts(rows, k, more_than_k=True)
    if c is None:
        return ranks(rows, k).sum(-1)
    mask = _general_ranks(rows, k, ranks, c).sum(-1)
    return torch.where(c.full | c.short, c.closed_mask(k, rows.dtype), mask)
