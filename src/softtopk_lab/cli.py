"""The ``softtopk`` console script.

Subcommands: ``demo`` (the main job, :mod:`softtopk_lab.demo`), ``train-embeddings``
(:mod:`softtopk_lab.embeddings`), ``train-cifar100`` (:mod:`softtopk_lab.cifar100`),
``knn`` (:mod:`softtopk_lab.knn_train`), ``sweep`` (:mod:`softtopk_lab.sweep`,
the runs of ``docs/results.md``) and ``data build-wordnet``
(:mod:`softtopk_lab.wordnet`). Problems with flags or data exit with status 2 and one line
``softtopk <command>: error: <message>`` on stderr; unexpected exceptions keep their traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    from .embeddings import add_arguments

    parser = argparse.ArgumentParser(prog="softtopk", description="Differentiable top-k for PyTorch.")
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
    embeddings = commands.add_parser(
        "train-embeddings", help="train a linear/MLP head on precomputed embeddings (difftopk's train_imagenet.py)",
        description="Train a linear (or MLP) head on precomputed embeddings with a top-k loss. Flags of difftopk's "
                    "experiments/train_imagenet.py keep their names and defaults. Writes config.json, metrics.jsonl, "
                    "checkpoint.pt (every epoch), results.json and curves.png to the run directory. Under torchrun "
                    "the global batch is split across processes.")
    add_arguments(embeddings)
    from . import cifar100

    cifar = commands.add_parser(
        "train-cifar100", help="train a ResNet-18 on CIFAR-100 from scratch (difftopk's train_cifar100.py)",
        description="Train a CIFAR ResNet-18 from scratch on CIFAR-100 with a top-k loss. Flags of difftopk's "
                    "experiments/train_cifar100.py keep their names and defaults (--device cuda). Writes config.json, "
                    "metrics.jsonl (every epoch), checkpoint.pt (every epoch), results.json and curves.png to the "
                    "run directory. Under torchrun the global batch is split across processes.")
    cifar100.add_arguments(cifar)
    from . import knn_train

    knn = commands.add_parser(
        "knn", help="train a differentiable-kNN embedding on MNIST / Fashion-MNIST (NeuralSort / subsets protocol)",
        description="Train an embedding net with a relaxed top-k kNN loss (k = 9, 100 queries x 100 candidates per "
                    "step, SGD) and evaluate the hard kNN majority vote on validation and test with the training "
                    "split as neighbours; the result is the test accuracy at the best validation accuracy. Writes "
                    "config.json, metrics.jsonl, checkpoint.pt (every epoch), results.json and curves.png to the "
                    "run directory. Under torchrun the queries of a step are split across processes.")
    knn_train.add_arguments(knn)
    from . import sweep

    sweep_parser = commands.add_parser(
        "sweep", help="run a results suite (the runs of docs/results.md) over seeds and summarise it",
        description="Run every setting of a suite with every seed, each as its own softtopk process with one torch "
                    "thread, into OUT/SUITE/<setting>/seed<S> (finished runs are kept, interrupted ones resumed), "
                    "then write OUT/SUITE/summary.json and summary.md: mean +- sample std over seeds of the test "
                    "value at the best validation value, time per step, and each row's exact command.")
    sweep.add_arguments(sweep_parser)
    data = commands.add_parser("data", help="build datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    wordnet = data_commands.add_parser("build-wordnet", help="embed the WordNet noun datasets once and cache them",
                                       description="Build the built-in WordNet embedding datasets.")
    wordnet.add_argument("--out", type=Path, required=True, help="directory the datasets are written to")
    wordnet.add_argument("--wordnet-dir", dest="wordnet_dir", type=Path, default=None,
                         help="directory holding WordNet's data.noun (default: the system's WordNet)")
    return parser


def _demo(args: argparse.Namespace) -> None:
    from .demo import run_demo
    from .runner import UsageError

    if args.n_epochs is not None and args.n_epochs < 1:
        raise UsageError(f"--n_epochs must be >= 1, got {args.n_epochs}")
    run_demo(seed=args.seed, out=args.out, n_epochs=args.n_epochs)


def _train_embeddings(args: argparse.Namespace) -> None:
    import torch

    from .embeddings import train_embeddings

    torch.set_num_threads(1)  # as difftopk's train_imagenet.py
    train_embeddings(args)


def _train_cifar100(args: argparse.Namespace) -> None:
    from .cifar100 import train_cifar100

    train_cifar100(args)


def _knn(args: argparse.Namespace) -> None:
    from .knn_train import train_knn

    train_knn(args)


def _sweep(args: argparse.Namespace) -> None:
    from .sweep import run_sweep

    run_sweep(args)


def _build_wordnet(args: argparse.Namespace) -> None:
    from .wordnet import build_wordnet

    from .runner import UsageError

    options = {} if args.wordnet_dir is None else {"wordnet_dir": args.wordnet_dir}
    try:
        build_wordnet(args.out, **options)
    except (FileNotFoundError, RuntimeError) as error:  # a missing source; the message names the install
        raise UsageError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    """Run the ``softtopk`` command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    from .runner import UsageError

    args = _parser().parse_args(argv)
    name = args.command if args.command != "data" else f"data {args.data_command}"
    handler = {"demo": _demo, "train-embeddings": _train_embeddings, "train-cifar100": _train_cifar100, "knn": _knn,
               "sweep": _sweep, "data": _build_wordnet}[args.command]
    try:
        handler(args)
    except UsageError as error:
        print(f"softtopk {name}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
