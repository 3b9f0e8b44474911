"""What masking scores with ``-inf`` costs: every mask method, masked call against unmasked call.

Usage::

    python benchmarks/bench_masked.py                 # ~3 min on a 2-core VM, 1 thread
    python benchmarks/bench_masked.py --quick         # smoke run (< 30 s)
    python benchmarks/bench_masked.py --out benchmarks/results/masked.json   # also writes masked.md

Inputs: ``x = randn(64, n)`` float32, ``n`` in {256, 4096}, ``k = 8``. The masked input sets a random
quarter of each row to ``-inf`` (different entries and counts per row, as padding or a causal mask
would); the unmasked input is the same ``x``. Each repeat takes the next (x, masked x) pair of a
pool of distinct ones (``_inputs.py``: a sort or top-k timed again on one input runs on branches
the CPU has learnt) and times one forward+backward
(``(mask * g).sum().backward()``) of both, interleaved in an order that alternates every repeat;
the ratio is masked / unmasked per repeat, and the table gives the median ratio over repeats with
its interquartile range. Issue 12 asks for at most 1.10.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, steady_malloc

import softtopk

METHODS = {
    "lapsum": {},
    "sparse": {},
    "neuralsort": {},
    "softsort": {},
    "bitonic": {},
    "perturbed": {"n_samples": 100},
    "gumbel": {},
}


def _step(x: torch.Tensor, k: int, method: str, params: dict, g: torch.Tensor) -> float:
    leaf = x.detach().requires_grad_()
    start = time.perf_counter()
    (softtopk.soft_topk(leaf, k, method=method, **params) * g).sum().backward()
    return time.perf_counter() - start


def measure(n: int, k: int, method: str, repeats: int) -> dict:
    def pair(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(64, n, generator=gen)
        hidden = torch.rand(64, n, generator=gen).argsort(-1)[:, : n // 4]
        return x, x.clone().scatter_(-1, hidden, float("-inf"))

    pool = Pool(pair, 2 * 64 * n, seed=n)
    g = torch.randn(64, n, generator=torch.Generator().manual_seed(n + 1))
    params = METHODS[method]
    for _ in range(2):  # warm-up
        x, masked = pool.next()
        _step(x, k, method, params, g), _step(masked, k, method, params, g)
    ratios = []
    for repeat in range(repeats):
        x, masked = pool.next()
        if repeat % 2:
            masked_s, plain_s = _step(masked, k, method, params, g), _step(x, k, method, params, g)
        else:
            plain_s, masked_s = _step(x, k, method, params, g), _step(masked, k, method, params, g)
        ratios.append(masked_s / plain_s)
    q = statistics.quantiles(ratios, n=4)
    return {
        "method": method,
        "n": n,
        "k": k,
        "median_ratio": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "repeats": repeats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 256 only, 10 repeats")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="JSON path; a .md table is written beside it")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    malloc = steady_malloc()
    sizes, repeats = ((256,), 10) if args.quick else ((256, 4096), args.repeats)
    rows = [measure(n, 8, method, repeats) for n in sizes for method in METHODS]
    lines = ["| method | n | k | masked / unmasked (median) | IQR |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['method']} | {r['n']} | {r['k']} | {r['median_ratio']:.3f} | {r['q1']:.3f}–{r['q3']:.3f} |" for r in rows
    ]
    print("\n".join(lines))
    if args.out is not None:
        info = machine_info()
        info["malloc"], info["threads"] = malloc, args.threads
        args.out.write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
        header = (
            f"Masked (-inf on a random quarter of each row) against unmasked forward+backward, "
            f"`python benchmarks/bench_masked.py --out {args.out}`; "
            f"{info['cpu_model']} ({info['logical_cpus']} logical CPUs), "
            f"{args.threads} thread(s), torch {torch.__version__}, {info['date']}.\n\n"
        )
        args.out.with_suffix(".md").write_text(header + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
