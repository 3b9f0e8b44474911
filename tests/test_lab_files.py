"""The lab writes and deletes only its own files, and every failure a user can cause is one line and
exit 2 (issue 22, part 1). The reproductions run the CLI on the built-in wordnet148 data."""

from __future__ import annotations

import json
import sys

import pytest

from softtopk_lab.cli import main

#: plain cross-entropy on the built-in data, one epoch
BUILTIN = ["train-embeddings", "-d", "wordnet148", "--method", "softmax_cross_entropy", "--p_k", "1", "--n_epochs",
           "1", "--eval_freq", "1000", "--no-progress", "--quiet"]


def _one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("softtopk "), err
    for word in words:
        assert word in err, err
    return err


# ---- 6. the lab's install and plain cross-entropy ---------------------------------------------------------


@pytest.mark.parametrize("package", ["tqdm", "matplotlib"])
def test_without_the_lab_extra_every_command_is_one_line_with_the_install_command(tmp_path, monkeypatch, capsys,
                                                                                  package):
    monkeypatch.setitem(sys.modules, package, None)
    assert main([*BUILTIN, "--out", str(tmp_path / "run")]) == 2
    _one_line(capsys, f"{package} not installed", "pip install 'softtopk[lab]'")
    assert not (tmp_path / "run").exists()


def test_plain_cross_entropy_needs_no_p_k_and_the_others_name_it(tmp_path, capsys):
    at = BUILTIN.index("--p_k")
    argv = [*BUILTIN[:at], *BUILTIN[at + 2:], "--out"]
    assert main([*argv, str(tmp_path / "ce")]) == 0
    assert json.loads((tmp_path / "ce" / "config.json").read_text())["flags"]["p_k"] == [1.0]
    argv[argv.index("softmax_cross_entropy")] = "softsort"
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "softsort")]) == 2
    _one_line(capsys, "--p_k is required for --method softsort")
