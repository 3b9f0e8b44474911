"""Smoke test of ``examples/moe_routing.py``: it runs (one seed, one epoch), writes finite metrics in their
ranges for every router, the gates behave as each router promises, and a seed reproduces its numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from example_scripts import run_example

SETTINGS = ("hard", "lapsum", "sparse", "straight_through")


def run_json(out: Path, *flags: str) -> dict[str, Any]:
    """Run the example on seed 0 for one epoch, check it succeeded and return its results JSON."""
    done = run_example("moe_routing.py", "--seeds", "0", "--epochs", "1", "--out", str(out), *flags)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_json(tmp_path_factory.mktemp("moe") / "r.json")


def test_help() -> None:
    done = run_example("moe_routing.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "--tau" in done.stdout and "--settings" in done.stdout


def test_every_setting_has_finite_metrics_in_range(report: dict[str, Any]) -> None:
    results = report["results"]
    assert set(results) == set(SETTINGS)
    for setting, metrics in results.items():
        means = {name: metric["mean"] for name, metric in metrics.items()}
        assert all(math.isfinite(value) for value in means.values()), setting
        assert 0 <= means["top1"] <= means["top5"] <= 100, setting
        assert means["load_cv"] >= 0 and 1 <= means["max_load"] <= 8 / 2 + 1e-9, setting
        assert means["aux"] > 0 and means["ms_step"] > 0, setting
        assert 0 < means["gate_sum"] <= 2 + 1e-6, setting
        assert f"`{setting}`" in report["table"]


def test_gates(report: dict[str, Any]) -> None:
    results = report["results"]
    assert results["hard"]["gate_sum"]["mean"] == pytest.approx(1, abs=1e-5)  # softmax over the chosen logits
    assert results["straight_through"]["gate_sum"]["mean"] == 2  # exactly 1 per chosen expert, forward
    assert results["lapsum"]["gate_sum"]["mean"] < 2 and results["sparse"]["gate_sum"]["mean"] < 2


def test_same_seed_same_numbers(report: dict[str, Any], tmp_path: Path) -> None:
    again = run_json(tmp_path / "r.json", "--settings", "lapsum")["results"]
    assert set(again) == {"lapsum"}
    for name, metric in again["lapsum"].items():
        if name != "ms_step":
            assert metric["values"] == report["results"]["lapsum"][name]["values"], name
