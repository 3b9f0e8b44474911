"""Functional face: every operator and loss as a function (re-exported; defined in the family files
:mod:`softtopk.operators`, :mod:`softtopk.sorting`, :mod:`softtopk.stochastic` and :mod:`softtopk.losses`)."""

from ._registry import methods
from .losses.ndcg import ndcg_loss
from .losses.noised import bal_noised_topk
from .losses.noised_imbalanced import imbal_noised_topk
from .losses.smooth_svm import smooth_top1_svm, smooth_topk_svm, top1_svm, topk_svm
from .losses.spearman import spearman_loss
from .losses.topk_ce import topk_cross_entropy
from .operators import soft_permutation, soft_topk, soft_topk_ranks, topk
from .routing import load_balancing_loss
from .sorting import soft_rank, soft_sort
from .sparse import hard_topk_mag, hard_topk_mask, sparse_topk_mag, sparse_topk_mask
from .stochastic import gumbel_topk, noised_kth_value, perturbed_topk

__all__ = [
    "bal_noised_topk",
    "gumbel_topk",
    "hard_topk_mag",
    "hard_topk_mask",
    "imbal_noised_topk",
    "load_balancing_loss",
    "methods",
    "ndcg_loss",
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
    "topk_cross_entropy",
    "topk",
    "topk_svm",
]
