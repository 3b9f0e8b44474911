"""Typed, frozen configs of the ``softtopk`` commands: the flags, checked once.

:func:`softtopk_lab.cli.main` turns the parsed flags into one of these with :meth:`Config.from_args`
(the only reader of an ``argparse.Namespace``); the training tools take the config. A config can
also be built directly (the demo does), and checks its values the same way: a refused value raises
:class:`~softtopk_lab.errors.UsageError` naming the flag. Field names are the flags' names;
:meth:`Config.flags` gives them flat (``config.json``) and :meth:`Config.to_argv` as a command line.
Like :mod:`softtopk_lab.flags`, this module imports neither torch nor numpy.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar, get_type_hints

from .errors import UsageError
from .flags import CIFAR100_VAL_SIZE, KNN_DATASETS, KNN_METHODS, KNN_NETS
from .suites import SUITES

C = TypeVar("C", bound="Config")


class Config:
    """What every config shares: built from parsed flags, given back as flags or as a command line."""

    #: the ``softtopk`` subcommand of a top-level config.
    command: ClassVar[str] = ""

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace) -> C:
        """The config of parsed flags (nested configs read the same Namespace; lists become tuples).

        Raises:
            UsageError: a refused flag value (the message names the flag).
        """
        hints, values = get_type_hints(cls), {}
        for item in fields(cls):  # type: ignore[arg-type]
            hint = hints[item.name]
            if isinstance(hint, type) and issubclass(hint, Config):
                values[item.name] = hint.from_args(args)
            else:
                value = getattr(args, item.name)
                values[item.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)

    def flags(self) -> dict[str, Any]:
        """Every flag's value by its name, nested configs flattened (what ``config.json`` stores)."""
        flat: dict[str, Any] = {}
        for item in fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            flat.update(value.flags() if isinstance(value, Config) else {item.name: value})
        return flat

    def to_argv(self) -> list[str]:
        """The flags that parse back to this config: every value set (``None`` values and ``False``
        switches left out, as their flags' defaults)."""
        argv: list[str] = []
        for item in fields(self):  # type: ignore[arg-type]
            value, flag = getattr(self, item.name), item.metadata.get("flag", f"--{item.name}")
            if isinstance(value, Config):
                argv += value.to_argv()
            elif value is True:
                argv.append(flag)
            elif value is not None and value is not False and value != ():
                argv += [*([flag] if flag else []), *map(str, value if isinstance(value, tuple) else (value,))]
        return argv

    def command_line(self) -> str:
        """The equivalent ``softtopk`` command line."""
        return shlex.join(["softtopk", *self.command.split(), *self.to_argv()])


def _at_least(low: int, **values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < low:
            raise UsageError(f"--{name} must be >= {low}, got {value}")


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise UsageError(f"--{name} must be > 0, got {value}")


def _one_of(flag: str, value: str | None, options: tuple[str, ...]) -> None:
    if value not in options:
        raise UsageError(f"{flag} must be one of {', '.join(options)}, got {value!r}")


def check_p_k(p_k: tuple[float, ...]) -> tuple[float, ...]:
    """``--p_k`` as floats: non-empty, finite, non-negative, summing to 1 within 1e-4 (as difftopk)."""
    values = tuple(float(p) for p in p_k)
    if not values:
        raise UsageError("--p_k: p_k must be a non-empty sequence of floats, got ()")
    if any(not math.isfinite(p) or p < 0 for p in values):
        raise UsageError(f"--p_k: p_k entries must be finite and >= 0, got {list(values)}")
    if abs(sum(values) - 1.0) > 1e-4:
        raise UsageError(f"--p_k: p_k must sum to 1, got {list(values)} summing to {sum(values)}")
    return values


@dataclass(frozen=True)
class RunOutput(Config):
    """Where a training run writes: a new directory ``out`` or the run in ``resume`` continued."""

    out: Path | None = None
    resume: Path | None = None
    no_progress: bool = field(default=False, metadata={"flag": "--no-progress"})
    quiet: bool = False
    tensorboard: bool = False

    def __post_init__(self) -> None:
        if self.out is not None and self.resume is not None:
            raise UsageError("--out and --resume are exclusive (a resumed run continues in its own directory)")


@dataclass(frozen=True)
class LossConfig(Config):
    """The loss of ``train-embeddings`` / ``train-cifar100`` (:func:`softtopk_lab.train_losses.build_loss`)."""

    method: str
    p_k: tuple[float, ...] | None  # None: (1,) for softmax_cross_entropy, refused for the other methods
    inverse_temperature: float = 1.0
    m: int | None = 16
    distribution: str | None = None
    art_lambda: float = 0.5
    top1_mode: str = "sm"
    tau: float = 1.0
    alpha: float = 1.0
    epsilon: float = 1.0
    n_samples: int = 5
    max_m: float = 0.5
    scale: float = 50.0

    def __post_init__(self) -> None:
        if self.p_k is None and self.method != "softmax_cross_entropy":
            raise UsageError(
                f"--p_k is required for --method {self.method} (weights of ranks 1..k summing to 1, "
                "e.g. --p_k .2 .2 .2 .2 .2)"
            )
        object.__setattr__(self, "p_k", check_p_k((1.0,) if self.p_k is None else self.p_k))
        if self.m is not None and self.m < 1:
            raise UsageError(f"-m/--m must be >= 1, got {self.m}")
        _positive(inverse_temperature=self.inverse_temperature)


@dataclass(frozen=True)
class EmbeddingConfig(Config):
    """``softtopk train-embeddings`` (:func:`softtopk_lab.embeddings.train_embeddings`)."""

    command: ClassVar[str] = "train-embeddings"
    data_path: str = field(metadata={"flag": "-d"})
    loss: LossConfig
    experiment_id: int | None = None
    n_epochs: int = 20
    nloglr: float = 4.5
    batch_size: int = 500
    seed: int = 0
    device: str = "cpu"
    hidden_dims: tuple[int, ...] = ()
    eval_freq: int = 100
    apply_relu: bool = False
    apply_dropout: bool = False
    normalize_ll: bool = False
    val_size: int | None = None
    output: RunOutput = RunOutput()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EmbeddingConfig:
        """As :meth:`Config.from_args`; ``--n_epochs``, ``--nloglr`` and ``--batch_size`` not given
        take :data:`BUILTIN_DEFAULTS` for a built-in dataset, :data:`FILE_DEFAULTS` otherwise."""
        defaults = BUILTIN_DEFAULTS if is_builtin(args.data_path) else FILE_DEFAULTS
        resolved = argparse.Namespace(**vars(args))
        for name, value in defaults.items():
            if getattr(resolved, name) is None:
                setattr(resolved, name, value)
        return super().from_args(resolved)

    def __post_init__(self) -> None:
        _at_least(1, n_epochs=self.n_epochs, batch_size=self.batch_size, eval_freq=self.eval_freq)
        if any(width < 1 for width in self.hidden_dims):
            raise UsageError(f"--hidden_dims must be positive widths, got {list(self.hidden_dims)}")
        _at_least(1, val_size=self.val_size)


#: ``train-embeddings`` defaults for a difftopk embedding file (difftopk's ``train_imagenet.py``) and
#: for a built-in dataset (the settings ``docs/results.md`` chose on them)
FILE_DEFAULTS = {"n_epochs": 20, "nloglr": 4.5, "batch_size": 500}
BUILTIN_DEFAULTS = {"n_epochs": 30, "nloglr": 2.0, "batch_size": 256}
#: the built-in datasets' names (``softtopk_lab.wordnet.BUILTIN_DATASETS``, without its imports)
BUILTIN_NAMES = ("wordnet148", "wordnet-plants150")


def is_builtin(data_path: str) -> bool:
    """Whether ``-d`` names a built-in dataset (a file of that name wins, as in ``load_data``)."""
    return data_path in BUILTIN_NAMES and not os.path.exists(data_path)


@dataclass(frozen=True)
class Cifar100Config(Config):
    """``softtopk train-cifar100`` (:func:`softtopk_lab.cifar100.train_cifar100`)."""

    command: ClassVar[str] = "train-cifar100"
    data_path: str = field(metadata={"flag": "-d"})
    loss: LossConfig
    experiment_id: int | None = None
    n_epochs: int = 200
    nloglr: float = 3.0
    batch_size: int = 128
    seed: int = 0
    device: str = "cuda"
    label_noise: float = 0.0
    val_size: int = CIFAR100_VAL_SIZE
    output: RunOutput = RunOutput()

    def __post_init__(self) -> None:
        _at_least(1, n_epochs=self.n_epochs, batch_size=self.batch_size, val_size=self.val_size)
        if not (math.isfinite(self.label_noise) and 0.0 <= self.label_noise <= 1.0):
            raise UsageError(f"--label_noise must be a probability in [0, 1], got {self.label_noise}")
        if self.val_size < self.batch_size:
            raise UsageError(
                f"--val_size {self.val_size} must be >= --batch_size {self.batch_size} "
                "(the incomplete last validation batch is dropped, as in difftopk)"
            )


@dataclass(frozen=True)
class KnnConfig(Config):
    """``softtopk knn`` (:func:`softtopk_lab.knn_train.train_knn`)."""

    command: ClassVar[str] = "knn"
    dataset: str = "mnist"
    net: str | None = None
    data_root: Path | None = None
    k: int = 9
    method: str = "gumbel"
    tau: float = 1.0
    relaxation: str = "subsets"
    steepness: float = 10.0
    distribution: str = "cauchy"
    num_queries: int = 100
    num_candidates: int = 100
    n_epochs: int = 200
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 5e-4
    batch_eval: int = 500
    eval_neighbors: int | None = None
    eval_queries: int | None = None
    train_subset: int | None = None
    seed: int = 0
    device: str = "cpu"
    output: RunOutput = RunOutput()

    def __post_init__(self) -> None:
        _one_of("--dataset", self.dataset, KNN_DATASETS)
        if self.net is not None:
            _one_of("--net", self.net, KNN_NETS)
        _one_of("--method", self.method, KNN_METHODS)
        _at_least(
            1,
            k=self.k,
            num_queries=self.num_queries,
            num_candidates=self.num_candidates,
            n_epochs=self.n_epochs,
            batch_eval=self.batch_eval,
            eval_neighbors=self.eval_neighbors,
            eval_queries=self.eval_queries,
            train_subset=self.train_subset,
        )
        if self.k > self.num_candidates:
            raise UsageError(f"--k must be <= --num_candidates, got k = {self.k} > {self.num_candidates}")
        if self.eval_neighbors is not None and self.k > self.eval_neighbors:
            raise UsageError(f"--k must be <= --eval_neighbors, got k = {self.k} > {self.eval_neighbors}")
        _positive(tau=self.tau, steepness=self.steepness, lr=self.lr)
        for name in ("momentum", "weight_decay"):
            if not getattr(self, name) >= 0:
                raise UsageError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.relaxation not in ("subsets", "lapsum"):
            raise UsageError(f"--relaxation must be subsets or lapsum, got {self.relaxation!r}")


@dataclass(frozen=True)
class SweepConfig(Config):
    """``softtopk sweep`` (:func:`softtopk_lab.sweep.run_sweep`)."""

    command: ClassVar[str] = "sweep"
    suite: str = field(metadata={"flag": ""})
    seeds: tuple[int, ...] = (0, 1, 2)
    only: tuple[str, ...] | None = None
    n_epochs: int | None = None
    jobs: int = 1
    out: Path = Path("runs/sweep")
    dry_run: bool = field(default=False, metadata={"flag": "--dry-run"})
    quiet: bool = False

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise UsageError(f"SUITE must be one of {', '.join(SUITES)}, got {self.suite!r}")
        labels = [setting.label for setting in SUITES[self.suite].settings]
        for label in self.only or ():
            if label not in labels:
                raise UsageError(f"--only: {self.suite} has no setting {label!r} (it has {', '.join(labels)})")
        if len(set(self.seeds)) != len(self.seeds):
            raise UsageError(f"--seeds must be distinct, got {list(self.seeds)}")
        _at_least(1, jobs=self.jobs, n_epochs=self.n_epochs)


@dataclass(frozen=True)
class DemoConfig(Config):
    """``softtopk demo`` (:func:`softtopk_lab.demo.run_demo`)."""

    command: ClassVar[str] = "demo"
    n_epochs: int | None = None
    seed: int = 0
    out: Path = Path("runs/demo")

    def __post_init__(self) -> None:
        _at_least(1, n_epochs=self.n_epochs)


@dataclass(frozen=True)
class WordnetBuildConfig(Config):
    """``softtopk data build-wordnet`` (:func:`softtopk_lab.wordnet.build_wordnet`)."""

    command: ClassVar[str] = "data build-wordnet"
    out: Path
    wordnet_dir: Path | None = field(default=None, metadata={"flag": "--wordnet-dir"})
