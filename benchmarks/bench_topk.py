"""Benchmark softtopk against difftopk: TopKCrossEntropyLoss and top-k ranks, fwd+bwd time and memory.

Usage::

    python benchmarks/bench_topk.py                    # full run (a few minutes, 1 thread)
    python benchmarks/bench_topk.py --quick            # smoke run (seconds)
    python benchmarks/bench_topk.py --repeats 30 --out benchmarks/results/topk.json

What one run measures (see benchmarks/README.md):

* Suite ``topk_ce``: ``softtopk.TopKCrossEntropyLoss`` for every method and difftopk's
  ``TopKCrossEntropyLoss`` for every variant, m = 16, P_K = [.2]*5, top1_mode 'sm', on
  (n, b) = (100, 128), (1000, 128), (1000, 512); each as a ratio to ``nn.CrossEntropyLoss`` on the same
  logits timed in the same repeat.
* Suite ``ranks``: fwd+bwd of ``(P * g).sum()`` for top-5 ranks ``P`` (b = 128, n in {16, 64, 256}),
  cauchy, steepness 10: softtopk bitonic / splitter_selection vs difftopk ``DiffTopkNet('bitonic')``
  sparse and dense; ``nn.CrossEntropyLoss`` on (b, n) as the yardstick.

Timing: forward+backward, wall clock. Per repeat every candidate of a config is timed once, one call
each, interleaved in an order rotated every repeat, so load noise hits all of them alike and no call
runs in a tight loop of itself (a tight loop flatters CE: its 2 MB gradient buffer and the logits stay
hot, ~1.5x faster at n=1000, b=512; ``--steady-state`` times back-to-back loops of >= ``--min-time``
instead). Every call takes the next (logits, target) of a pool of distinct ones that all candidates
of a config share (``_inputs.py``: a sort or top-k timed again on one input runs on branches the CPU
has learnt). Reported: median and IQR over repeats of ms per call and of the per-repeat ratio to CE.
Candidates slower than ~0.1 s get fewer repeats (a time budget per candidate, at least 5).

Memory: (1) ``saved_mib``: bytes autograd saves for backward (unique storages packed through
``torch.autograd.graph.saved_tensors_hooks``), deterministic; (2) ``peak_mib``: resident-set peak increase
of one fwd+bwd in a fresh child process forked from a "zygote" that only imported the libraries, after a
warm-up call on a batch of 2 (so code-page faults and one-off set-up are not counted);
(3) ``peak_live_mib``: the same with ``MALLOC_MMAP_THRESHOLD_=131072`` so that freed tensors leave the RSS
and the peak tracks live tensor memory rather than glibc heap fragmentation; (4) ``peak_cold_mib``: as (2)
for the very first call of a fresh process (as REFERENCE §8.2 measured). The peak is reset with
/proc/self/clear_refs where allowed, else it is a ``ru_maxrss`` delta.

difftopk's sparse paths import ``torch_sparse``; if it is not installed a pure-torch stand-in of
``torch_sparse.spmm`` (index_select rows, scale, index_add) is injected via ``sys.modules`` before
difftopk is imported. The JSON records whether that happened.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, steady_malloc

import softtopk

# ------------------------------------------------------------------------------------------------------
# difftopk, with a pure-torch torch_sparse stand-in when needed

TORCH_SPARSE_SHIM = False


def _spmm(index: torch.Tensor, value: torch.Tensor, m: int, n: int, matrix: torch.Tensor) -> torch.Tensor:
    """Pure-torch ``torch_sparse.spmm``: ``out[index[0]] += value * matrix[index[1]]`` (differentiable)."""
    rows = matrix.index_select(0, index[1]) * value.unsqueeze(-1).to(matrix.dtype)
    out = torch.zeros(m, matrix.shape[1], dtype=rows.dtype, device=matrix.device)
    return out.index_add(0, index[0], rows)


try:  # noqa: SIM105
    import torch_sparse  # noqa: F401
except ImportError:
    _shim = types.ModuleType("torch_sparse")
    _shim.spmm = _spmm
    _shim.__doc__ = "softtopk benchmark stand-in: pure-torch spmm (index_select, multiply, index_add)"
    sys.modules["torch_sparse"] = _shim
    TORCH_SPARSE_SHIM = True

warnings.filterwarnings("ignore", message="Sparse invariant checks")  # difftopk builds sparse networks
warnings.filterwarnings("ignore", message="The use of `x.T` on tensors")  # difftopk's sparse path
try:
    import difftopk

    DIFFTOPK_ERROR = None
except Exception as error:  # noqa: BLE001 - any import failure means "skip difftopk"
    difftopk = None
    DIFFTOPK_ERROR = f"{type(error).__name__}: {error}"

# ------------------------------------------------------------------------------------------------------
# Candidates

P_K = [0.2] * 5
M = 16
NET_PARAMS = {"distribution": "logistic_phi", "steepness": 1.0, "art_lambda": 0.5}
TAU = 2.0
SOFTTOPK_CE_METHODS = ("bitonic", "splitter_selection", "odd_even", "neuralsort", "softsort")
# difftopk variant -> the softtopk method it is compared with
DIFFTOPK_CE_VARIANTS = {
    "bitonic": "bitonic",  # sparse
    "bitonic__non_sparse": "bitonic",
    "splitter_selection": "splitter_selection",  # sparse
    "odd_even": "odd_even",  # dense
    "neuralsort": "neuralsort",
    "softsort": "softsort",
}
CE_CONFIGS = ((100, 128), (1000, 128), (1000, 512))
RANKS_K = 5
RANKS_B = 128
RANKS_NS = (16, 64, 256)
RANKS_PARAMS = {"distribution": "cauchy", "steepness": 10.0}


def _ce_params(method: str) -> dict:
    return {"tau": TAU} if method in ("neuralsort", "softsort") else dict(NET_PARAMS)


def candidate_list(quick: bool) -> list[dict]:
    """All (candidate, config) specs of one run, as plain dicts (picklable, JSON-able)."""
    specs = []
    for n, b in CE_CONFIGS:
        cfg = {"suite": "topk_ce", "n": n, "b": b}
        specs.append({**cfg, "library": "torch", "method": "cross_entropy", "params": {}})
        for method in SOFTTOPK_CE_METHODS:
            specs.append({**cfg, "library": "softtopk", "method": method, "params": _ce_params(method)})
        if difftopk is not None:
            for variant, method in DIFFTOPK_CE_VARIANTS.items():
                params = (
                    {"inverse_temperature": 1.0 / TAU}
                    if method in ("neuralsort", "softsort")
                    else {
                        "inverse_temperature": NET_PARAMS["steepness"],
                        "distribution": NET_PARAMS["distribution"],
                        "art_lambda": NET_PARAMS["art_lambda"],
                    }
                )
                specs.append({**cfg, "library": "difftopk", "method": variant, "compare_to": method, "params": params})
    for n in RANKS_NS:
        cfg = {"suite": "ranks", "n": n, "b": RANKS_B, "k": RANKS_K}
        specs.append({**cfg, "library": "torch", "method": "cross_entropy", "params": {}})
        for method in ("bitonic", "splitter_selection"):
            specs.append({**cfg, "library": "softtopk", "method": method, "params": dict(RANKS_PARAMS)})
        if difftopk is not None:
            specs.append(
                {
                    **cfg,
                    "library": "difftopk",
                    "method": "bitonic_sparse",
                    "compare_to": "bitonic",
                    "params": dict(RANKS_PARAMS),
                }
            )
            if not (quick and n == 256):
                specs.append(
                    {
                        **cfg,
                        "library": "difftopk",
                        "method": "bitonic_dense",
                        "compare_to": "bitonic",
                        "params": dict(RANKS_PARAMS),
                    }
                )
    return specs


def make_step(spec: dict, seed: int = 0):
    """Build inputs and the candidate; return ``step()`` running one fwd+bwd on the next (logits,
    target) of a pool of distinct ones (``_inputs.py``) and returning the loss, ``loss_of()`` (the
    loss on the pool's first) and those first logits."""
    n, b = spec["n"], spec["b"]
    seed = seed + 1000 * n + b
    pool = Pool(
        lambda gen: (torch.randn(b, n, generator=gen).requires_grad_(), torch.randint(0, n, (b,), generator=gen)),
        b * n,
        seed=seed,
    )
    lib, method, params = spec["library"], spec["method"], spec["params"]

    if lib == "torch":
        fn = torch.nn.CrossEntropyLoss()
    elif spec["suite"] == "topk_ce" and lib == "softtopk":
        fn = softtopk.TopKCrossEntropyLoss(P_K, method=method, m=M, top1_mode="sm", **params)
    elif spec["suite"] == "topk_ce" and lib == "difftopk":
        with contextlib.redirect_stdout(io.StringIO()):  # difftopk prints its network sizes
            fn = difftopk.TopKCrossEntropyLoss(method, p_k=P_K, n=n, m=M, top1_mode="sm", device="cpu", **params)
    elif spec["suite"] == "ranks":
        k = spec["k"]
        g = torch.randn(b, n, k, generator=torch.Generator().manual_seed(seed + 1))
        if lib == "softtopk":
            fn = lambda logits, _: (softtopk.soft_topk_ranks(logits, k, method=method, **params) * g).sum()  # noqa: E731
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                net = difftopk.DiffTopkNet("bitonic", n, k, sparse=method == "bitonic_sparse", device="cpu", **params)
            fn = lambda logits, _: (net(logits)[1] * g).sum()  # noqa: E731
    else:
        raise ValueError(spec)

    def step() -> torch.Tensor:
        logits, target = pool.next()
        logits.grad = None
        loss = fn(logits, target)
        loss.backward()
        return loss.detach()

    return step, (lambda: fn(*pool.first)), pool.first[0]


def spec_key(spec: dict) -> str:
    return f"{spec['suite']}|{spec['library']}|{spec['method']}|n={spec['n']}|b={spec['b']}"


# ------------------------------------------------------------------------------------------------------
# Memory


def saved_bytes(spec: dict) -> tuple[int, int]:
    """(unique-storage bytes, naive bytes) of tensors autograd saves for backward in one forward."""
    _, loss_of, logits = make_step(spec)
    storages: dict[int, int] = {}
    naive = 0

    def add(tensor: torch.Tensor) -> None:
        nonlocal naive
        if tensor.layout == torch.sparse_coo:  # difftopk saves its sparse network matrices
            add(tensor._indices())
            add(tensor._values())
            return
        naive += tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()

    def pack(tensor: torch.Tensor):
        add(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = loss_of()
    loss.backward()
    return sum(storages.values()), naive


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_child(spec: dict) -> dict:
    """Runs in a fresh forked child: resident peak increase of one fwd+bwd, in MiB.

    ``spec["warm"]``: first run the same candidate once on a batch of 2 (faults in code pages, starts
    the autograd engine, builds cached networks; allocates almost nothing that the full batch could
    reuse), so the figure is the call's own working memory; otherwise the very first call is measured.
    """
    torch.set_num_threads(1)
    if spec.get("warm"):
        make_step({**spec, "b": 2})[0]()
    step, _, _ = make_step(spec)
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # reset VmHWM (peak RSS) to the current RSS
        how = "VmHWM after clear_refs"
    except OSError:
        how = "ru_maxrss delta"
    rss_before = _proc_status_kib("VmRSS")
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step()
    if how.startswith("VmHWM"):
        peak = _proc_status_kib("VmHWM")
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if peak <= maxrss_before:
            how += " (upper bound: peak not above earlier maximum)"
    return {"peak_mib": max(0, peak - rss_before) / 1024, "peak_method": how}


def zygote() -> None:
    """``--zygote``: imports only, then per spec line on stdin fork a child that measures one peak.

    Forking from this process gives every measurement a fresh address space that has done no
    computation (and skips re-importing torch each time); the result comes back as a JSON line.
    """
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the libraries print goes to stderr, not into the protocol
    for line in sys.stdin:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(read_end)
            try:
                result = peak_child(json.loads(line))
            except BaseException as error:  # noqa: BLE001 - report and exit the child
                result = {"peak_error": f"{type(error).__name__}: {error}"}
            with os.fdopen(write_end, "w") as out:
                out.write(json.dumps(result))
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as inp:
            answer = inp.read()
        os.waitpid(pid, 0)
        protocol.write((answer or json.dumps({"peak_error": "child died"})) + "\n")
        protocol.flush()


PEAK_KINDS = (
    # (result name, warm-up first, glibc mmap threshold or None for glibc's default dynamic one)
    ("peak_mib", True, None),
    ("peak_live_mib", True, 131072),
    ("peak_cold_mib", False, None),
)


def measure_peaks(specs: list[dict], log, kinds=PEAK_KINDS) -> dict[str, dict]:
    """Peak RSS increase of one fwd+bwd per spec and kind, each in its own forked child of a zygote.

    With glibc's default (dynamic) mmap threshold, freed tensors of a few hundred KiB stay on the heap
    and fragment it, so the RSS peak can be several times the live tensor bytes and varies run to run.
    ``MALLOC_MMAP_THRESHOLD_=131072`` fixes the threshold: every tensor >= 128 KiB is mmapped and
    unmapped when freed, so that RSS peak tracks the peak of live tensor memory.
    """
    results: dict[str, dict] = {spec_key(spec): {} for spec in specs}
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    for threshold in dict.fromkeys(kind[2] for kind in kinds):
        env = dict(base_env) if threshold is None else {**base_env, "MALLOC_MMAP_THRESHOLD_": str(threshold)}
        with subprocess.Popen(
            [sys.executable, __file__, "--zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        ) as proc:
            for spec in specs:
                key = spec_key(spec)
                for name, warm, _ in (kind for kind in kinds if kind[2] == threshold):
                    proc.stdin.write(json.dumps({**spec, "warm": warm}) + "\n")
                    proc.stdin.flush()
                    answer = json.loads(proc.stdout.readline())
                    if "peak_error" in answer:
                        log(f"  {name} {key}: {answer['peak_error']}")
                        continue
                    results[key][name] = answer["peak_mib"]
                    results[key]["peak_method"] = answer["peak_method"]
            proc.stdin.close()
    return results


# ------------------------------------------------------------------------------------------------------
# Timing


def time_calls(step, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        step()
    return (time.perf_counter() - start) / inner


def quantiles(values: list[float]) -> dict:
    values = sorted(values)
    if len(values) == 1:
        return {"median": values[0], "q1": values[0], "q3": values[0]}
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "q1": q1, "q3": q3}


def run_timing(specs: list[dict], repeats: int, warmup: int, min_time: float | None, budget_s: float, log) -> dict:
    """Interleaved timing. Returns per spec key: raw per-repeat seconds per call, inner count, loss value.

    ``min_time=None``: one call per measurement; else back-to-back calls lasting >= ``min_time``.
    """
    steps, info = {}, {}
    for spec in specs:
        key = spec_key(spec)
        step, _, _ = make_step(spec)
        for _ in range(warmup):
            loss = step()
        single = time_calls(step, 1)
        inner = 1 if min_time is None else max(1, min(1000, math.ceil(min_time / max(single, 1e-7))))
        # slow candidates (difftopk dense at n=256: seconds per call) get fewer repeats; they still interleave
        reps = min(repeats, max(5, int(budget_s / max(single * inner, 1e-9))))
        steps[key] = step
        info[key] = {"inner": inner, "repeats": reps, "times": {}, "loss": float(loss)}
        log(f"  warm {key}: {single * 1e3:.2f} ms/call, inner {inner}, repeats {reps}")

    groups: dict[tuple, list[dict]] = {}
    for spec in specs:
        groups.setdefault((spec["suite"], spec["n"], spec["b"]), []).append(spec)
    t0 = time.perf_counter()
    for rep in range(repeats):
        for group in groups.values():
            shift = rep % len(group)
            for spec in group[shift:] + group[:shift]:
                key = spec_key(spec)
                if rep < info[key]["repeats"]:
                    info[key]["times"][rep] = time_calls(steps[key], info[key]["inner"])
        if (rep + 1) % max(1, repeats // 10) == 0 or rep + 1 == repeats:
            log(f"  repeat {rep + 1}/{repeats}: {time.perf_counter() - t0:.1f} s")
    return info


# ------------------------------------------------------------------------------------------------------
# Machine info and report


def summarise(specs: list[dict], timing: dict, saved: dict, peaks: dict) -> list[dict]:
    records = []
    ce_times = {
        (spec["suite"], spec["n"], spec["b"]): timing[spec_key(spec)]["times"]
        for spec in specs
        if spec["library"] == "torch"
    }
    for spec in specs:
        key = spec_key(spec)
        times = timing[key]["times"]
        ce = ce_times[(spec["suite"], spec["n"], spec["b"])]
        ratios = [times[r] / ce[r] for r in times if r in ce]
        record = {
            **spec,
            "key": key,
            "ms": {name: value * 1e3 for name, value in quantiles(list(times.values())).items()},
            "x_ce": quantiles(ratios),
            "times_ms": [times[r] * 1e3 for r in sorted(times)],
            "repeats": len(times),
            "inner": timing[key]["inner"],
            "loss": timing[key]["loss"],
            "saved_mib": saved[key][0] / 2**20,
            "saved_naive_mib": saved[key][1] / 2**20,
            **peaks.get(key, {}),
        }
        records.append(record)
    # paired speed-ups (difftopk / softtopk, per repeat, same config)
    by_key = {(r["suite"], r["library"], r["method"], r["n"], r["b"]): r for r in records}
    for record in records:
        if record["library"] != "difftopk":
            continue
        mine = by_key.get((record["suite"], "softtopk", record["compare_to"], record["n"], record["b"]))
        if mine is None:
            continue
        theirs_t, mine_t = timing[record["key"]]["times"], timing[mine["key"]]["times"]
        record["speedup_vs_softtopk"] = quantiles([theirs_t[r] / mine_t[r] for r in theirs_t if r in mine_t])
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few repeats, short measurements")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per candidate (default 60, quick 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per candidate (default 3, quick 1)")
    parser.add_argument(
        "--steady-state",
        action="store_true",
        help="time back-to-back loops of each candidate (>= --min-time) instead of single calls",
    )
    parser.add_argument("--min-time", type=float, default=0.02, help="seconds per loop with --steady-state")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="timing seconds per candidate that caps its repeats (default 15, quick 1)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS child processes")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's adaptive malloc thresholds for the timings (see _machine.steady_malloc)",
    )
    parser.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON to write (default benchmarks/results/topk.json, quick: topk_quick.json)",
    )
    args = parser.parse_args(argv)
    if args.zygote:
        zygote()
        return
    # timings only: the peak-RSS children run in a separate zygote process with their own malloc settings
    malloc = "glibc default" if args.default_malloc else steady_malloc()
    if args.out is None:
        args.out = Path(__file__).resolve().parent / "results" / ("topk_quick.json" if args.quick else "topk.json")
    repeats = args.repeats or (3 if args.quick else 60)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    min_time = args.min_time if args.steady_state else None
    budget = args.budget or (1.0 if args.quick else 15.0)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    notes = []
    if difftopk is None:
        notes.append(f"difftopk not importable ({DIFFTOPK_ERROR}); only softtopk measured")
    elif TORCH_SPARSE_SHIM:
        notes.append(
            "torch_sparse not installed: difftopk's sparse methods (bitonic, splitter_selection, "
            "DiffTopkNet sparse=True) ran on a pure-torch stand-in for torch_sparse.spmm "
            "(index_select rows by index[1], multiply by value, index_add at index[0]) injected via "
            "sys.modules; the real torch_sparse kernel may be faster"
        )
    for note in notes:
        log("NOTE: " + note)

    specs = candidate_list(args.quick)
    load_before = os.getloadavg()
    log(
        f"{len(specs)} candidates x configs; repeats {repeats}, warm-up {warmup}, "
        f"{f'steady-state loops of {min_time}s' if min_time else 'single interleaved calls'}, "
        f"threads {args.threads}"
    )
    saved = {spec_key(spec): saved_bytes(spec) for spec in specs}
    log("saved-for-backward bytes done")
    timing = run_timing(specs, repeats, warmup, min_time, budget, log=log)
    peaks = {}
    if not args.no_memory:
        log("peak RSS: one forked child per candidate/config")
        peaks = measure_peaks(specs, log, PEAK_KINDS[:2] if args.quick else PEAK_KINDS)
    records = summarise(specs, timing, saved, peaks)
    result = {
        "machine": {
            **machine_info("difftopk"),
            "malloc": malloc,
            "torch_threads": args.threads,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "settings": {
            "quick": args.quick,
            "repeats": repeats,
            "warmup": warmup,
            "timing_mode": "steady-state loops" if min_time else "single interleaved calls",
            "min_time_s": min_time,
            "budget_s": budget,
            "m": M,
            "p_k": P_K,
            "top1_mode": "sm",
            "network_params": NET_PARAMS,
            "tau": TAU,
            "ranks": {"k": RANKS_K, "b": RANKS_B, **RANKS_PARAMS},
            "torch_sparse_shim": TORCH_SPARSE_SHIM,
            "difftopk_available": difftopk is not None,
        },
        "notes": notes,
        "records": records,
        "wall_s": time.perf_counter() - started,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))

    print()
    print(
        f"{'suite':8} {'library':9} {'method':20} {'n':>5} {'b':>4} {'ms':>9} {'IQR':>17} {'xCE':>8} "
        f"{'saved MiB':>9} {'peak MiB':>8} {'live MiB':>8} {'cold MiB':>8} {'diff/soft':>9}"
    )
    for r in records:
        speed = r.get("speedup_vs_softtopk", {}).get("median")
        print(
            f"{r['suite']:8} {r['library']:9} {r['method']:20} {r['n']:5d} {r['b']:4d} {r['ms']['median']:9.3f} "
            f"{r['ms']['q1']:8.3f}-{r['ms']['q3']:8.3f} {r['x_ce']['median']:8.2f} {r['saved_mib']:9.2f} "
            f"{r.get('peak_mib', float('nan')):8.1f} {r.get('peak_live_mib', float('nan')):8.1f} "
            f"{r.get('peak_cold_mib', float('nan')):8.1f} "
            f"{'' if speed is None else f'{speed:9.1f}'}"
        )
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
