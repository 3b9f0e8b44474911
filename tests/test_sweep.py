"""``softtopk sweep``: the suites behind docs/results.md, their aggregation, resume and errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from softtopk_lab import sweep
from softtopk_lab.cli import main
from softtopk_lab.config import EmbeddingConfig, KnnConfig
from softtopk_lab.flags import build_parser
from softtopk_lab.train_losses import build_loss


def _sweep(tmp_path, *flags: str) -> int:
    return main(["sweep", "wordnet148", "--n_epochs", "1", "--out", str(tmp_path / "out"), *flags])


def _timeless(path) -> dict:
    results = json.loads(path.read_text())
    for timing in ("elapsed", "train_seconds", "ms_per_step"):
        results.pop(timing)
    return results


def test_mean_and_sample_std():
    assert sweep.mean_std([0.5]) == (0.5, None)
    mean, std = sweep.mean_std([0.1, 0.2, 0.6])
    assert mean == pytest.approx(0.3) and std == pytest.approx(math.sqrt((0.04 + 0.01 + 0.09) / 2))


def test_every_suite_command_parses_and_builds_its_loss():
    for name, suite in sweep.SUITES.items():
        labels = [s.label for s in suite.settings]
        assert len(set(labels)) == len(labels), name
        for setting in suite.settings:
            args = build_parser().parse_args([*sweep.command(suite, setting, 3), "--out", "x"])
            config = {"train-embeddings": EmbeddingConfig, "knn": KnnConfig}[args.command].from_args(args)
            assert config.command == suite.tool and config.seed == 3
            if suite.tool == "train-embeddings":
                loss = build_loss(config.loss, 123, torch.arange(1, 124), torch.Generator().manual_seed(0))
                logits = torch.randn(4, 123, requires_grad=True)
                loss(logits, torch.arange(4)).backward()
                assert torch.isfinite(logits.grad).all(), setting.label


def test_sweep_runs_summarises_and_keeps_finished_runs(tmp_path, capsys):
    assert _sweep(tmp_path, "--seeds", "0", "1", "--only", "cross_entropy", "svm_tau1", "--jobs", "2") == 0
    out = tmp_path / "out" / "wordnet148"
    summary = json.loads((out / "summary.json").read_text())
    assert [row["label"] for row in summary["rows"]] == ["cross_entropy", "svm_tau1"]
    for row in summary["rows"]:
        runs = [json.loads((out / row["label"] / f"seed{s}" / "results.json").read_text()) for s in (0, 1)]
        for metric in ("top1", "top5"):
            values = [r["reported_test_at_best_valid"][metric] for r in runs]
            assert row[metric]["values"] == values
            assert (row[metric]["mean"], row[metric]["std"]) == pytest.approx(sweep.mean_std(values))
        assert row["ms_per_step"] == pytest.approx(sum(r["ms_per_step"] for r in runs) / 2)
        assert row["seconds_per_run"] == pytest.approx(sum(r["elapsed"] for r in runs) / 2)
        assert row["command"].startswith("softtopk train-embeddings -d wordnet148 ") and row["command"].endswith(
            "--n_epochs 1 --seed S"
        )
    assert runs[0]["epochs"] == 1 and runs[0]["n_classes"] == 148
    assert summary["total_run_seconds"] == pytest.approx(2 * sum(row["seconds_per_run"] for row in summary["rows"]))
    markdown = (out / "summary.md").read_text()
    assert "| `svm_tau1` | smooth top-k SVM (Berrada) | " in markdown and "--method smooth_topk_svm" in markdown
    printed = capsys.readouterr().out
    assert markdown in printed
    finished = [line for line in printed.splitlines() if line.startswith("finished ")]
    assert len(finished) == 4 and all(line.endswith(" s") for line in finished)  # one line per run
    before = (out / "cross_entropy" / "seed0" / "results.json").stat().st_mtime_ns
    (out / "svm_tau1" / "seed1" / "results.json").unlink()  # a run to finish (resumed), silently
    assert _sweep(tmp_path, "--seeds", "0", "1", "--only", "cross_entropy", "svm_tau1", "--quiet") == 0
    assert (out / "svm_tau1" / "seed1" / "results.json").exists()
    assert (out / "cross_entropy" / "seed0" / "results.json").stat().st_mtime_ns == before  # kept, not rerun
    assert "finished " not in capsys.readouterr().out
    assert (out / "cross_entropy" / "seed0.command").read_text().endswith("--n_epochs 1 --seed 0")
    capsys.readouterr()
    # the same directories with another epoch count: refused, not mixed into the summary
    argv = ["sweep", "wordnet148", "--n_epochs", "2", "--out", str(tmp_path / "out"), "--only", "cross_entropy"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"softtopk sweep: error: {out / 'cross_entropy' / 'seed0'} holds a run of another command (")
    assert err.endswith("; use another --out\n") and err.count("\n") == 1
    assert (out / "cross_entropy" / "seed0" / "results.json").stat().st_mtime_ns == before
    assert not (out / "cross_entropy" / "seed2").exists()  # checked before anything ran


def test_a_killed_run_is_resumed_by_the_next_sweep(tmp_path, monkeypatch, capsys):
    flags = ("--seeds", "0", "--only", "bal_noised_eps1")
    monkeypatch.setenv("SOFTTOPK_TEST_KILL_AT_STEP", "26")  # 21 steps per epoch: dies in epoch 2
    assert main(["sweep", "wordnet148", "--n_epochs", "2", "--out", str(tmp_path / "cut"), *flags]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("softtopk sweep: error: run failed (exit -9): softtopk train-embeddings") and "seed0.log" in err
    )
    run_dir = tmp_path / "cut" / "wordnet148" / "bal_noised_eps1" / "seed0"
    assert (run_dir / "checkpoint.pt").exists() and not (run_dir / "results.json").exists()
    monkeypatch.delenv("SOFTTOPK_TEST_KILL_AT_STEP")
    assert main(["sweep", "wordnet148", "--n_epochs", "2", "--out", str(tmp_path / "cut"), *flags]) == 0
    assert main(["sweep", "wordnet148", "--n_epochs", "2", "--out", str(tmp_path / "whole"), *flags]) == 0
    whole = tmp_path / "whole" / "wordnet148" / "bal_noised_eps1" / "seed0" / "results.json"
    assert _timeless(run_dir / "results.json") == _timeless(whole)


def test_dry_run_prints_every_command(tmp_path, capsys):
    assert _sweep(tmp_path, "--seeds", "4", "5", "--dry-run") == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 * len(sweep.SUITES["wordnet148"].settings)
    assert lines[0] == (
        f"softtopk train-embeddings -d wordnet148 --nloglr 2 --batch_size 256 --n_epochs 30 --eval_freq "
        f"50 --method softmax_cross_entropy --p_k 1 0 0 0 0 --n_epochs 1 --seed 4 --out "
        f"{tmp_path / 'out' / 'wordnet148' / 'cross_entropy' / 'seed4'}"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["nosuch"],
            "SUITE must be one of wordnet148-lr, wordnet148, wordnet-plants150, knn-mnist, knn-fashion-mnist, "
            "got 'nosuch'",
        ),
        (["wordnet148", "--only", "foo"], "--only: wordnet148 has no setting 'foo' (it has cross_entropy, "),
        (["wordnet148", "--seeds", "1", "1"], "--seeds must be distinct, got [1, 1]"),
        (["wordnet148", "--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["wordnet148", "--n_epochs", "0"], "--n_epochs must be >= 1, got 0"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, argv, message):
    assert main(["sweep", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"softtopk sweep: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_render_formats_percentages_and_single_seed():
    summary = {
        "suite": "s",
        "about": "a",
        "metrics": ["top1"],
        "seeds": [0],
        "total_run_seconds": 90.0,
        "rows": [
            {
                "label": "x",
                "family": "f",
                "top1": {"mean": 0.12345, "std": None},
                "ms_per_step": 1.234,
                "seconds_per_run": 9.6,
                "command": "softtopk knn --seed S",
            }
        ],
    }
    text = sweep.render(summary)
    assert "| `x` | f | 12.35 | 1.23 | 10 |" in text and "softtopk knn --seed S" in text
    assert "1 runs, 1.5 min of run time in all" in text
    summary["rows"][0]["top1"]["std"] = 0.0123
    assert "| `x` | f | 12.35 ± 1.23 |" in sweep.render(summary)


def test_metric_values_read_from_the_run_files(tmp_path):
    (tmp_path / "results.json").write_text(
        json.dumps(
            {"reported_test_at_best_valid": {"top1": 0.5}, "best": {"top1": {"valid": 0.6, "test": 0.5, "step": 3}}}
        )
    )
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "test": {"top1": 0.1}}) + "\n" + json.dumps({"step": 3, "test": {"top1": 0.5}}) + "\n"
    )
    assert sweep.metric_value(tmp_path, "top1") == 0.5
    assert sweep.metric_value(tmp_path, "valid_top1") == 0.6
    assert sweep.metric_value(tmp_path, "untrained_top1") == 0.1
