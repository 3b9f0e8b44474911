"""Module face: every operator and loss as an ``nn.Module`` (re-exported; defined in the family files
next to the function each one twins)."""

from ._deprecated import SmoothTopkSVM, TopkSVM
from .knn import DifferentiableKNN, KNNOutput
from .losses.ndcg import NDCGLoss
from .losses.noised import BalNoisedTopK
from .losses.noised_imbalanced import ImbalNoisedTopK
from .losses.smooth_svm import SmoothTop1SVM, SmoothTopKSVM, Top1SVM, TopKSVM
from .losses.spearman import SpearmanLoss
from .losses.topk_ce import TopKCrossEntropyLoss
from .operators import SoftTopK, SoftTopKRanks
from .routing import Routing, TopKRouter
from .sorting import SoftRank, SoftSort

__all__ = [
    "BalNoisedTopK",
    "DifferentiableKNN",
    "ImbalNoisedTopK",
    "KNNOutput",
    "NDCGLoss",
    "Routing",
    "SmoothTop1SVM",
    "SmoothTopKSVM",
    "SmoothTopkSVM",
    "SoftRank",
    "SoftSort",
    "SoftTopK",
    "SoftTopKRanks",
    "SpearmanLoss",
    "Top1SVM",
    "TopKCrossEntropyLoss",
    "TopKRouter",
    "TopKSVM",
    "TopkSVM",
]
