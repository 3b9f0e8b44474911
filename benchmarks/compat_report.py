"""Measures the figures of docs/compat.md against the installed difftopk/diffsort 0.2.0.

Run ``python benchmarks/compat_report.py`` (about a minute); it prints, and writes to
``benchmarks/results/compat.md`` with the machine and commit, for docs/compat.md:

1. the largest output/gradient deviations of every compat class from its original, over all cases of
   ``tests/test_compat_difftopk.py`` (the test module runs with a plugin that records its comparisons);
2. how often difftopk's bitonic network (n = 22, steepness 1e4) and softtopk's order the top 5 wrongly;
3. how often difftopk's ``NeuralSort(hard=True)`` output is not a permutation;
4. how far the network losses of difftopk (classes in class order) and softtopk (sorted) lie apart;
5. the gradient error of both smooth top-k losses against softtopk's float64 loss, and their speed.

difftopk's sparse paths run on the pure-torch ``torch_sparse.spmm`` stand-in of ``bench_topk.py``.
The timings run on one thread under :func:`_machine.steady_malloc`, each call on the next input of a
pool (:mod:`_inputs`), the three losses interleaved in every repeat.
"""

from __future__ import annotations

import collections
import functools
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import diffsort  # noqa: E402,F401  (the tests' oracle for DiffSortNet)
from _inputs import Pool  # noqa: E402
from _machine import machine_info, provenance, steady_malloc  # noqa: E402
from bench_topk import difftopk  # noqa: E402  (installs the torch_sparse stand-in first)

import softtopk  # noqa: E402
from softtopk.compat import difftopk as compat  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "compat.md"
LINES: list[str] = []


def say(line: str) -> None:
    """Print ``line`` and keep it for the results file."""
    print(line)
    LINES.append(line)


class _DeviationRecorder:
    """Pytest plugin: wraps the compat tests' ``_assert_match`` to record the largest deviations."""

    def __init__(self) -> None:
        self.worst = collections.defaultdict(lambda: [0.0, 0.0, 0.0])

    def pytest_collection_modifyitems(self, items):
        for module in {item.module for item in items}:
            compare = module._assert_match

            def recording(ours, original, x, tol, _compare=compare, _module=module):
                theirs, their_grad, cotangents = _module._run(original, x)
                mine, my_grad, _ = _module._run(ours, x, cotangents)
                key = (type(ours).__name__, getattr(ours, "sorting_network_type", ""), str(x.dtype)[6:])
                record = self.worst[key]
                record[0] = max(
                    [record[0]]
                    + [(a.double() - b.double()).abs().max().item() for a, b in zip(mine, theirs, strict=True)]
                )
                record[1] = max(record[1], (my_grad.double() - their_grad.double()).abs().max().item())
                record[2] = max(record[2], their_grad.abs().max().item())
                return _compare(ours, original, x, tol)

            module._assert_match = recording


def deviations() -> None:
    recorder = _DeviationRecorder()
    code = pytest.main(
        ["-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_compat_difftopk.py")], plugins=[recorder]
    )
    say(f"\n1. deviations from the originals (test exit code {code}); max |d output|, max |d grad|, max |grad|")
    for (name, kind, dtype), (output, grad, scale) in sorted(recorder.worst.items()):
        say(f"   {name:<22} {kind:<19} {dtype:<8} {output:.1e}  {grad:.1e}  {scale:.1f}")


def _wrong_top5(ranks_desc: torch.Tensor, x: torch.Tensor) -> float:
    """Share of rows whose argmax item per rank differs from the true top-5 order."""
    return (ranks_desc.argmax(-2) != x.topk(5, dim=-1).indices).any(-1).float().mean().item()


def bitonic_22() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randperm(22, generator=generator) for _ in range(1000)]).float()
    _, theirs = difftopk.DiffTopkNet("bitonic", 22, 5, steepness=1e4)(x)
    ours = softtopk.soft_topk_ranks(x, 5, method="bitonic", distribution="cauchy", steepness=1e4)
    say(
        f"\n2. bitonic n=22, steepness 1e4, 1000 random permutations, wrong top-5 order: "
        f"difftopk {_wrong_top5(theirs.flip(-1), x):.1%}, softtopk {_wrong_top5(ours, x):.1%}"
    )


def hard_neuralsort() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 8, generator=generator)
    for tau in (1.0, 0.1):
        permutation = difftopk.NeuralSort(tau, hard=True)(x).detach()
        broken = ((permutation.sum(-1) != 1) | (permutation.sum(-2) != 1)).any(-1).float().mean().item()
        say(f"3. difftopk NeuralSort(hard=True), n=8, tau={tau}: not a permutation in {broken:.0%} of rows")


def network_loss_gap() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 16, generator=generator) * 2
    labels = torch.randint(0, 16, (200,), generator=generator)
    say("4. per-sample |difftopk loss - softtopk loss|, 16 classes in class order, steepness 2, logistic:")
    for method in ("bitonic__non_sparse", "odd_even", "splitter_selection"):
        theirs = difftopk.TopKCrossEntropyLoss(method, 2.0, [0.5, 0.5], 16, distribution="logistic")
        ours = compat.TopKCrossEntropyLoss(method, 2.0, [0.5, 0.5], 16, distribution="logistic")
        gap = max(
            abs(theirs(row[None], y[None]).item() - ours(row[None], y[None]).item())
            for row, y in zip(logits, labels, strict=True)
        )
        say(f"   {method:<20} max {gap:.2f}")


def _grad(loss_fn, x, y):
    x = x.detach().clone().requires_grad_()
    loss_fn(x, y).backward()
    return x.grad.double()


def smooth_losses() -> None:
    say("5. smooth top-k losses: max gradient error against softtopk's float64 loss (C = 10..82, B = 16, 5 seeds)")
    for k, tau in ((1, 1.0), (3, 0.1), (5, 0.1)):
        error_theirs = error_ours = 0.0
        for seed in range(5):
            generator = torch.Generator().manual_seed(seed)
            classes = 10 + 18 * seed
            x = torch.randn(16, classes, generator=generator)
            y = torch.randint(0, classes, (16,), generator=generator)
            truth = _grad(functools.partial(softtopk.smooth_topk_svm, k=k, tau=tau), x.double(), y)
            error_theirs = max(
                error_theirs, (_grad(difftopk.SmoothTopKLoss(classes, k, tau), x, y) - truth).abs().max().item()
            )
            error_ours = max(
                error_ours, (_grad(compat.SmoothTopKLoss(classes, k, tau), x, y) - truth).abs().max().item()
            )
        say(f"   k={k}, tau={tau}: difftopk {error_theirs:.1e}, softtopk {error_ours:.1e}")
    torch.set_num_threads(1)
    for batch, classes in ((128, 100), (256, 1000)):
        pool = Pool(
            lambda g, b=batch, c=classes: (torch.randn(b, c, generator=g), torch.randint(0, c, (b,), generator=g)),
            batch * classes,
        )
        losses = {
            "CE": torch.nn.CrossEntropyLoss(),
            "difftopk": difftopk.SmoothTopKLoss(classes, 5, 1.0),
            "softtopk": compat.SmoothTopKLoss(classes, 5, 1.0),
        }
        times: dict[str, list[float]] = {name: [] for name in losses}
        for repeat in range(35):  # the first 5 warm up
            for name, fn in losses.items():
                x, y = pool.next()
                x = x.clone().requires_grad_()
                start = time.perf_counter()
                fn(x, y).backward()
                if repeat >= 5:
                    times[name].append(time.perf_counter() - start)
        say(
            f"   fwd+bwd k=5 tau=1, 1 thread, B={batch}, C={classes}, median of 30: "
            + ", ".join(f"{name} {1e3 * statistics.median(t):.2f} ms" for name, t in times.items())
        )


if __name__ == "__main__":
    if difftopk is None:
        sys.exit("difftopk is not installed: pip install --no-deps difftopk==0.2.0 diffsort==0.2.0")
    malloc = steady_malloc()
    deviations()
    bitonic_22()
    hard_neuralsort()
    network_loss_gap()
    smooth_losses()
    info = machine_info("difftopk", "diffsort")
    opening = provenance(info, "torch", "difftopk", "diffsort")
    head = f"# docs/compat.md's figures\n\n{opening}; malloc: {malloc}.\n\n```text"
    OUT.write_text("\n".join([head, *(line.lstrip("\n") for line in LINES), "```", ""]))
