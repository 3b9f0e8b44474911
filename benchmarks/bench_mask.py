"""Benchmark relaxed top-k *mask* operators (an n-length mask per row) against hard ``torch.topk``.

Usage::

    python benchmarks/bench_mask.py                  # full run (~15 min on a 2-core VM, 1 thread)
    python benchmarks/bench_mask.py --quick          # smoke run (< 1 min): n <= 10000, few repeats,
                                                     # -> $TMPDIR/softtopk_bench/mask_quick.json
    python benchmarks/bench_mask.py --repeats 20 --out benchmarks/results/mask.json
    python benchmarks/plot_mask.py                   # -> results/mask.png, results/mask.md

What one run measures (see benchmarks/README.md, "Top-k masks"):

* Inputs: ``x = randn(64, n)`` float32, ``n`` in {100, 1000, 10000, 100000}, ``k`` in {10, n // 10}
  (at n = 100 both rules give k = 10: measured once, shown under both rules); every timed call
  takes the next input of a pool of distinct ones that all candidates of a config share
  (``_inputs.py``: a sort or top-k timed again on one input runs on branches the CPU has learnt).
* Forward (``fwd``): one call ``out = f(x, k)`` with ``x.requires_grad`` (the graph is built as in
  training, then dropped). Forward + backward (``fwd+bwd``): ``(out * g).sum().backward()`` with a
  fixed random ``g`` of ``out``'s shape.
* Baseline: ``torch.topk(x, k).values`` (hard, ``(64, k)`` output) and the backward of
  ``(values * g_k).sum()``. Every candidate's ratio is taken against the baseline timed *in the same
  repeat* (fwd against fwd, fwd+bwd against fwd+bwd), median over repeats.
* Candidates: ``entmax.budget_bisect`` (Euclidean projection on the capped simplex, bisection),
  ``torchsort.soft_rank`` clamped to a top-k mask (if torchsort is importable), softtopk's
  ``soft_topk(method="lapsum")``, ``sparse_topk_mask`` (p = 2, p = 4/3, Dykstra), ``sparse_topk_mag``,
  ``perturbed_topk`` (when the installed softtopk has them), and a plain sigmoid around the k-th value
  (not normalised: a cost floor). A candidate that cannot be imported, lacks the function, or raises
  is recorded with its reason instead of stopping the run.
* Sanity per candidate and config (from one forward on the benchmark batch): max over rows of
  ``|sum(mask) - k|``, min and max of the mask, whether ``x.grad`` is finite.

Timing: wall clock, one thread (``--threads``). Per repeat, the candidates of one (n, k) config are
timed one call each, interleaved in an order rotated every repeat (a forward pass over all of them,
then a forward+backward pass), so load bursts from other processes hit all alike and nothing runs in
a tight loop of itself. Slow candidates get fewer repeats: ``--budget`` seconds of timing per
candidate and config, at least ``--min-repeats``; a candidate whose first fwd+bwd takes longer than
``--max-call`` seconds is not timed (its sanity figures are still recorded).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, steady_malloc

try:
    import softtopk

    SOFTTOPK_ERROR = None
except Exception as error:  # noqa: BLE001 - the benchmark still runs the other libraries
    softtopk = None
    SOFTTOPK_ERROR = f"{type(error).__name__}: {error}"

BATCH = 64
NS = (100, 1000, 10000, 100000)
QUICK_NS = (100, 1000, 10000)
K_RULES = {"k=10": lambda n: 10, "k=n/10": lambda n: n // 10}
L_REG = 0.1  # sparse_topk_mask / sparse_topk_mag regularisation
DYKSTRA_ITERS = 500
SIGMOID_TEMPERATURE = 0.1
# torchsort's soft ranks of x at strength eps are those of x / eps, which reach the top ranks (n - k, n]
# only when x / eps spreads over more than about n: eps = (max - min) / (4 n) of the benchmark batch
# (set per n on the first call, outside the timing) gives a real top-k mask (results/mask.md: |sum - k|
# at most 1.3, 10-12 non-zeros per row at k = 10); at 1.0 the mask was all zeros.
TORCHSORT_SPREAD = 4.0
PERTURBED = {"sigma": 1.0, "n_samples": 100}
LAPSUM_TAU = 1.0


class Unavailable(Exception):
    """The candidate cannot run in this environment (missing package or function)."""


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= 600 else text[:600] + " ..."


# ------------------------------------------------------------------------------------------------------
# Candidates: each ``resolve()`` returns ``f(x, k) -> tensor`` or raises Unavailable.


def _softtopk_function(name: str) -> Callable:
    if softtopk is None:
        raise Unavailable(f"softtopk not importable ({SOFTTOPK_ERROR})")
    fn = getattr(softtopk, name, None)
    if fn is None:
        raise Unavailable(f"softtopk {getattr(softtopk, '__version__', '?')} has no attribute {name!r}")
    return fn


def _resolve_topk():
    return lambda x, k: torch.topk(x, k, dim=-1).values


def _resolve_entmax():
    try:
        import entmax
    except Exception as error:
        raise Unavailable(f"entmax not importable ({_short(error)})") from error
    fn = getattr(entmax, "budget_bisect", None)
    if fn is None:
        raise Unavailable(f"entmax {getattr(entmax, '__version__', '?')} has no budget_bisect")
    # entmax 1.3: budget_bisect(X, budget=2, dim=-1, n_iter=50)
    return lambda x, k: fn(x, budget=k, dim=-1)


def _resolve_torchsort():
    try:
        import torchsort
    except Exception as error:
        raise Unavailable(f"torchsort not importable ({_short(error)})") from error

    strengths: dict[int, float] = {}

    def mask(x, k):
        n = x.shape[-1]
        if n not in strengths:
            with torch.no_grad():
                strengths[n] = float((x.amax(-1) - x.amin(-1)).mean()) / (TORCHSORT_SPREAD * n)
        ranks = torchsort.soft_rank(x, regularization_strength=strengths[n])  # ascending, 1..n
        return (ranks - (n - k)).clamp(0.0, 1.0)

    return mask


def _resolve_lapsum():
    fn = _softtopk_function("soft_topk")
    methods = getattr(softtopk, "methods", dict)()
    if "lapsum" not in methods:
        raise Unavailable(f"'lapsum' not in softtopk.methods() ({', '.join(methods)})")
    return lambda x, k: fn(x, k, method="lapsum", tau=LAPSUM_TAU)


def _resolve_sparse(p: float, **extra):
    def resolve():
        fn = _softtopk_function("sparse_topk_mask")
        return lambda x, k: fn(x, k, l=L_REG, p=p, **extra)

    return resolve


def _resolve_mag():
    fn = _softtopk_function("sparse_topk_mag")
    return lambda x, k: fn(x, k, l=L_REG)


def _resolve_perturbed():
    fn = _softtopk_function("perturbed_topk")
    return lambda x, k: fn(x, k, **PERTURBED)


def _resolve_sigmoid():
    def mask(x, k):
        kth = x.topk(k, dim=-1).values[..., -1:]
        return torch.sigmoid((x - kth) / SIGMOID_TEMPERATURE)

    return mask


@dataclass
class Candidate:
    name: str  # short label used in tables and plots
    call: str  # the call as a user writes it
    resolve: Callable[[], Callable]
    max_n: int | None = None  # larger n is skipped (cost or memory)
    kind: str = "mask"  # "mask": n-length, should sum to k in [0, 1]; "mag": n-length soft top-k
    #                     magnitudes (x-valued, sum != k by design); "values": torch.topk's (B, k) values
    note: str = ""
    fn: Callable | None = field(default=None, repr=False)
    unavailable: str | None = None


def candidate_list() -> list[Candidate]:
    return [
        Candidate(
            "torch.topk",
            "torch.topk(x, k).values",
            _resolve_topk,
            kind="values",
            note="hard baseline; output (B, k) values, backward of (values * g_k).sum()",
        ),
        Candidate(
            "entmax.budget_bisect",
            "entmax.budget_bisect(x, budget=k, dim=-1)",
            _resolve_entmax,
            note="Euclidean projection onto the capped simplex, 50 bisection steps (entmax default)",
        ),
        Candidate(
            "torchsort soft_rank clamp",
            "clamp(torchsort.soft_rank(x, regularization_strength=(max x - min x) / (4 n)) - (n - k), 0, 1)",
            _resolve_torchsort,
            note="l2 soft ranks (PAV), ranks ascending 1..n; not normalised",
        ),
        Candidate(
            "softtopk lapsum",
            f"softtopk.soft_topk(x, k, method='lapsum', tau={LAPSUM_TAU})",
            _resolve_lapsum,
            note="closed-form Laplace-CDF threshold",
        ),
        Candidate("softtopk sparse p=2", f"softtopk.sparse_topk_mask(x, k, l={L_REG}, p=2)", _resolve_sparse(2.0)),
        Candidate(
            "softtopk sparse p=4/3", f"softtopk.sparse_topk_mask(x, k, l={L_REG}, p=4/3)", _resolve_sparse(4.0 / 3.0)
        ),
        Candidate(
            "softtopk sparse p=2 dykstra",
            f"softtopk.sparse_topk_mask(x, k, l={L_REG}, p=2, solver='dykstra', n_iter={DYKSTRA_ITERS})",
            _resolve_sparse(2.0, solver="dykstra", n_iter=DYKSTRA_ITERS),
            max_n=10000,
            note="O(n_iter * n); only n <= 10000",
        ),
        Candidate(
            "softtopk sparse_topk_mag",
            f"softtopk.sparse_topk_mag(x, k, l={L_REG})",
            _resolve_mag,
            kind="mag",
            note="soft top-k by magnitude, x-valued output: sum != k and range beyond [0, 1] "
            "by design (shown for reference)",
        ),
        Candidate(
            "softtopk perturbed",
            f"softtopk.perturbed_topk(x, k, sigma={PERTURBED['sigma']}, n_samples={PERTURBED['n_samples']})",
            _resolve_perturbed,
            max_n=10000,
            note="memory B * n_samples * n; only n <= 10000",
        ),
        Candidate(
            "sigmoid (k-th value)",
            f"torch.sigmoid((x - x.topk(k).values[..., -1:]) / {SIGMOID_TEMPERATURE})",
            _resolve_sigmoid,
            note="not normalised (sum != k); a cost floor",
        ),
    ]


def resolve_all(candidates: list[Candidate]) -> None:
    for cand in candidates:
        try:
            cand.fn = cand.resolve()
        except Unavailable as error:
            cand.unavailable = str(error)
        except Exception as error:  # noqa: BLE001
            cand.unavailable = f"resolving raised {_short(error)}"


# ------------------------------------------------------------------------------------------------------
# Configs, steps and sanity


def configs(ns: tuple[int, ...]) -> list[dict]:
    """Distinct (n, k) pairs; ``rules`` names the k rules that give this k (both at n = 100)."""
    out: dict[tuple[int, int], dict] = {}
    for n in ns:
        for rule, k_of in K_RULES.items():
            k = k_of(n)
            out.setdefault((n, k), {"n": n, "k": k, "rules": []})["rules"].append(rule)
    return list(out.values())


def make_inputs(n: int, k: int, seed: int) -> dict:
    """The pool of inputs ``x`` the timed calls take in turn (``_inputs.py``), its first (the sanity
    checks' batch) and the fixed cotangents."""
    seed = seed + 7919 * n + k
    pool = Pool(lambda gen: torch.randn(BATCH, n, generator=gen).requires_grad_(), BATCH * n, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return {
        "pool": pool,
        "x": pool.first,
        "g": torch.randn(BATCH, n, generator=gen),
        "g_k": torch.randn(BATCH, k, generator=gen),
    }


def make_steps(cand: Candidate, inputs: dict, k: int):
    """(fwd, fwd+bwd) closures running one call each, on the pool's next input."""
    pool = inputs["pool"]
    g = inputs["g_k"] if cand.kind == "values" else inputs["g"]
    fn = cand.fn

    def fwd() -> None:
        fn(pool.next(), k)

    def fwd_bwd() -> None:
        x = pool.next()
        x.grad = None
        (fn(x, k) * g).sum().backward()

    return fwd, fwd_bwd


def sanity(cand: Candidate, inputs: dict, k: int) -> dict:
    """One fwd+bwd on the benchmark batch: sum error, mask range, gradient finiteness, shape."""
    x = inputs["x"]
    x.grad = None
    out = cand.fn(x, k)
    g = inputs["g_k"] if cand.kind == "values" else inputs["g"]
    (out * g).sum().backward()
    grad = x.grad
    result = {"kind": cand.kind, "out_shape": list(out.shape), "grad_finite": bool(torch.isfinite(grad).all())}
    if cand.kind != "values":
        mask = out.detach().double()
        nnz = (mask != 0).sum(-1)
        result.update(
            {
                "sum_err_max": float((mask.sum(-1) - k).abs().max()),  # meaningful for kind "mask" only
                "mask_min": float(mask.min()),
                "mask_max": float(mask.max()),
                "nnz_min": int(nnz.min()),
                "nnz_max": int(nnz.max()),
                "finite": bool(torch.isfinite(mask).all()),
                "shape_ok": list(out.shape) == list(x.shape),
            }
        )
        if cand.kind == "mask":
            result["in_unit_interval"] = bool(mask.min() >= 0 and mask.max() <= 1)
    x.grad = None
    return result


# ------------------------------------------------------------------------------------------------------
# Timing


def quantiles(values: list[float]) -> dict | None:
    if not values:
        return None
    values = sorted(values)
    if len(values) == 1:
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "q1": q1, "q3": q3}


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


@dataclass
class Entry:
    cand: Candidate
    cfg: dict
    inputs: dict
    status: str = "ok"  # ok | unavailable | skipped | error | too_slow
    reason: str | None = None
    sanity: dict | None = None
    steps: tuple | None = None
    repeats: int = 0
    first_ms: dict = field(default_factory=dict)
    times: dict = field(default_factory=lambda: {"fwd": {}, "fwd_bwd": {}})


def prepare(entries: list[Entry], args, log) -> None:
    """Sanity call, warm-up, single-call estimate and repeat count for each entry."""
    for e in entries:
        cand, n, k = e.cand, e.cfg["n"], e.cfg["k"]
        tag = f"{cand.name} n={n} k={k}"
        if cand.unavailable:
            e.status, e.reason = "unavailable", cand.unavailable
            continue
        if cand.max_n is not None and n > cand.max_n:
            e.status, e.reason = "skipped", f"n > {cand.max_n} ({cand.note or 'too costly'})"
            continue
        try:
            start = time.perf_counter()
            e.sanity = sanity(cand, e.inputs, k)
            first = time.perf_counter() - start
            e.first_ms["fwd_bwd_first_call"] = first * 1e3
            if first > args.max_call:
                e.status = "too_slow"
                e.reason = f"first fwd+bwd took {first:.1f} s > --max-call {args.max_call} s"
                log(f"  {tag}: {e.reason}")
                continue
            fwd, fwd_bwd = make_steps(cand, e.inputs, k)
            for _ in range(args.warmup if first < 0.5 else 0):
                fwd()
                fwd_bwd()
            t_f, t_fb = timed(fwd), timed(fwd_bwd)
        except Exception as error:  # noqa: BLE001 - record and go on
            e.status, e.reason = "error", _short(error)
            e.sanity = e.sanity or None
            log(f"  {tag}: ERROR {e.reason}")
            log("    " + traceback.format_exc().strip().splitlines()[-3].strip())
            continue
        e.steps = (fwd, fwd_bwd)
        e.first_ms.update({"fwd": t_f * 1e3, "fwd_bwd": t_fb * 1e3})
        e.repeats = min(args.repeats, max(args.min_repeats, int(args.budget / max(t_f + t_fb, 1e-9))))
        s = e.sanity or {}
        extra = ""
        if "sum_err_max" in s:
            extra = (
                f", |sum-k| {s['sum_err_max']:.2e}, range [{s['mask_min']:.3g}, {s['mask_max']:.3g}]"
                f"{'' if s['grad_finite'] else ', NON-FINITE GRAD'}"
            )
        log(f"  {tag}: fwd {t_f * 1e3:.2f} ms, fwd+bwd {t_fb * 1e3:.2f} ms, repeats {e.repeats}{extra}")


def plan(entries: list[Entry], time_limit: float, min_repeats: int, log) -> None:
    """Scale repeat counts down (not below ``min_repeats``) if the timing would exceed ``time_limit`` s."""
    timed_entries = [e for e in entries if e.steps is not None]

    def cost(e: Entry) -> float:
        return (e.first_ms["fwd"] + e.first_ms["fwd_bwd"]) / 1e3

    planned = sum(e.repeats * cost(e) for e in timed_entries)
    if planned > time_limit:
        floor = sum(min_repeats * cost(e) for e in timed_entries)
        extra = sum((e.repeats - min_repeats) * cost(e) for e in timed_entries)
        scale = max(0.0, (time_limit - floor) / extra) if extra > 0 else 0.0
        for e in timed_entries:
            e.repeats = max(min_repeats, min_repeats + int((e.repeats - min_repeats) * scale))
        log(f"  planned timing {planned:.0f} s > --time-limit {time_limit:.0f} s: repeats scaled by {scale:.2f}")
        planned = sum(e.repeats * cost(e) for e in timed_entries)
    log(f"  planned timing ~{planned:.0f} s")


def run_timing(entries: list[Entry], repeats: int, log) -> None:
    groups: dict[tuple[int, int], list[Entry]] = {}
    for e in entries:
        if e.steps is not None:
            groups.setdefault((e.cfg["n"], e.cfg["k"]), []).append(e)
    total = max((e.repeats for e in entries if e.steps is not None), default=0)
    t0 = time.perf_counter()
    gc.collect()
    for rep in range(min(repeats, total)):
        for group in groups.values():
            active = [e for e in group if rep < e.repeats]
            if not active:
                continue
            shift = rep % len(active)
            order = active[shift:] + active[:shift]
            for mode, idx in (("fwd", 0), ("fwd_bwd", 1)):
                for e in order:
                    if e.steps is None:
                        continue
                    try:
                        e.times[mode][rep] = timed(e.steps[idx])
                    except Exception as error:  # noqa: BLE001 - record, drop from later repeats
                        e.status, e.reason, e.repeats = "error", f"repeat {rep} ({mode}): {_short(error)}", rep
                        e.steps = None
                        log(f"  {e.cand.name} n={e.cfg['n']} k={e.cfg['k']}: ERROR {e.reason}")
            group[:] = [e for e in group if e.steps is not None]
        if (rep + 1) % max(1, total // 10) == 0 or rep + 1 == total:
            log(f"  repeat {rep + 1}/{total}: {time.perf_counter() - t0:.1f} s")


def summarise(entries: list[Entry]) -> list[dict]:
    base = {(e.cfg["n"], e.cfg["k"]): e for e in entries if e.cand.name == "torch.topk"}
    records = []
    for e in entries:
        n, k = e.cfg["n"], e.cfg["k"]
        rec = {
            "candidate": e.cand.name,
            "call": e.cand.call,
            "n": n,
            "k": k,
            "k_rules": e.cfg["rules"],
            "batch": BATCH,
            "status": e.status,
            "reason": e.reason,
            "sanity": e.sanity,
            "first_ms": e.first_ms or None,
        }
        b = base.get((n, k))
        for mode in ("fwd", "fwd_bwd"):
            times = e.times[mode]
            ms = quantiles([t * 1e3 for t in times.values()])
            ratios = []
            if b is not None and ms is not None:
                bt = b.times[mode]
                ratios = [times[r] / bt[r] for r in times if r in bt]
            rec[f"{mode}_ms"] = ms
            rec[f"{mode}_ratio"] = quantiles(ratios)
            rec[f"{mode}_times_ms"] = [times[r] * 1e3 for r in sorted(times)]
        rec["repeats"] = len(e.times["fwd_bwd"])
        records.append(rec)
    return records


# ------------------------------------------------------------------------------------------------------
# Environment


def softtopk_api() -> dict:
    if softtopk is None:
        return {"error": SOFTTOPK_ERROR}
    return {
        "functions": {
            name: hasattr(softtopk, name)
            for name in ("soft_topk", "sparse_topk_mask", "sparse_topk_mag", "perturbed_topk")
        },
        "lapsum_method": "lapsum" in getattr(softtopk, "methods", dict)(),
    }


# ------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: n <= 10000, few repeats (< 1 min)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="max timed repeats per candidate (default 40, quick 3)"
    )
    parser.add_argument(
        "--min-repeats", type=int, default=None, help="least repeats for slow candidates (default 5, quick 1)"
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed fwd and fwd+bwd calls (default 2, quick 1)")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="timing seconds per candidate and config capping its repeats (default 6, quick 0.3)",
    )
    parser.add_argument(
        "--max-call",
        type=float,
        default=None,
        help="do not time a candidate whose first fwd+bwd exceeds this (s; default 20, quick 1)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="scale repeats down so the timed part takes about this long (s; default 600, quick 20)",
    )
    parser.add_argument("--ns", type=int, nargs="+", default=None, help="sizes n (default 100 1000 10000 100000)")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="candidate names to run (substring match); torch.topk is always included",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        help="free text recorded in the JSON notes (e.g. why torchsort could not be installed); repeatable",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON to write (default benchmarks/results/mask.json; --quick: $TMPDIR/softtopk_bench/mask_quick.json)",
    )
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's adaptive malloc thresholds (see _machine.steady_malloc)",
    )
    args = parser.parse_args(argv)
    malloc = "glibc default" if args.default_malloc else steady_malloc()
    q = args.quick
    args.repeats = args.repeats or (3 if q else 40)
    args.min_repeats = min(args.repeats, args.min_repeats or (1 if q else 5))
    args.warmup = args.warmup if args.warmup is not None else (1 if q else 2)
    args.budget = args.budget or (0.3 if q else 6.0)
    args.max_call = args.max_call or (1.0 if q else 20.0)
    args.time_limit = args.time_limit or (20.0 if q else 600.0)
    ns = tuple(args.ns or (QUICK_NS if q else NS))
    if args.out is None:  # smoke runs stay out of the repository
        args.out = (
            Path(tempfile.gettempdir()) / "softtopk_bench" / "mask_quick.json"
            if q
            else Path(__file__).resolve().parent / "results" / "mask.json"
        )
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    candidates = candidate_list()
    if args.only:
        candidates = [c for c in candidates if c.name == "torch.topk" or any(s in c.name for s in args.only)]
    resolve_all(candidates)
    for c in candidates:
        if c.unavailable:
            log(f"UNAVAILABLE {c.name}: {c.unavailable}")
    for note in args.note:
        log(f"NOTE: {note}")

    load_before = os.getloadavg()
    cfgs = configs(ns)
    entries = [
        Entry(c, cfg, inputs)
        for cfg in cfgs
        for inputs in [make_inputs(cfg["n"], cfg["k"], args.seed)]
        for c in candidates
    ]
    log(
        f"{len(cfgs)} configs x {len(candidates)} candidates; repeats <= {args.repeats} (>= {args.min_repeats}), "
        f"budget {args.budget} s each, warm-up {args.warmup}, threads {args.threads}"
    )
    prepare(entries, args, log)
    plan(entries, args.time_limit, args.min_repeats, log)
    log("timing (interleaved, rotated order per repeat)")
    run_timing(entries, args.repeats, log)
    records = summarise(entries)

    command = "python " + " ".join(
        shlex.quote(a)
        for a in [
            os.path.relpath(__file__, Path.cwd()) if Path(__file__).is_absolute() else __file__,
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    result = {
        "command": command,
        "machine": {
            **machine_info("entmax", "torchsort"),
            "malloc": malloc,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "settings": {
            "quick": q,
            "ns": list(ns),
            "k_rules": list(K_RULES),
            "batch": BATCH,
            "dtype": "float32",
            "repeats": args.repeats,
            "min_repeats": args.min_repeats,
            "warmup": args.warmup,
            "budget_s": args.budget,
            "max_call_s": args.max_call,
            "time_limit_s": args.time_limit,
            "seed": args.seed,
            "timing_mode": "single interleaved calls, rotated order; fwd pass then fwd+bwd pass per repeat",
            "fwd": "out = f(x, k) with x.requires_grad (graph built, dropped)",
            "fwd_bwd": "(out * g).sum().backward(), g fixed randn of out's shape",
            "params": {
                "l": L_REG,
                "dykstra_n_iter": DYKSTRA_ITERS,
                "sigmoid_temperature": SIGMOID_TEMPERATURE,
                "torchsort_regularization_strength": "(max x - min x) / (4 n), mean over the rows",
                "perturbed": PERTURBED,
                "lapsum_tau": LAPSUM_TAU,
            },
        },
        "softtopk_api": softtopk_api(),
        "candidates": [
            {
                "name": c.name,
                "call": c.call,
                "max_n": c.max_n,
                "kind": c.kind,
                "note": c.note,
                "available": c.unavailable is None,
                "unavailable_reason": c.unavailable,
            }
            for c in candidates
        ],
        "notes": list(args.note),
        "records": records,
        "wall_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))

    print()
    print(
        f"{'candidate':28} {'n':>6} {'k':>5} {'fwd ms':>9} {'x topk':>7} {'f+b ms':>9} {'x topk':>7} "
        f"{'reps':>4} {'|sum-k|':>9} {'min':>7} {'max':>7}  status"
    )
    for r in records:
        s = r["sanity"] or {}

        def num(d, key="median", fmt="9.3f"):
            return format(d[key], fmt) if d else format("-", fmt.split(".")[0] + "s")

        print(
            f"{r['candidate']:28} {r['n']:6d} {r['k']:5d} {num(r['fwd_ms'])} {num(r['fwd_ratio'], fmt='7.2f')} "
            f"{num(r['fwd_bwd_ms'])} {num(r['fwd_bwd_ratio'], fmt='7.2f')} {r['repeats']:4d} "
            f"{num(s, 'sum_err_max', '9.2e') if 'sum_err_max' in s else format('-', '>9')} "
            f"{num(s, 'mask_min', '7.3f') if 'mask_min' in s else format('-', '>7')} "
            f"{num(s, 'mask_max', '7.3f') if 'mask_max' in s else format('-', '>7')}  "
            f"{r['status']}{'' if not r['reason'] else ': ' + r['reason'][:80]}"
        )
    log(f"wrote {args.out} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
