"""What a JAX user waits for before the first result: the compile time of softtopk.jax's programs.

Usage::

    python benchmarks/bench_jax_compile.py            # -> results/jax_compile.md
    python benchmarks/bench_jax_compile.py --repeats 5

Every operator of :mod:`softtopk.jax` compiles one XLA program per shape, dtype and static
argument (``jit`` inside the public functions); on a CPU that compile takes far longer than a call
(a second where a call takes a millisecond), and it is also most of the time of the JAX tests.
For each operator at ``randn(64, n)`` float32, ``k = 10``, this script times ``lower`` and
``compile`` of the forward (``jit(op)``) and of the forward and backward (``jit(value_and_grad)``
of ``sum(op(x) * g)``), each in a fresh process with JAX's persistent cache off, ``--repeats``
processes per program (median), each pinned to one CPU with XLA told to use one thread.
``lax.top_k`` is the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _machine import machine_info, provenance

K = 10


def _ops() -> dict[str, Callable]:
    """The programs, by name (imports JAX: the parent reads the names, a child runs one)."""
    import jax

    import softtopk.jax as sj

    return {
        "lax.top_k (baseline)": lambda x: jax.lax.top_k(x, K)[0],
        "soft_topk lapsum": lambda x: sj.soft_topk(x, K),
        "sparse_topk_mask p=4/3": lambda x: sj.sparse_topk_mask(x, K),
        "sparse_topk_mask p=2": lambda x: sj.sparse_topk_mask(x, K, p=2),
        "sparse_topk_mag p=4/3": lambda x: sj.sparse_topk_mag(x, K),
        "soft_rank l2": lambda x: sj.soft_rank(x),
        "soft_sort kl": lambda x: sj.soft_sort(x, regularization="kl"),
    }


def _child(name: str, n: int, backward: bool) -> None:
    """One program compiled once, in a process of its own (no cache), pinned to one CPU; prints
    the seconds of ``lower`` and ``compile`` as JSON."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import jax

    op = _ops()[name]
    x = jax.random.normal(jax.random.key(0), (64, n))
    if backward:
        f = jax.jit(jax.value_and_grad(lambda x, g: (op(x) * g[:, : op(x).shape[-1]]).sum()))
        args: tuple = (x, x)
    else:
        f, args = jax.jit(op), (x,)
    jax.block_until_ready(jax.jit(lambda v: v + 1)(x))  # the backend's own start-up, not the program's
    t0 = time.perf_counter()
    lowered = f.lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    print(json.dumps({"lower": t1 - t0, "compile": time.perf_counter() - t1}))


def measure(name: str, n: int, backward: bool) -> dict:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_ENABLE_COMPILATION_CACHE": "false",
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    }
    done = subprocess.run(
        [sys.executable, __file__, "--child", name, str(n), "1" if backward else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per program (median)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "jax_compile.md")
    parser.add_argument("--child", nargs=3, metavar=("NAME", "N", "BACKWARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, n, backward = args.child
        _child(name, int(n), backward == "1")
        return
    rows = []
    for n in args.sizes:
        for name in _ops():
            for backward in (False, True):
                runs = [measure(name, n, backward) for _ in range(args.repeats)]
                row = {key: statistics.median(run[key] for run in runs) for key in ("lower", "compile")}
                rows.append({"n": n, "op": name, "backward": backward, **row})
                mode = "fwd+bwd" if backward else "fwd"
                print(f"n={n:<5} {name:<24} {mode:<7} lower {row['lower']:.3f} s  compile {row['compile']:.3f} s")
    info = machine_info("jax")
    lines = [
        "# softtopk.jax: compile time of each program",
        "",
        f"{provenance(info, 'jax')}. `randn(64, n)` float32, "
        f"k = 10, one thread; the median of {args.repeats} fresh processes per program (no persistent cache).",
        "",
        "| n | operator | program | lower (s) | compile (s) |",
        "|---|---|---|---:|---:|",
    ]
    for row in rows:
        program = "fwd+bwd" if row["backward"] else "fwd"
        lines.append(f"| {row['n']} | {row['op']} | {program} | {row['lower']:.3f} | {row['compile']:.3f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
