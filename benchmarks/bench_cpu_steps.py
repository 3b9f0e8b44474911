"""Time the CPU's own steps of ``softtopk.ops.compute`` against the one ATen call they stand for.

Usage::

    python benchmarks/bench_cpu_steps.py                 # -> results/cpu_steps.md
    python benchmarks/bench_cpu_steps.py --repeats 5     # quick

On a CPU some ATen kernels are much slower than other calls that give the same values: ``topk``
once ``k`` nears ``n / 64`` (it leaves its partial sort for ``nth_element``), the float ``sort`` (its
comparator places NaN), ``exp`` (not vectorised here, where ``exp2`` is), ``addcmul`` with two
broadcast operands and the batched one-row ``bmm``. The library takes the faster call on the CPU
only (``ops.compute.on_cpu``); this script shows each choice on the shapes the kernels meet. With
numba installed, it also times the soft sorts' radix sort (``ops.isotonic_numba.sorted_rows``)
against ``torch.sort`` around the row lengths where it starts to pay. One more row times the host
cost of applying an autograd Function: torch's ``Function.apply``, which binds the arguments to
``forward``'s signature at every call, against the library's base class (``ops._function``),
which skips that where it changes nothing (on any device).
Forward only, float32 unless noted, one thread;
per repeat both calls of a row are timed once, in alternating order, each on the next input of a
pool of distinct ones (``_inputs.py``: on an input it has just met, a sort or a top-k runs on
branches the CPU has learnt); the table gives medians and the median ratio to the
ATen call timed in the same repeat.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, steady_malloc

from softtopk.ops import compute, isotonic_numba
from softtopk.ops._function import Function

LOG2E = 1.0 / math.log(2.0)


class _TorchScale(torch.autograd.Function):
    """``(x * scale, x[:, :1])``, the second output non-differentiable: a Function as torch has it."""

    @staticmethod
    def forward(x, scale):
        return x * scale, x[:, :1]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, grad, _):
        return grad * ctx.scale, None


class _OurScale(Function):
    """:class:`_TorchScale` on the library's base class (its own ``forward``: the base caches the
    signature on the function, which torch's class would then share)."""

    @staticmethod
    def forward(x, scale):
        return x * scale, x[:, :1]

    setup_context = _TorchScale.setup_context
    backward = _TorchScale.backward


def cases() -> list[tuple[str, str, Callable, Callable, Pool]]:
    """(step, shape, ATen call, the library's CPU step, the pool of inputs both take in turn)."""
    found = []

    def add(step: str, shape: str, aten: Callable, ours: Callable, make: Callable, numel: int) -> None:
        found.append((step, shape, aten, ours, Pool(make, numel, seed=len(found))))

    for rows, n, k in (
        (64, 1000, 20),
        (64, 1000, 10),
        (64, 4000, 5),
        (64, 8000, 10),
        (512, 1000, 15),
        (512, 1000, 5),
        (64, 10000, 20),
        (64, 100000, 20),
        (16384, 64, 4),
    ):
        add(
            "topk",
            f"{rows}×{n}, k={k}",
            lambda x, k=k: x.topk(k, -1),
            lambda x, k=k: compute.topk_rows(x, k),
            lambda gen, rows=rows, n=n: torch.randn(rows, n, generator=gen),
            rows * n,
        )
    sorts = ((64, 32), (64, 64), (64, 100), (64, 128), (64, 192), (64, 1000), (64, 10000))
    for rows, n, dtype in [(r, m, torch.float32) for r, m in sorts] + [(64, 1000, torch.float64)]:
        add(
            "sort",
            f"{rows}×{n} {str(dtype).removeprefix('torch.')}",
            lambda x: x.sort(-1),
            lambda x: compute.sort_rows(x),
            lambda gen, rows=rows, n=n, dtype=dtype: torch.randn(rows, n, generator=gen).to(dtype),
            rows * n,
        )
    if isotonic_numba.available():  # the soft sorts' radix sort (numba), where it starts to pay
        for rows, n, dtype in [(64, m, torch.float32) for m in (32, 48, 100, 1000)] + [
            (64, m, torch.float64) for m in (128, 160, 1000)
        ]:
            add(
                "radix sort",
                f"{rows}×{n} {str(dtype).removeprefix('torch.')}",
                lambda x: x.sort(-1, descending=True),
                lambda x: isotonic_numba.sorted_rows(x, 1.0),
                lambda gen, rows=rows, n=n, dtype=dtype: torch.randn(rows, n, generator=gen).to(dtype),
                rows * n,
            )
    for dtype in (torch.float32, torch.float64):
        add(
            "exp",
            f"512×1000 {str(dtype).removeprefix('torch.')}",
            lambda x: x.exp(),
            lambda x: x.mul(LOG2E).exp2_(),
            lambda gen, dtype=dtype: -10 * torch.rand(512, 1000, generator=gen).to(dtype),
            512 * 1000,
        )
    for n in (1000, 100000):  # the second past muladd_rows' size limit: addcmul itself
        add(
            "muladd",
            f"64×{n}",
            lambda t: torch.addcmul(t[2], t[0], t[1]),
            lambda t: compute.muladd_rows(*t),
            lambda gen, n=n: tuple(torch.rand(64, m, generator=gen) for m in (n, 1, 1)),
            64 * n,
        )
    add(
        "row dot",
        "64×1000",
        lambda t: torch.bmm(t[0].unsqueeze(-2), t[1].unsqueeze(-1)),
        lambda t: compute.row_dot(*t),
        lambda gen: tuple(torch.randn(2, 64, 1000, generator=gen)),
        2 * 64 * 1000,
    )
    add(
        "Function.apply",
        "64×100",
        lambda x: _TorchScale.apply(x, 2.0),
        lambda x: _OurScale.apply(x, 2.0),
        lambda gen: torch.randn(64, 100, generator=gen, requires_grad=True),
        64 * 100,
    )
    return found


def run(repeats: int) -> list[dict]:
    rows = []
    for step, shape, aten, ours, pool in cases():
        for x in pool.items:  # warm-up
            aten(x), ours(x)
        times: dict[str, list[float]] = {"aten": [], "ours": []}
        for r in range(repeats):
            for name, fn in (("aten", aten), ("ours", ours)) if r % 2 else (("ours", ours), ("aten", aten)):
                x = pool.next()  # every call another input: the second call must not meet the first's
                start = time.perf_counter()
                fn(x)
                times[name].append(time.perf_counter() - start)
        ratio = statistics.median(o / a for o, a in zip(times["ours"], times["aten"], strict=True))
        row = {
            "step": step,
            "shape": shape,
            "aten_ms": 1e3 * statistics.median(times["aten"]),
            "ours_ms": 1e3 * statistics.median(times["ours"]),
            "ratio": ratio,
        }
        rows.append(row)
        print(f"{step:<8} {shape:<22} aten {row['aten_ms']:8.3f} ms  ours {row['ours_ms']:8.3f} ms  x{ratio:5.2f}")
    return rows


def write(out: Path, rows: list[dict], args: argparse.Namespace, malloc: str) -> None:
    info = machine_info()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "malloc": malloc, "rows": rows}, indent=1) + "\n")
    lines = [
        "# The CPU's own steps against the ATen call they stand for",
        "",
        f"`python benchmarks/bench_cpu_steps.py {' '.join(sys.argv[1:])}`: {info['cpu_model']}, "
        f"{torch.get_num_threads()} thread, torch {info['torch']}, softtopk commit {info['git_commit']}"
        f"{' (src dirty)' if info['git_src_dirty'] else ''}, {info['date']}, malloc: {malloc}, "
        f"{args.repeats} repeats. Forward only; × is the median ratio (ours / ATen) within a repeat.",
        "",
        "| step | shape | ATen call | ATen ms | `ops.compute` step | ms | × |",
        "|---|---|---|---:|---|---:|---:|",
    ]
    names = {
        "topk": ("`x.topk(k, -1)`", "`topk_rows` (block maxima where it pays)"),
        "sort": ("`x.sort(-1)`", "`sort_rows` (integer keys)"),
        "radix sort": ("`x.sort(-1, descending=True)`", "`isotonic_numba.sorted_rows` (radix, float64 out)"),
        "exp": ("`x.exp()`", "`x.mul(log2 e).exp2_()`"),
        "muladd": ("`addcmul` with two (B, 1) operands", "`muladd_rows` (product, in-place sum)"),
        "row dot": ("`bmm` of one-row products", "`row_dot` (`vecdot`)"),
        "Function.apply": ("torch's `Function.apply` (binds the arguments)", "`ops._function.Function.apply`"),
    }
    for r in rows:
        aten, ours = names[r["step"]]
        timed = f"{r['aten_ms']:.3f} | {ours} | {r['ours_ms']:.3f} | {r['ratio']:.2f}"
        lines.append(f"| {r['step']} | {r['shape']} | {aten} | {timed} |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cpu_steps.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    malloc = steady_malloc()
    write(args.out, run(args.repeats), args, malloc)


if __name__ == "__main__":
    main()
