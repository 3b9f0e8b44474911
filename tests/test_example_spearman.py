"""Smoke test of ``examples/spearman.py``: it runs (one seed, one epoch), writes every setting's
correlations in [-1, 1]."""

from __future__ import annotations

import json

import pytest

from example_scripts import run_example

pytest.importorskip("sklearn", reason="examples/spearman.py needs scikit-learn (the test extra)")


def test_help() -> None:
    done = run_example("spearman.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "--strength" in done.stdout and "--validation" in done.stdout


def test_a_short_run_writes_every_setting(tmp_path) -> None:
    out = tmp_path / "spearman.json"
    done = run_example("spearman.py", "--seeds", "0", "--epochs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"mse", "spearman", "spearman_kl", "mse+spearman"}
    for metrics in results.values():
        assert -1 <= metrics["spearman"]["mean"] <= 1 and -1 <= metrics["pearson"]["mean"] <= 1
        assert metrics["ms_step"]["mean"] > 0
