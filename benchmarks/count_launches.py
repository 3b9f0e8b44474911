"""Launches and host reads of one forward + backward, per operator, loss and router.

Every aten op that computes something is a kernel launch on a GPU, and every
``aten._local_scalar_dense`` a host synchronisation; views launch nothing and are listed apart.
The counts come from a ``TorchDispatchMode`` on the CPU (``tests/dispatch_counter.py``, the same
counter the test suite's budgets use), so they need no GPU and do not depend on timing noise.

"accelerator path" counts what a CUDA tensor runs: the CPU-only argument checks and the CPU
shortcuts of the sparse and isotonic solvers are switched off, and the isotonic solver takes an
accelerator's segment size, as they do for every non-CPU tensor. "with the Triton kernels" counts
it once more with the Triton kernels routed in (their default on a CUDA GPU with triton;
here in Triton's interpreter, on two rows), each kernel launch counted as one launch beside the
aten ops.

Run ``python benchmarks/count_launches.py``; writes ``benchmarks/results/launches.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "tests"))  # one counter for the tests and this script
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from _accelerator import accelerator_path, kernels  # noqa: E402
from _machine import machine_info  # noqa: E402

import softtopk  # noqa: E402
from dispatch_counter import accelerator_steps, count_call  # noqa: E402
from softtopk import losses  # noqa: E402

# issue 21's budgets (launches of one fwd+bwd at 64 x 1000, k = 10, or 64 rows x 1000 classes)
BUDGETS = {
    "soft_topk lapsum": 16,
    "soft_topk lapsum hard": 20,
    "sparse_topk_mask p=4/3": 32,
    "soft_topk neuralsort": 24,
    "soft_topk softsort": 24,
    "soft_topk gumbel": 24,
    "soft_topk splitter_selection": 256,
    "TopKCrossEntropyLoss splitter m=16": 96,
    "SmoothTopKSVM k=5": 32,
    "BalNoisedTopK k=5": 24,
}


def _cases(target: torch.Tensor) -> dict:
    router = softtopk.TopKRouter(64, 16, 2, method="hard")

    def routed(x: torch.Tensor) -> torch.Tensor:
        return router(x[:, :64]).weights.sum() + router.aux_loss

    def plain_router(x: torch.Tensor) -> torch.Tensor:  # softmax + topk gate with the Switch aux loss
        logits = router.gate(x[:, :64])
        probs = logits.softmax(-1)
        weights, indices = probs.topk(2, -1)
        counts = torch.zeros_like(probs).scatter_add_(-1, indices, torch.ones_like(weights)).mean(0)
        return weights.sum() + 16 * (counts / 2 * probs.mean(0)).sum()

    return {
        "torch.topk + scatter (baseline)": lambda x: torch.zeros_like(x).scatter(-1, x.topk(10).indices, 1.0) * x,
        "F.cross_entropy (baseline)": lambda x: torch.nn.functional.cross_entropy(x, target),
        "soft_topk lapsum": lambda x: softtopk.soft_topk(x, 10),
        "soft_topk lapsum hard": lambda x: softtopk.soft_topk(x, 10, hard=True),
        "topk lapsum (router weights)": lambda x: softtopk.topk(x, 10).weights,
        "sparse_topk_mask p=4/3": lambda x: softtopk.sparse_topk_mask(x, 10),
        "sparse_topk_mask p=2": lambda x: softtopk.sparse_topk_mask(x, 10, p=2),
        "soft_topk neuralsort": lambda x: softtopk.soft_topk(x, 10, method="neuralsort"),
        "soft_topk softsort": lambda x: softtopk.soft_topk(x, 10, method="softsort"),
        "soft_topk gumbel": lambda x: softtopk.soft_topk(x, 10, method="gumbel"),
        "soft_topk perturbed (S=100)": lambda x: softtopk.soft_topk(x, 10, method="perturbed"),
        "soft_topk splitter_selection": lambda x: softtopk.soft_topk(x, 10, method="splitter_selection"),
        "soft_topk bitonic": lambda x: softtopk.soft_topk(x, 10, method="bitonic"),
        "TopKCrossEntropyLoss splitter m=16": lambda x: losses.TopKCrossEntropyLoss(
            [0.2] * 5, m=16, method="splitter_selection"
        )(x, target),
        "TopKCrossEntropyLoss neuralsort m=16": lambda x: losses.TopKCrossEntropyLoss(
            [0.2] * 5, m=16, method="neuralsort"
        )(x, target),
        "SmoothTopKSVM k=5": lambda x: losses.SmoothTopKSVM(k=5)(x, target),
        "BalNoisedTopK k=5": lambda x: losses.BalNoisedTopK(k=5, epsilon=1.0)(x, target),
        "soft_rank l2": lambda x: softtopk.soft_rank(x),
        "soft_rank kl": lambda x: softtopk.soft_rank(x, regularization="kl"),
        "soft_sort l2": lambda x: softtopk.soft_sort(x),
        "softmax+topk router + aux loss (baseline)": plain_router,
        "TopKRouter hard (64 x 16 experts, k=2)": routed,
    }


def _with_kernels(fn, x: torch.Tensor) -> int | None:
    """Launches of one fwd+bwd on the accelerator path with the Triton kernels routed in
    (aten ops plus kernel launches); None without triton."""
    if importlib.util.find_spec("triton") is None:
        return None
    import pytest  # its MonkeyPatch restores every attribute set (the test extra has it)

    from softtopk.ops import triton_gate
    from triton_kernels import count_kernels

    with pytest.MonkeyPatch.context() as patch:
        launched: list = []
        for module, name in list(kernels()):
            count_kernels(patch, module, name, launched=launched)
        patch.setattr(triton_gate, "usable", lambda v, k=0, scale=0.0: isinstance(k, int) and isinstance(scale, float))
        with accelerator_steps():  # the path count_call counts (no numba kernel on the CPU rows)
            fn(x)  # the kernels of one forward: count_call runs a warm-up forward first
        forward = len(launched)
        launched.clear()
        counts = count_call(fn, x)
    return counts.launches + len(launched) - forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "launches")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(64, 1000)
    target = torch.randint(0, 1000, (64,))
    rows = []
    # the kernels' column on the first 2 rows: the interpreter runs each row's program in turn (PAV's
    # row walk in Python takes minutes at 64 rows), and a call launches the same ops at any row count
    few = _cases(target[:2])
    for name, fn in _cases(target).items():
        cpu = count_call(fn, x)
        with accelerator_path():
            accel = count_call(fn, x)
            count_call(few[name], x[:2])  # the same history: a module's gradients exist, so they accumulate
            kernels = _with_kernels(few[name], x[:2])
        rows.append(
            {
                "case": name,
                "launches": accel.launches,
                "with_kernels": kernels,
                "views": accel.views,
                "reads": accel.reads,
                "cpu_reads": cpu.reads,
                "budget": BUDGETS.get(name),
            }
        )
        print(f"{name:42s} {accel.launches:5d} launches ({kernels} with kernels) {accel.reads} reads (CPU {cpu.reads})")
    info = machine_info()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1) + "\n")
    lines = [
        "# Launches per forward + backward",
        "",
        "`python benchmarks/count_launches.py`: aten ops dispatched by one forward + backward at",
        "x = randn(64, 1000), k = 10 (losses: 64 rows x 1000 classes), counted on the CPU with a",
        "`TorchDispatchMode`; on a GPU each launch is a kernel and each read a host synchronisation.",
        "Counted on the accelerator path (the CPU-only argument checks and the CPU shortcuts of the",
        "sparse and isotonic solvers off, the isotonic solver's accelerator segment size);",
        f'torch {torch.__version__}. Budget: issue 21\'s target. "With the Triton kernels": the same path',
        "with the Triton kernels (the lapsum, sparse, NeuralSort, SoftSort and network masks, the label's ranks of",
        "top-k CE by networks and NeuralSort, its selection and head, the smooth top-k SVM's rows, the noised",
        "losses' hinge, and top-k CE's and the noised losses' mean of the rows, in one autograd node with",
        "their kernels), their default on a CUDA GPU with triton: aten ops plus kernel launches, counted in",
        "Triton's interpreter on the first two rows (a call launches the same ops at any row count). The",
        "soft sort and rank, l2 and kl, by their own kernels after `torch.sort`.",
        "",
        "| case | launches | with the Triton kernels | views | host reads | reads on CPU tensors | budget |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        budget = "—" if row["budget"] is None else str(row["budget"])
        kernels = "—" if row["with_kernels"] is None else str(row["with_kernels"])
        lines.append(
            f"| {row['case']} | {row['launches']} | {kernels} | {row['views']} | {row['reads']} | {row['cpu_reads']}"
            f" | {budget} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
