"""The ``softtopk`` console script.

Subcommands: ``demo`` (the main job, :mod:`softtopk_lab.demo`), ``train-embeddings``
(:mod:`softtopk_lab.embeddings`), ``train-cifar100`` (:mod:`softtopk_lab.cifar100`), ``knn``
(:mod:`softtopk_lab.knn_train`), ``sweep`` (:mod:`softtopk_lab.sweep`, the runs of
``docs/results.md``) and ``data build-wordnet`` (:mod:`softtopk_lab.wordnet`). :func:`main` is the
one place that parses flags (:mod:`softtopk_lab.flags`) and turns them into a typed config
(:mod:`softtopk_lab.config`); the training modules, which import torch, are imported only when their
command runs, so ``softtopk --help`` and ``--version`` import neither torch nor numpy. Refused flags
(:class:`~softtopk_lab.errors.UsageError`) and bad data (:class:`~softtopk_lab.errors.DataError`)
exit with status 2 and one line ``softtopk <command>: error: <message>`` on stderr; unexpected
exceptions keep their traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from .config import (
    Cifar100Config,
    Config,
    DemoConfig,
    EmbeddingConfig,
    KnnConfig,
    SweepConfig,
    WordnetBuildConfig,
)
from .errors import DataError, UsageError
from .flags import build_parser


def _demo(config: DemoConfig) -> None:
    from .demo import run_demo

    run_demo(seed=config.seed, out=config.out, n_epochs=config.n_epochs)


def _train_embeddings(config: EmbeddingConfig) -> None:
    import torch

    from .embeddings import train_embeddings

    torch.set_num_threads(1)  # as difftopk's train_imagenet.py
    train_embeddings(config)


def _train_cifar100(config: Cifar100Config) -> None:
    from .cifar100 import train_cifar100

    train_cifar100(config)


def _knn(config: KnnConfig) -> None:
    from .knn_train import train_knn

    train_knn(config)


def _sweep(config: SweepConfig) -> None:
    from .sweep import run_sweep

    run_sweep(config)


def _build_wordnet(config: WordnetBuildConfig) -> None:
    from .wordnet import build_wordnet

    options = {} if config.wordnet_dir is None else {"wordnet_dir": config.wordnet_dir}
    try:
        build_wordnet(config.out, **options)
    except (FileNotFoundError, RuntimeError) as error:  # a missing source; the message names the install
        raise DataError(str(error)) from None


#: command → (its config, its handler, the flag whose path a DataError's message starts with).
_COMMANDS: dict[str, tuple[type[Config], Callable[[Any], None], str | None]] = {
    "demo": (DemoConfig, _demo, None),
    "train-embeddings": (EmbeddingConfig, _train_embeddings, "-d/--data_path"),
    "train-cifar100": (Cifar100Config, _train_cifar100, "-d/--data_path"),
    "knn": (KnnConfig, _knn, None),
    "sweep": (SweepConfig, _sweep, None),
    "data build-wordnet": (WordnetBuildConfig, _build_wordnet, None),
}


def main(argv: list[str] | None = None) -> int:
    """Run the ``softtopk`` command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    if "SOFTTOPK_SWEEP_PID" in os.environ:  # a run of a sweep ends with the sweep
        from .sweep import stop_with_parent

        stop_with_parent()
    args = build_parser().parse_args(argv)
    name = args.command if args.command != "data" else f"data {args.data_command}"
    config_type, handler, data_flag = _COMMANDS[name]
    try:
        handler(config_type.from_args(args))
    except UsageError as error:
        print(f"softtopk {name}: error: {error}", file=sys.stderr)
        return 2
    except DataError as error:
        print(f"softtopk {name}: error: {'' if data_flag is None else data_flag + ' '}{error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
