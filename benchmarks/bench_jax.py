"""softtopk.jax against ``jax.lax.top_k``, the original google-research sparse_soft_topk, ott-jax and
SoftJAX: jitted forward and forward+backward on CPU, one thread.

Usage, in a venv of its own (numba, ott-jax and softjax stay out of the project's)::

    python3 -m venv /tmp/benchjax/venv && . /tmp/benchjax/venv/bin/activate
    pip install torch==2.13.0                         # first: the local CPU wheel (no CUDA)
    pip install -e . -c constraints.txt
    pip install jax numba ott-jax
    pip install --ignore-requires-python softjax      # 0.1.1 declares Python >= 3.12; runs on 3.11
    # the original, from a google-research checkout: git archive HEAD sparse_soft_topk | tar -x -C /tmp/benchjax/src

    python benchmarks/bench_jax.py                    # ~10 min on a 2-core VM
    python benchmarks/bench_jax.py --quick            # n = 100 only, 3 repeats, no RSS (< 1 min)
    python benchmarks/bench_jax.py --out benchmarks/results/jax.json   # also writes jax.md
    python benchmarks/bench_jax.py --original /tmp/benchjax/src        # folder holding sparse_soft_topk/

Inputs: ``x = randn(64, n)`` float32, ``n`` in {1e2, 1e3, 1e4, 1e5}, ``k`` in {10, n/10}, ``g`` a
fixed ``randn(64, n)``, λ = 0.1. Forward: ``jit(op)(x)``. Forward+backward: ``jit(value_and_grad)``
of ``L = sum(op(x) * g)`` (``g[:, :k]`` for ops returning the ``k`` top values); the value is kept
because under a bare ``grad`` XLA drops any forward work the derivative rule does not read (our
Dykstra's iterations: its derivative is the exact problem's). Baseline: ``lax.top_k(x, k)``, its
values (``L = sum(values * g[:, :k])``). Each op and the baseline are compiled ahead, called once
to warm up, then timed back to back for as many repeats as fit in ``--budget`` seconds (at least
3, at most ``--repeats``; one repeat for a call over 5 s), in an order that alternates; a call
under 10 ms is timed as a run of calls lasting about 10 ms, after an untimed one (the first call
after another op's runs cold). The ratio is op / baseline per repeat; the tables give its median
with the interquartile range, and the op's median time per call. After each timing the script
sleeps as long as it took (at most 0.25 s): the runtime frees a call's buffers on a background
thread, which on one CPU would otherwise land on the next timing (60 ms after the original's
Dykstra at n = 1e3).

One thread: the process is pinned to one CPU and XLA, numba and OpenMP are told to use one thread.

The original (``--original PATH`` or ``SPARSE_SOFT_TOPK_SRC``, a folder holding the
``sparse_soft_topk`` package of github.com/google-research/google-research) fails on current JAX:
``jax.pure_callback(vectorized=...)`` is gone and callbacks receive ``jax.Array``, which numba
rejects. This script wraps ``jax.pure_callback`` once the original is imported: ``vectorized=False``
becomes ``vmap_method="sequential"`` (``True``: ``"expand_dims"``) and the callback's arguments pass
through ``np.asarray``; the original's code is unchanged. Its wrappers permute with a dense one-hot
``(B, n, n)`` float32 matrix, so sizes where that exceeds 4 GB are skipped, as is Dykstra (its and
ours) above n = 1e3. SoftJAX's ``top_k`` (default NeuralSort) sums ``|x_i - x_j|`` over all pairs:
skipped where ``B n^2 > 1e10`` or its dense ``(B, k, n)`` soft index exceeds 1 GB.

Memory: a fresh subprocess runs one fwd+bwd of ``sparse_topk_mask`` (p = 4/3) at 64 x 1e5,
k = 1e4 and reports its peak RSS next to a subprocess doing the same with ``lax.top_k`` (both
include Python and JAX). The peak is ``VmHWM`` of /proc/self/status: ``ru_maxrss`` would report
this script's own peak, which Linux carries across fork and exec.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
for _name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import softtopk.jax as stj  # noqa: E402

B, L = 64, 0.1
SLOW = 5.0  # seconds: a call this slow is timed once after its warm-up
MIN_TIMED = 1e-2  # seconds: faster calls are timed in runs of several
BASELINE = "lax.top_k"
GB = 1e9


def original_ops(path: str | None) -> tuple[dict, str | None]:
    """The original's four operators with the pure_callback shim, or ({}, why not)."""
    if not path or not (Path(path) / "sparse_soft_topk").is_dir():
        return {}, "original: not installed (--original PATH or SPARSE_SOFT_TOPK_SRC)"
    pure_callback = jax.pure_callback

    def shim(callback, result_shape_dtypes, *args, vectorized=None, **kwargs):
        if vectorized is not None:
            kwargs.setdefault("vmap_method", "expand_dims" if vectorized else "sequential")
        host = lambda *a: callback(*(np.asarray(v) for v in a))  # noqa: E731
        return pure_callback(host, result_shape_dtypes, *args, **kwargs)

    jax.pure_callback = shim
    sys.path.insert(0, path)
    import sparse_soft_topk as sst

    def dense_p(n, k):
        return f"one-hot P (B, n, n) = {B * n * n * 4 / GB:.0f} GB" if B * n * n * 4 > 4 * GB else None

    def dykstra_skip(n, k):
        return "n > 1e3 (Dykstra)" if n > 1000 else dense_p(n, k)

    dykstra = lambda x, k: jax.vmap(lambda r: sst.sparse_soft_topk_mask_dykstra(r, k, L, 500))(x)  # noqa: E731
    return {
        "original mask_pav p=4/3": (lambda x, k: sst.sparse_soft_topk_mask_pav(x, k, L, 4 / 3), dense_p),
        "original mask_pav p=2": (lambda x, k: sst.sparse_soft_topk_mask_pav(x, k, L, 2.0), dense_p),
        "original mag_pav p=4/3": (lambda x, k: sst.sparse_soft_topk_mag_pav(x, k, L, 4 / 3), dense_p),
        "original mask_dykstra(500)": (dykstra, dykstra_skip),
    }, None


def other_ops() -> tuple[dict, list[str]]:
    """ott-jax's topk_mask and SoftJAX's top_k where importable, and notes for those that are not."""
    ops, notes = {}, []
    try:
        from ott.tools import soft_sort

        ops["ott topk_mask (eps 1e-2)"] = (lambda x, k: soft_sort.topk_mask(x, axis=-1, k=k), lambda n, k: None)
        notes.append(
            f"ott-jax {version('ott-jax')}: `soft_sort.topk_mask(x, axis=-1, k=k)`, defaults "
            "(epsilon 1e-2, Sinkhorn's defaults)"
        )
    except ImportError:
        notes.append("ott-jax: not installed")
    try:
        import softjax

        def softjax_skip(n, k):
            if B * n * n > 1e10:
                return f"pairwise NeuralSort sum: B n^2 = {B * n * n:.1e} terms"
            return f"soft index (B, k, n) = {B * k * n * 4 / GB:.1f} GB" if B * k * n * 4 > GB else None

        ops["softjax top_k (neuralsort)"] = (lambda x, k: softjax.top_k(x, k)[0], softjax_skip)
        notes.append(
            f"SoftJAX {version('softjax')}: the values of `softjax.top_k(x, k)`, defaults "
            "(method 'neuralsort', mode 'smooth', softness 0.1)"
        )
    except ImportError:
        notes.append(
            "SoftJAX: not installed (PyPI's softjax 0.1.1 declares Python >= 3.12; "
            "pip install --ignore-requires-python softjax)"
        )
    return ops, notes


def our_ops() -> dict:
    never = lambda n, k: None  # noqa: E731
    return {
        "sparse_topk_mask p=4/3": (lambda x, k: stj.sparse_topk_mask(x, k, l=L, p=4 / 3), never),
        "sparse_topk_mask p=2": (lambda x, k: stj.sparse_topk_mask(x, k, l=L, p=2), never),
        "sparse_topk_mag p=4/3": (lambda x, k: stj.sparse_topk_mag(x, k, l=L, p=4 / 3), never),
        "soft_topk tau=1": (lambda x, k: stj.soft_topk(x, k, tau=1.0), never),
        "sparse_topk_mask p=2 dykstra(500)": (
            lambda x, k: stj.sparse_topk_mask(x, k, l=L, p=2, solver="dykstra", n_iter=500),
            lambda n, k: "n > 1e3 (Dykstra)" if n > 1000 else None,
        ),
    }


def jitted(fn, k: int, backward: bool):
    """The jitted forward ``(x, g) -> fn(x, k)`` or step ``(x, g) -> (L, dL/dx)``, ``L = sum(fn(x, k) * g)``."""
    if not backward:
        return jax.jit(lambda x, g: fn(x, k))

    def loss(x, g):
        out = fn(x, k)
        return jnp.sum(out * g[:, : out.shape[-1]])

    return jax.jit(jax.value_and_grad(loss))


def seconds(f, x, g, number: int = 1) -> float:
    """Seconds per call of ``number`` calls in a row (after an untimed one when ``number > 1``: the
    first call after another op's runs cold)."""
    if number > 1:
        jax.block_until_ready(f(x, g))
    start = time.perf_counter()
    for _ in range(number):
        out = f(x, g)
    jax.block_until_ready(out)
    spent = time.perf_counter() - start
    time.sleep(min(spent, 0.25))  # the runtime frees the call's buffers asynchronously: off the clock
    return spent / number


def measure(fn, base, n: int, k: int, backward: bool, repeats: int, budget: float) -> dict:
    rng = np.random.default_rng(n + k)
    x = jnp.asarray(rng.standard_normal((B, n), dtype=np.float32))
    g = jnp.asarray(rng.standard_normal((B, n), dtype=np.float32))
    f, b = (jitted(h, k, backward).lower(x, g).compile() for h in (fn, base))

    def per_call(h) -> float:  # warm-up; a fast call is timed again, warm, to size its runs
        spent = seconds(h, x, g)
        return spent if spent > MIN_TIMED else seconds(h, x, g, 10)

    op_s, base_s = per_call(f), per_call(b)
    op_n, base_n = (max(1, round(MIN_TIMED / t)) for t in (op_s, base_s))
    repeats = max(1 if op_s > SLOW else 3, min(repeats, int(budget / (op_n * op_s + base_n * base_s))))
    times, ratios = [], []
    for repeat in range(repeats):
        if repeat % 2:
            base_s, op_s = seconds(b, x, g, base_n), seconds(f, x, g, op_n)
        else:
            op_s, base_s = seconds(f, x, g, op_n), seconds(b, x, g, base_n)
        times.append(op_s)
        ratios.append(op_s / base_s)
    q = statistics.quantiles(ratios, n=4) if repeats > 1 else ratios * 3
    return {
        "ms": 1e3 * statistics.median(times),
        "ratio": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "repeats": repeats,
    }


def peak_rss(which: str) -> None:
    """Child process: one fwd+bwd at 64 x 1e5, k = 1e4; prints its peak RSS in MB (VmHWM: Linux's
    ru_maxrss keeps the parent's peak across fork and exec)."""
    fn = our_ops()["sparse_topk_mask p=4/3"][0] if which == "sparse" else lambda x, k: lax.top_k(x, k)[0]
    x = jnp.asarray(np.random.default_rng(0).standard_normal((B, 100_000), dtype=np.float32))
    jax.block_until_ready(jitted(fn, 10_000, True)(x, x))
    status = Path("/proc/self/status").read_text()
    print(int(status.split("VmHWM:")[1].split()[0]) / 1024)


def num(v: float) -> str:
    return f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def cell(r: dict | None) -> str:
    if r is None:
        return "|"
    if "skipped" in r:
        return f"skipped: {r['skipped']} |"
    spread = f"{num(r['q1'])}–{num(r['q3'])}" if r["repeats"] > 1 else "1 run"
    return f"{num(r['ms'])} | {num(r['ratio'])}× ({spread}) |"


def tables(rows: list[dict], names: list[str]) -> list[str]:
    lines = []
    for name in names:
        mine = {(r["n"], r["k"], r["backward"]): r for r in rows if r["op"] == name}
        lines += [
            f"### {name}",
            "",
            "| n | k | fwd ms | fwd ÷ top_k (IQR) | fwd+bwd ms | fwd+bwd ÷ top_k (IQR) |",
            "|---|---|---|---|---|---|",
        ]
        for n, k in sorted({(n, k) for n, k, _ in mine}):
            fwd, bwd = mine.get((n, k, False)), mine.get((n, k, True))
            if fwd and bwd and "skipped" in fwd and "skipped" in bwd:
                lines.append(f"| {n} | {k} | skipped: {fwd['skipped']} | | | |")
            else:
                lines.append(f"| {n} | {k} | {cell(fwd)} {cell(bwd)}")
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 100 only, 3 repeats, no RSS")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of repeats per cell")
    parser.add_argument("--original", default=os.environ.get("SPARSE_SOFT_TOPK_SRC"))
    parser.add_argument("--out", type=Path, default=None, help="JSON path; a .md table is written beside it")
    parser.add_argument("--rss-child", choices=("sparse", "top_k"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        return peak_rss(args.rss_child)
    load_before = os.getloadavg()[0]
    base = lambda x, k: lax.top_k(x, k)[0]  # noqa: E731
    ops = {BASELINE: (base, lambda n, k: None), **our_ops()}
    original, original_note = original_ops(args.original)
    others, notes = other_ops()
    ops.update(original)
    ops.update(others)
    notes = ([original_note] if original_note else []) + notes
    device = jax.devices()[0]
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, device {device}, 1 thread")
    print("\n".join(notes))
    sizes, repeats = ((100,), 3) if args.quick else ((100, 1000, 10_000, 100_000), args.repeats)
    rows = []
    for n in sizes:
        for k in sorted({10, n // 10}):
            for name, (fn, skip) in ops.items():
                for backward in (False, True):
                    row = {"op": name, "n": n, "k": k, "backward": backward}
                    reason = skip(n, k)
                    row.update(
                        {"skipped": reason} if reason else measure(fn, base, n, k, backward, repeats, args.budget)
                    )
                    rows.append(row)
                    print(
                        f"{name:36s} n={n:<6d} k={k:<5d} {'fwd+bwd' if backward else 'fwd':7s} {cell(row)}", flush=True
                    )
    rss = {}
    if not args.quick:
        for which in ("sparse", "top_k"):
            out = subprocess.run(
                [sys.executable, __file__, "--rss-child", which], capture_output=True, text=True, check=True
            )
            rss[which] = float(out.stdout.split()[-1])
    from _machine import machine_info  # imports torch (kept out of the RSS children)

    info = machine_info("jax", "jaxlib", "numba", "ott-jax", "softjax")
    info.update(
        backend=jax.default_backend(),
        device=str(device),
        threads=1,
        notes=notes,
        loadavg_before=load_before,
        loadavg_after=os.getloadavg()[0],
    )
    header = [
        f"jitted forward and forward+backward ÷ `lax.top_k` (B = {B}, float32, λ = {L}), "
        f"`python benchmarks/bench_jax.py{' --quick' if args.quick else ''}`; jax {jax.__version__}, "
        f"backend {jax.default_backend()} ({device}), {info['cpu_model']}, 1 thread, {info['date']}, load average "
        f"{info['loadavg_before']:.1f} → {info['loadavg_after']:.1f}. "
        "The original runs through this script's pure_callback shim (see its docstring).",
        "",
    ]
    header += [f"* {note}" for note in notes]
    if rss:
        header.append(
            f"* peak RSS, one fwd+bwd at 64 × 1e5, k = 1e4 in a fresh process: sparse_topk_mask p=4/3 "
            f"{rss['sparse']:.0f} MB, lax.top_k {rss['top_k']:.0f} MB (both include Python and JAX)"
        )
    lines = header + [""] + tables(rows, list(ops))
    print("\n".join(lines))
    if args.out is not None:
        args.out.write_text(json.dumps({"machine": info, "peak_rss_mb": rss, "rows": rows}, indent=1))
        args.out.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
