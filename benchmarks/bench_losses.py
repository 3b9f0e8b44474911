"""Top-k hinge losses and the Gumbel subset sampler, forward + backward, as ratios to cross-entropy.

Usage::

    python benchmarks/bench_losses.py            # ~2 minutes, writes benchmarks/results/losses.{json,md}
    python benchmarks/bench_losses.py --quick    # smoke run

Each repeat times every candidate once, each call on the next logits of a pool of distinct ones
(``randn(b, n)``, float32, one thread; ``_inputs.py``), in an order rotated every repeat, and
divides by ``nn.CrossEntropyLoss`` timed in that repeat; the tables give medians over repeats.
glibc's malloc thresholds are fixed first (``_machine.steady_malloc``; ``--default-malloc`` keeps
them adaptive). Candidates: softtopk's
``SmoothTopKSVM`` (k = 5, τ = 1 and τ = 0.1), ``SmoothTop1SVM``, ``BalNoisedTopK`` (ε = 1, 5 samples) and
``ImbalNoisedTopK`` (ε = 0.01, max_m = 0.2, scale 60), pytopk 0.1.0's ``BalNoisedTopK`` and ``ImbalNoisedTopK``
with the same settings when importable, and ``gumbel_topk`` (k = 5, τ = 1) for both relaxations as
``(mask * g).sum()``, and the ``torch.randn(b, n, 5)`` draw alone: the floor of a noised loss that
draws that tensor (pytopk's; softtopk's draw their own on CPU rows with numba). Berrada's smooth-topk
package is not installable here (REFERENCE §2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _inputs import Pool
from _machine import machine_info, steady_malloc

import softtopk

CONFIGS = ((100, 128), (1000, 256))
RESULTS = Path(__file__).parent / "results"


def _candidates(n: int, b: int) -> dict:
    target = torch.randint(0, n, (b,), generator=torch.Generator().manual_seed(1))
    counts = [int(c) for c in torch.randint(10, 400, (n,), generator=torch.Generator().manual_seed(2))]
    g = torch.randn(b, n, generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(4)
    losses = {
        "cross_entropy": torch.nn.CrossEntropyLoss(),
        "SmoothTopKSVM k=5 tau=1": softtopk.SmoothTopKSVM(k=5, tau=1.0),
        "SmoothTopKSVM k=5 tau=0.1": softtopk.SmoothTopKSVM(k=5, tau=0.1),
        "SmoothTop1SVM tau=1": softtopk.SmoothTop1SVM(tau=1.0),
        "BalNoisedTopK k=5 eps=1 S=5": softtopk.BalNoisedTopK(5, epsilon=1.0, n_samples=5, generator=gen),
        "ImbalNoisedTopK k=5 eps=0.01 S=5": softtopk.ImbalNoisedTopK(
            5, epsilon=0.01, max_m=0.2, cls_num_list=counts, scale=60.0, n_samples=5, generator=gen
        ),
    }
    calls = {name: (lambda x, f=f: f(x, target)) for name, f in losses.items()}
    try:
        import pytopk

        bal = pytopk.BalNoisedTopK(5, 1.0, n_sample=5)
        imbal = pytopk.ImbalNoisedTopK(5, 0.01, 0.2, counts, scale=60, n_sample=5)
        calls["pytopk BalNoisedTopK"] = lambda x: bal(x, target)
        calls["pytopk ImbalNoisedTopK"] = lambda x: imbal(x, target)
    except ImportError:
        pass
    # the floor of a noised loss that draws B·C·S Gaussians (pytopk's): the draw alone, no backward
    calls["randn(b, n, 5) alone"] = lambda x: torch.randn((*x.shape, 5), generator=gen)
    for relaxation in ("lapsum", "subsets"):
        calls[f"gumbel_topk k=5 {relaxation}"] = lambda x, r=relaxation: (
            softtopk.gumbel_topk(x, 5, tau=1.0, relaxation=r, generator=gen) * g
        ).sum()
    return calls


def _time(call, x: torch.Tensor) -> float:
    x.grad = None
    start = time.perf_counter()
    out = call(x)
    if out.requires_grad:
        out.backward()
    return time.perf_counter() - start


def run(repeats: int, malloc: str) -> dict:
    torch.set_num_threads(1)
    rows = []
    for n, b in CONFIGS:
        pool = Pool(lambda gen, b=b, n=n: torch.randn(b, n, generator=gen, requires_grad=True), b * n)
        calls = _candidates(n, b)
        names = list(calls)
        for name in names:  # warm-up
            _time(calls[name], pool.first)
        times = {name: [] for name in names}
        ratios = {name: [] for name in names}
        for rep in range(repeats):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            now = {name: _time(calls[name], pool.next()) for name in order}
            for name in names:
                times[name].append(now[name] * 1e3)
                ratios[name].append(now[name] / now["cross_entropy"])
        for name in names:
            rows.append(
                {
                    "n": n,
                    "batch": b,
                    "candidate": name,
                    "ms": statistics.median(times[name]),
                    "ratio_to_ce": statistics.median(ratios[name]),
                    "repeats": repeats,
                }
            )
    return {
        "command": "python benchmarks/bench_losses.py",
        "machine": {**machine_info("pytopk"), "malloc": malloc},
        "rows": rows,
    }


def markdown(result: dict) -> str:
    machine = result["machine"]
    lines = [
        f"fwd+bwd, 1 thread, torch {machine['torch']}, malloc: {machine['malloc']}, medians (`{result['command']}`)",
        "",
    ]
    lines += ["| candidate | n | batch | ms | × CE |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['candidate']} | {r['n']} | {r['batch']} | {r['ms']:.3g} | {r['ratio_to_ce']:.1f}× |"
        for r in result["rows"]
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats, results not written")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's adaptive malloc thresholds (see _machine.steady_malloc)",
    )
    args = parser.parse_args()
    malloc = "glibc default" if args.default_malloc else steady_malloc()
    result = run(3 if args.quick else args.repeats, malloc)
    text = markdown(result)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "losses.json").write_text(json.dumps(result, indent=1))
        (RESULTS / "losses.md").write_text(text)


if __name__ == "__main__":
    main()
