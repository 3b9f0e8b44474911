"""Time the Laplace mask's numba kernels (``ops.lapsum_numba``) against its torch path on a CPU.

Usage::

    python benchmarks/bench_lapsum_cpu.py                # -> results/lapsum_cpu.md (~2 min)
    python benchmarks/bench_lapsum_cpu.py --repeats 5    # quick

Forward + backward of ``softtopk.soft_topk(x, k)`` (the default method) at the shapes where
:func:`softtopk.ops.lapsum_numba.pays` draws its line, float32, with torch on one thread and on
every core: the kernels (forced on at every size), the torch path
(``ops.triton_gate.torch_path()``) and ``torch.topk`` + scatter, interleaved on a pool of distinct
inputs (``_report.interleaved``, ``_inputs.py``); the table gives medians and the median ratios
within a repeat, and which path the gate takes there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, provenance, steady_malloc
from _report import gate_open, interleaved, median_ratio, per_thread_count, write_table

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
    calls = {
        "kernels": _step(lambda x: softtopk.soft_topk(x, k)),
        "torch path": _step(lambda x: _torch_path(x, k)),
        "topk+scatter": _step(lambda x: _baseline(x, k)),
    }
    with gate_open(lapsum_numba):
        times = interleaved(calls, pool, repeats)
    return {
        "shape": f"{rows}×{n}",
        "k": k,
        "threads": torch.get_num_threads(),
        **{f"{name} ms": 1e3 * statistics.median(times[name]) for name in calls},
        "kernels / torch path": median_ratio(times, "kernels", "torch path"),
        "kernels / topk": median_ratio(times, "kernels", "topk+scatter"),
        "torch path / topk": median_ratio(times, "torch path", "topk+scatter"),
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

    def run() -> Iterator[dict]:
        for shape in SHAPES:
            yield time_shape(*shape, repeats=args.repeats if shape[0] * shape[1] < 10**6 else max(5, args.repeats // 3))

    caption = (
        f"{provenance(info, 'torch', 'numba')}, malloc: {malloc}. Forward + backward of "
        "`softtopk.soft_topk(x, k)`, float32; medians over interleaved repeats, ratios within a repeat; "
        "*gate*: the path `ops.lapsum_numba.pays` takes there."
    )
    title = "The Laplace mask on a CPU: numba kernels against the torch path"
    write_table(args.out, title, caption, per_thread_count(run), machine=info, malloc=malloc)


if __name__ == "__main__":
    main()
