"""Module face: every operator and loss as an ``nn.Module`` (re-exported; defined in the family files
next to the function each one twins).

Each name is imported as ``X as X`` (the explicit re-export that type checkers read) and ``__all__``
is what this file imports, so a Module is listed once here; the package's ``__all__`` repeats these
names because it must know them without importing torch."""

from ._deprecated import SmoothTopkSVM as SmoothTopkSVM
from ._deprecated import TopkSVM as TopkSVM
from .knn import DifferentiableKNN as DifferentiableKNN
from .knn import KNNOutput as KNNOutput
from .losses.ndcg import NDCGLoss as NDCGLoss
from .losses.noised import BalNoisedTopK as BalNoisedTopK
from .losses.noised_imbalanced import ImbalNoisedTopK as ImbalNoisedTopK
from .losses.smooth_svm import SmoothTop1SVM as SmoothTop1SVM
from .losses.smooth_svm import SmoothTopKSVM as SmoothTopKSVM
from .losses.smooth_svm import Top1SVM as Top1SVM
from .losses.smooth_svm import TopKSVM as TopKSVM
from .losses.spearman import SpearmanLoss as SpearmanLoss
from .losses.topk_ce import TopKCrossEntropyLoss as TopKCrossEntropyLoss
from .operators import SoftTopK as SoftTopK
from .operators import SoftTopKRanks as SoftTopKRanks
from .routing import Routing as Routing
from .routing import TopKRouter as TopKRouter
from .sorting import SoftRank as SoftRank
from .sorting import SoftSort as SoftSort

__all__ = sorted(name for name in dir() if not name.startswith("_"))
