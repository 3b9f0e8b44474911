"""Functional face: every operator and loss as a function (re-exported; defined in the family files
:mod:`softtopk.operators`, :mod:`softtopk.sorting`, :mod:`softtopk.stochastic` and :mod:`softtopk.losses`).

Each name is imported as ``x as x`` (the explicit re-export that type checkers read) and ``__all__``
is what this file imports, so a function is listed once here; the package's ``__all__`` repeats
these names because it must know them without importing torch."""

from ._registry import methods as methods
from .losses.ndcg import ndcg_loss as ndcg_loss
from .losses.noised import bal_noised_topk as bal_noised_topk
from .losses.noised_imbalanced import imbal_noised_topk as imbal_noised_topk
from .losses.smooth_svm import smooth_top1_svm as smooth_top1_svm
from .losses.smooth_svm import smooth_topk_svm as smooth_topk_svm
from .losses.smooth_svm import top1_svm as top1_svm
from .losses.smooth_svm import topk_svm as topk_svm
from .losses.spearman import spearman_loss as spearman_loss
from .losses.topk_ce import topk_cross_entropy as topk_cross_entropy
from .operators import soft_permutation as soft_permutation
from .operators import soft_topk as soft_topk
from .operators import soft_topk_ranks as soft_topk_ranks
from .operators import topk as topk
from .routing import load_balancing_loss as load_balancing_loss
from .sorting import soft_rank as soft_rank
from .sorting import soft_sort as soft_sort
from .sparse import hard_topk_mag as hard_topk_mag
from .sparse import hard_topk_mask as hard_topk_mask
from .sparse import sparse_topk_mag as sparse_topk_mag
from .sparse import sparse_topk_mask as sparse_topk_mask
from .stochastic import gumbel_topk as gumbel_topk
from .stochastic import noised_kth_value as noised_kth_value
from .stochastic import perturbed_topk as perturbed_topk

__all__ = sorted(name for name in dir() if not name.startswith("_"))
