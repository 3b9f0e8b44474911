"""The evaluation records of ``metrics.jsonl`` as ``metrics.csv`` rows and as the plain line a run
prints per evaluation without a terminal."""

from __future__ import annotations

import csv
import io
from typing import Any


def metrics_csv(records: list[dict[str, Any]], header: bool) -> str:
    """``metrics.jsonl`` records as CSV rows: step, epoch, train_loss, elapsed, then ``valid_<metric>``
    and ``test_<metric>`` for every metric (with a header row first if ``header``)."""
    if not records:
        return ""
    metrics = list(records[0]["valid"])
    columns = [
        "step",
        "epoch",
        "train_loss",
        "elapsed",
        *(f"{split}_{name}" for split in ("valid", "test") for name in metrics),
    ]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(columns)
    for record in records:
        flat = {**record, **{f"{split}_{name}": record[split][name] for split in ("valid", "test") for name in metrics}}
        writer.writerow(["" if flat.get(column) is None else flat[column] for column in columns])
    return buffer.getvalue()


def progress_line(record: dict[str, Any], total_steps: int | None) -> str:
    """One evaluation as a plain line: step, training loss, validation metrics, elapsed time, ETA."""
    step, elapsed = record["step"], record["elapsed"]
    parts = [f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    if record.get("train_loss") is not None:
        parts.append(f"loss {record['train_loss']:.4f}")
    parts += [f"valid {name} {100 * value:.2f}%" for name, value in record["valid"].items()]
    parts.append(f"elapsed {elapsed:.0f}s")
    if total_steps and step:
        parts.append(f"ETA {elapsed / step * (total_steps - step):.0f}s")
    return ", ".join(parts)
