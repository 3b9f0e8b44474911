"""softtopk: differentiable top-k operators and top-k losses for PyTorch."""

from importlib.metadata import PackageNotFoundError, version

from . import functional
from ._methods import MethodInfo, methods
from .functional import (
    hard_topk_mag,
    hard_topk_mask,
    noised_kth_value,
    perturbed_topk,
    soft_permutation,
    soft_topk,
    soft_topk_ranks,
    sparse_topk_mag,
    sparse_topk_mask,
    topk_cross_entropy,
)
from .nn import SoftTopK, SoftTopKRanks, TopKCrossEntropyLoss

try:
    __version__ = version("softtopk")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "MethodInfo",
    "SoftTopK",
    "SoftTopKRanks",
    "TopKCrossEntropyLoss",
    "functional",
    "hard_topk_mag",
    "hard_topk_mask",
    "methods",
    "noised_kth_value",
    "perturbed_topk",
    "soft_permutation",
    "soft_topk",
    "soft_topk_ranks",
    "sparse_topk_mag",
    "sparse_topk_mask",
    "topk_cross_entropy",
]
