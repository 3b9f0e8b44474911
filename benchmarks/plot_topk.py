"""Plot and tabulate the results of bench_topk.py.

Usage::

    python benchmarks/plot_topk.py [--json benchmarks/results/topk.json]

Writes, next to the JSON: ``topk.png`` (x CE per method and config, softtopk vs difftopk; top-k ranks
ms and MiB vs n) and ``topk.md`` (markdown tables ready for the README, naming the hardware).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CE_METHODS = ("bitonic", "splitter_selection", "odd_even", "neuralsort", "softsort")
# softtopk method -> difftopk variants compared with it, and the table label
DIFFTOPK_LABELS = {
    "bitonic": [("bitonic", "bitonic (difftopk sparse)"), ("bitonic__non_sparse", "bitonic (difftopk dense)")],
    "splitter_selection": [("splitter_selection", "splitter_selection (difftopk sparse)")],
    "odd_even": [("odd_even", "odd_even (difftopk dense)")],
    "neuralsort": [("neuralsort", "neuralsort")],
    "softsort": [("softsort", "softsort")],
}
SOFT_COLOR, DIFF_COLOR, DIFF_DENSE_COLOR = "#1f77b4", "#ff7f0e", "#d62728"


def load(path: Path) -> dict:
    data = json.loads(path.read_text())
    data["index"] = {(r["suite"], r["library"], r["method"], r["n"], r["b"]): r for r in data["records"]}
    return data


def configs(data: dict, suite: str) -> list[tuple[int, int]]:
    seen = []
    for r in data["records"]:
        if r["suite"] == suite and (r["n"], r["b"]) not in seen:
            seen.append((r["n"], r["b"]))
    return seen


def hardware(data: dict) -> str:
    m = data["machine"]
    return (
        f"{m['cpu_model']} ({m['logical_cpus']} logical CPUs), torch {m['torch']} CPU, "
        f"{m['torch_threads']} thread(s), Python {m['python']}, malloc: {m['malloc']}"
    )


def err(record: dict, field: str) -> list[float]:
    q = record[field]
    return [q["median"] - q["q1"], q["q3"] - q["median"]]


def plot(data: dict, out: Path) -> None:
    ce_cfgs = configs(data, "topk_ce")
    idx = data["index"]
    fig = plt.figure(figsize=(5 * max(3, len(ce_cfgs)), 10), constrained_layout=True)
    grid = fig.add_gridspec(2, max(3, len(ce_cfgs)))
    width = 0.27
    for col, (n, b) in enumerate(ce_cfgs):
        ax = fig.add_subplot(grid[0, col])
        for i, method in enumerate(CE_METHODS):
            bars = [("softtopk", method, SOFT_COLOR, -width, "softtopk")]
            dense = "bitonic__non_sparse" if method == "bitonic" else None
            bars.append(
                (
                    "difftopk",
                    method,
                    DIFF_COLOR,
                    0.0 if dense else width / 2,
                    "difftopk (sparse)" if method in ("bitonic", "splitter_selection") else "difftopk",
                )
            )
            if dense:
                bars.append(("difftopk", dense, DIFF_DENSE_COLOR, width, "difftopk bitonic__non_sparse"))
            else:
                bars[0] = ("softtopk", method, SOFT_COLOR, -width / 2, "softtopk")
            for library, name, color, offset, label in bars:
                r = idx.get(("topk_ce", library, name, n, b))
                if r is None:
                    continue
                ax.bar(
                    i + offset,
                    r["x_ce"]["median"],
                    width,
                    color=color,
                    yerr=[[e] for e in err(r, "x_ce")],
                    capsize=2,
                    label=label if i in (0, 1) else None,
                )
        ax.set_xticks(range(len(CE_METHODS)), [m.replace("_", "\n") for m in CE_METHODS], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("fwd+bwd time / nn.CrossEntropyLoss")
        ce = idx.get(("topk_ce", "torch", "cross_entropy", n, b))
        ce_ms = f", CE {ce['ms']['median']:.2f} ms" if ce else ""
        ax.set_title(f"TopKCrossEntropyLoss, n={n}, b={b}{ce_ms}", fontsize=10)
        ax.set_ylim(top=ax.get_ylim()[1] * 3)  # room for the legend on the log axis
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper right")
        ax.grid(axis="y", which="both", alpha=0.3)

    rank_cfgs = configs(data, "ranks")
    ns = [n for n, _ in rank_cfgs]
    lines = [
        ("softtopk", "bitonic", SOFT_COLOR, "-", "softtopk bitonic"),
        ("softtopk", "splitter_selection", "#2ca02c", "-", "softtopk splitter_selection"),
        ("difftopk", "bitonic_sparse", DIFF_COLOR, "--", "difftopk bitonic sparse"),
        ("difftopk", "bitonic_dense", DIFF_DENSE_COLOR, "--", "difftopk bitonic dense"),
        ("torch", "cross_entropy", "gray", ":", "nn.CrossEntropyLoss (b x n)"),
    ]
    ax_ms = fig.add_subplot(grid[1, 0])
    ax_mem = fig.add_subplot(grid[1, 1])
    for library, method, color, style, label in lines:
        pts = [
            (n, idx[("ranks", library, method, n, b)]) for n, b in rank_cfgs if ("ranks", library, method, n, b) in idx
        ]
        if not pts:
            continue
        xs = [n for n, _ in pts]
        ax_ms.errorbar(
            xs,
            [r["ms"]["median"] for _, r in pts],
            yerr=list(zip(*[err(r, "ms") for _, r in pts], strict=True)),
            color=color,
            ls=style,
            marker="o",
            capsize=2,
            label=label,
        )
        if library != "torch":
            peaks = [(n, r["peak_mib"]) for n, r in pts if "peak_mib" in r]
            if peaks:
                ax_mem.plot(*zip(*peaks, strict=True), color=color, ls=style, marker="o", label=f"{label}: peak RSS")
            live = [(n, r["peak_live_mib"]) for n, r in pts if "peak_live_mib" in r]
            if live:
                ax_mem.plot(
                    *zip(*live, strict=True),
                    color=color,
                    ls=style,
                    marker="s",
                    mfc="none",
                    alpha=0.8,
                    label=f"{label}: peak RSS, mmap threshold 128 KiB",
                )
            ax_mem.plot(
                xs,
                [r["saved_mib"] for _, r in pts],
                color=color,
                ls=style,
                marker="x",
                alpha=0.5,
                label=f"{label}: saved for backward",
            )
    k = data["settings"]["ranks"]["k"]
    b_r = data["settings"]["ranks"]["b"]
    for ax, ylabel in ((ax_ms, "fwd+bwd ms"), (ax_mem, "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("n")
        ax.set_ylabel(ylabel)
        ax.grid(which="both", alpha=0.3)
        ax.legend(fontsize=6)
    ax_ms.set_title(f"top-{k} ranks fwd+bwd, b={b_r}, cauchy, steepness 10", fontsize=10)
    ax_mem.set_title("top-k ranks memory (o peak RSS, □ live-ish, x saved)", fontsize=10)

    ax_txt = fig.add_subplot(grid[1, 2])
    ax_txt.axis("off")
    s = data["settings"]
    text = [
        hardware(data),
        f"{data['machine']['date']}, load avg {data['machine']['loadavg_before'][0]:.1f}"
        f" -> {data['machine']['loadavg_after'][0]:.1f}",
        f"{s.get('timing_mode', 'steady-state loops')}, up to {s['repeats']} repeats (median, IQR bars), "
        f"warm-up {s['warmup']}",
        f"m={s['m']}, P_K={s['p_k']}, top1_mode {s['top1_mode']}",
        f"networks {s['network_params']}; NeuralSort/SoftSort tau {s['tau']}",
        "",
    ]
    text += [""] + ["note: " + "\n  ".join(textwrap.wrap(n, 80)) for n in data["notes"]]
    ax_txt.text(0, 1, "\n".join(text), va="top", ha="left", fontsize=7, family="monospace", wrap=True)
    fig.suptitle("softtopk vs difftopk 0.2.0 (CPU)")
    fig.savefig(out, dpi=110)
    plt.close(fig)


def fmt_ms(r: dict | None) -> str:
    return "—" if r is None else f"{r['ms']['median']:.2f}"


def fmt_x(r: dict | None) -> str:
    if r is None:
        return "—"
    q = r["x_ce"]
    return f"{q['median']:.1f}× ({q['q1']:.1f}–{q['q3']:.1f})"


def markdown(data: dict, figure: str) -> str:
    idx = data["index"]
    s = data["settings"]
    m = data["machine"]
    lines = [
        "### softtopk vs difftopk, fwd+bwd on CPU",
        "",
        f"Hardware: {hardware(data)}; measured {m['date']} (git {m['git_commit']}"
        f"{', src modified' if m['git_src_dirty'] else ''}), load average {m['loadavg_before'][0]:.1f}. "
        f"Timing: {s.get('timing_mode', 'steady-state loops')}, median of up to {s['repeats']} repeats in which "
        "all candidates of a config are interleaved (IQR in brackets); ×CE = time ÷ `nn.CrossEntropyLoss` "
        "fwd+bwd in the same repeat, every call on the next logits of a pool of distinct ones "
        "(`benchmarks/_inputs.py`); speed-up = difftopk ÷ softtopk, paired per repeat.",
        "",
        f"![×CE per method and config; top-k ranks time and memory against n]({figure})",
        "",
        f"**TopKCrossEntropyLoss**, m = {s['m']}, P_K = [.2]*5, top1_mode 'sm'; networks "
        f"{s['network_params']['distribution']}, steepness {s['network_params']['steepness']:g}, "
        f"art_lambda {s['network_params']['art_lambda']:g}; NeuralSort/SoftSort τ = {s['tau']:g} (difftopk "
        f"inverse_temperature {1 / s['tau']:g}).",
        "",
        "| method | config | softtopk ms | ×CE | difftopk ms | ×CE | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, b in configs(data, "topk_ce"):
        ce = idx.get(("topk_ce", "torch", "cross_entropy", n, b))
        lines.append(f"| *nn.CrossEntropyLoss* | n={n}, b={b} | {fmt_ms(ce)} | 1× | | | |")
        for method in CE_METHODS:
            mine = idx.get(("topk_ce", "softtopk", method, n, b))
            for variant, label in DIFFTOPK_LABELS[method]:
                theirs = idx.get(("topk_ce", "difftopk", variant, n, b))
                speed = "—"
                if theirs and "speedup_vs_softtopk" in theirs:
                    speed = f"{theirs['speedup_vs_softtopk']['median']:.1f}×"
                lines.append(
                    f"| {label} | n={n}, b={b} | {fmt_ms(mine)} | {fmt_x(mine)} | {fmt_ms(theirs)} | "
                    f"{fmt_x(theirs)} | {speed} |"
                )
    r = s["ranks"]
    lines += [
        "",
        f"**Top-{r['k']} ranks**, fwd+bwd of `(P * g).sum()`, b = {r['b']}, {r['distribution']}, steepness "
        f"{r['steepness']:g}: `softtopk.soft_topk_ranks(x, {r['k']}, method=...)` vs difftopk "
        f"`DiffTopkNet('bitonic', n, {r['k']}, sparse=...)`. ×CE is to `nn.CrossEntropyLoss` on (b, n). "
        "Saved = bytes autograd keeps for backward; peak = resident-set increase of one fwd+bwd in a fresh "
        "process after a "
        "tiny warm-up, with glibc's default malloc (live: with `MALLOC_MMAP_THRESHOLD_=131072`, so freed "
        "tensors leave the RSS and the peak tracks live tensor memory; cold: the very first call, default "
        "malloc).",
        "",
        "| n | candidate | ms | ×CE | saved MiB | peak MiB | live peak MiB | cold peak MiB "
        "| difftopk ÷ softtopk bitonic |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = [
        ("softtopk", "bitonic"),
        ("softtopk", "splitter_selection"),
        ("difftopk", "bitonic_sparse"),
        ("difftopk", "bitonic_dense"),
    ]
    for n, b in configs(data, "ranks"):
        for library, method in names:
            rec = idx.get(("ranks", library, method, n, b))
            if rec is None:
                continue
            speed = f"{rec['speedup_vs_softtopk']['median']:.1f}×" if "speedup_vs_softtopk" in rec else ""
            peak = f"{rec['peak_mib']:.1f}" if "peak_mib" in rec else "—"
            cold = f"{rec['peak_cold_mib']:.1f}" if "peak_cold_mib" in rec else "—"
            live = f"{rec['peak_live_mib']:.1f}" if "peak_live_mib" in rec else "—"
            lines.append(
                f"| {n} | {library} {method} | {fmt_ms(rec)} | {fmt_x(rec)} | {rec['saved_mib']:.2f} | "
                f"{peak} | {live} | {cold} | {speed} |"
            )
    if data["notes"]:
        lines += ["", *[f"Note: {note}." for note in data["notes"]]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "topk.json")
    args = parser.parse_args()
    data = load(args.json)
    png, md = args.json.with_suffix(".png"), args.json.with_suffix(".md")
    plot(data, png)
    md.write_text(markdown(data, png.name))
    print(f"wrote {png} and {md}")


if __name__ == "__main__":
    main()
