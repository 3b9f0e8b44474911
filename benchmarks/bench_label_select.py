"""Time top-k cross-entropy on a CPU: its numba kernels against the torch path.

Usage::

    python benchmarks/bench_label_select.py                # -> results/label_select.md (~3 min)
    python benchmarks/bench_label_select.py --repeats 7    # quick

For each shape ``(R rows, C classes, m)``: the selection alone (``ops.label_select.LabelSelect``
forward) by the kernel and by the torch path, the torch path's ``topk`` step alone
(``compute.topk_rows`` of the ``m - 1`` others), and forward + backward of
``TopKCrossEntropyLoss([0.2] * 5, m=m)`` (splitter network) with the CPU kernels (the selection's
and the network's backward, ``ops.networks_numba``) or the torch path, and of cross-entropy,
float32, torch on one thread and on every core. The selection kernel is forced on at every shape
(its gate is what is measured); ``ops.triton_gate.torch_path()`` gives the torch path. The calls are
interleaved on a pool of distinct inputs (``_report.interleaved``, ``_inputs.py``); the table gives
medians (ms) and median ratios within a repeat, and the path ``ops.label_select.pays`` takes there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, provenance, steady_malloc
from _report import gate_open, interleaved, median_ratio, per_thread_count, write_table

import softtopk
from softtopk.ops import compute, isotonic_numba, label_select, triton_gate
from softtopk.ops.label_select import LabelSelect

SHAPES = [(64, 100, 16), (512, 100, 16), (512, 1000, 16), (4096, 1000, 16), (64, 10000, 16), (512, 1000, 64)]
SHAPES += [(512, 200, 64), (512, 60, 16), (512, 1000, 96)]  # where the gate keeps topk

Item = tuple[torch.Tensor, torch.Tensor]


def _calls(m: int) -> dict[str, Callable[[Item], object]]:
    loss_fn = softtopk.TopKCrossEntropyLoss([0.2] * 5, m=m)

    def loss(item: Item) -> None:
        leaf = item[0].detach().requires_grad_()
        loss_fn(leaf, item[1]).backward()

    def torch_path(fn: Callable[[Item], object]) -> Callable[[Item], object]:
        def call(item: Item) -> object:
            with triton_gate.torch_path():
                return fn(item)

        return call

    def select(item: Item) -> object:
        return LabelSelect.apply(item[0], item[1], m)

    def topk_step(item: Item) -> object:
        return compute.topk_rows(item[0], m - 1)

    def cross_entropy(item: Item) -> None:
        leaf = item[0].detach().requires_grad_()
        torch.nn.functional.cross_entropy(leaf, item[1]).backward()

    return {
        "select: kernel": select,
        "select: torch path": torch_path(select),
        "topk step": topk_step,
        "loss: kernels": loss,
        "loss: torch path": torch_path(loss),
        "cross-entropy": cross_entropy,
    }


def time_shape(rows: int, classes: int, m: int, repeats: int) -> dict:
    pool = Pool(
        lambda gen: (torch.randn(rows, classes, generator=gen), torch.randint(0, classes, (rows,), generator=gen)),
        rows * classes,
    )
    picked = label_select.pays(classes, m)
    with gate_open(label_select):
        times = interleaved(_calls(m), pool, repeats)
    return {
        "shape": f"{rows}×{classes}",
        "m": m,
        "threads": torch.get_num_threads(),
        **{f"{name} ms": 1e3 * statistics.median(seconds) for name, seconds in times.items()},
        "select kernel / torch": median_ratio(times, "select: kernel", "select: torch path"),
        "topk step / select torch": median_ratio(times, "topk step", "select: torch path"),
        "loss kernels / torch": median_ratio(times, "loss: kernels", "loss: torch path"),
        "loss kernels / CE": median_ratio(times, "loss: kernels", "cross-entropy"),
        "loss torch / CE": median_ratio(times, "loss: torch path", "cross-entropy"),
        "gate": "kernel" if picked else "torch path",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "label_select.md")
    args = parser.parse_args()
    if not isotonic_numba.available():
        sys.exit("numba is not installed: there is no kernel to time (pip install numba)")
    malloc = steady_malloc()
    info = machine_info("numba")
    caption = (
        f"{provenance(info, 'torch', 'numba')}, malloc: {malloc}. Float32; *select*: the selection's "
        "forward; *topk step*: the torch path's `topk_rows` alone; *loss*: forward + backward of "
        "`TopKCrossEntropyLoss([0.2] * 5, m=m)` (*kernels*: the selection's and the network backward's); "
        "medians over interleaved repeats, ratios within a repeat; "
        "*gate*: the path `ops.label_select.pays` takes there."
    )
    rows = per_thread_count(lambda: (time_shape(*shape, repeats=args.repeats) for shape in SHAPES))
    title = "Top-k cross-entropy on a CPU: the numba kernels against the torch path"
    write_table(args.out, title, caption, rows, machine=info, malloc=malloc)


if __name__ == "__main__":
    main()
