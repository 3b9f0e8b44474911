"""Shared by the example scripts: the common flags, seeding, mean ± std over seeds, the Markdown table
and the results JSON (written atomically, with the machine it ran on)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from softtopk_lab.rundir import write_text_atomic


def parser(description: str, out: str) -> argparse.ArgumentParser:
    """An argument parser with ``--seeds``, ``--threads`` and ``--out`` (default ``runs/examples/<out>``)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed; the table is mean ± std")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=Path("runs/examples") / out, help="results JSON")
    return p


def seeded(seed: int) -> torch.Generator:
    """Seed torch's global RNG (initialisation, dropout) and return a generator for data order."""
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def summarise(runs: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """``{metric: {"mean", "std", "values"}}`` over runs (one dict of metrics per seed); ``std`` is the
    sample standard deviation (0 for a single run)."""
    out = {}
    for name in runs[0]:
        values = [run[name] for run in runs]
        out[name] = {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values,
        }
    return out


def table(rows: dict[str, dict[str, dict[str, Any]]], columns: list[tuple[str, str, str]]) -> str:
    """A Markdown table: one row per setting, one column per ``(metric, header, format)``, cells
    ``mean ± std``."""
    lines = ["| setting | " + " | ".join(header for _, header, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, metrics in rows.items():
        cells = [f"{metrics[key]['mean']:{fmt}} ± {metrics[key]['std']:{fmt}}" for key, _, fmt in columns]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_results(path: Path, args: argparse.Namespace, results: dict[str, Any], markdown: str) -> None:
    """Write ``{"flags", "machine", "results", "table"}`` to ``path`` atomically."""
    flags = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    machine = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"flags": flags, "machine": machine, "results": results, "table": markdown}, indent=2)
    write_text_atomic(path, text + "\n")


def compare(
    args: argparse.Namespace, run: Callable[[str, int], dict[str, float]], columns: list[tuple[str, str, str]]
) -> None:
    """Run ``run(setting, seed)`` for every ``args.settings`` and ``args.seeds``, print one line per
    setting as it finishes, then write the results JSON and print the Markdown table."""
    results = {}
    for setting in args.settings:
        results[setting] = summarise([run(setting, seed) for seed in args.seeds])
        print(
            f"{setting}: " + ", ".join(f"{key} {results[setting][key]['mean']:{fmt}}" for key, _, fmt in columns),
            flush=True,
        )
    markdown = table(results, columns)
    write_results(args.out, args, results, markdown)
    print(markdown)
