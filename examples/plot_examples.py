"""Plot the three examples' results JSONs (mean ± std over seeds) into one figure for docs/results.md.

Run::

    python examples/plot_examples.py      # reads runs/examples/*.json, writes docs/assets/examples.png

Panels: MoE routing (test top-1 and load CV per gate), weight pruning (test accuracy against the
density kept), ranking (test NDCG@10 and recall@10 per loss). A missing JSON leaves its panel
saying which command makes it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text())["results"] if path.is_file() else None


def _missing(ax, script: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, f"no results: run\npython examples/{script}", ha="center", va="center")


def _bars(ax, results: dict[str, Any], metrics: list[tuple[str, str]], title: str) -> None:
    """Grouped bars, one group per setting, one bar per metric (mean, std error bars)."""
    names, width = list(results), 0.8 / len(metrics)
    for j, (key, label) in enumerate(metrics):
        xs = [i + (j - (len(metrics) - 1) / 2) * width for i in range(len(names))]
        ax.bar(
            xs,
            [results[n][key]["mean"] for n in names],
            width,
            yerr=[results[n][key]["std"] for n in names],
            capsize=2,
            label=label,
        )
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)


def _moe(ax, results: dict[str, Any]) -> None:
    _bars(ax, results, [("top1", "test top-1 (%)")], "MoE routing, wordnet148 (8 experts, k = 2)")
    twin = ax.twinx()
    twin.plot(range(len(results)), [r["load_cv"]["mean"] for r in results.values()], "ko-", label="load CV")
    twin.set_ylim(bottom=0)
    twin.set_ylabel("load CV (0 = balanced)", fontsize=8)
    twin.legend(fontsize=7, loc="lower right")


def _pruning(ax, results: dict[str, Any]) -> None:
    for method, style in (("magnitude_after", "s--"), ("magnitude_after_finetune", "^-"), ("sparse_mag", "o-")):
        points = sorted(
            (float(name.split("@")[1].rstrip("%")), value["accuracy"])
            for name, value in results.items()
            if name.split("@")[0] == method
        )
        ax.errorbar(
            [d for d, _ in points],
            [v["mean"] for _, v in points],
            [v["std"] for _, v in points],
            fmt=style,
            capsize=2,
            label=method,
        )
    ax.axhline(results["dense"]["accuracy"]["mean"], color="gray", ls=":", label="dense")
    ax.set_xscale("log")
    densities = sorted({float(name.split("@")[1].rstrip("%")) for name in results if "@" in name})
    ax.set_xticks(densities, [f"{d:g}" for d in densities])
    ax.set_xlabel("weights kept (%)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Weight pruning, LeNet-300-100 on MNIST", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=Path("runs/examples"), help="where the examples wrote their JSONs")
    p.add_argument("--out", type=Path, default=Path("docs/assets/examples.png"), help="the figure")
    args = p.parse_args()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = (
        ("moe_routing", _moe),
        ("pruning", _pruning),
        (
            "ranking",
            lambda ax, r: _bars(
                ax, r, [("ndcg10", "NDCG@10"), ("recall10", "recall@10")], "Re-ranking WordNet retrieval lists"
            ),
        ),
    )
    for ax, (name, draw) in zip(axes, panels, strict=True):
        results = _load(args.runs / f"{name}.json")
        if results is None:
            _missing(ax, f"{name}.py")
        else:
            draw(ax, results)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
