"""Benchmark soft ranks and soft sorts (fwd+bwd) against ``torch.sort``, torchsort and SoftTorch.

Usage::

    python benchmarks/bench_soft_sort.py --sizes 100 1000 10000 100000 --repeats 31   # -> results/soft_sort.md
    python benchmarks/bench_soft_sort.py --device cuda --out /tmp/soft_sort_cuda.md
    python benchmarks/bench_soft_sort.py --sizes 100 1000 --repeats 5   # quick

What one run measures: ``x = randn(batch, n)`` float32 with ``requires_grad``, one call and the
backward of ``(out * g).sum()`` for a fixed random ``g`` (fwd+bwd), every call on the next input
of a pool of distinct ones (``_inputs.py``: a sort timed again on one input runs on branches the
CPU has learnt). Candidates: ``torch.sort``
(``values``), softtopk's ``soft_rank``/``soft_sort`` (l2 and kl, strength 1; on a CPU with numba
installed, l2 again with the numba kernels off, "no numba": the tensor solver of an install
without the ``numba`` extra; on CUDA, l2 and kl again with the sort's and rank's own Triton kernels off,
"PAV's kernel only": the torch path around PAV's kernel that they replace),
``torchsort.soft_rank``/``soft_sort`` (l2) when torchsort is importable (it needs a C++ build), and
SoftTorch's ``rank``/``sort`` with ``method="fast_soft_sort"`` when it is importable (Python >= 3.12;
its PAV is numba, row by row): ``mode="c0"`` is the same l2 projection (``standardize=False``, its
``softness`` set to the same problem: ``(n - 1) ε`` for ranks, ``ε / (n - 1)`` for sorts, since its
anchors are ``(0..n-1)/(n-1)``; its values then equal softtopk's to 1e-15 in float64), and
``mode="smooth"`` its entropic projection at that softness (its own parameterisation: not the
problem of softtopk's kl, whose values differ).
A peer that is not importable is named in the header. Per repeat every candidate is timed once, in
an order rotated every repeat, so load from other processes hits all alike; the table gives the
median over repeats and each candidate's median ratio to ``torch.sort`` timed in the same repeat.
Accelerators are synchronised around each call.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from _inputs import Pool
from _machine import machine_info, steady_malloc

import softtopk
from softtopk.ops import isotonic_numba

try:
    import torchsort

    TORCHSORT_ERROR = None
except ImportError as error:  # it compiles a C++ extension at install time
    torchsort, TORCHSORT_ERROR = None, f"{type(error).__name__}: {error}"

try:
    import softtorch

    SOFTTORCH_ERROR = None
except ImportError as error:  # Python >= 3.12, numba, POT and torchopt
    softtorch, SOFTTORCH_ERROR = None, f"{type(error).__name__}: {error}"


def candidates(device: str = "cpu") -> dict:
    found = {
        "torch.sort": lambda x: torch.sort(x, -1).values,
        "softtopk.soft_rank l2": lambda x: softtopk.soft_rank(x),
        "softtopk.soft_rank kl": lambda x: softtopk.soft_rank(x, regularization="kl"),
        "softtopk.soft_sort l2": lambda x: softtopk.soft_sort(x),
        "softtopk.soft_sort kl": lambda x: softtopk.soft_sort(x, regularization="kl"),
    }
    if isotonic_numba.available():
        found["softtopk.soft_rank l2 (no numba)"] = found["softtopk.soft_rank l2"]
        found["softtopk.soft_sort l2 (no numba)"] = found["softtopk.soft_sort l2"]
    if device == "cuda" and _fused() is not None:
        for name in ("soft_rank l2", "soft_sort l2", "soft_rank kl", "soft_sort kl"):
            found[f"softtopk.{name} (PAV's kernel only)"] = found[f"softtopk.{name}"]
    if torchsort is not None:
        found["torchsort.soft_rank l2"] = lambda x: torchsort.soft_rank(x)
        found["torchsort.soft_sort l2"] = lambda x: torchsort.soft_sort(x)
    if softtorch is not None:
        for mode, name in (("c0", "l2"), ("smooth", "kl")):
            found[f"SoftTorch rank {name}"] = _softtorch(softtorch.rank, mode, rank=True)
            found[f"SoftTorch sort {name}"] = _softtorch(softtorch.sort, mode, rank=False)
    return found


def _softtorch(fn, mode: str, rank: bool):
    """SoftTorch's fast_soft_sort on the problem of softtopk's strength 1 (module doc)."""

    def call(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        softness = (n - 1) if rank else 1.0 / max(n - 1, 1)
        out = fn(x, dim=-1, softness=softness, mode=mode, method="fast_soft_sort", descending=False, standardize=False)
        return out if rank else out.values

    return call


def setting(name: str) -> contextlib.AbstractContextManager:
    """What a candidate runs under, forward and backward: the numba kernels off for "no numba", the
    sort's and rank's own kernels off for "PAV's kernel only" (the torch path around PAV's
    kernel, as before them)."""
    if name.endswith("(no numba)"):
        return mock.patch.object(isotonic_numba, "available", lambda: False)
    if name.endswith("(PAV's kernel only)"):
        return mock.patch.object(_fused(), "usable", lambda *args, **kwargs: False)
    return contextlib.nullcontext()


def _fused():
    """``softtopk.ops.permutahedron_triton`` (the sort's and rank's own kernels), or None for a
    checkout from before it."""
    try:
        return importlib.import_module("softtopk.ops.permutahedron_triton")
    except ImportError:
        return None


def time_once(fn, x: torch.Tensor, g: torch.Tensor, name: str = "") -> float:
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    leaf = x.detach().requires_grad_()
    with setting(name):
        sync()
        start = time.perf_counter()
        (fn(leaf) * g).sum().backward()
        sync()
        return time.perf_counter() - start


def run(sizes: list[int], batch: int, repeats: int, device: str) -> list[dict]:
    rows = []
    for n in sizes:
        g = torch.randn(batch, n, generator=torch.Generator().manual_seed(n)).to(device)
        pool = Pool(lambda gen, n=n: torch.randn(batch, n, generator=gen).to(device), batch * n, seed=n)
        fns = candidates(device)
        for name, fn in fns.items():  # warm-up (and compile caches)
            time_once(fn, pool.first, g, name)
        times: dict[str, list[float]] = {name: [] for name in fns}
        names = list(fns)
        for r in range(repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                times[name].append(time_once(fns[name], pool.next(), g, name))
        base = times["torch.sort"]
        for name in names:
            ratio = statistics.median(t / b for t, b in zip(times[name], base, strict=False))
            rows.append({"n": n, "candidate": name, "ms": 1e3 * statistics.median(times[name]), "ratio": ratio})
            print(f"n={n:>6} {name:<34} {rows[-1]['ms']:9.2f} ms  x{ratio:6.2f} torch.sort", flush=True)
    return rows


def write_markdown(path: Path, rows: list[dict], args: argparse.Namespace) -> None:
    info = machine_info("torchsort", "softtorch")
    lines = [
        "# Soft sort and soft rank: fwd+bwd time",
        "",
        f"Command: `python benchmarks/bench_soft_sort.py {' '.join(sys.argv[1:])}`  ",
        f"Device: {args.device}; batch {args.batch}; {args.repeats} repeats; torch threads "
        f"{torch.get_num_threads()}; CPU {info['cpu_model']} ({info['logical_cpus']} logical); torch "
        f"{info['torch']}; Python {sys.version.split()[0]}; "
        f"torchsort {info['torchsort'] or 'not installed (' + str(TORCHSORT_ERROR) + ')'}; "
        f"SoftTorch {info['softtorch'] or 'not installed (' + str(SOFTTORCH_ERROR) + ')'}; "
        f"commit {info['git_commit']}{' (src dirty)' if info['git_src_dirty'] else ''}; {info['date']}; "
        f"load average at the end {os.getloadavg()[0]:.1f}.",
        "",
        "Median wall time of one forward and backward; ratio: median over repeats of the time over "
        "`torch.sort`'s in the same repeat.",
        "",
        "| n | candidate | fwd+bwd (ms) | × torch.sort |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['n']} | {r['candidate']} | {r['ms']:.2f} | {r['ratio']:.2f} |" for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "soft_sort.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print("malloc:", steady_malloc(), flush=True)
    write_markdown(args.out, run(args.sizes, args.batch, args.repeats, args.device), args)


if __name__ == "__main__":
    main()
