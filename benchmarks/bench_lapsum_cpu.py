"""Time the Laplace mask's numba kernels (``ops.lapsum_numba``) against its torch path on a CPU.

Usage::

    python benchmarks/bench_lapsum_cpu.py                # -> results/lapsum_cpu.md (~2 min)
    python benchmarks/bench_lapsum_cpu.py --repeats 5    # quick

Forward + backward of ``softtopk.soft_topk(x, k)`` (the default method) at the shapes where
:func:`softtopk.ops.lapsum_numba.pays` draws its line, float32, with torch on one thread and on
every core: the kernels (forced on at every size), the torch path
(``ops.triton_gate.torch_path()``) and ``torch.topk`` + scatter. Per repeat the three calls run once
each, in rotating order, on the next input of a pool of distinct ones (``_inputs.py``); the table
gives medians and the median ratios within a repeat, and which path the gate takes there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, provenance, steady_malloc

import softtopk
from softtopk.ops import isotonic_numba, lapsum_numba, triton_gate

SHAPES = [
    (8, 100, 10),
    (64, 100, 10),
    (64, 1000, 10),
    (64, 1000, 500),
    (32, 1000, 500),
    (128, 64, 32),
    (1024, 64, 8),
    (16384, 64, 2),
    (16384, 64, 8),
    (4096, 64, 32),
    (64, 10000, 10),
    (64, 100000, 10),
]


def _step(mask: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[tuple[torch.Tensor, torch.Tensor]], None]:
    def step(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, g = pair
        leaf = x.detach().requires_grad_()
        mask(leaf).backward(g)

    return step


def _torch_path(x: torch.Tensor, k: int) -> torch.Tensor:
    with triton_gate.torch_path():
        return softtopk.soft_topk(x, k)


def _baseline(x: torch.Tensor, k: int) -> torch.Tensor:
    values, indices = x.topk(k, -1)
    return torch.zeros_like(x).scatter(-1, indices, values)


def time_shape(rows: int, n: int, k: int, repeats: int) -> dict:
    pool = Pool(lambda gen: (torch.randn(rows, n, generator=gen), torch.randn(rows, n, generator=gen)), 2 * rows * n)
    picked = lapsum_numba.pays(pool.first[0], k)
    forced = lapsum_numba.pays
    lapsum_numba.pays = lambda x, k: True  # the kernels at every size: the rule is what is measured
    try:
        calls = {
            "kernels": _step(lambda x: softtopk.soft_topk(x, k)),
            "torch path": _step(lambda x: _torch_path(x, k)),
            "topk+scatter": _step(lambda x: _baseline(x, k)),
        }
        names = list(calls)
        for item in pool.items[:4]:
            for name in names:
                calls[name](item)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(repeats):
            for name in names[r % 3 :] + names[: r % 3]:
                item = pool.next()
                start = time.perf_counter()
                calls[name](item)
                times[name].append(time.perf_counter() - start)
    finally:
        lapsum_numba.pays = forced

    def ratio(top: str, bottom: str) -> float:
        return statistics.median(a / b for a, b in zip(times[top], times[bottom], strict=True))

    return {
        "shape": f"{rows}×{n}",
        "k": k,
        "threads": torch.get_num_threads(),
        **{f"{name} ms": 1e3 * statistics.median(times[name]) for name in names},
        "kernels / torch path": ratio("kernels", "torch path"),
        "kernels / topk": ratio("kernels", "topk+scatter"),
        "torch path / topk": ratio("torch path", "topk+scatter"),
        "gate": "kernels" if picked else "torch path",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "lapsum_cpu.md")
    args = parser.parse_args()
    if not isotonic_numba.available():
        sys.exit("numba is not installed: there are no kernels to time (pip install numba)")
    malloc = steady_malloc()
    info = machine_info("numba")
    rows = []
    for threads in sorted({1, os.cpu_count() or 1}):
        torch.set_num_threads(threads)
        for shape in SHAPES:
            row = time_shape(*shape, repeats=args.repeats if shape[0] * shape[1] < 10**6 else max(5, args.repeats // 3))
            rows.append(row)
            print({key: round(v, 3) if isinstance(v, float) else v for key, v in row.items()}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(
        json.dumps({"machine": info, "malloc": malloc, "rows": rows}, indent=1) + "\n"
    )
    keys = list(rows[0])
    lines = [
        "# The Laplace mask on a CPU: numba kernels against the torch path",
        "",
        f"{provenance(info, 'torch', 'numba')}, malloc: {malloc}. Forward + backward of "
        "`softtopk.soft_topk(x, k)`, float32; medians over interleaved repeats, ratios within a repeat; "
        "*gate*: the path `ops.lapsum_numba.pays` takes there.",
        "",
        "| " + " | ".join(keys) + " |",
        "|" + "---|" * len(keys),
    ]
    for row in rows:
        lines.append(
            "| "
            + " | ".join(f"{row[key]:.3f}" if isinstance(row[key], float) else str(row[key]) for key in keys)
            + " |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
