"""What the CPU kernel benchmarks share: interleaved timing on a pool of inputs, and their result
files (a markdown table and the JSON beside it)."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from _inputs import Pool

T = TypeVar("T")


def interleaved(calls: dict[str, Callable[[T], object]], pool: Pool[T], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each of ``calls``: after one untimed call each on three inputs, per repeat
    each call runs once, in rotating order, on the next input of ``pool``."""
    names = list(calls)
    for item in pool.items[:3]:
        for name in names:
            calls[name](item)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            item = pool.next()
            start = time.perf_counter()
            calls[name](item)
            times[name].append(time.perf_counter() - start)
    return times


@contextlib.contextmanager
def gate_open(module: Any) -> Iterator[None]:
    """Within the block ``module.pays`` (a kernel's size rule) says yes everywhere: the kernel at
    every size, so that the rule itself is what a benchmark measures."""
    rule = module.pays
    module.pays = lambda *args: True
    try:
        yield
    finally:
        module.pays = rule


def median_ratio(times: dict[str, list[float]], top: str, bottom: str) -> float:
    """The median over repeats of the ratio of two calls' times in the same repeat."""
    return statistics.median(a / b for a, b in zip(times[top], times[bottom], strict=True))


def per_thread_count(run: Callable[[], Iterable[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``run()``'s rows with torch on one thread, then on every core, each printed as it comes."""
    rows = []
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        for row in run():
            rows.append(row)
            print({key: round(v, 3) if isinstance(v, float) else v for key, v in row.items()}, flush=True)
    return rows


def write_table(out: Path, title: str, caption: str, rows: list[dict[str, Any]], **record: Any) -> None:
    """``rows`` as the markdown table ``out`` under ``title`` and ``caption``, and as the JSON beside
    it with ``record`` (the machine, malloc)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**record, "rows": rows}, indent=1) + "\n")
    keys = list(rows[0])
    lines = [f"# {title}", "", caption, "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = (f"{row[key]:.3f}" if isinstance(row[key], float) else str(row[key]) for key in keys)
        lines.append("| " + " | ".join(cells) + " |")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
