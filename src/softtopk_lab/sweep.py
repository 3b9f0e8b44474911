"""``softtopk sweep``: the runs behind ``docs/results.md``, over seeds, with their summary tables.

A *suite* (:data:`SUITES`) is one dataset's protocol: a training tool, flags common to every run, and
one entry per loss setting (the seeds' recommended settings where they give one). ``softtopk sweep
SUITE --seeds 0 1 2`` runs every setting with every seed as a separate ``softtopk`` process
(``--jobs`` at a time, each with one torch thread: results depend on the thread count), into
``OUT/SUITE/<setting>/seed<S>`` (its command in ``seed<S>.command``, its output in ``seed<S>.log``).
A run whose ``results.json`` exists is kept; one with only a checkpoint is continued with
``--resume``, so an interrupted sweep picks up where it stopped. A directory holding a run of a
different command (other ``--n_epochs``, or a changed suite) is an error, never mixed in.

``OUT/SUITE/summary.json`` and ``summary.md`` then give, per setting, the mean ± sample standard
deviation (``ddof = 1``) over seeds of each metric (the test value at the best validation value of
that metric, as the tools report it; ``valid_*``: the best validation value itself; ``untrained_*``:
the test value before the first step), the mean
training time per step and per run, and the exact command of every row (``--seed S`` being the seed).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UsageError

if TYPE_CHECKING:
    from .config import SweepConfig


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
SORTING_NETWORK, NEURALSORT, SOFTSORT = ("top-k CE, sorting network (difftopk)", "top-k CE, NeuralSort (difftopk)",
                                         "top-k CE, SoftSort (difftopk)")
SVM, NOISED, K5 = "smooth top-k SVM (Berrada)", "noised top-k hinge (Garcin)", "--p_k 0 0 0 0 1"
EMBEDDING_SETTINGS = (
    _setting("cross_entropy", "cross-entropy", CE_FLAGS),
    _setting("bitonic_pk_uniform", SORTING_NETWORK, f"--method bitonic {NETWORK} {P_K_UNIFORM}"),
    _setting("splitter_pk_uniform", SORTING_NETWORK, f"--method splitter_selection {NETWORK} {P_K_UNIFORM}"),
    _setting("splitter_logistic_pk_top5", SORTING_NETWORK,
             f"--method splitter_selection --distribution logistic --inverse_temperature .5 --m 16 {P_K_TOP5}"),
    _setting("neuralsort_pk_uniform", NEURALSORT, f"--method neuralsort --inverse_temperature .5 --m 16 {P_K_UNIFORM}"),
    _setting("neuralsort_pk_top5", NEURALSORT, f"--method neuralsort --inverse_temperature .5 --m 16 {P_K_TOP5}"),
    _setting("softsort_pk_uniform", SOFTSORT, f"--method softsort --inverse_temperature .5 --m 16 {P_K_UNIFORM}"),
    _setting("smooth_hard_topk_tau1", "smooth top-k hinge (Lapin, as difftopk)",
             f"--method smooth_hard_topk --inverse_temperature 1 {K5}"),
    _setting("svm_tau1", SVM, f"--method smooth_topk_svm --tau 1 --alpha 1 {K5}"),
    _setting("svm_tau0.1", SVM, f"--method smooth_topk_svm --tau .1 --alpha 1 {K5}"),
    _setting("bal_noised_eps1", NOISED, f"--method bal_noised_topk --epsilon 1 --n_samples 5 {K5}"),
    _setting("bal_noised_eps0.2", NOISED, f"--method bal_noised_topk --epsilon .2 --n_samples 10 {K5}"),
)
IMBALANCED = _setting("imbal_noised_normll", "noised top-k hinge, LDAM margins (Garcin)",
                      "--method imbal_noised_topk --epsilon .01 --max_m .2 --scale 60 --n_samples 5 --normalize_ll "
                      + K5)
EMBEDDING_PROTOCOL = "--batch_size 256 --n_epochs 30 --eval_freq 50"
EMBEDDING_COMMON = f"--nloglr 2 {EMBEDDING_PROTOCOL}"
LEARNING_RATES = tuple(_setting(f"cross_entropy_nloglr{x}", "cross-entropy", f"--nloglr {x} {CE_FLAGS}")
                       for x in ("1.5", "2", "2.5", "3"))
KNN_SETTINGS = (
    _setting("gumbel_tau1", "kNN, Gumbel subset sampling (Xie & Ermon)",
             "--method gumbel --relaxation subsets --tau 1"),
    _setting("neuralsort_tau1", "kNN, NeuralSort (Grover et al.)", "--method neuralsort --tau 1"),
    _setting("lapsum_tau1", "kNN, closed-form Laplace (softtopk)", "--method lapsum --tau 1"),
)
KNN_COMMON = "--n_epochs 3 --k 9 --eval_neighbors 10000 --eval_queries 5000"
SUITES: dict[str, Suite] = {
    "wordnet148-lr": Suite(
        "train-embeddings", f"-d wordnet148 {EMBEDDING_PROTOCOL}", ("valid_top1", "valid_top5", "top1", "top5"),
        LEARNING_RATES, "the learning rate of the wordnet suites, chosen by cross-entropy's validation top-1"),
    "wordnet148": Suite(
        "train-embeddings", f"-d wordnet148 {EMBEDDING_COMMON}", ("top1", "top5"), EMBEDDING_SETTINGS,
        "linear head on the built-in wordnet148 (148 balanced classes)"),
    "wordnet-plants150": Suite(
        "train-embeddings", f"-d wordnet-plants150 {EMBEDDING_COMMON}", ("top1", "top5", "macro_top1", "macro_top5"),
        (*EMBEDDING_SETTINGS, IMBALANCED), "linear head on the built-in long-tailed wordnet-plants150 (123 classes)"),
    "knn-mnist": Suite(
        "knn", f"--dataset mnist {KNN_COMMON}", ("untrained_top1", "top1"), KNN_SETTINGS,
        "differentiable kNN, ConvNet on MNIST, 3 epochs; hard 9-NN accuracy"),
    "knn-fashion-mnist": Suite(
        "knn", f"--dataset fashion-mnist --net convnet {KNN_COMMON}", ("untrained_top1", "top1"), KNN_SETTINGS,
        "differentiable kNN, ConvNet on Fashion-MNIST, 3 epochs; hard 9-NN accuracy"),
}


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


def _run_one(argv: list[str], run_dir: Path) -> None:
    if (run_dir / "results.json").exists():
        return
    where = ["--resume", str(run_dir)] if (run_dir / "checkpoint.pt").exists() else ["--out", str(run_dir)]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    _recorded(run_dir).write_text(shlex.join(argv))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "softtopk_lab.cli", *argv, *where, "--no-progress"], env=env,
                              stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise UsageError(f"run failed (exit {done.returncode}): softtopk {shlex.join(argv)}; "
                         f"see {run_dir.parent / f'{run_dir.name}.log'}")


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (``ddof = 1``; ``None`` for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def metric_value(run_dir: Path, metric: str) -> float:
    """One run's value of ``metric``: ``top1`` etc. the test value at the best validation value,
    ``valid_top1`` etc. the best validation value, ``untrained_top1`` etc. the test value at step 0."""
    if metric.startswith("untrained_"):
        with open(run_dir / "metrics.jsonl") as lines:
            return json.loads(lines.readline())["test"][metric.removeprefix("untrained_")]
    results = json.loads((run_dir / "results.json").read_text())
    if metric.startswith("valid_"):
        return results["best"][metric.removeprefix("valid_")]["valid"]
    return results["reported_test_at_best_valid"][metric]


def summarize(suite_name: str, settings: list[Setting], seeds: list[int], out: Path,
              n_epochs: int | None = None) -> dict[str, Any]:
    """Aggregate the finished runs of ``settings`` × ``seeds`` into ``summary.json`` and ``summary.md``."""
    suite, rows = SUITES[suite_name], []
    for setting in settings:
        run_dirs = [out / setting.label / f"seed{seed}" for seed in seeds]
        results = [json.loads((run_dir / "results.json").read_text()) for run_dir in run_dirs]
        row: dict[str, Any] = {"label": setting.label, "family": setting.family, "seeds": seeds,
                               "command": "softtopk " + shlex.join(command(suite, setting, 0, n_epochs)[:-1]) + " S"}
        for metric in suite.metrics:
            values = [metric_value(run_dir, metric) for run_dir in run_dirs]
            mean, std = mean_std(values)
            row[metric] = {"values": values, "mean": mean, "std": std}
        row["ms_per_step"] = mean_std([r["ms_per_step"] for r in results])[0]
        row["seconds_per_run"] = mean_std([r["elapsed"] for r in results])[0]
        rows.append(row)
    total = sum(row["seconds_per_run"] * len(seeds) for row in rows)
    summary = {"suite": suite_name, "about": suite.about, "tool": suite.tool, "metrics": list(suite.metrics),
               "seeds": seeds, "rows": rows, "total_run_seconds": total}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(render(summary))
    return summary


def _cell(entry: dict[str, Any]) -> str:
    std = "" if entry["std"] is None else f" ± {100 * entry['std']:.2f}"
    return f"{100 * entry['mean']:.2f}{std}"


def render(summary: dict[str, Any]) -> str:
    """The markdown table of a summary: one row per setting, metrics in % as mean ± std over seeds."""
    names = {"top1": "top-1", "top5": "top-5", "macro_top1": "macro top-1", "macro_top5": "macro top-5",
             "valid_top1": "best valid top-1", "valid_top5": "best valid top-5",
             "untrained_top1": "untrained net: test top-1"}
    metrics = summary["metrics"]
    head = ["setting", "loss family", *(f"{names[m]} (%)" for m in metrics), "ms/step", "s/run"]
    lines = [f"{summary['suite']}: {summary['about']}; seeds {', '.join(map(str, summary['seeds']))}; "
             "test value at the best validation value, mean ± std over seeds", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary["rows"]:
        cells = [f"`{row['label']}`", row["family"], *(_cell(row[m]) for m in metrics),
                 f"{row['ms_per_step']:.2f}", f"{row['seconds_per_run']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{len(summary['rows']) * len(summary['seeds'])} runs, {summary['total_run_seconds'] / 60:.1f} min "
              "of run time in all (the sum of the runs' wall-clock times).",
              "", "Commands (S = seed):", "", "```"] + [row["command"] for row in summary["rows"]] + ["```", ""]
    return "\n".join(lines)


def run_sweep(config: SweepConfig) -> dict[str, Any] | None:
    """Run ``softtopk sweep``; returns the summary (``None`` for ``--dry-run``).

    Raises:
        UsageError: a directory holding a run of another command, or a failed run (its log file named).
    """
    suite = SUITES[config.suite]
    settings = [s for s in suite.settings if config.only is None or s.label in config.only]
    jobs = [(command(suite, s, seed, config.n_epochs), config.out / config.suite / s.label / f"seed{seed}")
            for s in settings for seed in config.seeds]
    if config.dry_run:
        for argv, run_dir in jobs:
            print("softtopk " + shlex.join([*argv, "--out", str(run_dir)]))
        return None
    for argv, run_dir in jobs:  # before anything runs
        _check_recorded(argv, run_dir)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=config.jobs) as pool:
        futures = [pool.submit(_run_one, argv, run_dir) for argv, run_dir in jobs]
        try:
            for future in futures:
                future.result()
        except UsageError:  # a failed run: start no further runs
            pool.shutdown(cancel_futures=True)
            raise
    summary = summarize(config.suite, settings, list(config.seeds), config.out / config.suite, config.n_epochs)
    print(render(summary))
    print(f"{len(jobs)} runs, {time.perf_counter() - start:.0f} s; wrote {config.out / config.suite / 'summary.md'}")
    return summary
