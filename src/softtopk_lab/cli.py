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
exceptions keep their traceback. Without the packages of the ``lab`` extra every command is the one
line that names the install command.
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
from .flags import build_parser, resume_target, use_stored_flags

TRAINING_TOOLS = ("train-embeddings", "train-cifar100", "knn")
#: the packages of the ``lab`` extra (``pyproject.toml``), which every command needs
LAB_EXTRA = ("numpy", "tqdm", "matplotlib")


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


def _stored_flags(command: str, directory: str) -> dict[str, Any]:
    """The flags of the run in ``directory`` (its ``config.json``), for ``--resume DIR`` alone."""
    import json

    path = os.path.join(directory, "config.json")
    try:
        with open(path) as stream:
            stored = json.load(stream)["flags"]
    except FileNotFoundError:
        raise UsageError(f"--resume {directory}: no config.json there (nothing to resume)") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"--resume {directory}: config.json is damaged (not the JSON a run writes)") from None
    if stored.get("command") != command:
        raise UsageError(f"--resume {directory}: holds a run of softtopk {stored.get('command')}, not {command}")
    return stored


def _where(name: str) -> str:
    """Where an interrupted command stands and how to continue it (no torch import)."""
    runner = sys.modules.get("softtopk_lab.runner")
    run = getattr(runner, "ACTIVE", None)
    if name == "sweep":
        return "; run the same command again to continue (finished runs are kept, started ones resume)"
    if run is None:
        return ""
    if run.checkpoint_step is None:
        return f" before the first checkpoint; run the same command again (it starts over in {run.dir})"
    return (
        f" at its checkpoint of step {run.checkpoint_step} in {run.dir}; continue with: "
        f"softtopk {name} --resume {run.dir}"
    )


def _missing_lab_extra() -> list[str]:
    """The packages of the ``lab`` extra that cannot be imported."""
    import importlib.util

    missing = []
    for package in LAB_EXTRA:
        try:
            if importlib.util.find_spec(package) is None:
                missing.append(package)
        except (ImportError, ValueError):
            missing.append(package)
    return missing


def main(argv: list[str] | None = None) -> int:
    """Run the ``softtopk`` command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    if "SOFTTOPK_SWEEP_PID" in os.environ:  # a run of a sweep ends with the sweep
        from .sweep import stop_with_parent

        stop_with_parent()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    given_out = any(token == "--out" or token.startswith("--out=") for token in argv)
    if argv and argv[0] in TRAINING_TOOLS and resume_target(argv) is not None and not given_out:
        try:
            use_stored_flags(parser, argv[0], _stored_flags(argv[0], resume_target(argv)))
        except UsageError as error:
            print(f"softtopk {argv[0]}: error: {error}", file=sys.stderr)
            return 2
    args = parser.parse_args(argv)
    name = args.command if args.command != "data" else f"data {args.data_command}"
    config_type, handler, data_flag = _COMMANDS[name]
    missing = _missing_lab_extra()
    if missing:
        print(
            f"softtopk {name}: error: the lab needs the 'lab' extra ({', '.join(missing)} not installed); "
            "install it with: pip install 'softtopk[lab]'",
            file=sys.stderr,
        )
        return 2
    try:
        handler(config_type.from_args(args))
    except KeyboardInterrupt:
        print(f"softtopk {name}: interrupted{_where(name)}", file=sys.stderr)
        return 130
    except UsageError as error:
        print(f"softtopk {name}: error: {error}", file=sys.stderr)
        return 2
    except DataError as error:
        print(f"softtopk {name}: error: {'' if data_flag is None else data_flag + ' '}{error}", file=sys.stderr)
        return 2
    finally:
        _release_run()
    return 0


def _release_run() -> None:
    """Release the lock of this process's run however the command ended (a process exit does this
    too; a caller of :func:`main` in the same process may resume it next)."""
    runner = sys.modules.get("softtopk_lab.runner")
    run = getattr(runner, "ACTIVE", None)
    if run is not None and run.lock is not None:
        run.lock.release()
    if runner is not None:
        runner.ACTIVE = None


if __name__ == "__main__":
    sys.exit(main())
