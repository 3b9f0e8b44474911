"""Where a mask's GPU time goes: ``torch.profiler`` tables of its CUDA kernels.

For each mask (lapsum, sparse p = 4/3, NeuralSort and SoftSort, tau or l as in ``bench_gpu.py``)
at 65536 x 256 (k = 8, float32 and bfloat16), 64 x 1e5 (k = 10) and 64 x 1e4 (k = 1000), ten
forward + backward calls after three warm-ups are profiled, and the kernels with the most CUDA
time are listed (the O(n k) methods are skipped where rows n k exceeds 2^31). The table says which
kernel bounds a shape: ``torch.topk``'s, a Triton kernel of softtopk's, or the torch path's ops.

Usage (on a CUDA machine)::

    python benchmarks/profile_masks.py --out benchmarks/results/gpu_profile_masks.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import softtopk

SHAPES = [
    ((65536, 256), 8, torch.float32),
    ((65536, 256), 8, torch.bfloat16),
    ((64, 100000), 10, torch.float32),
    ((64, 10000), 1000, torch.float32),
]


def mask(method: str):
    if method == "sparse":
        return lambda x, k: softtopk.sparse_topk_mask(x, k, l=0.1, p=4.0 / 3.0)
    return lambda x, k: softtopk.soft_topk(x, k, method=method, tau=1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="text file to write")
    parser.add_argument("--rows", type=int, default=14, help="kernels listed per table")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_masks.py needs a CUDA device")
    tables = []
    for shape, k, dtype in SHAPES:
        for method in ("lapsum", "sparse", "neuralsort", "softsort"):
            if method in ("neuralsort", "softsort") and shape[0] * shape[1] * k > 2**31:
                continue
            fn = mask(method)
            x = torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()
            g = torch.randn(*shape, device="cuda", dtype=dtype)
            for _ in range(3):
                fn(x, k).backward(g)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    fn(x, k).backward(g)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=opts.rows, max_name_column_width=70)
            tables.append(f"\n##### {method} {shape} k={k} {dtype} (10 fwd+bwd)\n{table}")
            print(method, shape, k, dtype, "done", flush=True)
    opts.out.write_text("\n".join(tables))


if __name__ == "__main__":
    main()
