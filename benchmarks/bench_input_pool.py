"""How much one fixed input flatters a CPU timing: calls timed back to back on one input, against the
same calls taking their inputs in turn from a pool of distinct ones (``_inputs.Pool``).

Usage::

    python benchmarks/bench_input_pool.py              # ~1 min, 1 thread -> results/input_pool.md
    python benchmarks/bench_input_pool.py --blocks 5 --out /tmp/input_pool.md

Each case runs ``--blocks`` pairs of blocks of ``--calls`` back-to-back calls (the way a timing loop
such as ``timeit`` runs), one block on the pool's first input only ("fixed"), one on the pool's
inputs in turn ("pool"), in alternating order; the table gives the median time per call of each.
Inputs ``randn(rows, n)`` float32; fwd+bwd against a fixed random ``g`` where the case says so.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _inputs import Pool, pool_size
from _machine import machine_info, provenance, steady_malloc

import softtopk


def _topk_scatter(x: torch.Tensor) -> torch.Tensor:
    top = x.topk(10, dim=-1)
    return torch.zeros_like(x).scatter(-1, top.indices, top.values)


# (name, shape, call, with its backward)
CASES: list[tuple[str, tuple[int, int], Callable[[torch.Tensor], torch.Tensor], bool]] = [
    ("torch.sort", (64, 100), lambda x: x.sort(-1).values, False),
    ("torch.sort", (64, 1000), lambda x: x.sort(-1).values, False),
    ("torch.topk (k = 10) + scatter, fwd+bwd", (64, 100), _topk_scatter, True),
    ("torch.topk (k = 10) + scatter, fwd+bwd", (64, 1000), _topk_scatter, True),
    ("soft_topk lapsum (k = 10), fwd+bwd", (64, 100), lambda x: softtopk.soft_topk(x, 10), True),
    ("soft_rank l2, fwd+bwd", (64, 100), lambda x: softtopk.soft_rank(x), True),
]


def run(blocks: int, calls: int) -> list[dict]:
    rows = []
    for name, shape, call, backward in CASES:
        pool = Pool(lambda gen, shape=shape: torch.randn(shape, generator=gen), math.prod(shape))
        g = torch.randn(shape, generator=torch.Generator().manual_seed(1))

        def once(x: torch.Tensor, call=call, backward=backward, g=g) -> float:
            if backward:
                x = x.detach().requires_grad_()
            start = time.perf_counter()
            out = call(x)
            if backward:
                out.backward(g)
            return time.perf_counter() - start

        for x in pool.items:  # warm-up
            once(x)
        times: dict[str, list[float]] = {"fixed": [], "pool": []}
        for block in range(blocks):
            for mode in ("fixed", "pool") if block % 2 else ("pool", "fixed"):
                for _ in range(calls):
                    times[mode].append(once(pool.first if mode == "fixed" else pool.next()))
        fixed, pooled = (1e3 * statistics.median(times[mode]) for mode in ("fixed", "pool"))
        rows.append(
            {"case": name, "shape": shape, "inputs": pool_size(math.prod(shape)), "fixed": fixed, "pool": pooled}
        )
        print(f"{name:42s} {shape}  fixed {fixed:.3f} ms  pool {pooled:.3f} ms")
    return rows


def markdown(rows: list[dict]) -> str:
    info = machine_info()
    lines = [
        "# One fixed input against a pool of inputs",
        "",
        f"{provenance(info, 'torch')}; one thread. "
        "Median time per call of calls timed back to back: fixed, always the same input; pool, distinct "
        "inputs in turn, as every benchmark of this folder takes them (`_inputs.py`).",
        "",
        "| case | shape | inputs in the pool | fixed (ms) | pool (ms) | pool / fixed |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        shape = f"{r['shape'][0]}×{r['shape'][1]}"
        times = f"{r['fixed']:.3f} | {r['pool']:.3f} | {r['pool'] / r['fixed']:.2f}"
        lines.append(f"| {r['case']} | {shape} | {r['inputs']} | {times} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "input_pool.md")
    args = parser.parse_args()
    steady_malloc()
    torch.set_num_threads(1)
    text = markdown(run(args.blocks, args.calls))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
