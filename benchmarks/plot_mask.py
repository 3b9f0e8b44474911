"""Plot and tabulate the results of bench_mask.py.

Usage::

    python benchmarks/plot_mask.py [--json benchmarks/results/mask.json]

Writes, next to the JSON (same stem): ``mask.png`` (log-log fwd+bwd ms against n, one line per
candidate, one panel per k rule, torch.topk dashed) and ``mask.md`` (markdown tables naming the
hardware, torch version and the commands that produced them).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BASELINE = "torch.topk"
STYLE = {  # candidate -> (color, linestyle, marker)
    "torch.topk": ("black", "--", "o"),
    "entmax.budget_bisect": ("#ff7f0e", "-", "s"),
    "torchsort soft_rank clamp": ("#8c564b", "-", "D"),
    "softtopk lapsum": ("#1f77b4", "-", "o"),
    "softtopk sparse p=2": ("#2ca02c", "-", "^"),
    "softtopk sparse p=4/3": ("#17becf", "-", "v"),
    "softtopk sparse p=2 dykstra": ("#9467bd", "-", "P"),
    "softtopk sparse_topk_mag": ("#e377c2", "-", "X"),
    "softtopk perturbed": ("#d62728", "-", "*"),
    "sigmoid (k-th value)": ("gray", ":", "."),
}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def hardware(data: dict) -> str:
    m = data["machine"]
    return (
        f"{m['cpu_model']} ({m['logical_cpus']} logical CPUs), CPU only, "
        f"{m['torch_threads']} thread(s), Python {m['python']}, malloc: {m['malloc']}"
    )


def candidates(data: dict) -> list[str]:
    return [c["name"] for c in data["candidates"]]


def rule_records(data: dict, rule: str) -> list[dict]:
    return [r for r in data["records"] if rule in r["k_rules"]]


def plot(data: dict, out: Path) -> None:
    rules = data["settings"]["k_rules"]
    fig, axes = plt.subplots(1, len(rules), figsize=(6.5 * len(rules), 5.8), sharey=True, constrained_layout=True)
    axes = list(axes) if len(rules) > 1 else [axes]
    ns = data["settings"]["ns"]
    for ax, rule in zip(axes, rules, strict=True):
        recs = rule_records(data, rule)
        for name in candidates(data):
            pts = sorted((r["n"], r) for r in recs if r["candidate"] == name and r.get("fwd_bwd_ms"))
            if not pts:
                continue
            color, ls, marker = STYLE.get(name, (None, "-", "o"))
            xs = [n for n, _ in pts]
            ys = [r["fwd_bwd_ms"]["median"] for _, r in pts]
            yerr = [
                [r["fwd_bwd_ms"]["median"] - r["fwd_bwd_ms"]["q1"] for _, r in pts],
                [r["fwd_bwd_ms"]["q3"] - r["fwd_bwd_ms"]["median"] for _, r in pts],
            ]
            label = name + (" (hard baseline)" if name == BASELINE else "")
            if all((r.get("sanity") or {}).get("mask_max") == 0 for _, r in pts):
                label += " [mask is 0 everywhere, see notes]"
            ax.errorbar(
                xs,
                ys,
                yerr=yerr,
                color=color,
                ls=ls,
                marker=marker,
                capsize=2,
                label=label,
                lw=2.0 if name == BASELINE else 1.4,
                zorder=3 if name == BASELINE else 2,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("n (row length)")
        ax.grid(which="both", alpha=0.3)
        ax.set_title(f"{rule}: fwd+bwd of (mask * g).sum(), x = randn({data['settings']['batch']}, n)", fontsize=10)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("fwd+bwd ms per call (median, IQR bars)")
    missing = [f"{c['name']}: {c['unavailable_reason']}" for c in data["candidates"] if not c["available"]]
    foot = [hardware(data) + f", torch {data['machine']['torch']}; {data['machine']['date']}"]
    if missing:
        foot.append("not measured: " + "; ".join(missing))
    fig.suptitle("Relaxed top-k masks vs torch.topk (CPU, float32)", fontsize=12)
    fig.text(0.01, -0.01, "\n".join(textwrap.fill(line, 190) for line in foot), fontsize=7, va="top")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def ratio(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def ms(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if value >= 0.1 else f"{value:.3f}"


def sum_err(san: dict, kind: str) -> str:
    if kind == "values":
        return "n/a"
    text = fmt(san.get("sum_err_max"), ".2e")
    return f"({text})" if kind == "mag" and san else text


def bound(san: dict, key: str) -> str:
    """Mask min/max; values just outside [0, 1] (rounding) are shown as 1+eps / -eps, not rounded away."""
    value = san.get(key)
    if value is None:
        return "—"
    if san.get("kind") == "mask" and key == "mask_max" and 1 < value < 1.001:
        return f"1+{value - 1:.1e}"
    if san.get("kind") == "mask" and key == "mask_min" and -0.001 < value < 0:
        return f"{value:.1e}"
    return format(value, ".3g")


def nnz(san: dict) -> str:
    if "nnz_min" not in san:
        return "—"
    return str(san["nnz_max"]) if san["nnz_min"] == san["nnz_max"] else f"{san['nnz_min']}–{san['nnz_max']}"


def markdown(data: dict, json_path: Path, plot_command: str) -> str:
    s = data["settings"]
    m = data["machine"]
    lines = [
        "# Relaxed top-k masks: time against torch.topk",
        "",
        (
            f"Hardware: {hardware(data)}. torch {m['torch']}, softtopk {m['softtopk']} (git {m['git_commit']}"
            f"{', src/ with uncommitted changes' if m['git_src_dirty'] else ''}), entmax {m['entmax']}, "
            f"torchsort {m['torchsort'] or 'not installed'}. {m['date']}, load average "
            f"{m['loadavg_before'][0]:.1f} → {m['loadavg_after'][0]:.1f}."
        ),
        "",
        "Produced by:",
        "",
        "```bash",
        data["command"],
        plot_command,
        "```",
        "",
        (
            f"x = randn({s['batch']}, n) float32, each timed call on the next input of a pool of distinct ones "
            f"(`benchmarks/_inputs.py`); fwd = one call with `x.requires_grad`; fwd+bwd = "
            f"`(out * g).sum().backward()` with a fixed random `g` (torch.topk: `torch.topk(x, k).values` and "
            f"`(values * g_k).sum()`). Median over up to {s['repeats']} repeats (slow candidates fewer, at least "
            f"{s['min_repeats']}; *reps* column) of single calls interleaved in a rotated order; **×topk** = "
            f"median of the per-repeat ratio to torch.topk timed in the same repeat (fwd to fwd, fwd+bwd to "
            f"fwd+bwd). **max \\|Σ−k\\|** = max over the {s['batch']} rows of |sum(mask) − k|; **min/max** = range of "
            f"the mask over the batch; **nnz/row** = range over rows of the number of non-zero entries (all from one "
            f"forward on the benchmark batch; for sparse_topk_mag, whose output is x-valued, |Σ−k| is shown in "
            f"parentheses for reference only)."
        ),
        "",
        f"![fwd+bwd time against n, log-log]({json_path.with_suffix('.png').name})",
        "",
    ]
    by_name = {c["name"]: c for c in data["candidates"]}
    for rule in s["k_rules"]:
        lines += [
            f"## {rule}",
            "",
            "| candidate | n | k | fwd ms | fwd ×topk | fwd+bwd ms | fwd+bwd ×topk "
            "| max \\|Σ−k\\| | min | max | nnz/row | reps |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        recs = rule_records(data, rule)
        order = {name: i for i, name in enumerate(candidates(data))}
        shown: set[str] = set()
        for r in sorted(recs, key=lambda r: (r["n"], order.get(r["candidate"], 99))):
            san = r.get("sanity") or {}
            name = r["candidate"]
            if name == BASELINE:
                name = f"**{name}**"
            if r["status"] != "ok":
                status = {
                    "unavailable": "unavailable",
                    "skipped": "skipped",
                    "error": "ERROR",
                    "too_slow": "too slow",
                }.get(r["status"], r["status"])
                if r["status"] == "unavailable":
                    if r["candidate"] in shown:
                        continue  # one row per unavailable candidate and table is enough
                    shown.add(r["candidate"])
                cells = [
                    name,
                    str(r["n"]),
                    str(r["k"]),
                    f"*{status}*",
                    "",
                    "",
                    "",
                    fmt(san.get("sum_err_max"), ".2e"),
                    bound(san, "mask_min"),
                    bound(san, "mask_max"),
                    nnz(san),
                    "0",
                ]
                if r["status"] == "unavailable":
                    cells[1] = "all"
                    cells[2] = "all"
                lines.append("| " + " | ".join(cells) + " |")
                continue
            fr = r.get("fwd_ratio") or {}
            br = r.get("fwd_bwd_ratio") or {}
            cells = [
                name,
                str(r["n"]),
                str(r["k"]),
                ms((r.get("fwd_ms") or {}).get("median")),
                ratio(fr.get("median")),
                ms((r.get("fwd_bwd_ms") or {}).get("median")),
                ratio(br.get("median")),
                sum_err(san, by_name.get(r["candidate"], {}).get("kind", "mask")),
                bound(san, "mask_min"),
                bound(san, "mask_max"),
                nnz(san),
                str(r["repeats"]),
            ]
            if san and not san.get("grad_finite", True):
                cells[0] += " ⚠ non-finite grad"
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    problems = [r for r in data["records"] if r["status"] in ("error", "too_slow", "skipped")]
    unavailable = [c for c in data["candidates"] if not c["available"]]
    if unavailable or problems:
        lines += ["## Not measured", ""]
        for c in unavailable:
            lines.append(f"* **{c['name']}** (`{c['call']}`): unavailable — {c['unavailable_reason']}")
        seen = set()
        for r in problems:
            key = (r["candidate"], r["status"], r["reason"])
            if r["status"] == "skipped":
                if (r["candidate"], "skipped") in seen:
                    continue
                seen.add((r["candidate"], "skipped"))
                lines.append(f"* **{r['candidate']}**: skipped for {r['reason']}")
            elif key not in seen:
                seen.add(key)
                lines.append(f"* **{r['candidate']}** n={r['n']} k={r['k']}: {r['status']} — `{r['reason']}`")
        lines.append("")
    lines += ["## Candidates", ""]
    for c in data["candidates"]:
        lines.append(f"* **{c['name']}**: `{c['call']}`" + (f" — {c['note']}" if c["note"] else ""))
    if data.get("notes"):
        lines += ["", "## Notes", ""] + [f"* {note}" for note in data["notes"]]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(__file__).resolve().parent / "results" / "mask.json"
    parser.add_argument("--json", type=Path, default=default, help="bench_mask.py output (default results/mask.json)")
    args = parser.parse_args(argv)
    data = load(args.json)
    png, md = args.json.with_suffix(".png"), args.json.with_suffix(".md")
    plot(data, png)
    command = "python benchmarks/plot_mask.py" + "".join(
        " " + shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)
    )
    md.write_text(markdown(data, args.json, command))
    print(f"wrote {png} and {md}")


if __name__ == "__main__":
    main()
