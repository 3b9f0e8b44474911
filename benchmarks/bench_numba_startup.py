"""The one-time cost of softtopk's numba kernels on a CPU tensor: ``soft_sort``/``soft_rank``'s
(``ops/isotonic_numba.py``), the default mask's (``ops/lapsum_numba.py``), top-k
cross-entropy's (``ops/label_select.py``, ``ops/networks_numba.py``) and the noised losses'
(``ops/noised_numba.py``).

Usage::

    python benchmarks/bench_numba_startup.py      # -> results/numba_startup.md

Each measurement is a fresh Python process that imports softtopk and times one operator fwd+bwd
at ``randn(64, 1000)`` several times, each on another input (``_inputs.py`` says why): the first
call (numba's import, its compiler's start-up and the kernels' compilation or loading) and the
median of the next calls. Numba's cache goes to an empty temporary directory per operator
(``NUMBA_CACHE_DIR``): the first process compiles ("cold"), the next ones load what it wrote
("cached", what every later process of a user pays); a last process runs with
``SOFTTOPK_NUMBA=0`` (the torch path, no numba: the start-up the kernels add is the difference).
Without numba installed the script says so and writes nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import machine_info

_CHILD = """
import json, statistics, sys, time
t0 = time.perf_counter()
import torch, softtopk
imported = time.perf_counter() - t0
torch.set_num_threads(1)
calls, name = int(sys.argv[1]), sys.argv[2]
label = torch.randint(0, 1000, (64,))
op = {
    "soft_topk": lambda x: softtopk.soft_topk(x, 10),
    "soft_rank": softtopk.soft_rank,
    "topk_cross_entropy": lambda x: softtopk.topk_cross_entropy(x, label, [0.2] * 5),
    "bal_noised_topk": lambda x: softtopk.bal_noised_topk(x, label, k=5, epsilon=1.0),
}[name]
inputs = [torch.randn(64, 1000, requires_grad=True) for _ in range(calls)]  # each call another input
times = []
for x in inputs:
    t = time.perf_counter()
    op(x).sum().backward()
    times.append(time.perf_counter() - t)
print(json.dumps({"import": imported, "first": times[0], "later": statistics.median(times[1:])}))
"""


OPERATORS = ("soft_rank", "soft_topk", "topk_cross_entropy", "bal_noised_topk")


def measure(cache: str, calls: int, name: str, numba: bool = True) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "SOFTTOPK_NUMBA": "1" if numba else "0"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(calls), name], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cached-runs", type=int, default=3, help="processes after the cold one")
    parser.add_argument("--calls", type=int, default=5, help="calls per process (the first, then later)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "numba_startup.md")
    args = parser.parse_args()
    if importlib.util.find_spec("numba") is None:
        print("numba is not installed: the CPU soft sorts use the tensor solver and have no start-up")
        return
    runs = []
    for name in OPERATORS:
        with tempfile.TemporaryDirectory() as cache:
            cold = measure(cache, args.calls, name)
            cached = [measure(cache, args.calls, name) for _ in range(args.cached_runs)]
            off = measure(cache, args.calls, name, numba=False)
        median = {key: statistics.median(run[key] for run in cached) for key in cold}
        runs += [(name, "empty (cold)", cold), (name, "on disk (cached)", median), (name, "numba off", off)]
    info = machine_info("numba")
    lines = [
        "# numba start-up of the CPU kernels",
        "",
        f"`python benchmarks/bench_numba_startup.py {' '.join(sys.argv[1:])}`: {info['cpu_model']}, torch "
        f"{info['torch']}, numba {info['numba']}, softtopk commit {info['git_commit']}, {info['date']}. "
        f"fwd+bwd at randn(64, 1000) (`soft_topk`: k = 10, the default mask; `topk_cross_entropy`: "
        f"`p_k = [0.2] * 5`, m = 16, splitter network; `bal_noised_topk`: k = 5, ε = 1, 5 draws), one "
        f"thread, each row a fresh process; cached: the median of {args.cached_runs} processes; numba off: "
        "`SOFTTOPK_NUMBA=0`.",
        "",
        "| operator | numba cache | import softtopk (s) | first call (s) | later calls (ms, median) |",
        "|---|---|---:|---:|---:|",
    ]
    for name, state, run in runs:
        first, later = run["first"], 1e3 * run["later"]
        lines.append(f"| `{name}` | {state} | {run['import']:.2f} | {first:.2f} | {later:.1f} |")
        print(f"{name:<18} {state:<18} import {run['import']:.2f} s, first call {first:.2f} s, later {later:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
