"""Where the l2 soft rank's and sort's GPU time goes, and a check that the device agrees with the CPU.

First the fused kernels (``softtopk.ops.permutahedron_triton``) against the CPU's solver in
float64: rows of 700 to 16000 entries (the kernels' programs take 1 to 16 warps), every other seed
rounded to a tenth (ties), strengths 0.01, 1 and 100, 432 calls; it prints the largest difference.
Then ``torch.profiler`` tables of the CUDA kernels of five forward + backward calls (after three
warm-ups) of ``soft_rank`` and ``soft_sort`` at 64 x 100 and 64 x 1e4, float32; with ``--losses``
also top-k cross-entropy (splitter and NeuralSort, m = 16) and cross-entropy at 512 x 1000 and
4096 x 1000 (ten calls). The tables say what bounds a call: ``project_rows`` (the forward kernel:
the sort's, then PAV's walk, sequential in each row), ``project_grad``, ``torch.sort``'s.

Usage (on a CUDA machine; ``benchmarks/results/gpu_runs.md``, runs 19-21)::

    python benchmarks/profile_soft_sort.py [--losses] > benchmarks/results/soft_sort_profile_COMMIT.txt
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import softtopk


def agreement() -> float:
    """The largest ``|cuda - cpu|`` of the soft rank and sort over the rows above."""
    worst = 0.0
    for seed in range(12):
        for n in (700, 3000, 5000, 9000, 12000, 16000):
            x = 3 * torch.randn(16, n, generator=torch.Generator().manual_seed(seed * 100 + n), dtype=torch.float64)
            if seed % 2:
                x = x.round(decimals=1)
            for fn in (softtopk.soft_rank, softtopk.soft_sort):
                for strength in (0.01, 1.0, 100.0):
                    gap = (fn(x.cuda(), strength=strength).cpu() - fn(x, strength=strength)).abs().max().item()
                    worst = max(worst, gap)
    return worst


def table(fn, calls: int, rows: int) -> str:
    """The profiler's table of ``calls`` runs of ``fn`` after three warm-ups."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=50)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--losses", action="store_true", help="also profile top-k cross-entropy")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_soft_sort.py needs a CUDA device")
    print("stress: worst |cuda - cpu| over 432 calls:", agreement())
    torch.manual_seed(0)
    for n in (100, 10000):
        for name in ("soft_rank", "soft_sort"):
            x = torch.randn(64, n, device="cuda", requires_grad=True)
            fn = getattr(softtopk, name)
            print(f"== {name} n={n} (5 calls)")
            print(table(lambda fn=fn, x=x: fn(x).sum().backward(), 5, 6))
    if not opts.losses:
        return
    for rows in (512, 4096):
        x = torch.randn(rows, 1000, device="cuda", requires_grad=True)
        target = torch.randint(0, 1000, (rows,), device="cuda")
        cases = {
            "CE": F.cross_entropy,
            "TopKCE splitter m=16": softtopk.TopKCrossEntropyLoss([0.2] * 5, method="splitter_selection", m=16),
            "TopKCE neuralsort m=16": softtopk.TopKCrossEntropyLoss([0.2] * 5, method="neuralsort", m=16),
        }
        for name, loss in cases.items():
            print(f"== {name} {rows}x1000 (10 calls)")
            print(table(lambda loss=loss, x=x, target=target: loss(x, target).backward(), 10, 12))


if __name__ == "__main__":
    main()
