"""softtopk: differentiable top-k operators and top-k losses for PyTorch."""

from importlib.metadata import PackageNotFoundError, version

from . import functional
from ._methods import MethodInfo, methods
from .functional import soft_permutation, soft_topk, soft_topk_ranks, topk_cross_entropy
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
    "methods",
    "soft_permutation",
    "soft_topk",
    "soft_topk_ranks",
    "topk_cross_entropy",
]
