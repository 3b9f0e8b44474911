"""softtopk: differentiable top-k operators and top-k losses for PyTorch.

The face of the library: every public name, re-exported from :mod:`softtopk.functional`,
:mod:`softtopk.nn` and :mod:`softtopk.losses` (where they are documented); ``softtopk.compat`` holds
the original packages' signatures.
"""

from importlib.metadata import PackageNotFoundError, version

from . import functional, losses, nn
from ._registry import MethodInfo
from .operators import TopK
from .functional import (
    bal_noised_topk,
    gumbel_topk,
    hard_topk_mag,
    hard_topk_mask,
    imbal_noised_topk,
    load_balancing_loss,
    methods,
    ndcg_loss,
    noised_kth_value,
    perturbed_topk,
    smooth_top1_svm,
    smooth_topk_svm,
    soft_permutation,
    soft_rank,
    soft_sort,
    soft_topk,
    soft_topk_ranks,
    sparse_topk_mag,
    sparse_topk_mask,
    spearman_loss,
    top1_svm,
    topk,
    topk_cross_entropy,
    topk_svm,
)
from .nn import (
    BalNoisedTopK,
    DifferentiableKNN,
    ImbalNoisedTopK,
    NDCGLoss,
    SmoothTop1SVM,
    SmoothTopKSVM,
    SmoothTopkSVM,
    SoftTopK,
    Routing,
    SoftTopKRanks,
    SpearmanLoss,
    Top1SVM,
    TopKCrossEntropyLoss,
    TopKRouter,
    TopKSVM,
    TopkSVM,
)

try:
    __version__ = version("softtopk")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "BalNoisedTopK",
    "DifferentiableKNN",
    "ImbalNoisedTopK",
    "MethodInfo",
    "NDCGLoss",
    "Routing",
    "SmoothTop1SVM",
    "SmoothTopKSVM",
    "SmoothTopkSVM",
    "SoftTopK",
    "SoftTopKRanks",
    "SpearmanLoss",
    "Top1SVM",
    "TopKCrossEntropyLoss",
    "TopKRouter",
    "TopK",
    "TopKSVM",
    "TopkSVM",
    "bal_noised_topk",
    "functional",
    "gumbel_topk",
    "hard_topk_mag",
    "hard_topk_mask",
    "imbal_noised_topk",
    "load_balancing_loss",
    "losses",
    "methods",
    "ndcg_loss",
    "nn",
    "noised_kth_value",
    "perturbed_topk",
    "smooth_top1_svm",
    "smooth_topk_svm",
    "soft_permutation",
    "soft_rank",
    "soft_sort",
    "soft_topk",
    "soft_topk_ranks",
    "sparse_topk_mag",
    "sparse_topk_mask",
    "spearman_loss",
    "top1_svm",
    "topk",
    "topk_cross_entropy",
    "topk_svm",
]
