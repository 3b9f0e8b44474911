"""Where users train: masks, losses and the router, forward + backward, on a GPU (or one CPU thread),
as ratios to ``torch.topk``, cross-entropy and a plain softmax+topk router; host syncs, CUDA-graph
capture and peak memory per call.

Usage::

    python benchmarks/bench_gpu.py --device cuda            # -> benchmarks/results/gpu.{json,md}
    python benchmarks/bench_gpu.py --device cpu --quick     # -> results/gpu_cpu.{json,md}, < 1 min on 2 cores

Cases (``--quick``: the shapes of issue 21's CPU targets and two more, seven repeats):

* masks: ``soft_topk`` lapsum (tau 1), ``sparse_topk_mask`` (l 0.1, p 4/3) and NeuralSort, each
  on CUDA by its Triton kernels and by the torch path (lapsum on a CPU too: by its numba kernels,
  where they pay, and by the torch path), SoftSort, NeuralSort and SoftSort on CUDA by their tiled
  kernels at every shape too (their default for long rows and many ranks), gumbel (tau 1), and torchsort's
  soft-rank mask and SoftTorch where importable, at 64 x 100 (k = 10), 64 x 1e3/1e4/1e5 (k = 10
  and 1000 where k < n), 16384 x 64 (k = 2, 8) and 65536 x 256 (k = 8), float32 and bfloat16
  (``--quick``: k = 10 at 64 x n, k = 2 at 16384 x 64, bfloat16 at 64 x 1000 only); fwd+bwd is
  ``f(x, k).backward(g)``. Baseline: ``zeros_like(x).scatter(-1, i, v)`` of ``torch.topk``. The
  O(n k) methods are skipped where ``rows n k`` exceeds 2^31 (recorded; ``--quick`` on a CPU:
  2^25, NeuralSort and SoftSort at 64 x 1e5, which take seconds a call there), except NeuralSort
  and SoftSort on their Triton kernels (O(n) memory).
* losses at 512 x 1000 and 4096 x 1000 (float32): ``TopKCrossEntropyLoss`` (P_K = [.2]*5, m = 16,
  splitter network, on CUDA by its Triton kernels, in one autograd node and chained as three,
  and by the torch path, and NeuralSort),
  ``SmoothTopKSVM(k=5)`` (on CUDA by its Triton kernels and by the torch path),
  ``BalNoisedTopK(5, epsilon=1, n_samples=5)`` (on CUDA reduced by its kernels and by torch ops),
  pytopk's ``BalNoisedTopK``
  and difftopk's NeuralSort loss where importable.
  Baseline: ``F.cross_entropy``; a row of cross-entropy plus the draw of five noise samples per
  score shows the floor of every noised loss.
* router: 16384 tokens (``--quick``: 2048), d = 1024, 64 experts, k = 2, bfloat16: ``TopKRouter``
  ``hard``, lapsum ``hard=True`` and sparse, fwd+bwd of ``(weights * g).sum() + aux_loss``.
  Baseline: a softmax+topk router with the Switch load-balancing loss, written here.

Protocol: every case of one shape is timed one call each per repeat, interleaved in an order rotated
every repeat, each call on the next input of a pool of distinct ones that every case of the shape
shares (``_inputs.py``: on the CPU, a sort or top-k timed again on one input runs on branches the
CPU has learnt); the ratio is the median over repeats of case / baseline *of the same repeat*. CUDA:
CUDA events around each call after ``--warmup`` calls; host syncs per fwd+bwd are the warnings of
``torch.cuda.set_sync_debug_mode("warn")``; each forward (under ``no_grad``) is captured in a CUDA
graph, its replay compared with eager (stochastic cases: shapes only) and timed; peak memory is
``torch.cuda.max_memory_allocated`` over one fwd+bwd above what was allocated before. CPU: one
thread, ``time.perf_counter``; syncs are the ``aten._local_scalar_dense`` calls (value reads) of one
fwd+bwd, CPU-only argument checks included; graph capture and peak memory "n/a". A case that raises
is recorded with its error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _accelerator import reduced_by_torch, three_nodes
from _inputs import Pool
from _machine import machine_info, steady_malloc
from torch.utils._python_dispatch import TorchDispatchMode

import softtopk

RESULTS = Path(__file__).resolve().parent / "results"
MASK_SHAPES = [
    ((64, 100), (10,)),
    ((64, 1000), (10,)),
    ((64, 10000), (10, 1000)),
    ((64, 100000), (10, 1000)),
    ((16384, 64), (2, 8)),
    ((65536, 256), (8,)),
]
# the quick run holds issue 21's CPU targets: 64 x 100, 64 x 1000 and 64 x 1e5 at k = 10
QUICK_MASK_SHAPES = [
    ((64, 100), (10,)),
    ((64, 1000), (10,)),
    ((64, 10000), (10,)),
    ((64, 100000), (10,)),
    ((16384, 64), (2,)),
]
LOSS_ROWS, QUICK_LOSS_ROWS, CLASSES = (512, 4096), (512,), 1000
ROUTER = {"tokens": 16384, "d_model": 1024, "experts": 64, "k": 2}
QUICK_TOKENS = 2048
DENSE_LIMIT = 2**31  # rows * n * k above which the O(n k) methods are skipped (their memory)
QUICK_DENSE_LIMIT = 2**25  # --quick on a CPU: the same above this (seconds per call at 64 x 1e5)


class Skip(Exception):
    """The case cannot run here (a missing package, too much memory): recorded, not timed."""


# ------------------------------------------------------------------------------------------- cases
# A case builds ``(forward, step)`` on a device: ``forward()`` returns the output (graph capture),
# ``step()`` runs one fwd+bwd on the next input of a pool of distinct ones (``_inputs.py``), the
# forward on the pool's first.


def _mask_case(fn: Callable, stochastic: bool = False) -> Callable:
    def build(shape, k, dtype, device):
        g = torch.randn(shape, generator=torch.Generator(device).manual_seed(1), device=device).to(dtype)
        pool = Pool(
            lambda gen: torch.randn(shape, generator=gen, device=device).to(dtype).requires_grad_(),
            math.prod(shape),
            device=device,
        )

        def step():
            x = pool.next()
            x.grad = None
            fn(x, k).backward(g)

        def forward():
            return fn(pool.first, k)

        forward.no_capture = getattr(fn, "no_capture", None)  # type: ignore[attr-defined]
        return forward, step, stochastic

    return build


def _kernels_here(x) -> bool:
    """Whether the masks' Triton kernels run on ``x``: CUDA, triton installed, not switched off."""
    from softtopk.ops import triton_gate

    return x.device.type == "cuda" and importlib.util.find_spec("triton") is not None and triton_gate.ENABLED


def _dense(fn: Callable, limit: int, kernels: bool = False) -> Callable:
    """``fn``, skipped where rows * n * k exceeds ``limit`` (O(n k) memory or time), unless
    ``kernels`` and the Triton kernels run (NeuralSort's and SoftSort's: O(n) memory)."""

    def call(x, k):
        if x.numel() * k > limit and not (kernels and _kernels_here(x)):
            why = "memory" if limit == DENSE_LIMIT else "time: --quick on a CPU"
            raise Skip(f"O(n k) {why}: rows * n * k = {x.numel() * k} > 2^{limit.bit_length() - 1}")
        return fn(x, k)

    return call


def _topk_scatter(x, k):
    top = x.topk(k, dim=-1)
    return torch.zeros_like(x).scatter(-1, top.indices, top.values)


def _torch_path(fn: Callable, cpu_kernels: bool = False) -> Callable:
    """``fn`` with the masks' kernels (their default: Triton on CUDA; with ``cpu_kernels``, the
    Laplace mask's numba kernels on a CPU where they pay) switched off."""

    def call(x, k):
        from softtopk.ops import isotonic_numba, lapsum_numba, triton_gate

        on_cpu = cpu_kernels and x.device.type == "cpu" and isotonic_numba.available()
        if on_cpu and not lapsum_numba.pays(x.reshape(-1, x.shape[-1]), k):
            raise Skip("the same as the kernels' row here: the numba kernels do not pay at this shape")
        if not on_cpu and (x.device.type != "cuda" or importlib.util.find_spec("triton") is None):
            raise Skip("the same as the kernels' row here: they run on CUDA with triton installed")
        with triton_gate.torch_path():
            return fn(x, k)

    return call


def _tiled(fn: Callable, module: str) -> Callable:
    """``fn`` with the tiled kernels of ``softtopk.ops.<module>`` at every shape (by default they
    take long rows and many ranks only; the row kernels the rest)."""

    def call(x, k):
        if not _kernels_here(x):
            raise Skip("the kernels run on CUDA with triton installed")
        layout = importlib.import_module(f"softtopk.ops.{module}")
        saved, layout.ROW_WORK = layout.ROW_WORK, -1
        try:
            return fn(x, k)
        finally:
            layout.ROW_WORK = saved

    return call


def _peer_torchsort():
    try:
        import torchsort
    except ImportError as error:
        raise Skip(f"torchsort not installed ({error})") from None

    strengths: dict[tuple, float] = {}

    def mask(x, k):  # soft ranks of x / eps reach the top ranks once x / eps spans ~n (bench_mask.py)
        n, key = x.shape[-1], x.shape
        if key not in strengths:  # its strength is a float: read once per shape, in the warm-up
            strengths[key] = float((x.amax(-1) - x.amin(-1)).mean()) / (4.0 * n)
        return (torchsort.soft_rank(x, regularization_strength=strengths[key]) - (n - k)).clamp(0.0, 1.0)

    # its CUDA kernels launch on the legacy default stream (isotonic_cuda.cu), which a CUDA graph
    # capture does not allow (the H200 run with torchsort importable hung: results/gpu_runs.md)
    mask.no_capture = "not attempted: torchsort launches on the legacy default stream"  # type: ignore[attr-defined]
    return mask


def _peer_softtorch():
    try:
        import softtorch
    except ImportError as error:
        raise Skip(f"SoftTorch not installed ({error})") from None

    def mask(x, k):  # its top-k with its defaults: NeuralSort, softness 0.1 on standardised scores
        rows, n = x.shape
        if rows * n * n > DENSE_LIMIT:
            raise Skip(f"O(n^2) memory: its NeuralSort holds rows * n * n = {rows * n * n} > 2^31")
        return softtorch.topk(x, k, dim=-1).indices.sum(-2)  # (rows, k, n) soft indices -> a mask

    return mask


def mask_cases(dense_limit: int) -> dict[str, Callable]:
    def topk_method(method, **params):
        return lambda x, k: softtopk.soft_topk(x, k, method=method, **params)

    def sparse(x, k):
        return softtopk.sparse_topk_mask(x, k, l=0.1, p=4.0 / 3.0)

    return {
        "torch.topk+scatter": _mask_case(_topk_scatter),
        "lapsum": _mask_case(topk_method("lapsum", tau=1.0)),
        "lapsum (torch path)": _mask_case(_torch_path(topk_method("lapsum", tau=1.0), cpu_kernels=True)),
        "sparse p=4/3": _mask_case(sparse),
        "sparse p=4/3 (torch path)": _mask_case(_torch_path(sparse)),
        "neuralsort": _mask_case(_dense(topk_method("neuralsort", tau=1.0), dense_limit, kernels=True)),
        "neuralsort (tiled kernels)": _mask_case(_tiled(topk_method("neuralsort", tau=1.0), "neuralsort_triton")),
        "neuralsort (torch path)": _mask_case(_torch_path(_dense(topk_method("neuralsort", tau=1.0), dense_limit))),
        "softsort": _mask_case(_dense(topk_method("softsort", tau=1.0), dense_limit, kernels=True)),
        "softsort (tiled kernels)": _mask_case(_tiled(topk_method("softsort", tau=1.0), "softsort_triton")),
        "gumbel": _mask_case(topk_method("gumbel", tau=1.0), stochastic=True),
        "torchsort soft_rank clamp": lambda *a: _mask_case(_peer_torchsort())(*a),
        "SoftTorch": lambda *a: _mask_case(_peer_softtorch())(*a),
    }


def _loss_case(make: Callable, stochastic: bool = False) -> Callable:
    def build(rows, device):
        pool = Pool(
            lambda gen: (
                torch.randn(rows, CLASSES, generator=gen, device=device).requires_grad_(),
                torch.randint(0, CLASSES, (rows,), generator=gen, device=device),
            ),
            rows * CLASSES,
            device=device,
        )
        loss = make(device)

        def step():
            x, target = pool.next()
            x.grad = None
            loss(x, target).backward()

        return (lambda: loss(*pool.first)), step, stochastic

    return build


def _pytopk(device):
    try:
        import pytopk
    except ImportError as error:
        raise Skip(f"pytopk not installed ({error})") from None
    return pytopk.BalNoisedTopK(5, 1.0, n_sample=5)


def _difftopk(device):
    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import difftopk

            return difftopk.TopKCrossEntropyLoss("neuralsort", 1.0, [0.2] * 5, CLASSES, m=16, device=str(device))
    except ImportError as error:
        raise Skip(f"difftopk not installed ({error})") from None


def _noise_floor(device):
    """Cross-entropy plus the draw of a noised loss's noise, ``randn(B, C, 5)``, and nothing else:
    the least a noised top-k loss with five samples costs where it draws that tensor (pytopk's;
    softtopk's off the CPU or without numba: on CPU rows with numba its kernel draws only what
    can matter, and the loss costs less than this row)."""

    def loss(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        torch.randn((*x.shape, 5), device=x.device)
        return F.cross_entropy(x, target)

    return loss


def _loss_switched(make: Callable, switch: Callable) -> Callable:
    """A loss made by ``make(device)`` with its kernels, or a fast path of theirs, switched off by
    ``switch`` (:func:`_torch_path`, as for the masks; ``_accelerator.three_nodes``,
    ``reduced_by_torch``): on CUDA with triton, where they run."""

    def build(device):
        if torch.device(device).type != "cuda" or importlib.util.find_spec("triton") is None:
            raise Skip("the same as the kernels' row here: they run on CUDA with triton installed")
        call = switch(make(device))
        if call is None:
            raise Skip("this checkout has no such path")
        return call

    return build


def loss_cases() -> dict[str, Callable]:
    def topk_ce(method):
        return lambda d: softtopk.TopKCrossEntropyLoss([0.2] * 5, method=method, m=16)

    def svm(device):
        return softtopk.SmoothTopKSVM(k=5)

    def noised(device):
        return softtopk.BalNoisedTopK(5, epsilon=1.0, n_samples=5)

    return {
        "cross_entropy": _loss_case(lambda d: F.cross_entropy),
        "TopKCE splitter m=16": _loss_case(topk_ce("splitter_selection")),
        "TopKCE splitter m=16 (three nodes)": _loss_case(_loss_switched(topk_ce("splitter_selection"), three_nodes)),
        "TopKCE splitter m=16 (torch path)": _loss_case(_loss_switched(topk_ce("splitter_selection"), _torch_path)),
        "TopKCE neuralsort m=16": _loss_case(topk_ce("neuralsort")),
        "SmoothTopKSVM k=5": _loss_case(svm),
        "SmoothTopKSVM k=5 (torch path)": _loss_case(_loss_switched(svm, _torch_path)),
        "BalNoisedTopK k=5 eps=1 S=5": _loss_case(noised, stochastic=True),
        "BalNoisedTopK k=5 eps=1 S=5 (torch's reduction)": _loss_case(
            _loss_switched(noised, reduced_by_torch), stochastic=True
        ),
        "cross_entropy + noise draw randn(B, C, 5)": _loss_case(_noise_floor, stochastic=True),
        "pytopk BalNoisedTopK": _loss_case(_pytopk, stochastic=True),
        "difftopk neuralsort m=16": _loss_case(_difftopk),
    }


class PlainRouter(torch.nn.Module):
    """Softmax over the experts, ``torch.topk``, gates renormalised over the k chosen (Mixtral), and the
    Switch load-balancing loss ``E sum_e f_e P_e`` with ``f`` counted by ``scatter_add_`` (``one_hot``
    and ``bincount`` read values on the host)."""

    def __init__(self, d_model: int, experts: int, k: int) -> None:
        super().__init__()
        self.gate, self.k, self.experts = torch.nn.Linear(d_model, experts), k, experts

    def forward(self, x):
        logits = self.gate(x)
        probs = logits.float().softmax(-1)
        top = probs.topk(self.k, dim=-1)
        weights = (top.values / top.values.sum(-1, keepdim=True)).to(x.dtype)
        ones = probs.new_ones(()).expand(top.indices.numel())  # a histogram without a host read
        counts = probs.new_zeros(self.experts).scatter_add_(0, top.indices.reshape(-1), ones) / ones.numel()
        self.aux_loss = self.experts * (counts * probs.mean(0)).sum()
        return weights, top.indices


def _router_case(make: Callable) -> Callable:
    def build(tokens, device):
        torch.manual_seed(0)
        router = make().to(device=device, dtype=torch.bfloat16)
        g = torch.randn(tokens, ROUTER["k"], generator=torch.Generator(device).manual_seed(1), device=device)
        g = g.to(torch.bfloat16)
        pool = Pool(
            lambda gen: (
                torch.randn(tokens, ROUTER["d_model"], generator=gen, device=device).to(torch.bfloat16).requires_grad_()
            ),
            tokens * ROUTER["d_model"],
            device=device,
        )

        def forward():
            return router(pool.first)[0]

        def step():
            x = pool.next()
            x.grad = None
            router.zero_grad(set_to_none=True)
            weights = router(x)[0]
            ((weights * g).sum() + router.aux_loss).backward()

        return forward, step, False

    return build


def router_cases() -> dict[str, Callable]:
    d, e, k = ROUTER["d_model"], ROUTER["experts"], ROUTER["k"]
    return {
        "softmax+topk router": _router_case(lambda: PlainRouter(d, e, k)),
        "TopKRouter hard": _router_case(lambda: softtopk.TopKRouter(d, e, k, method="hard")),
        "TopKRouter lapsum hard=True": _router_case(lambda: softtopk.TopKRouter(d, e, k, method="lapsum", hard=True)),
        "TopKRouter sparse": _router_case(lambda: softtopk.TopKRouter(d, e, k, method="sparse")),
    }


# ----------------------------------------------------------------------------------- measurements


class _Reads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense``: a value read on the host (a sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def count_syncs(step: Callable, device: torch.device) -> int:
    if device.type != "cuda":
        with _Reads() as counter:
            step()
        return counter.reads
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def peak_mib(step: Callable, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _same(a: Any, b: Any) -> bool:
    a, b = (a if isinstance(a, torch.Tensor) else a[0]), (b if isinstance(b, torch.Tensor) else b[0])
    return a.shape == b.shape and bool(torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-5, equal_nan=True))


def graph_capture(forward: Callable, stochastic: bool, device: torch.device, repeats: int) -> dict | str:
    """Capture ``forward`` in a CUDA graph; replay == eager and replay vs eager forward times."""
    if device.type != "cuda":
        return "n/a"
    try:
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    forward()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = forward()
            graph.replay()
            eager = forward()
            torch.cuda.synchronize()
            equal = "shapes only (stochastic)" if stochastic else _same(captured, eager)
            replay_ms = statistics.median(cuda_ms(graph.replay) for _ in range(repeats))
            eager_ms = statistics.median(cuda_ms(forward) for _ in range(repeats))
        return {"captured": True, "replay_equals_eager": equal, "replay_ms": replay_ms, "eager_fwd_ms": eager_ms}
    except Exception as error:  # noqa: BLE001 - recorded
        return {"captured": False, "error": _short(error)}


def cuda_ms(fn: Callable) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def cpu_ms(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text if len(text) <= 300 else text[:300] + " ..."


def run_group(group: str, shape: dict, cases: dict[str, Callable], args: list, device, opts, log) -> list[dict]:
    """Build, check and time every case of one shape, interleaved; the first case is the baseline."""
    records, live = [], []
    for name, build in cases.items():
        rec = {"group": group, "case": name, **shape, "status": "ok", "reason": None}
        records.append(rec)
        log(f"  {group} {shape} {name}: building")
        try:
            forward, step, stochastic = build(*args, device)
            for _ in range(opts.warmup):
                step()
            rec["syncs_per_call"] = count_syncs(step, device)
            rec["peak_mib"] = peak_mib(step, device)
            skip = getattr(forward, "no_capture", None)
            rec["graph"] = (
                {"captured": False, "error": skip} if skip else graph_capture(forward, stochastic, device, opts.repeats)
            )
            live.append((rec, step, []))
        except Skip as why:
            rec["status"], rec["reason"] = "skipped", str(why)
        except Exception as error:  # noqa: BLE001 - a failing case is a result, not a crash
            rec["status"], rec["reason"] = "error", _short(error)
        if rec["status"] != "ok":
            log(f"  {group} {shape} {name}: {rec['status']}: {rec['reason']}")
    timer = cuda_ms if device.type == "cuda" else cpu_ms
    for rep in range(opts.repeats):
        order = live[rep % max(len(live), 1) :] + live[: rep % max(len(live), 1)]
        for rec, step, times in order:
            if rec["status"] == "ok":
                try:
                    times.append(timer(step))
                except Exception as error:  # noqa: BLE001
                    rec["status"], rec["reason"] = "error", f"repeat {rep}: {_short(error)}"
    base = live[0][2] if live and live[0][0] is records[0] else []
    for rec, _, times in live:
        rec["fwd_bwd_ms"] = statistics.median(times) if times else None
        ratios = [t / b for t, b in zip(times, base, strict=True)] if len(base) == len(times) else []
        rec["ratio"] = statistics.median(ratios) if ratios else None
        rec["times_ms"] = times
        log(
            f"  {group} {shape} {rec['case']}: {rec['fwd_bwd_ms'] or float('nan'):.3f} ms, "
            f"x{rec['ratio'] or float('nan'):.2f}, syncs {rec['syncs_per_call']}"
        )
    return records


def _where(path: Path) -> str:
    """``path`` relative to this repository when inside it (the code measured is this checkout's)."""
    root = RESULTS.parent.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def device_name(device: torch.device, machine: dict) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{machine['cpu_model']} (CPU, {torch.get_num_threads()} thread)"


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# bench_gpu: {result['device_name']}",
        "",
        f"`{result['command']}`, torch {m['torch']}, softtopk commit {m['git_commit']}"
        f"{' (src modified)' if m['git_src_dirty'] else ''} imported from `{result['softtopk_path']}`, {m['date']}, "
        "load average "
        f"{m['loadavg_before'][0]:.1f} → {m['loadavg_after'][0]:.1f}, {result['wall_s']:.0f} s. "
        "Forward + backward, median over interleaved repeats; × is the median ratio to the first row of its "
        "shape in the same repeat. Syncs: host syncs per call (CPU: value reads, CPU-only argument checks "
        "included).",
        "",
        "| group | shape | dtype | k | case | fwd+bwd ms | × base | syncs | graph (replay / eager fwd ms) "
        "| peak MiB | status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(value, spec):
        return "—" if value is None else format(value, spec)

    for r in result["records"]:
        graph = r.get("graph")
        if isinstance(graph, dict):
            graph = (
                f"{graph['replay_equals_eager']} ({graph['replay_ms']:.3f} / {graph['eager_fwd_ms']:.3f})"
                if graph["captured"]
                else f"failed: {graph['error'][:60]}"
            )
        status = r["status"] + (f": {r['reason'][:80]}" if r["reason"] else "")
        lines.append(
            f"| {r['group']} | {'×'.join(map(str, r['shape']))} | {r['dtype']} | {r.get('k', '—')} "
            f"| {r['case']} | {fmt(r.get('fwd_bwd_ms'), '.3f')} | {fmt(r.get('ratio'), '.2f')} "
            f"| {fmt(r.get('syncs_per_call'), 'd')} | {graph or '—'} | {fmt(r.get('peak_mib'), '.1f')} "
            f"| {status} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="the smaller shapes, seven repeats (< 1 min on a CPU)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 30, quick 7)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed fwd+bwd calls (default 3, quick 2)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON to write, the .md next to it (default: results/gpu.json; cpu: gpu_cpu.json)",
    )
    parser.add_argument(
        "--cases",
        default=None,
        help="a regular expression: only the cases whose name it finds, with each shape's baseline "
        "(shapes where it finds none are left out)",
    )
    opts = parser.parse_args(argv)
    if opts.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu)")
    opts.out = opts.out or RESULTS / ("gpu.json" if opts.device == "cuda" else "gpu_cpu.json")
    opts.repeats = opts.repeats or (7 if opts.quick else 30)
    opts.warmup = opts.warmup if opts.warmup is not None else (2 if opts.quick else 3)
    device = torch.device(opts.device)
    dense_limit = QUICK_DENSE_LIMIT if opts.quick and device.type == "cpu" else DENSE_LIMIT
    malloc = steady_malloc() if device.type == "cpu" else "n/a"
    if device.type == "cpu":
        torch.set_num_threads(1)
    started, load_before = time.perf_counter(), os.getloadavg()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    args = argv if argv is not None else sys.argv[1:]
    records: list[dict] = []

    def chosen(cases: dict[str, Callable]) -> dict[str, Callable]:
        """``cases`` as ``--cases`` keeps them: the baseline (first) and the matching ones, or none."""
        if opts.cases is None:
            return cases
        names = [name for name in list(cases)[1:] if re.search(opts.cases, name)]
        return {name: cases[name] for name in list(cases)[:1] + names} if names else {}

    def group(kind: str, info: dict, cases: dict[str, Callable], case_args: list) -> None:
        if cases := chosen(cases):
            save(run_group(kind, info, cases, case_args, device, opts, log))

    def save(group_records: list[dict]) -> None:
        """Add one group's records and rewrite both files: an interrupted run keeps what it measured."""
        records.extend(group_records)
        machine = {
            **machine_info("pytopk", "difftopk", "torchsort", "softtorch"),
            "malloc": malloc,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        }
        result = {
            "command": " ".join(["python benchmarks/bench_gpu.py", *args]),
            "device": opts.device,
            "device_name": device_name(device, machine),
            "machine": machine,
            "softtopk_path": _where(Path(softtopk.__file__).parent),
            "settings": {
                "quick": opts.quick,
                "repeats": opts.repeats,
                "warmup": opts.warmup,
                "router": ROUTER,
                "router_tokens": tokens,
                "dense_limit": dense_limit,
                "timing": "CUDA events per call" if device.type == "cuda" else "time.perf_counter, 1 thread",
            },
            "records": records,
            "wall_s": time.perf_counter() - started,
        }
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(result, indent=1))
        opts.out.with_suffix(".md").write_text(markdown(result))

    dtypes = (torch.float32, torch.bfloat16)
    tokens = QUICK_TOKENS if opts.quick else ROUTER["tokens"]
    for shape, ks in QUICK_MASK_SHAPES if opts.quick else MASK_SHAPES:
        for dtype in dtypes if not opts.quick or shape == (64, 1000) else dtypes[:1]:
            for k in (k for k in ks if k < shape[-1]):
                info = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "k": k}
                group("mask", info, mask_cases(dense_limit), [shape, k, dtype])
    for rows in QUICK_LOSS_ROWS if opts.quick else LOSS_ROWS:
        group("loss", {"shape": [rows, CLASSES], "dtype": "float32"}, loss_cases(), [rows])
    info = {"shape": [tokens, ROUTER["d_model"], ROUTER["experts"]], "dtype": "bfloat16", "k": ROUTER["k"]}
    group("router", info, router_cases(), [tokens])
    log(f"wrote {opts.out} and {opts.out.with_suffix('.md').name}")


if __name__ == "__main__":
    main()
