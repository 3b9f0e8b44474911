"""The one-time cost of the numba kernels of ``soft_sort``/``soft_rank`` on a CPU tensor.

Usage::

    python benchmarks/bench_numba_startup.py      # -> results/numba_startup.md

Each measurement is a fresh Python process that imports softtopk and times ``soft_rank`` fwd+bwd
at ``randn(64, 1000)`` several times, each on another input (``_inputs.py`` says why): the first
call (numba's import, its compiler's start-up and the kernels' compilation or loading) and the
median of the next calls. Numba's cache goes to an empty
temporary directory (``NUMBA_CACHE_DIR``): the first process compiles ("cold"), the next ones load
what it wrote ("cached", what every later process of a user pays). Without numba installed the
script says so and writes nothing.
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
calls = int(sys.argv[1])
inputs = [torch.randn(64, 1000, requires_grad=True) for _ in range(calls)]  # each call another input
times = []
for x in inputs:
    t = time.perf_counter()
    softtopk.soft_rank(x).sum().backward()
    times.append(time.perf_counter() - t)
print(json.dumps({"import": imported, "first": times[0], "later": statistics.median(times[1:])}))
"""


def measure(cache: str, calls: int) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "SOFTTOPK_NUMBA": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(calls)], env=env, capture_output=True, text=True, check=True
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
    with tempfile.TemporaryDirectory() as cache:
        cold = measure(cache, args.calls)
        cached = [measure(cache, args.calls) for _ in range(args.cached_runs)]
    median = {key: statistics.median(run[key] for run in cached) for key in cold}
    info = machine_info("numba")
    lines = [
        "# numba start-up of the CPU soft sorts",
        "",
        f"`python benchmarks/bench_numba_startup.py {' '.join(sys.argv[1:])}`: {info['cpu_model']}, torch "
        f"{info['torch']}, numba {info['numba']}, softtopk commit {info['git_commit']}, {info['date']}. "
        f"`soft_rank` fwd+bwd at randn(64, 1000), one thread, each row a fresh process; cached: the "
        f"median of {args.cached_runs} processes.",
        "",
        "| numba cache | import softtopk (s) | first call (s) | later calls (ms, median) |",
        "|---|---:|---:|---:|",
    ]
    for name, run in (("empty (cold)", cold), ("on disk (cached)", median)):
        lines.append(f"| {name} | {run['import']:.2f} | {run['first']:.2f} | {1e3 * run['later']:.1f} |")
        first, later = run["first"], 1e3 * run["later"]
        print(f"{name:<18} import {run['import']:.2f} s, first call {first:.2f} s, later {later:.1f} ms")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
