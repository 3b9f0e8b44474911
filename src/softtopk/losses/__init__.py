"""Loss face: the top-k classification losses, functions and Modules (re-exported from the family
files :mod:`~softtopk.losses.topk_ce`, :mod:`~softtopk.losses.smooth_svm` and
:mod:`~softtopk.losses.noised`, :mod:`~softtopk.losses.noised_imbalanced`), the LDAM margins of the
imbalanced noised loss, and the ranking losses of :mod:`~softtopk.losses.ndcg` and
:mod:`~softtopk.losses.spearman`."""

from .ndcg import NDCGLoss, ndcg_loss
from .noised import BalNoisedTopK, bal_noised_topk
from .noised_imbalanced import ImbalNoisedTopK, imbal_noised_topk, ldam_margins
from .smooth_svm import (
    SmoothTop1SVM,
    SmoothTopKSVM,
    Top1SVM,
    TopKSVM,
    smooth_top1_svm,
    smooth_topk_svm,
    top1_svm,
    topk_svm,
)
from .spearman import SpearmanLoss, spearman_loss
from .topk_ce import TopKCrossEntropyLoss, topk_cross_entropy

__all__ = [
    "BalNoisedTopK",
    "ImbalNoisedTopK",
    "NDCGLoss",
    "SmoothTop1SVM",
    "SmoothTopKSVM",
    "SpearmanLoss",
    "Top1SVM",
    "TopKCrossEntropyLoss",
    "TopKSVM",
    "bal_noised_topk",
    "imbal_noised_topk",
    "ldam_margins",
    "ndcg_loss",
    "smooth_top1_svm",
    "smooth_topk_svm",
    "spearman_loss",
    "top1_svm",
    "topk_cross_entropy",
    "topk_svm",
]
