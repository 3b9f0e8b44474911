"""The ``softtopk`` console script: the demo runs, prints every method and writes its JSON."""

import json

import pytest

import softtopk
from softtopk.cli import main


def test_demo_prints_every_method_and_writes_json(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert main(["demo", "--steps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    for name, info in softtopk.methods().items():
        assert name in printed
        assert abs(sum(results["masks"][name]) - 3.0) < 1e-4
        if "ranks" in info.outputs and not info.stochastic:
            assert 0.0 <= results["training"][f"topk_ce[{name}]"]["top5"] <= 1.0
    assert results["steps"] == 2


def test_demo_rejects_non_positive_steps(capsys):
    assert main(["demo", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


def test_unknown_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_info:
        main(["bogus"])
    assert exit_info.value.code == 2
