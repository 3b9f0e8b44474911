"""``softtopk sweep``: the runs behind ``docs/results.md``, over seeds, with their summary tables.

A *suite* (:data:`softtopk_lab.suites.SUITES`) is one dataset's protocol: a training tool, flags
common to every run, and one entry per loss setting (the seeds' recommended settings where they give
one). ``softtopk sweep SUITE --seeds 0 1 2`` runs every setting with every seed as a separate ``softtopk`` process
(``--jobs`` at a time, each with one torch thread: results depend on the thread count), into
``OUT/SUITE/<setting>/seed<S>`` (its command in ``seed<S>.command``, its output in ``seed<S>.log``).
A run whose ``results.json`` exists is kept; one with only a checkpoint is continued with
``--resume``, so an interrupted sweep picks up where it stopped. A directory holding a run of a
different command (other ``--n_epochs``, or a changed suite) is an error, never mixed in. The
sweep writes only into its own tree: ``OUT/SUITE`` must be new or carry a sweep's marker
(:mod:`.rundir`); a setting or run directory that is a link, a log that is a link, or a damaged
``results.json`` is a one-line error.

``OUT/SUITE/summary.json`` and ``summary.md`` then give, per setting, the mean ± sample standard
deviation (``ddof = 1``) over seeds of each metric (the test value at the best validation value of
that metric, as the tools report it; ``valid_*``: the best validation value itself; ``untrained_*``:
the test value before the first step), the mean
training time per step and per run, and the exact command of every row (``--seed S`` being the seed).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .config import SweepConfig
from .errors import UsageError
from .files import open_for_writing, write_text_atomic
from .rundir import LOCK, RunLock, claim, read_marker
from .suites import SUITES, Setting, Suite


def command(suite: Suite, setting: Setting, seed: int, n_epochs: int | None = None) -> list[str]:
    """The ``softtopk`` arguments of one run (without ``--out``/``--resume``)."""
    epochs = () if n_epochs is None else ("--n_epochs", str(n_epochs))
    return [suite.tool, *shlex.split(suite.common), *setting.flags, *epochs, "--seed", str(seed)]


def _recorded(run_dir: Path) -> Path:
    return run_dir.parent / f"{run_dir.name}.command"


def _check_recorded(argv: list[str], run_dir: Path) -> None:
    recorded = _recorded(run_dir)
    if recorded.exists() and recorded.read_text() != shlex.join(argv):
        raise UsageError(f"{run_dir} holds a run of another command ({recorded.read_text()}); use another --out")


PARENT_ENV = "SOFTTOPK_SWEEP_PID"


def stop_with_parent() -> None:
    """In a run started by a sweep (``SOFTTOPK_SWEEP_PID`` set): ask Linux to send this process
    SIGTERM when the sweep dies, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``), and end at once if
    it is already gone. Elsewhere a no-op (an interrupted sweep's SIGINT reaches its process group)."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        sys.exit(1)


def _run_one(argv: list[str], run_dir: Path, quiet: bool = False) -> None:
    for path in (run_dir.parent, run_dir):
        if path.is_symlink():
            raise UsageError(f"{path} is a symbolic link, which softtopk sweep did not make; remove it")
    if (run_dir / "results.json").exists():  # written atomically, last: the run is finished
        return
    start = time.perf_counter()
    where = ["--resume", str(run_dir)] if (run_dir / "checkpoint.pt").exists() else ["--out", str(run_dir)]
    log_path = run_dir.parent / f"{run_dir.name}.log"
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(_recorded(run_dir), shlex.join(argv))
        log = os.fdopen(open_for_writing(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")
    except OSError as error:
        raise UsageError(f"cannot write {log_path}: {error.strerror or error}") from None
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", PARENT_ENV: str(os.getpid())}
    with log:
        done = subprocess.run(
            [sys.executable, "-m", "softtopk_lab.cli", *argv, *where, "--no-progress"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        raise UsageError(
            f"run failed (exit {done.returncode}): softtopk {shlex.join(argv)}; "
            f"see {run_dir.parent / f'{run_dir.name}.log'}"
        )
    if not quiet:
        print(f"finished {run_dir} in {time.perf_counter() - start:.0f} s", flush=True)


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``ddof = 1``; ``None`` for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _results(run_dir: Path) -> dict[str, Any]:
    """A finished run's ``results.json``.

    Raises:
        UsageError: it is not the JSON a finished run writes.
    """
    try:
        results = json.loads((run_dir / "results.json").read_text())
        if not isinstance(results, dict):
            raise TypeError
    except (OSError, ValueError, TypeError):
        raise UsageError(
            f"{run_dir / 'results.json'} is damaged (not the JSON a finished run writes); delete "
            f"{run_dir} and run the sweep again to redo that run"
        ) from None
    return results


def metric_value(run_dir: Path, metric: str) -> float:
    """One run's value of ``metric``: ``top1`` etc. the test value at the best validation value,
    ``valid_top1`` etc. the best validation value, ``untrained_top1`` etc. the test value at step 0.

    Raises:
        UsageError: the run's files do not hold the value (damaged).
    """
    try:
        if metric.startswith("untrained_"):
            with open(run_dir / "metrics.jsonl") as lines:
                return float(json.loads(lines.readline())["test"][metric.removeprefix("untrained_")])
        results = _results(run_dir)
        if metric.startswith("valid_"):
            return float(results["best"][metric.removeprefix("valid_")]["valid"])
        return float(results["reported_test_at_best_valid"][metric])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        raise UsageError(
            f"{run_dir}: its results.json or metrics.jsonl lacks {metric} (damaged); delete "
            f"{run_dir} and run the sweep again to redo that run"
        ) from None


def summarize(
    suite_name: str, settings: list[Setting], seeds: list[int], out: Path, n_epochs: int | None = None
) -> dict[str, Any]:
    """Aggregate the finished runs of ``settings`` × ``seeds`` into ``summary.json`` and ``summary.md``."""
    suite, rows = SUITES[suite_name], []
    for setting in settings:
        run_dirs = [out / setting.label / f"seed{seed}" for seed in seeds]
        results = [_results(run_dir) for run_dir in run_dirs]
        row: dict[str, Any] = {
            "label": setting.label,
            "family": setting.family,
            "seeds": seeds,
            "command": "softtopk " + shlex.join(command(suite, setting, 0, n_epochs)[:-1]) + " S",
        }
        for metric in suite.metrics:
            values = [metric_value(run_dir, metric) for run_dir in run_dirs]
            mean, std = mean_std(values)
            row[metric] = {"values": values, "mean": mean, "std": std}
        try:
            row["ms_per_step"] = mean_std([float(r["ms_per_step"]) for r in results])[0]
            row["seconds_per_run"] = mean_std([float(r["elapsed"]) for r in results])[0]
        except (KeyError, TypeError, ValueError):
            raise UsageError(
                f"a results.json of {out / setting.label} lacks ms_per_step or elapsed (damaged); "
                "delete that run and run the sweep again"
            ) from None
        rows.append(row)
    total = sum(row["seconds_per_run"] * len(seeds) for row in rows)
    summary = {
        "suite": suite_name,
        "about": suite.about,
        "tool": suite.tool,
        "metrics": list(suite.metrics),
        "seeds": seeds,
        "rows": rows,
        "total_run_seconds": total,
    }
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1))
    write_text_atomic(out / "summary.md", render(summary))
    return summary


def _cell(entry: dict[str, Any]) -> str:
    std = "" if entry["std"] is None else f" ± {100 * entry['std']:.2f}"
    return f"{100 * entry['mean']:.2f}{std}"


def render(summary: dict[str, Any]) -> str:
    """The markdown table of a summary: one row per setting, metrics in % as mean ± std over seeds."""
    names = {
        "top1": "top-1",
        "top5": "top-5",
        "macro_top1": "macro top-1",
        "macro_top5": "macro top-5",
        "valid_top1": "best valid top-1",
        "valid_top5": "best valid top-5",
        "untrained_top1": "untrained net: test top-1",
    }
    metrics = summary["metrics"]
    head = ["setting", "loss family", *(f"{names[m]} (%)" for m in metrics), "ms/step", "s/run"]
    lines = [
        f"{summary['suite']}: {summary['about']}; seeds {', '.join(map(str, summary['seeds']))}; "
        "test value at the best validation value, mean ± std over seeds",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in summary["rows"]:
        cells = [
            f"`{row['label']}`",
            row["family"],
            *(_cell(row[m]) for m in metrics),
            f"{row['ms_per_step']:.2f}",
            f"{row['seconds_per_run']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += (
        [
            "",
            f"{len(summary['rows']) * len(summary['seeds'])} runs, {summary['total_run_seconds'] / 60:.1f} min "
            "of run time in all (the sum of the runs' wall-clock times).",
            "",
            "Commands (S = seed):",
            "",
            "```",
        ]
        + [row["command"] for row in summary["rows"]]
        + ["```", ""]
    )
    return "\n".join(lines)


def _claim_suite(suite_dir: Path, out: Path) -> None:
    """Mark ``suite_dir`` as a sweep's (it must be empty or a sweep's already): a sweep writes only
    into its own tree."""
    marker = read_marker(suite_dir)
    if marker is None:
        others = sorted(path.name for path in suite_dir.iterdir() if path.name != LOCK)
        if others:
            raise UsageError(
                f"--out {out}: {suite_dir} holds {', '.join(others[:5])}, not written by softtopk sweep; "
                "choose another --out"
            )
        claim(suite_dir, "sweep")
    elif marker.get("command") != "sweep":
        raise UsageError(
            f"--out {out}: {suite_dir} holds a run of softtopk {marker.get('command')}, not a sweep; "
            "choose another --out"
        )


def run_sweep(config: SweepConfig) -> dict[str, Any] | None:
    """Run ``softtopk sweep``; returns the summary (``None`` for ``--dry-run``).

    Raises:
        UsageError: a directory holding a run of another command, or a failed run (its log file named).
    """
    suite = SUITES[config.suite]
    settings = [s for s in suite.settings if config.only is None or s.label in config.only]
    jobs = [
        (command(suite, s, seed, config.n_epochs), config.out / config.suite / s.label / f"seed{seed}")
        for s in settings
        for seed in config.seeds
    ]
    if config.dry_run:
        for argv, run_dir in jobs:
            print("softtopk " + shlex.join([*argv, "--out", str(run_dir)]))
        return None
    for argv, run_dir in jobs:  # before anything runs
        _check_recorded(argv, run_dir)
    suite_dir = config.out / config.suite
    try:
        suite_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {config.out}: cannot be created ({error.strerror or error})") from None
    lock = RunLock(suite_dir, "--out")  # one sweep per suite directory, until this process ends
    try:
        _claim_suite(suite_dir, config.out)
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=config.jobs) as pool:
            futures = [pool.submit(_run_one, argv, run_dir, config.quiet) for argv, run_dir in jobs]
            try:
                for future in futures:
                    future.result()
            except UsageError:  # a failed run: start no further runs
                pool.shutdown(cancel_futures=True)
                raise
        summary = summarize(config.suite, settings, list(config.seeds), suite_dir, config.n_epochs)
    finally:
        lock.release()
    print(render(summary))
    print(f"{len(jobs)} runs, {time.perf_counter() - start:.0f} s; wrote {config.out / config.suite / 'summary.md'}")
    return summary
