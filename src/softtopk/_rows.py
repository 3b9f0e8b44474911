"""Row view of an operator's input: move ``dim`` last, flatten the rest, compute, put back."""

from __future__ import annotations

from typing import Callable

import torch

from ._validation import compute_dtype


def along_rows(
    x: torch.Tensor, dim: int, fn: Callable[[torch.Tensor], torch.Tensor], extra: int | None
) -> torch.Tensor:
    """Apply ``fn`` to the rows ``(B, n)`` of ``x`` along ``dim``; put the result back in place.

    ``fn`` returns ``(B, n)`` (``extra=None``) or ``(B, n, extra)``.
    """
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).to(compute_dtype(x.dtype))
    out = fn(rows).to(x.dtype)
    if extra is None:
        return out.reshape(moved.shape).movedim(-1, dim)
    return out.reshape(*moved.shape, extra).movedim(-2, dim)
