"""The results suites of ``softtopk sweep`` (the runs behind ``docs/results.md``): per dataset, the
training tool, the flags common to every run, the metrics shown, and one setting per loss (the
seeds' recommended settings where they give one)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One row of a suite: ``label`` (also its directory name), the loss ``family``, and its flags."""

    label: str
    family: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Suite:
    """One dataset's protocol: the ``tool`` subcommand, flags of every run, metrics shown, and settings."""

    tool: str
    common: str
    metrics: tuple[str, ...]
    settings: tuple[Setting, ...]
    about: str


def _setting(label: str, family: str, flags: str) -> Setting:
    return Setting(label, family, tuple(shlex.split(flags)))


CE_FLAGS = "--method softmax_cross_entropy --p_k 1 0 0 0 0"
P_K_UNIFORM = "--p_k .2 .2 .2 .2 .2"
P_K_TOP5 = "--p_k .25 0 0 0 .75"
NETWORK = "--distribution logistic_phi --inverse_temperature 1 --art_lambda .5 --m 16"
SORTING_NETWORK, NEURALSORT, SOFTSORT = (
    "top-k CE, sorting network (difftopk)",
    "top-k CE, NeuralSort (difftopk)",
    "top-k CE, SoftSort (difftopk)",
)
SVM, NOISED, K5 = "smooth top-k SVM (Berrada)", "noised top-k hinge (Garcin)", "--p_k 0 0 0 0 1"
EMBEDDING_SETTINGS = (
    _setting("cross_entropy", "cross-entropy", CE_FLAGS),
    _setting("bitonic_pk_uniform", SORTING_NETWORK, f"--method bitonic {NETWORK} {P_K_UNIFORM}"),
    _setting("splitter_pk_uniform", SORTING_NETWORK, f"--method splitter_selection {NETWORK} {P_K_UNIFORM}"),
    _setting(
        "splitter_logistic_pk_top5",
        SORTING_NETWORK,
        f"--method splitter_selection --distribution logistic --inverse_temperature .5 --m 16 {P_K_TOP5}",
    ),
    _setting("neuralsort_pk_uniform", NEURALSORT, f"--method neuralsort --inverse_temperature .5 --m 16 {P_K_UNIFORM}"),
    _setting("neuralsort_pk_top5", NEURALSORT, f"--method neuralsort --inverse_temperature .5 --m 16 {P_K_TOP5}"),
    _setting("softsort_pk_uniform", SOFTSORT, f"--method softsort --inverse_temperature .5 --m 16 {P_K_UNIFORM}"),
    _setting(
        "smooth_hard_topk_tau1",
        "smooth top-k hinge (Lapin, as difftopk)",
        f"--method smooth_hard_topk --inverse_temperature 1 {K5}",
    ),
    _setting("svm_tau1", SVM, f"--method smooth_topk_svm --tau 1 --alpha 1 {K5}"),
    _setting("svm_tau0.1", SVM, f"--method smooth_topk_svm --tau .1 --alpha 1 {K5}"),
    _setting("bal_noised_eps1", NOISED, f"--method bal_noised_topk --epsilon 1 --n_samples 5 {K5}"),
    _setting("bal_noised_eps0.2", NOISED, f"--method bal_noised_topk --epsilon .2 --n_samples 10 {K5}"),
)
IMBALANCED = _setting(
    "imbal_noised_normll",
    "noised top-k hinge, LDAM margins (Garcin)",
    "--method imbal_noised_topk --epsilon .01 --max_m .2 --scale 60 --n_samples 5 --normalize_ll " + K5,
)
EMBEDDING_PROTOCOL = "--batch_size 256 --n_epochs 30 --eval_freq 50"
EMBEDDING_COMMON = f"--nloglr 2 {EMBEDDING_PROTOCOL}"
LEARNING_RATES = tuple(
    _setting(f"cross_entropy_nloglr{x}", "cross-entropy", f"--nloglr {x} {CE_FLAGS}") for x in ("1.5", "2", "2.5", "3")
)
KNN_SETTINGS = (
    _setting(
        "gumbel_tau1", "kNN, Gumbel subset sampling (Xie & Ermon)", "--method gumbel --relaxation subsets --tau 1"
    ),
    _setting("neuralsort_tau1", "kNN, NeuralSort (Grover et al.)", "--method neuralsort --tau 1"),
    _setting("lapsum_tau1", "kNN, closed-form Laplace (softtopk)", "--method lapsum --tau 1"),
)
KNN_COMMON = "--n_epochs 3 --k 9 --eval_neighbors 10000 --eval_queries 5000"
SUITES: dict[str, Suite] = {
    "wordnet148-lr": Suite(
        "train-embeddings",
        f"-d wordnet148 {EMBEDDING_PROTOCOL}",
        ("valid_top1", "valid_top5", "top1", "top5"),
        LEARNING_RATES,
        "the learning rate of the wordnet suites, chosen by cross-entropy's validation top-1",
    ),
    "wordnet148": Suite(
        "train-embeddings",
        f"-d wordnet148 {EMBEDDING_COMMON}",
        ("top1", "top5"),
        EMBEDDING_SETTINGS,
        "linear head on the built-in wordnet148 (148 balanced classes)",
    ),
    "wordnet-plants150": Suite(
        "train-embeddings",
        f"-d wordnet-plants150 {EMBEDDING_COMMON}",
        ("top1", "top5", "macro_top1", "macro_top5"),
        (*EMBEDDING_SETTINGS, IMBALANCED),
        "linear head on the built-in long-tailed wordnet-plants150 (123 classes)",
    ),
    "knn-mnist": Suite(
        "knn",
        f"--dataset mnist {KNN_COMMON}",
        ("untrained_top1", "top1"),
        KNN_SETTINGS,
        "differentiable kNN, ConvNet on MNIST, 3 epochs; hard 9-NN accuracy",
    ),
    "knn-fashion-mnist": Suite(
        "knn",
        f"--dataset fashion-mnist --net convnet {KNN_COMMON}",
        ("untrained_top1", "top1"),
        KNN_SETTINGS,
        "differentiable kNN, ConvNet on Fashion-MNIST, 3 epochs; hard 9-NN accuracy",
    ),
}
