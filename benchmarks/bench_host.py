"""Host time per call: what the losses cost the CPU that drives the GPU.

On a GPU the top-k losses at 512 x 1000 take several times what their CUDA graph's replay takes
(``bench_gpu.py``): the host, which launches the ops one by one, is the bound. This script times,
per case, loops of ``--calls`` calls (forward, and forward + backward): the host's time until the
loop's last call returns ("host", the device still busy or not), and until the device has finished
("loop"), per call, median of ``--repeats`` loops; then profiles with cProfile a loop of forwards
and one of forwards and backwards (the functions with the most own time, per call). On a CPU "host"
and "loop" are the same time; small shapes (``--rows 8 --classes 50``) make it the per-op
overhead. ``--stubbed-kernels`` (CPU, with triton installed) runs the CPU tensors down a CUDA
tensor's path with every Triton kernel routed in and stubbed out (``_accelerator.py``): what the
calls cost the host that drives a GPU, dispatch, allocation and Python, less the launches' own
cost; without a GPU, the CPU's proxy of ``--device cuda``'s host column.

Cases: ``F.cross_entropy``; softtopk's ``BalNoisedTopK(5, epsilon=1, n_samples=5)``,
``SmoothTopKSVM(k=5)``, ``TopKCrossEntropyLoss`` (P_K = [.2]*5, m = 16; splitter network and
NeuralSort; and the splitter's kernels chained as three autograd nodes, "three nodes", where they
run in one: ``ops/topk_ce_triton.py``; and ``BalNoisedTopK`` reduced by torch ops, where its
kernels reduce it: ``ops/reduce_triton.py``) and pytopk's ``BalNoisedTopK`` where importable; and the
noised losses' selection alone on the ``(rows, classes, 5)`` draws along the class axis:
``topk(6)``, and ``kthvalue`` of the same entry.

Usage::

    python benchmarks/bench_host.py --device cuda      # -> benchmarks/results/host.md
    python benchmarks/bench_host.py --device cpu --rows 8 --classes 50 --out /tmp/host_cpu.md
    python benchmarks/bench_host.py --device cpu --stubbed-kernels --rows 8 --classes 64  # -> results/host_stubbed.md
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from _accelerator import reduced_by_torch, stubbed_kernels, three_nodes
from _machine import machine_info

import softtopk

RESULTS = Path(__file__).parent / "results"
SAMPLES, K = 5, 5


def cases(rows: int, classes: int, device: torch.device) -> dict[str, tuple[Callable, bool]]:
    """name -> (call, differentiable) on one fixed input."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, classes, device=device, generator=gen).requires_grad_()
    y = torch.randint(0, classes, (rows,), device=device, generator=gen)
    draws = torch.randn(rows, classes, SAMPLES, device=device, generator=gen)
    losses = {
        "cross_entropy": lambda a, b: F.cross_entropy(a, b),
        "BalNoisedTopK k=5 eps=1 S=5": softtopk.BalNoisedTopK(K, epsilon=1.0, n_samples=SAMPLES),
        "SmoothTopKSVM k=5": softtopk.SmoothTopKSVM(k=K),
        "TopKCE splitter m=16": softtopk.TopKCrossEntropyLoss([0.2] * K, method="splitter_selection", m=16),
        "TopKCE neuralsort m=16": softtopk.TopKCrossEntropyLoss([0.2] * K, method="neuralsort", m=16),
    }
    variants = {
        "TopKCE splitter m=16 (three nodes)": three_nodes(losses["TopKCE splitter m=16"]),
        "BalNoisedTopK k=5 eps=1 S=5 (torch's reduction)": reduced_by_torch(losses["BalNoisedTopK k=5 eps=1 S=5"]),
    }
    losses |= {name: loss for name, loss in variants.items() if loss is not None}
    try:
        import pytopk

        losses["pytopk BalNoisedTopK"] = pytopk.BalNoisedTopK(K, 1.0, n_sample=SAMPLES)
    except ImportError:
        pass
    out: dict[str, tuple[Callable, bool]] = {name: (partial(loss, x, y), True) for name, loss in losses.items()}
    out["draws.topk(6, dim=1)"] = (lambda: draws.topk(K + 1, dim=1), False)
    out["kthvalue(draws, C - 5, dim=1)"] = (lambda: torch.kthvalue(draws, classes - K, dim=1), False)
    return out


def loop_us(call: Callable, backward: bool, calls: int, sync: Callable) -> tuple[float, float]:
    """(host, loop) microseconds per call of one loop of ``calls`` calls."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        out = call()
        if backward:
            out.backward()
    host = time.perf_counter()
    sync()
    end = time.perf_counter()
    return (host - start) / calls * 1e6, (end - start) / calls * 1e6


def profile(call: Callable, calls: int, sync: Callable, top: int, backward: bool) -> list[tuple[str, float, float]]:
    """(function, calls per call, own microseconds per call) of the ``top`` functions by own time,
    over a loop of forwards, or with ``backward`` of forwards and backwards; the backward then runs
    in the calling thread (a CUDA tensor's backward runs in autograd's device thread, which
    cProfile does not see)."""
    profiler = cProfile.Profile()
    sync()
    with torch.autograd.set_multithreading_enabled(not backward):
        profiler.enable()
        for _ in range(calls):
            out = call()
            if backward:
                out.backward()
        sync()
        profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, ncalls, own, _, _) in stats.items():
        where = name if path == "~" else f"{Path(path).name}:{line}({name})"
        rows.append((where, ncalls / calls, own / calls * 1e6))
    return sorted(rows, key=lambda row: -row[2])[:top]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=100, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per case (median)")
    parser.add_argument("--top", type=int, default=12, help="functions listed per profile")
    parser.add_argument("--stubbed-kernels", action="store_true", help="CPU: a CUDA call's path, kernels stubbed")
    parser.add_argument("--out", type=Path, default=None, help="markdown to write (default results/host.md)")
    opts = parser.parse_args(argv)
    if opts.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if opts.stubbed_kernels and opts.device != "cpu":
        parser.error("--stubbed-kernels stands in for a GPU on the CPU: use it with --device cpu")
    device = torch.device(opts.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = opts.out or RESULTS / ("host_stubbed.md" if opts.stubbed_kernels else "host.md")
    started = time.time()
    with stubbed_kernels() if opts.stubbed_kernels else contextlib.nullcontext():
        table, profiles = measure(opts, device, sync)
    write(out, opts, device, table, profiles, time.time() - started)
    print(f"wrote {out}")


def measure(opts, device: torch.device, sync: Callable) -> tuple[list, list]:
    """The table's rows and the profiles. The cases take turns within each repeat, so that a drift
    of the machine's speed falls on every case alike; ``ratio`` is the median over repeats of the
    case's host fwd+bwd over cross-entropy's in the same repeat."""
    calls = cases(opts.rows, opts.classes, device)
    for call, differentiable in calls.values():
        for _ in range(10):  # warm-up: caches, Triton's compilation
            result = call()
            if differentiable:
                result.backward()
    fwd: dict[str, list] = {name: [] for name in calls}
    both: dict[str, list] = {name: [] for name, (_, differentiable) in calls.items() if differentiable}
    for _ in range(opts.repeats):
        for name, (call, differentiable) in calls.items():
            fwd[name].append(loop_us(call, False, opts.calls, sync))
            if differentiable:
                both[name].append(loop_us(call, True, opts.calls, sync))
    table, profiles = [], []
    for name, (call, differentiable) in calls.items():
        row = {
            "case": name,
            "fwd": tuple(statistics.median(t[i] for t in fwd[name]) for i in (0, 1)),
            "both": tuple(statistics.median(t[i] for t in both[name]) for i in (0, 1)) if differentiable else None,
            "ratio": statistics.median(a[0] / b[0] for a, b in zip(both[name], both["cross_entropy"], strict=True))
            if differentiable
            else None,
        }
        table.append(row)
        print(f"{name}: {row}", flush=True)
        if differentiable:
            for backward in (False, True):
                profiles.append((name, backward, profile(call, opts.calls, sync, opts.top, backward)))
    return table, profiles


def write(out: Path, opts, device, table, profiles, seconds: float) -> None:
    info = machine_info("pytopk")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else info["cpu_model"]
    lines = [
        f"# bench_host: {name}",
        "",
        f"`python benchmarks/bench_host.py --device {opts.device} --rows {opts.rows} --classes {opts.classes}"
        f"{' --stubbed-kernels' if opts.stubbed_kernels else ''}`, "
        f"torch {torch.__version__}, softtopk commit {info.get('git_commit')}"
        f"{' (src modified)' if info.get('git_src_dirty') else ''}, {time.strftime('%Y-%m-%dT%H:%M:%S')}, "
        f"{seconds:.0f} s. Microseconds per call, median of {opts.repeats} loops of {opts.calls} calls: "
        "host = until the loop's last call returned, loop = until the device finished too; "
        "× CE = host fwd+bwd over cross-entropy's in the same repeat (median; the cases take turns).",
        "",
        "| case | host fwd | loop fwd | host fwd+bwd | loop fwd+bwd | × CE (host fwd+bwd) |",
        "|---|---|---|---|---|---|",
    ]
    for row in table:
        both = row["both"]
        cells = [f"{row['fwd'][0]:.1f}", f"{row['fwd'][1]:.1f}"]
        cells += [f"{both[0]:.1f}", f"{both[1]:.1f}", f"{row['ratio']:.2f}"] if both else ["—", "—", "—"]
        lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
    for case, backward, rows in profiles:
        what = "forward + backward (the backward in the calling thread)" if backward else "forward"
        lines += ["", f"## {case}: {what}, own time per call (cProfile)", ""]
        lines += ["| function | calls | µs |", "|---|---|---|"]
        lines += [f"| `{where}` | {calls:g} | {own:.1f} |" for where, calls, own in rows]
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
