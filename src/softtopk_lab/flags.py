"""The ``softtopk`` command line's flags: :func:`build_parser`, called by :func:`softtopk_lab.cli.main` only.

This module imports neither torch nor numpy, so ``softtopk --help`` stays fast: the ``--method``
choices are listed here (``tests/test_flags.py`` checks them against :func:`softtopk.methods`).
Flag values are checked when :mod:`softtopk_lab.config` turns them into a config.
"""

from __future__ import annotations

import argparse
from importlib.metadata import version
from pathlib import Path

from .flags_tools import CIFAR100_VAL_SIZE as CIFAR100_VAL_SIZE
from .flags_tools import DIFFTOPK_RANKS as DIFFTOPK_RANKS
from .flags_tools import HINGE_LOSSES as HINGE_LOSSES
from .flags_tools import KNN_DATASETS as KNN_DATASETS
from .flags_tools import KNN_METHODS as KNN_METHODS
from .flags_tools import KNN_NETS as KNN_NETS
from .flags_tools import OTHER_RANKS as OTHER_RANKS
from .flags_tools import TRAIN_METHODS as TRAIN_METHODS
from .flags_tools import (
    cifar100_flags,
    embedding_flags,
    knn_flags,
    sweep_flags,
)

#: the training subcommands: (name, flags, help, description)
_TOOLS = (
    (
        "train-embeddings",
        embedding_flags,
        "train a linear/MLP head on precomputed embeddings (difftopk's train_imagenet.py)",
        "Train a linear (or MLP) head on precomputed embeddings with a top-k loss. Flags of difftopk's "
        "experiments/train_imagenet.py keep their names and defaults. Writes config.json, metrics.jsonl, "
        "checkpoint.pt (every epoch), results.json and curves.png to the run directory. Under torchrun "
        "the global batch is split across processes.",
    ),
    (
        "train-cifar100",
        cifar100_flags,
        "train a ResNet-18 on CIFAR-100 from scratch (difftopk's train_cifar100.py)",
        "Train a CIFAR ResNet-18 from scratch on CIFAR-100 with a top-k loss. Flags of difftopk's "
        "experiments/train_cifar100.py keep their names and defaults (--device cuda). Writes config.json, "
        "metrics.jsonl (every epoch), checkpoint.pt (every epoch), results.json and curves.png to the "
        "run directory. Under torchrun the global batch is split across processes.",
    ),
    (
        "knn",
        knn_flags,
        "train a differentiable-kNN embedding on MNIST / Fashion-MNIST (NeuralSort / subsets protocol)",
        "Train an embedding net with a relaxed top-k kNN loss (k = 9, 100 queries x 100 candidates per "
        "step, SGD) and evaluate the hard kNN majority vote on validation and test with the training "
        "split as neighbours; the result is the test accuracy at the best validation accuracy. Writes "
        "config.json, metrics.jsonl, checkpoint.pt (every epoch), results.json and curves.png to the "
        "run directory. Under torchrun the queries of a step are split across processes.",
    ),
    (
        "sweep",
        sweep_flags,
        "run a results suite (the runs of docs/results.md) over seeds and summarise it",
        "Run every setting of a suite with every seed, each as its own softtopk process with one torch "
        "thread, into OUT/SUITE/<setting>/seed<S> (finished runs are kept, interrupted ones resumed), "
        "then write OUT/SUITE/summary.json and summary.md: mean +- sample std over seeds of the test "
        "value at the best validation value, time per step, and each row's exact command.",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``softtopk`` parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="softtopk", description="Differentiable top-k for PyTorch.")
    parser.add_argument(
        "--version",
        action="version",
        version=f"softtopk {version('softtopk')}",
        help="print the installed softtopk version and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="the main job: soft top-k of an example, then CE vs top-k losses on the built-in wordnet148",
        description="Print the soft top-3 mask of an example for every method, then train a linear head on the "
        "built-in wordnet148 embeddings with cross-entropy and one loss of each top-k family; print "
        "top-1/top-5 (test at best validation) and ms per step; write demo.json and demo.png.",
    )
    demo.add_argument("--n_epochs", type=int, default=None, help="epochs per run (default: 30)")
    demo.add_argument("--seed", type=int, default=0, help="random seed of every run (default 0)")
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("runs/demo"),
        help="output directory: demo.json, demo.png and one run directory per loss (default runs/demo)",
    )
    for name, add_flags, help_text, description in _TOOLS:
        add_flags(commands.add_parser(name, help=help_text, description=description))
    _data_flags(commands)
    return parser


def _data_flags(commands: argparse._SubParsersAction) -> None:
    """The ``data`` subcommand and its ``build-wordnet``."""
    data = commands.add_parser("data", help="build datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    wordnet = data_commands.add_parser(
        "build-wordnet",
        help="embed the WordNet noun datasets once and cache them",
        description="Build the built-in WordNet embedding datasets.",
    )
    wordnet.add_argument("--out", type=Path, required=True, help="directory the datasets are written to")
    wordnet.add_argument(
        "--wordnet-dir",
        dest="wordnet_dir",
        type=Path,
        default=None,
        help="directory holding WordNet's data.noun (default: the system's WordNet)",
    )


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
    sub.set_defaults(
        **{name: value for name, value in stored.items() if name in known and name not in ("out", "resume")}
    )
    for action in sub._actions:
        action.required = False
