r"""Decreasing isotonic regression of short segments, solved at once (the base case of the level
merges of :mod:`softtopk.ops.isotonic`).

For a segment of ``m`` points, ``M[a, i]`` is the value of the block ``a..i`` (``a <= i``): its
mean (l2) or ``logsumexp(y_{a..i}) - logsumexp(lw_{a..i})`` (kl). The solution is the least
concave majorant of the cumulative sums (in the kl case, of ``exp(y)`` over those of
``exp(lw)``): point ``j`` (``0 < j < m``, between points ``j - 1`` and ``j``) is a breakpoint of
the majorant iff no block across it beats the blocks that end there,

.. math:: \min_{a < j} M[a, j - 1] \ \ge\ \max_{i \ge j} M[j, i],

and every point takes the value of the block between the breakpoints around it, read from ``M``
itself: points of one block get bitwise equal values (the backward finds blocks by equality), and
a point alone keeps its own value bitwise.
``O(m^2)`` memory and work per segment, in a fixed sequence of about 25 tensor operations with no
value read: a handful of launches instead of ``log2 m`` levels of merges. A point within rounding
of a chord may be taken for a breakpoint or not; either way its value is the block's within
rounding.

Reference: the characterisation of isotonic regression by the concave majorant of the cumulative
sum diagram (Barlow, Bartholomew, Bremner, Brunk, "Statistical Inference under Order
Restrictions", Wiley 1972); the kl blocks are those of Blondel et al., ICML 2020.
"""

from __future__ import annotations

import torch

_BUDGET = 1 << 22  # elements of one (segments, m, m) table


def _cap(device: torch.device) -> int:
    """The largest segment solved at once: 4 on the CPU, where a launch costs little next to the
    ``O(m^2)`` tables, 128 elsewhere, where each level of merges costs dozens of launches."""
    return 4 if device.type == "cpu" else 128


def small_size(shape: torch.Size, device: torch.device) -> int:
    """The segment size solved at once for rows of ``shape`` (``(..., N)``, ``N`` a power of two)
    on ``device``: up to :func:`_cap`, within :data:`_BUDGET` elements per table; 1 (nothing to
    solve) for large rows."""
    m = 1
    while 2 * m <= min(_cap(device), shape[-1]) and shape.numel() * 2 * m <= _BUDGET:
        m *= 2
    return m


def _grid(m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions ``0..m-1`` and ``a > i`` over ``[a, i]`` (m, m): the entries of a block table
    that hold no block."""
    pos = torch.arange(m, device=device)
    return pos, pos.unsqueeze(-1) > pos


def _solved(table: torch.Tensor, grid: tuple[torch.Tensor, torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """The solution from the block values ``table`` (S, m, m) (``[a, i]``, ``a <= i``)."""
    m = table.shape[-1]
    pos, outside = grid
    ending = table.masked_fill(outside, torch.inf).amin(-2)  # min over a of the blocks ending at i
    starting = table.masked_fill(outside, -torch.inf).amax(-1)  # max over i of the blocks from a
    breaks = ending[:, :-1] >= starting[:, 1:]  # between points j - 1 and j, j = 1..m-1
    yes = breaks.new_ones(breaks.shape[0], 1)
    start = (torch.cat([yes, breaks], -1) * pos).cummax(-1).values
    end = torch.where(torch.cat([breaks, yes], -1), pos, m - 1).flip(-1).cummin(-1).values.flip(-1)
    return table.flatten(1).gather(-1, start * m + end).reshape(shape)


def small_l2(v: torch.Tensor, m: int) -> torch.Tensor:
    """Every segment of ``m`` points of ``v`` (B, N) solved (l2), ``N`` a multiple of ``m``."""
    seg = v.reshape(-1, m)
    first = seg[:, :1]
    sums = torch.nn.functional.pad((seg - first).cumsum(-1), (1, 0))  # relative to the first point
    pos = torch.arange(m, device=v.device, dtype=v.dtype)
    count = (pos + 1) - pos.unsqueeze(-1)  # i + 1 - a
    table = (sums[:, 1:].unsqueeze(-2) - sums[:, :-1].unsqueeze(-1)) / count + first.unsqueeze(-1)
    table.diagonal(0, -2, -1).copy_(seg)  # a point alone keeps its value, bitwise
    return _solved(table, _grid(m, v.device), v.shape)


def small_kl(v: torch.Tensor, lw: torch.Tensor, m: int) -> torch.Tensor:
    """Every segment of ``m`` points of ``v`` (B, N) solved (kl, log weights ``lw``; ``v`` holds
    ``y - lw``), ``N`` a multiple of ``m``."""
    grid = _grid(m, v.device)
    outside = grid[1]

    def block_lse(values: torch.Tensor) -> torch.Tensor:  # logsumexp of values[a..i], (S, m, m)
        return values.reshape(-1, 1, m).expand(-1, m, m).masked_fill(outside, -torch.inf).logcumsumexp(-1)

    seg, seg_lw = v.reshape(-1, m), lw.reshape(-1, m)
    table = block_lse(seg + seg_lw) - block_lse(seg_lw)
    table.diagonal(0, -2, -1).copy_(seg)  # a point alone keeps its value, bitwise
    return _solved(table, grid, v.shape)
