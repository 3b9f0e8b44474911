"""``softtopk demo``: every method on one example input, then a short training comparison.

The training part fits a linear classifier on a seeded synthetic 50-class problem (Gaussian classes
with overlapping means, so top-5 is much easier than top-1) with ``nn.CrossEntropyLoss`` and with
:class:`softtopk.TopKCrossEntropyLoss` for each ranks method, and reports held-out top-1/top-5
accuracy and the time per training step. It runs in well under a minute on a 2-core CPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .. import TopKCrossEntropyLoss, methods, soft_topk

EXAMPLE = torch.tensor([0.3, 2.0, -1.0, 1.2, 0.9, 1.9, -0.4, 0.0])
EXAMPLE_PARAMS = {
    "bitonic": {"distribution": "logistic", "steepness": 4.0},
    "odd_even": {"distribution": "logistic", "steepness": 4.0},
    "splitter_selection": {"distribution": "logistic", "steepness": 4.0},
    "neuralsort": {"tau": 0.25},
    "softsort": {"tau": 0.25},
    "lapsum": {"tau": 0.25},
    "sparse": {"l": 0.5},
    "perturbed": {"sigma": 0.5, "n_samples": 1000},
    "gumbel": {"tau": 0.25},
}
TRAIN_PARAMS = {
    "bitonic": {"distribution": "logistic_phi", "steepness": 1.0, "art_lambda": 0.5},
    "odd_even": {"distribution": "logistic_phi", "steepness": 1.0, "art_lambda": 0.5},
    "splitter_selection": {"distribution": "logistic_phi", "steepness": 1.0, "art_lambda": 0.5},
    "neuralsort": {"tau": 2.0},
    "softsort": {"tau": 2.0},
}


def _synthetic(seed: int, classes: int = 50, dim: int = 32, per_class: int = 60):
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(classes, dim, generator=generator) * 0.4
    labels = torch.arange(classes).repeat_interleave(per_class)
    features = means[labels] + torch.randn(len(labels), dim, generator=generator)
    order = torch.randperm(len(labels), generator=generator)
    features, labels = features[order], labels[order]
    split = len(labels) * 3 // 4
    return (features[:split], labels[:split]), (features[split:], labels[split:])


def _topk_accuracy(logits: torch.Tensor, labels: torch.Tensor, k: int) -> float:
    return (logits.topk(k, dim=-1).indices == labels.unsqueeze(-1)).any(-1).float().mean().item()


def _train(loss_fn, train, test, *, steps: int, seed: int) -> dict:
    torch.manual_seed(seed)
    features, labels = train
    model = torch.nn.Linear(features.shape[1], int(labels.max()) + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(steps):
        batch = torch.randint(0, len(labels), (256,), generator=generator)
        optimizer.zero_grad()
        loss_fn(model(features[batch]), labels[batch]).backward()
        optimizer.step()
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        logits = model(test[0])
    return {
        "top1": _topk_accuracy(logits, test[1], 1),
        "top5": _topk_accuracy(logits, test[1], 5),
        "ms_per_step": 1e3 * elapsed / steps,
    }


def run_demo(*, steps: int = 150, seed: int = 0, out: Path | None = None) -> dict:
    """Print the demo and return its results (also written as JSON to ``out`` if given)."""
    torch.set_num_threads(1)
    shown = ", ".join(f"{v:.1f}" for v in EXAMPLE.tolist())
    print(f"Soft top-3 mask of x = [{shown}] (hard top-3: items {sorted(EXAMPLE.topk(3).indices.tolist())})")
    masks = {}
    for name in methods():
        params = dict(EXAMPLE_PARAMS[name])
        if methods()[name].stochastic:
            params["generator"] = torch.Generator().manual_seed(seed)
        mask = soft_topk(EXAMPLE, 3, method=name, **params)
        masks[name] = mask.tolist()
        print(f"  {name:<19} {' '.join(f'{v:5.2f}' for v in mask.tolist())}   sum={mask.sum().item():.3f}")

    train, test = _synthetic(seed)
    print(f"\nLinear classifier, synthetic 50 classes, {steps} Adam steps (batch 256), held-out accuracy:")
    print(f"  {'loss':<40} {'top-1':>6} {'top-5':>6} {'ms/step':>8}")
    runs = {"cross_entropy": _train(torch.nn.CrossEntropyLoss(), train, test, steps=steps, seed=seed)}
    for name in (name for name, info in methods().items() if "ranks" in info.outputs and not info.stochastic):
        loss = TopKCrossEntropyLoss([0.25, 0, 0, 0, 0.75], method=name, m=16, **TRAIN_PARAMS[name])
        runs[f"topk_ce[{name}]"] = _train(loss, train, test, steps=steps, seed=seed)
    for name, result in runs.items():
        print(f"  {name:<40} {result['top1']:6.3f} {result['top5']:6.3f} {result['ms_per_step']:8.2f}")
    results = {"example": EXAMPLE.tolist(), "masks": masks, "training": runs, "steps": steps, "seed": seed}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(f"\nwrote {out}")
    return results
