"""Shared machinery of the ``softtopk`` training tools: run directory, device, DDP, progress, resume.

A :class:`Run` owns one training run (the training loop that drives it: :mod:`.loop`):

* **run directory** (``--out DIR``, default ``runs/<command>-<YYYYmmdd-HHMMSS>``; marked and locked
  as :mod:`.rundir` says, every file written as :mod:`.files` says): ``config.json``
  (every flag, softtopk/torch versions, git commit when available, world size), ``metrics.jsonl``
  (one JSON object per evaluation), ``checkpoint.pt`` (atomic, end of every epoch),
  ``results.json`` and ``curves.png`` (written by :meth:`Run.finish`).
* **resume** (``--resume DIR``): the run continues in ``DIR`` from its last checkpoint (the end of
  the last completed epoch); evaluations logged after that checkpoint are dropped from
  ``metrics.jsonl`` because they are replayed. A flag that changes the result (anything but
  ``RESUME_IGNORED`` and the tool's own extra list) must equal the stored config, else
  :class:`UsageError`; so is a checkpoint that lacks an entry, holds another model's weights or an
  epoch this run never reaches, and a missing or damaged ``metrics.jsonl``.
* **device** (``--device cpu|cuda|cuda:N``) and **multi-process** training: launched by
  ``torchrun`` (env ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``), the run initialises
  ``torch.distributed`` (gloo on CPU, nccl on CUDA; ``cuda`` means ``cuda:LOCAL_RANK``), wraps the
  model in ``DistributedDataParallel`` and splits every global batch across ranks
  (:meth:`Run.shard`, :meth:`Run.shard_weight`), so the global batch size stays the flag's value.
  Only rank 0 writes files and prints.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from .checkpoint import is_number, load_checkpoint, malformed_entries, rng_state, save_atomic, set_rng_state
from .config import Cifar100Config, EmbeddingConfig, KnnConfig
from .errors import UsageError
from .files import append_text, remove_stale_temporaries, replace_atomic, write_failure, write_text_atomic
from .interrupts import interrupt_after
from .records import metrics_csv, progress_line
from .rundir import RunLock, check_new_run_directory, claim, owned
from .runtime import git_commit, jsonable, resolve_device

#: the run of this process, for the line an interruption prints (``softtopk_lab.cli``)
ACTIVE: Run | None = None
RESUME_IGNORED = ("out", "resume", "no_progress", "quiet", "tensorboard", "device", "experiment_id")


class Run:
    """One training run (see the module docstring).

    Args:
        config: the tool's config; its command names the default directory.
        resume_ignored: extra flag names that may differ on ``--resume``.
        parent: the run id of the command that started this run (the demo), stored in its marker.
    """

    def __init__(
        self,
        config: EmbeddingConfig | Cifar100Config | KnnConfig,
        resume_ignored: Iterable[str] = (),
        parent: str | None = None,
    ) -> None:
        self.command = command = config.command
        output = config.output
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ
        self.device = resolve_device(config.device, local_rank if self.distributed else None)
        self.is_main = self.rank == 0
        self.show_progress = self.is_main and not output.no_progress and not output.quiet and sys.stderr.isatty()
        # without a terminal: one plain line per evaluation on stdout instead of bars
        self.print_lines = self.is_main and not output.quiet and not sys.stdout.isatty()
        self.total_steps: int | None = None  # set by the tool, for the ETA of those lines
        self.tensorboard = output.tensorboard
        flags = {"command": command, **config.flags()}  # the keys of the parsed flags, as before the typed configs
        self.config = {name: jsonable(value) for name, value in sorted(flags.items())}
        self.resumed: dict[str, Any] | None = None
        self.lock: RunLock | None = None
        if output.resume is not None:
            self.dir = Path(output.resume)
            self._check_resumable()
            if self.is_main:
                self._lock("--resume")
            self._check_resume(resume_ignored)
        else:
            self.dir = Path(output.out) if output.out is not None else self._default_dir()
            check_new_run_directory(self.dir, "--out", command, parent)
            if self.is_main:
                try:
                    self.dir.mkdir(parents=True, exist_ok=True)
                except OSError as error:
                    raise UsageError(f"--out {self.dir}: cannot be created ({error.strerror or error})") from None
                self._lock("--out")
                check_new_run_directory(self.dir, "--out", command, parent)  # again, now that no other writer can start
                claim(self.dir, command, parent)
        if self.distributed:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            torch.distributed.init_process_group(backend)
        if self.is_main and self.resumed is None:
            meta = {
                "softtopk_version": version("softtopk"),
                "torch_version": torch.__version__,
                "git_commit": git_commit(),
                "world_size": self.world_size,
                "command": command,
            }
            write_text_atomic(self.dir / "config.json", json.dumps({"flags": self.config, **meta}, indent=2) + "\n")
            write_text_atomic(self.dir / "metrics.jsonl", "")
        self.started = time.monotonic() - (self.resumed["elapsed"] if self.resumed else 0.0)
        self.checkpoint_step: int | None = self.resumed["step"] if self.resumed else None
        self.writer = self._tensorboard_writer() if self.is_main and self.tensorboard else None
        global ACTIVE
        ACTIVE = self

    def _default_dir(self) -> Path:
        """``runs/<command>-<YYYYmmdd-HHMMSS>``, with ``-2``, ``-3``, ... when that already exists."""
        base = Path("runs") / f"{self.command}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, number = base, 1
        while path.exists():
            number += 1
            path = base.with_name(f"{base.name}-{number}")
        return path

    def _tensorboard_writer(self) -> Any:
        """A TensorBoard writer into ``DIR/tensorboard`` (events after the checkpoint of a resumed run
        are purged: they are replayed)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UsageError("--tensorboard needs the tensorboard package (pip install tensorboard)") from None
        if (self.dir / "tensorboard").is_symlink():
            raise UsageError(
                f"--tensorboard: {self.dir / 'tensorboard'} is a symbolic link; softtopk never writes "
                "through a link (remove it)"
            )
        purge = self.checkpoint_step + 1 if self.checkpoint_step is not None else None
        return SummaryWriter(log_dir=str(self.dir / "tensorboard"), purge_step=purge)

    def _lock(self, flag: str) -> None:
        """Hold the run directory's lock for the rest of the process; drop stale temporary files."""
        self.lock = RunLock(self.dir, flag)
        try:
            remove_stale_temporaries(self.dir)
        except UsageError:
            self.lock.release()
            raise

    def _check_resumable(self) -> None:
        """Refuse a ``--resume`` directory without a run's files or its marker (before taking its lock)."""
        if not (self.dir / "config.json").is_file() or not (self.dir / "checkpoint.pt").is_file():
            raise UsageError(f"--resume {self.dir}: no config.json and checkpoint.pt there (nothing to resume)")
        if not owned(self.dir):
            raise UsageError(
                f"--resume {self.dir}: not a run directory of this softtopk version (no .softtopk-run "
                "marker); start a new run with --out"
            )

    def _check_resume(self, resume_ignored: Iterable[str]) -> None:
        config_path, checkpoint_path = self.dir / "config.json", self.dir / "checkpoint.pt"
        try:
            stored = json.loads(config_path.read_text())["flags"]
            if not isinstance(stored, dict):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"--resume {self.dir}: config.json is damaged (not the JSON a run writes)") from None
        ignored = set(RESUME_IGNORED) | set(resume_ignored)
        for name in sorted(set(stored) | set(self.config)):
            if name not in ignored and stored.get(name) != self.config.get(name):
                raise UsageError(
                    f"--resume {self.dir}: flag --{name} differs from the stored run "
                    f"(stored {stored.get(name)!r}, given {self.config.get(name)!r})"
                )
        try:
            self.resumed = load_checkpoint(checkpoint_path)
        except UsageError as error:
            raise UsageError(f"--resume {self.dir}: {error}") from None
        missing = malformed_entries(self.resumed)
        if missing:
            raise UsageError(
                f"--resume {self.dir}: checkpoint.pt is not a checkpoint of this run (missing or "
                f"malformed: {', '.join(missing)})"
            )

    # ---- model and batches -------------------------------------------------------------------
    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move ``model`` to the device; under torchrun wrap it in ``DistributedDataParallel``."""
        model = model.to(self.device)
        if not self.distributed:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)

    def shard(self, indices: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous part of a global batch (the whole batch without torchrun)."""
        return indices.tensor_split(self.world_size)[self.rank]

    def shard_weight(self, local: int, total: int) -> float:
        """Factor for a rank's mean loss so DDP's gradient average equals the global-batch mean."""
        return local * self.world_size / total

    def mean_loss(self, losses: list[torch.Tensor]) -> float | None:
        """Mean over steps and ranks of detached per-step losses (``None`` for none): one reduction and
        one host sync per evaluation, none per step."""
        if not losses:
            return None
        value = torch.stack(losses).double().mean().reshape(1)
        if self.distributed:
            torch.distributed.all_reduce(value)
            value /= self.world_size
        return value.item()

    def progress(self, iterable: Iterable, total: int, desc: str):
        """A tqdm bar on stderr, disabled on other ranks, without a TTY or with ``--no-progress``."""
        from tqdm import tqdm

        return tqdm(
            iterable,
            total=total,
            desc=desc,
            file=sys.stderr,
            disable=not self.show_progress,
            leave=False,
            dynamic_ncols=True,
        )

    # ---- files -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds of training so far, counting the time before a resume."""
        return time.monotonic() - self.started

    def log(self, record: dict[str, Any]) -> None:
        """Append one evaluation record to ``metrics.jsonl`` (rank 0 only); without a terminal, print
        it as one line (step, loss, validation metrics, elapsed, ETA).

        Raises:
            UsageError: the disk is full (the checkpoint of the last epoch stays intact).
        """
        if not self.is_main:
            return
        after = (
            "no checkpoint was written yet"
            if self.checkpoint_step is None
            else f"the last checkpoint is intact; continue with --resume {self.dir}"
        )
        for name, text in (
            ("metrics.jsonl", lambda empty: json.dumps(record) + "\n"),
            ("metrics.csv", lambda empty: metrics_csv([record], header=empty)),
        ):
            try:
                append_text(self.dir / name, text)
            except OSError as error:
                raise write_failure(self.dir / name, error, after) from None
        if self.print_lines:
            print(progress_line(record, self.total_steps), flush=True)
        if self.writer is not None:
            if record.get("train_loss") is not None:
                self.writer.add_scalar("train/loss", record["train_loss"], record["step"])
            for split in ("valid", "test"):
                for name, value in record[split].items():
                    self.writer.add_scalar(f"{split}/{name}", value, record["step"])
            self.writer.flush()

    def save_checkpoint(self, state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
        """Write ``checkpoint.pt`` atomically: ``state`` plus every RNG state and the elapsed time (a
        Ctrl-C meanwhile waits for the end, so the line it prints names the checkpoint on disk)."""
        if self.is_main:
            payload = dict(state, rng=rng_state(generators), elapsed=self.elapsed())
            with interrupt_after():
                save_atomic(payload, self.dir / "checkpoint.pt")
                self.checkpoint_step = state["step"]

    def save_best(
        self, model: torch.nn.Module, model_args: dict[str, Any], improved: set[str], best: Any, metric: str = "top1"
    ) -> None:
        """Write ``best.pt`` when ``metric`` improved: the weights at its best validation value (the
        evaluation whose test value the tools report), with the builder's arguments, so that::

            state = torch.load("RUN/best.pt", weights_only=True)
            model = build_model(**state["model_args"]); model.load_state_dict(state["model"])

        rebuilds it (``build_model`` of the tool's module)."""
        if self.is_main and metric in improved:
            entry = best.best[metric]
            state = {
                "format": "softtopk-lab-best/1",
                "model": model.state_dict(),
                "model_args": model_args,
                "metric": metric,
                **entry,
            }
            replace_atomic(self.dir / "best.pt", lambda stream: torch.save(state, stream))

    def restore(
        self,
        generators: dict[str, torch.Generator],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        best: Any,
        *,
        n_epochs: int,
        steps_per_epoch: int,
    ) -> dict[str, Any] | None:
        """On ``--resume``: restore the RNG states, ``model``, ``optimizer`` and ``best`` (a
        :class:`~softtopk_lab.metrics.BestTracker`), trim ``metrics.jsonl`` and return the
        checkpoint (its entries checked when the run opened it); ``None`` for a new run.

        Raises:
            UsageError: the checkpoint holds another model's weights, or an epoch and step that a
                run of ``n_epochs`` epochs of ``steps_per_epoch`` steps never writes;
                ``metrics.jsonl`` is missing or damaged.
        """
        state = self.resumed
        if state is None:
            return None
        epoch, step = state["epoch"], state["step"]
        if not (isinstance(epoch, int) and 0 <= epoch < n_epochs and step == (epoch + 1) * steps_per_epoch):
            raise UsageError(
                f"--resume {self.dir}: checkpoint.pt claims epoch {epoch + 1} (step {step}) of a run of "
                f"{n_epochs} epochs of {steps_per_epoch} steps; it is not this run's checkpoint"
            )
        try:
            valid, test = state["last_evaluation"]
            if not (
                isinstance(valid, dict)
                and isinstance(test, dict)
                and valid.keys() == test.keys()
                and all(is_number(value) for value in (*valid.values(), *test.values()))
            ):
                raise TypeError("last_evaluation is not two dicts of the same metrics")
            set_rng_state(state["rng"], generators)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            best.load_state_dict(state["best"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as error:
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise UsageError(f"--resume {self.dir}: checkpoint.pt does not fit this run ({reason[:160]})") from None
        if self.is_main:
            self._trim_metrics(step)
        return state

    def _trim_metrics(self, step: int) -> None:
        """Drop the evaluations after the checkpoint's ``step`` from ``metrics.jsonl`` and ``metrics.csv``."""
        path = self.dir / "metrics.jsonl"
        try:
            lines = [line for line in path.read_text().splitlines() if line]
            records = [json.loads(line) for line in lines]
            kept = [index for index, record in enumerate(records) if record["step"] <= step]
            csv_text = metrics_csv([records[index] for index in kept], header=True)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise UsageError(
                f"--resume {self.dir}: metrics.jsonl is missing or damaged (not the lines a run "
                "writes); start a new run with --out"
            ) from None
        write_text_atomic(path, "".join(lines[index] + "\n" for index in kept))
        write_text_atomic(self.dir / "metrics.csv", csv_text)

    def finish(self, results: dict[str, Any], summary: str) -> None:
        """Write ``curves.png`` then ``results.json`` (each atomically: a ``results.json`` means a
        finished run with its plot), print ``summary``, release the lock, end the process group."""
        if self.is_main:
            replace_atomic(self.dir / "curves.png", self._plot)
            write_text_atomic(self.dir / "results.json", json.dumps(results, indent=2) + "\n")
            print(summary)
            print(f"run directory: {self.dir}")
            if self.writer is not None:
                self.writer.close()
            self.lock.release()
        if self.distributed:
            torch.distributed.barrier()  # no rank closes its connections while a peer still uses them
            torch.distributed.destroy_process_group()

    def _plot(self, stream: Any) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        records = [json.loads(line) for line in (self.dir / "metrics.jsonl").read_text().splitlines() if line]
        figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        trained = [r for r in records if r.get("train_loss") is not None]
        left.plot([r["step"] for r in trained], [r["train_loss"] for r in trained], marker=".")
        left.set(xlabel="step", ylabel="training loss (mean since last evaluation)", title="training loss")
        for name in ("top1", "top5", "macro_top1", "macro_top5"):
            if records and name in records[0]["valid"]:
                right.plot([r["step"] for r in records], [r["valid"][name] for r in records], label=name)
        right.set(xlabel="step", ylabel="validation accuracy", title="validation metrics")
        # beside the panel, not on it: a legend never hides a line
        right.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        figure.tight_layout()
        figure.savefig(stream, dpi=100, format="png")
        plt.close(figure)
