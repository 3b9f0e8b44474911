"""torchsort (teddykoker/torchsort 0.1.10) names and signatures, computed by softtopk.

``import softtopk.compat.torchsort as torchsort`` replaces ``import torchsort`` (Blondel et al.,
"Fast Differentiable Sorting and Ranking", ICML 2020):

* ``soft_rank(values, regularization="l2", regularization_strength=1.0)``
* ``soft_sort(values, regularization="l2", regularization_strength=1.0)``

with the original's positional order and defaults: ranks ``1..n`` with rank ``n`` to the largest
entry, the soft sort in increasing order, along the last dimension. They are
:func:`softtopk.soft_rank` and :func:`softtopk.soft_sort` (``strength`` is
``regularization_strength``), exact and with no compiled extension.

Intended differences from the original (``docs/compat.md``):

* any number of leading dimensions (the original accepts 2-d tensors only) and a per-row tensor
  ``regularization_strength`` with gradients;
* integer ``values`` are computed in the default float dtype (as the original's output is);
  float16/bfloat16 in float32, and every isotonic problem in float64;
* ``±inf`` entries get their limits (ranks shared at the top or bottom; sorts at the ends) where
  the original returns NaN, and a NaN makes its whole row NaN (the original's NaN stays in place);
* bad arguments raise ``TypeError``/``ValueError`` naming them (a non-positive strength included).
"""

from __future__ import annotations

from typing import Any

import torch

from .. import functional as F

__all__ = ["soft_rank", "soft_sort"]


def _floating(values: Any) -> Any:
    """Integer tensors in the default float dtype (the original computes them so); others as given."""
    if isinstance(values, torch.Tensor) and not (values.is_floating_point() or values.is_complex()):
        return values.to(torch.get_default_dtype())
    return values


def soft_rank(values: torch.Tensor, regularization: str = "l2", regularization_strength: Any = 1.0) -> torch.Tensor:
    """torchsort's ``soft_rank``: soft ranks along the last dimension, rank ``n`` to the largest.

    Example:
        >>> import torch
        >>> import softtopk.compat.torchsort as torchsort
        >>> torchsort.soft_rank(torch.tensor([[8, 0, 5, 3, 2, 1, 6, 7, 9]]))
        tensor([[8., 1., 5., 4., 3., 2., 6., 7., 9.]])
    """
    return F.soft_rank(_floating(values), regularization=regularization, strength=regularization_strength)


def soft_sort(values: torch.Tensor, regularization: str = "l2", regularization_strength: Any = 1.0) -> torch.Tensor:
    """torchsort's ``soft_sort``: soft sort in increasing order along the last dimension.

    Example:
        >>> import torch
        >>> import softtopk.compat.torchsort as torchsort
        >>> torchsort.soft_sort(torch.tensor([[8, 0, 5, 3, 2, 1, 6, 7, 9]]), regularization_strength=1.0)
        tensor([[0.5556, 1.5556, 2.5556, 3.5556, 4.5556, 5.5556, 6.5556, 7.5556, 8.5556]])
    """
    return F.soft_sort(_floating(values), regularization=regularization, strength=regularization_strength)
