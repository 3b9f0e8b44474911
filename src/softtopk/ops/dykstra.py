"""Approximate decreasing isotonic regression by Dykstra's alternating projections (batched).

The cone of decreasing vectors {v_1 >= ... >= v_n} is the intersection of two sets that are easy to
project on: C_odd (pairs (1,2),(3,4),... in order) and C_even (pairs (2,3),(4,5),...). Projecting
onto either replaces each out-of-order pair by its (weighted) mean, all pairs in parallel. Dykstra's
algorithm alternates the two projections with one correction vector each and converges to the
weighted projection onto the cone,

    v* = argmin_{v_1 >= ... >= v_n} sum_i u_i (s_i - v_i)^2     (u = 1 unless ``weights`` given).

This is the scheme of the original sparse soft top-k code (same pairing, order, padding and
iteration count), written on (B, n) rows with reshapes so that it runs on any device and compiles
with ``torch.compile(fullgraph=True)``: the iteration count is fixed, nothing depends on the data.
Each projection keeps sum_i u_i v_i, so the relaxed mask sums to k at every iteration; its
[0, 1] bounds and exact zeros only hold at convergence, which needs roughly (block size)^2
iterations.

Reference: M. E. Sander, J. Puigcerver, J. Djolonga, G. Peyre, M. Blondel, "Fast, Differentiable
and Sparse Top-k: a Convex Analysis Perspective", ICML 2023, arXiv:2302.01425.
"""

from __future__ import annotations

import torch

from .compute import sort_rows, unsort

__all__ = ["dykstra_isotonic", "dykstra_mag_rows", "dykstra_mask_rows"]


def _project_pairs(z: torch.Tensor, u: torch.Tensor | None) -> torch.Tensor:
    """Project (B, 2m) rows onto {z_1 >= z_2, z_3 >= z_4, ...}: average each out-of-order pair."""
    pairs = z.reshape(z.shape[0], z.shape[1] // 2, 2)  # explicit sizes: a batch of 0 rows reshapes too
    first, second = pairs[..., 0], pairs[..., 1]
    if u is None:
        mean = first / 2.0 + second / 2.0  # halves first: no overflow near the dtype's largest values
    else:
        w = u.reshape(u.shape[0], u.shape[1] // 2, 2)
        share = w[..., 0] / (w[..., 0] + w[..., 1])
        mean = first * share + second * (1.0 - share)
    keep = (second - first) < 0  # strictly decreasing pairs stay; ties are averaged (a no-op)
    mean = mean.unsqueeze(-1)
    return torch.where(keep.unsqueeze(-1), pairs, mean).reshape(z.shape)


def dykstra_isotonic(s: torch.Tensor, n_iter: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Approximate (weighted) decreasing isotonic regression of each row of ``s``.

    Approximates ``argmin_{v_1 >= ... >= v_n} sum_i u_i (s_i - v_i)^2`` row by row, with
    ``u = weights`` (``1`` when omitted), by ``n_iter // 2`` Dykstra trips, each a projection on
    C_odd (pairs (1,2),(3,4),...; the last entry passes) then on C_even (pairs (2,3),(4,5),...;
    the first entry passes), with one correction vector per set. An even length is made odd by
    appending ``min(row) - 1`` (weight 0), removed at the end.

    Args:
        s: (B, n) floating tensor.
        n_iter: number of single projections (``n_iter // 2`` trips; 0 returns ``s``).
        weights: optional positive weights, shape (B, n) or (n,); default all ones.

    Returns:
        (B, n) tensor of ``s``'s dtype, approximately decreasing along each row.

    Example:
        >>> s = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
        >>> dykstra_isotonic(s, 100)
        tensor([[2., 2., 2., 0.]])
    """
    batch, n = s.shape
    u = None
    if weights is not None:
        u = torch.broadcast_to(weights.to(s.dtype), s.shape)
    if n % 2 == 0:
        pad = s.detach().amin(dim=-1, keepdim=True) - 1.0 if n > 0 else s.new_zeros(batch, 1)
        s = torch.cat([s, pad], dim=-1)
        if u is not None:
            u = torch.cat([u, u.new_zeros(batch, 1)], dim=-1)
    u_head = None if u is None else u[:, :-1]
    u_tail = None if u is None else u[:, 1:]
    v = s
    p = torch.zeros_like(s)
    q = torch.zeros_like(s)
    for _ in range(n_iter // 2):
        a = v + p
        y = torch.cat([_project_pairs(a[:, :-1], u_head), a[:, -1:]], dim=-1)
        p = a - y
        b = y + q
        v = torch.cat([b[:, :1], _project_pairs(b[:, 1:], u_tail)], dim=-1)
        q = b - v
    return v[:, :n]


def _sorted_rows(x: torch.Tensor, k: int):
    n = x.shape[-1]
    s, perm = sort_rows(x, descending=True, stable=True)
    w = (torch.arange(n, device=x.device) < k).to(x.dtype)
    return s, perm, w


def dykstra_mask_rows(x: torch.Tensor, k: int, l, n_iter: int) -> torch.Tensor:
    """Relaxed top-k mask (p = 2) of each row by Dykstra's algorithm.

    With s = x sorted decreasingly and w = (1,...,1,0,...,0) (k ones),
    v = iso(s - l w) (decreasing isotonic regression, :func:`dykstra_isotonic`) and
    y = (s - v) / l, un-permuted: the Euclidean projection of x / l onto
    {y in [0, 1]^n, sum(y) = k} once converged.

    Args:
        x: (B, n) floating tensor.
        k: int, 0 <= k <= n.
        l: regularisation strength lambda > 0 (float or tensor broadcastable to (B, 1)).
        n_iter: number of single projections (the original's ``num_iter``, default there 500).

    Returns:
        (B, n) tensor of x's dtype; each row sums to k (at every ``n_iter``).

    Example:
        >>> dykstra_mask_rows(torch.tensor([[-5.0, -2.0, 3.0, 1.0]]), 2, 1e-2, 500)
        tensor([[0.0000, 0.0000, 1.0000, 1.0000]])
    """
    s, perm, w = _sorted_rows(_stand_ins(x, l), k)
    v = dykstra_isotonic(s - l * w, n_iter)
    return torch.where(x.isinf(), (x > 0).to(x.dtype), unsort((s - v) / l, perm))


def _stand_ins(x: torch.Tensor, l) -> torch.Tensor:
    """``±inf`` entries as finite values beyond every finite one by more than the row's spread plus
    ``l`` + 1 (at convergence exactly 0 or 1; their iterates are replaced by that value)."""
    finite = x.isfinite()
    low = torch.where(finite, x, torch.inf).amin(-1, keepdim=True)
    high = torch.where(finite, x, -torch.inf).amax(-1, keepdim=True)
    low, high = low.where(low.isfinite(), 0.0), high.where(high.isfinite(), 0.0)
    span = high - low + l + 1.0
    return torch.where(x == -torch.inf, low - span, torch.where(x == torch.inf, high + span, x))


def dykstra_mag_rows(x: torch.Tensor, k: int, l, n_iter: int) -> torch.Tensor:
    """Relaxed top-k in magnitude (p = 2) of each row by Dykstra's algorithm.

    With s = |x| sorted decreasingly, w as for the mask and u = 1 + l w,
    v = iso_u(s / u) (isotonic regression weighted by u) and the result is
    sign(x) * (s - v) / l * (1 + l), un-permuted; converged, the kept entries equal x and the
    others are exactly 0.

    Args:
        x: (B, n) floating tensor.
        k: int, 0 <= k <= n.
        l: regularisation strength lambda > 0 (float or tensor broadcastable to (B, 1)).
        n_iter: number of single projections.

    Returns:
        (B, n) tensor of x's dtype.

    Example:
        >>> dykstra_mag_rows(torch.tensor([[-5.0, -2.0, 3.0, 1.0]]), 2, 1e-2, 500)
        tensor([[-5.0000, -0.0000,  3.0000,  0.0000]])
    """
    infinite = x.isinf()
    s, perm, w = _sorted_rows(torch.where(infinite, _saturating(x, l), x.abs()), k)
    u = 1 + l * w
    v = dykstra_isotonic(s / u, n_iter, weights=u)
    return torch.where(infinite, x, torch.sign(x) * unsort((s - v) / l, perm) * (1 + l))


def _saturating(x: torch.Tensor, l) -> torch.Tensor:
    """A stand-in for the infinite magnitudes of each row, above ``(1 + l)`` times every finite one:
    saturated at convergence while fewer than ``k`` entries are infinite (their iterates are
    replaced by ``x``)."""
    high = torch.where(x.isinf(), 0.0, x.abs()).amax(-1, keepdim=True) if x.shape[-1] else x.new_zeros(x.shape[0], 1)
    return (high * (1 + l) + 1.0).clamp_max(torch.finfo(x.dtype).max)
