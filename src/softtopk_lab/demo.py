"""``softtopk demo``, the main job: every method on one example input, then CE against top-k losses
on the built-in WordNet dataset.

1. The soft top-3 mask of an 8-item example for every method of :func:`softtopk.methods`.
2. A linear head on the embedded ``wordnet148`` dataset (MiniLM embeddings of WordNet noun glosses,
   148 hypernym classes; ``docs/data.md``) trained with ``nn.CrossEntropyLoss`` and with one loss of
   each top-k family (sorting-network top-k cross-entropy, smooth top-k SVM, noised top-k hinge),
   each as one ``softtopk train-embeddings`` run (:func:`run_config` of a loss in :data:`RUNS`,
   taken from the seeds' recommended settings where they give one; ``demo.json`` records each run's
   equivalent command). Reported as in the papers: the test
   value at the best validation value of each metric. The table gives top-1, top-5 and the training
   time per step; ``demo.json`` and ``demo.png`` (validation top-5 over steps) go to ``--out``,
   next to each run's own directory.

``--out`` is marked as a demo's directory and locked (:mod:`.rundir`); each run's marker names the
demo as its parent, and a second demo into the same ``--out`` replaces only those runs: a run there
that it did not start (a user's own ``train-embeddings --out D/cross_entropy``) is a one-line error,
and nothing is deleted. Its run time is measured in ``docs/lab.md``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from softtopk import methods, soft_topk

from .config import EmbeddingConfig, LossConfig, RunOutput
from .errors import UsageError
from .files import remove_stale_temporaries, replace_atomic, write_text_atomic
from .rundir import LOCK, MARKER, RUN_FILES, RunLock, claim, read_marker

DEMO_FILES = ("demo.json", "demo.png")

EXAMPLE = torch.tensor([0.3, 2.0, -1.0, 1.2, 0.9, 1.9, -0.4, 0.0])
EXAMPLE_PARAMS = {
    "bitonic": {"distribution": "logistic", "steepness": 4.0},
    "odd_even": {"distribution": "logistic", "steepness": 4.0},
    "splitter_selection": {"distribution": "logistic", "steepness": 4.0},
    "neuralsort": {"tau": 0.25},
    "softsort": {"tau": 0.25},
    "lapsum": {"tau": 0.25},
    "sparse": {"l": 0.5},
    "perturbed": {"sigma": 0.5, "n_samples": 1000},
    "gumbel": {"tau": 0.25},
}
RUNS = {
    "cross_entropy": LossConfig("softmax_cross_entropy", (1.0, 0.0, 0.0, 0.0, 0.0)),
    "topk_ce splitter_selection": LossConfig(
        "splitter_selection", (0.2,) * 5, distribution="logistic_phi", inverse_temperature=1.0, art_lambda=0.5, m=16
    ),
    "smooth_topk_svm (Berrada)": LossConfig("smooth_topk_svm", (0.0, 0.0, 0.0, 0.0, 1.0), tau=1.0, alpha=1.0),
    "bal_noised_topk (Garcin)": LossConfig("bal_noised_topk", (0.0, 0.0, 0.0, 0.0, 1.0), epsilon=1.0, n_samples=5),
}


def run_config(loss: LossConfig, run_dir: Path, seed: int, n_epochs: int | None) -> EmbeddingConfig:
    """The ``train-embeddings`` run of ``loss`` on wordnet148: Adam lr 1e-2, batch 256, 30 epochs (or
    ``n_epochs``), evaluated every 50 steps, into ``run_dir``."""
    return EmbeddingConfig(
        "wordnet148",
        loss,
        n_epochs=30 if n_epochs is None else n_epochs,
        nloglr=2.0,
        batch_size=256,
        seed=seed,
        eval_freq=50,
        output=RunOutput(out=run_dir, no_progress=True),
    )


def _print_masks(seed: int) -> dict:
    shown = ", ".join(f"{v:.1f}" for v in EXAMPLE.tolist())
    print(f"Soft top-3 mask of x = [{shown}] (hard top-3: items {sorted(EXAMPLE.topk(3).indices.tolist())})")
    masks = {}
    for name in methods():
        params = dict(EXAMPLE_PARAMS[name])
        if methods()[name].stochastic:
            params["generator"] = torch.Generator().manual_seed(seed)
        mask = soft_topk(EXAMPLE, 3, method=name, **params)
        masks[name] = mask.tolist()
        shown_params = ", ".join(f"{key}={value}" for key, value in EXAMPLE_PARAMS[name].items())
        print(
            f"  {name:<19} {' '.join(f'{v:5.2f}' for v in mask.tolist())}   sum={mask.sum().item():.3f}"
            f"   ({shown_params})"
        )
    return masks


def _run_dir(out: Path, name: str) -> Path:
    return out / name.split(" (")[0].replace(" ", "_")


def _claim_out(out: Path) -> tuple[str, RunLock]:
    """Make ``out`` the demo's directory and lock it, or refuse: the demo writes only into a
    directory it marked as a demo's, or one that holds none of the names it would write; returns
    the demo's run id (the parent named in each of its runs' markers) and the lock."""
    names = [*DEMO_FILES, *(_run_dir(out, name).name for name in RUNS)]
    clashes = [name for name in names if os.path.lexists(out / name)]
    marker = read_marker(out)
    if clashes and marker is None:
        raise UsageError(f"--out {out}: holds {', '.join(clashes)} not written by softtopk demo; choose another --out")
    if marker is not None and marker.get("command") != "demo":
        raise UsageError(
            f"--out {out}: holds a run of softtopk {marker.get('command')}, not a demo; choose another --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot be created ({error.strerror or error})") from None
    lock = RunLock(out, "--out")
    marker = read_marker(out)
    return (claim(out, "demo") if marker is None else marker["run_id"]), lock


def _clear(run_dir: Path, out: Path, demo_id: str) -> None:
    """Remove an earlier run of this demo from ``run_dir``: only a directory whose marker names this
    demo as its parent, only the files a run writes, under the run's lock; anything else stays and is
    an error."""
    if run_dir.is_symlink():
        raise UsageError(
            f"--out {out}: {run_dir} is a symbolic link, which softtopk demo did not make; choose another --out"
        )
    if not run_dir.exists():
        return
    marker = read_marker(run_dir)
    if marker is None or marker.get("parent") != demo_id:
        raise UsageError(
            f"--out {out}: {run_dir} holds a run this demo did not start; it is left as it is; choose another --out"
        )
    lock = RunLock(run_dir, "--out")
    try:
        remove_stale_temporaries(run_dir)
        others = sorted(path.name for path in run_dir.iterdir() if path.name not in RUN_FILES)
        if others:
            raise UsageError(
                f"--out {out}: {run_dir} holds {', '.join(others[:5])}, which softtopk did not write; "
                "choose another --out"
            )
        for name in RUN_FILES:
            if name not in (MARKER, LOCK):
                (run_dir / name).unlink(missing_ok=True)
        (run_dir / MARKER).unlink(missing_ok=True)
    finally:
        lock.release()
    (run_dir / LOCK).unlink(missing_ok=True)
    run_dir.rmdir()


def _run(name: str, loss: LossConfig, out: Path, seed: int, n_epochs: int | None, demo_id: str) -> dict:
    """One ``train-embeddings`` run (replacing this demo's earlier run of the same name); returns its
    reported metrics, time per step and curve."""
    from .embeddings import train_embeddings

    run_dir = _run_dir(out, name)
    _clear(run_dir, out, demo_id)
    config = run_config(loss, run_dir, seed, n_epochs)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # each run's own summary table
        results = train_embeddings(config, parent=demo_id)
    elapsed = time.perf_counter() - start
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "command": config.command_line(),
        "top1": results["reported_test_at_best_valid"]["top1"],
        "top5": results["reported_test_at_best_valid"]["top5"],
        "ms_per_step": results["ms_per_step"],
        "seconds": elapsed,
        "curve": [(line["step"], line["valid"]["top1"], line["valid"]["top5"]) for line in lines],
    }


def _plot(runs: dict, stream: Any) -> None:
    """Validation top-1 and top-5 over steps of every run, as a PNG into ``stream``: each panel zoomed to
    the range of its values, the legend below the panels (it hides no line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for column, (axis, metric) in enumerate(zip(axes, ("top-1", "top-5"), strict=True), start=1):
        values = []
        for name, run in runs.items():
            steps = [point[0] for point in run["curve"]]
            shown = [100 * point[column] for point in run["curve"][1:]]  # after the untrained evaluation
            axis.plot(steps[1:], shown, label=name)
            values += shown
        low, high = min(values), max(values)
        margin = max(0.05 * (high - low), 0.5)
        axis.set_ylim(low - margin, high + margin)
        axis.set(xlabel="training step", ylabel=f"validation {metric} (%)", title=f"validation {metric}")
        axis.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    figure.suptitle("Linear head on wordnet148 (MiniLM embeddings, 148 classes)")
    figure.tight_layout(rect=(0, 0.07, 1, 1))
    figure.savefig(stream, dpi=120, format="png")
    plt.close(figure)


def run_demo(*, seed: int = 0, out: Path = Path("runs/demo"), n_epochs: int | None = None) -> dict:
    """Print the demo, write ``demo.json`` and ``demo.png`` into ``out``, and return the results.

    Args:
        seed: seed of every run.
        out: output directory (one subdirectory per run; a second call replaces the first's runs).
        n_epochs: override of the runs' 30 epochs (for quick checks).
    """
    torch.set_num_threads(1)
    demo_id, lock = _claim_out(out)
    try:
        return _demo(seed, out, n_epochs, demo_id)
    finally:
        lock.release()


def _demo(seed: int, out: Path, n_epochs: int | None, demo_id: str) -> dict:
    masks = _print_masks(seed)
    print("\nLinear head on wordnet148 (384-d MiniLM embeddings, 148 classes), Adam lr 1e-2, batch 256;")
    print("test accuracy at the best validation value of each metric:")
    print(f"  {'loss':<28} {'top-1':>7} {'top-5':>7} {'ms/step':>8}")
    runs = {}
    for name, loss in RUNS.items():
        runs[name] = _run(name, loss, out, seed, n_epochs, demo_id)
        run = runs[name]
        print(f"  {name:<28} {100 * run['top1']:6.2f}% {100 * run['top5']:6.2f}% {run['ms_per_step']:8.2f}")
    results = {"example": EXAMPLE.tolist(), "masks": masks, "runs": runs, "seed": seed}
    replace_atomic(out / "demo.png", lambda stream: _plot(runs, stream))
    write_text_atomic(out / "demo.json", json.dumps(results, indent=1))
    print(f"\nwrote {out / 'demo.json'} and {out / 'demo.png'}")
    return results
