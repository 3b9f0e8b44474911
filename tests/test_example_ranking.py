"""Smoke test of ``examples/ranking.py``: it runs (one seed, one epoch) and writes every setting's metrics in
[0, 1], the untrained cosine ranking is the same for every seed, and its exact NDCG@10 and recall@10 agree
with hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "ranking.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports examples/_common.py
    try:
        spec = importlib.util.spec_from_file_location("ranking_example", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)


def test_help():
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert "--tau_softsort" in done.stdout


def test_runs_and_writes_every_setting(tmp_path):
    out = tmp_path / "r.json"
    done = _run("--seeds", "0", "1", "--epochs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"cosine", "ndcg", "ndcg_softsort", "pairwise", "cross_entropy"}
    for metrics in results.values():
        for name in ("ndcg10", "recall10"):
            assert all(0.0 <= value <= 1.0 for value in metrics[name]["values"])
    cosine = results["cosine"]
    assert cosine["ndcg10"]["values"][0] == cosine["ndcg10"]["values"][1]  # no training, no seed
    assert results["ndcg"]["ndcg10"]["mean"] > cosine["ndcg10"]["mean"]  # one epoch already helps


def test_exact_metrics_by_hand():
    ranking = _module()
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [1.0, 1.0, 0.0, 0.0]])
    relevance = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    ndcg = ranking.ndcg_at(scores, relevance, 2)
    # row 0: relevant at ranks 1 and 3, top 2 holds rank 1: DCG = 1/log2(3), ideal = 1 + 1/log2(3)
    assert ndcg[0].item() == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    # row 1: the tie at 1.0 keeps list order, the relevant item is second: DCG = 1/log2(3), ideal = 1
    assert ndcg[1].item() == pytest.approx(1 / math.log2(3))
    assert ranking.recall_at(scores, relevance, 2).tolist() == [0.5, 1.0]
    empty = ranking.ndcg_at(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), 1)
    assert empty.item() == 0.0
