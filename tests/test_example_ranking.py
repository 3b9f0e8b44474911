"""Smoke test of ``examples/ranking.py``: it runs (two seeds, one epoch) and writes every setting's metrics in
[0, 1], the untrained cosine ranking is the same for every seed, its lists are well formed, and its exact
NDCG@10 and recall@10 (with and without padding) agree with hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from example_scripts import EXAMPLES, run_example

SCRIPT = EXAMPLES / "ranking.py"
SETTINGS = {"cosine", "ndcg", "ndcg_softsort", "pairwise", "cross_entropy"}


@pytest.fixture(scope="module")
def ranking() -> ModuleType:
    """The script imported as a module (its ``main`` does not run)."""
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports examples/_common.py
    try:
        spec = importlib.util.spec_from_file_location("ranking_example", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def test_help() -> None:
    done = run_example("ranking.py", "--help")
    assert done.returncode == 0, done.stderr
    assert "--tau_softsort" in done.stdout and "--min_size" in done.stdout


def test_runs_and_writes_every_setting(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = run_example("ranking.py", "--seeds", "0", "1", "--epochs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["table"] in done.stdout
    results = report["results"]
    assert set(results) == SETTINGS
    for metrics in results.values():
        for name in ("ndcg10", "recall10"):
            assert all(0.0 <= value <= 1.0 for value in metrics[name]["values"])
    cosine = results["cosine"]
    assert cosine["ndcg10"]["values"][0] == cosine["ndcg10"]["values"][1]  # no training, no seed
    assert results["ndcg"]["ndcg10"]["mean"] > cosine["ndcg10"]["mean"]  # one epoch already helps


def test_lists(ranking: ModuleType) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.nn.functional.normalize(torch.randn(60, 8, generator=g), dim=-1)
    y = torch.arange(60) % 6
    items, rel, mask = ranking.build_lists(x, y, 20, 12, 3)
    lengths = mask.sum(-1)
    assert lengths.min() >= 12 and lengths.max() <= 20
    assert torch.equal(mask, torch.arange(20) < lengths[:, None])  # padding at the end
    assert not ((items == torch.arange(60)[:, None]) & mask).any()  # never the query itself
    assert torch.equal(rel.bool(), (y[items] == y[:, None]) & mask)  # relevant = same class
    assert (rel.sum(-1) >= 1).all() and (rel.sum(-1) <= 3).all()
    assert all(len(set(row[keep].tolist())) == int(keep.sum()) for row, keep in zip(items, mask, strict=True))
    again = ranking.build_lists(x, y, 20, 12, 3)
    assert all(torch.equal(a, b) for a, b in zip((items, rel, mask), again, strict=True))


def test_exact_metrics_by_hand(ranking: ModuleType) -> None:
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6], [1.0, 1.0, 0.0, 0.0]])
    relevance = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    ndcg = ranking.ndcg_at(scores, relevance, k=2)
    # row 0: relevant at ranks 1 and 3, top 2 holds rank 1: DCG = 1/log2(3), ideal = 1 + 1/log2(3)
    assert ndcg[0].item() == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    # row 1: the tie at 1.0 keeps list order, the relevant item is second: DCG = 1/log2(3), ideal = 1
    assert ndcg[1].item() == pytest.approx(1 / math.log2(3))
    assert ranking.recall_at(scores, relevance, k=2).tolist() == [0.5, 1.0]
    assert ranking.ndcg_at(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2), k=1).item() == 0.0
    # graded: relevance 2 (gain 3) at rank 1, relevance 1 (gain 1) at rank 0: DCG = 1 + 3/log2(3), ideal = 3 + 1/log2(3)
    graded = ranking.ndcg_at(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([[1.0, 2.0, 0.0]]), k=10)
    assert graded.item() == pytest.approx((1 + 3 / math.log2(3)) / (3 + 1 / math.log2(3)))


def test_exact_metrics_leave_padding_out(ranking: ModuleType) -> None:
    # the padded item (highest score, relevance 1) must count neither in the ranking nor in the ideal DCG
    scores = torch.tensor([[0.2, 0.9, 0.5, 5.0]])
    relevance = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    mask = torch.tensor([[True, True, True, False]])
    # top 2 of the three real items: 0.9 (irrelevant), 0.5 (relevant): DCG = 1/log2(3), ideal = 1 + 1/log2(3)
    ndcg = ranking.ndcg_at(scores, relevance, mask, k=2)
    assert ndcg.item() == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)))
    assert ranking.recall_at(scores, relevance, mask, k=2).tolist() == [0.5]


def test_losses_leave_padding_out(ranking: ModuleType) -> None:
    scores = torch.randn(1, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    relevance = torch.tensor([[1.0, 0, 1, 0, 0, 1, 0, 0]], dtype=torch.float64)  # the padding's relevance is ignored
    mask = torch.tensor([[True] * 5 + [False] * 3])
    for loss in (ranking.pairwise_loss, ranking.listnet_loss):
        padded, short = scores.clone().requires_grad_(), scores[:, :5].clone().requires_grad_()
        value = loss(padded, relevance, mask)
        expected = loss(short, relevance[:, :5], torch.ones(1, 5, dtype=torch.bool))
        (value + expected).backward()
        assert value.item() == pytest.approx(expected.item())
        torch.testing.assert_close(padded.grad[:, :5], short.grad)
        assert torch.equal(padded.grad[:, 5:], torch.zeros(1, 3, dtype=torch.float64))
