"""The one training loop of the lab (``softtopk_lab.loop``): kill-and-resume for every tool, and the
size rules of the lab's code (functions of at most 60 lines but the dataset builder, files of 400)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from softtopk_lab import embeddings
from softtopk_lab.cli import main
from test_knn_train import needs_mnist
from test_train_cifar100 import make_archive

LAB = Path(__file__).resolve().parents[1] / "src" / "softtopk_lab"
#: the functions allowed over :data:`MAX_FUNCTION_LINES`, by file and name, with the reason
LONG_FUNCTIONS = {("wordnet.py", "build_wordnet"): "the dataset builder: one documented pass per dataset"}
MAX_FUNCTION_LINES, MAX_FILE_LINES = 60, 400

#: per tool: its flags (small: seconds per run), the step the kill hook stops it at, and the step of
#: the last checkpoint before that (the end of epoch 1); each draws from its own generators
KILLS = {
    # 3 steps per epoch, evaluations every 2 steps: the kill comes after a checkpoint that holds a
    # loss not yet evaluated; dropout (torch's global RNG) and the noised loss (its own generator)
    "train-embeddings": (
        [
            "-d",
            "wordnet148",
            "--method",
            "bal_noised_topk",
            "--p_k",
            "0",
            "0",
            "0",
            "0",
            "1",
            "--n_samples",
            "2",
            "--apply_dropout",
            "--hidden_dims",
            "8",
            "--batch_size",
            "2000",
            "--n_epochs",
            "2",
            "--eval_freq",
            "2",
            "--nloglr",
            "2",
        ],
        5,
        3,
    ),
    # 2 steps per epoch: augmentation, the noised loss and the label noise, each with its own generator
    "train-cifar100": (
        [
            "--method",
            "bal_noised_topk",
            "--p_k",
            "0",
            "0",
            "0",
            "0",
            "1",
            "--n_samples",
            "2",
            "--label_noise",
            ".4",
            "--val_size",
            "104",
            "--batch_size",
            "8",
            "--n_epochs",
            "2",
            "--device",
            "cpu",
        ],
        3,
        2,
    ),
    # 10 steps per epoch: the Gumbel noise (its own generator) and SGD's momentum
    "knn": (
        [
            "--train_subset",
            "200",
            "--num_queries",
            "20",
            "--num_candidates",
            "20",
            "--k",
            "3",
            "--n_epochs",
            "2",
            "--eval_neighbors",
            "200",
            "--eval_queries",
            "100",
            "--relaxation",
            "lapsum",
            "--lr",
            "1e-2",
        ],
        13,
        10,
    ),
}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # the torch thread count of this process (conftest sets 1): float reductions depend on it
    threads = {"OMP_NUM_THREADS": str(torch.get_num_threads())}
    return subprocess.run(
        [sys.executable, "-m", "softtopk_lab.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, **threads, **(env or {})},
    )


def _outcome(run_dir: Path) -> tuple[dict, list, dict]:
    """results.json and metrics.jsonl without wall-clock times, and the final weights."""
    results = json.loads((run_dir / "results.json").read_text())
    for timing in ("elapsed", "train_seconds", "ms_per_step"):
        results.pop(timing, None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        record.pop("elapsed")
    return results, records, torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.parametrize("tool", ["train-embeddings", "train-cifar100", pytest.param("knn", marks=needs_mnist)])
def test_a_killed_run_resumes_to_the_results_of_an_uninterrupted_one(tool, tmp_path):
    flags, kill_at, checkpoint_step = KILLS[tool]
    flags = [tool, *flags, "--no-progress"]
    if tool == "train-cifar100":
        flags[1:1] = ["-d", str(make_archive(tmp_path / "cifar"))]
    killed = _cli(*flags, "--out", str(tmp_path / "killed"), env={"SOFTTOPK_TEST_KILL_AT_STEP": str(kill_at)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["step"] == checkpoint_step
    assert not (tmp_path / "killed" / "results.json").exists()
    resumed = _cli(*flags, "--resume", str(tmp_path / "killed"))
    assert resumed.returncode == 0, resumed.stderr
    assert main([*flags, "--out", str(tmp_path / "straight")]) == 0
    (results, records, weights), (straight, straight_records, straight_weights) = (
        _outcome(tmp_path / name) for name in ("killed", "straight")
    )
    assert results == straight and records == straight_records
    assert weights.keys() == straight_weights.keys()
    assert all(torch.equal(weights[name], straight_weights[name]) for name in weights)  # bit for bit


class _Diverging(torch.nn.Module):
    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return logits.sum() * float("nan")


def test_a_diverged_training_loss_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(embeddings, "build_loss", lambda *args: _Diverging())
    flags = [
        "train-embeddings",
        "-d",
        "wordnet148",
        "--method",
        "softmax_cross_entropy",
        "--p_k",
        "1",
        "--n_epochs",
        "1",
        "--no-progress",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "softtopk train-embeddings: error: training diverged: the mean training loss is nan at step "
    ), err


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first decorator (or ``def``) to the end of the body, docstring and blank lines included."""
    first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
    return node.end_lineno - first + 1


def test_no_lab_function_is_longer_than_60_lines_but_the_dataset_builder():
    long = {}
    for path in sorted(LAB.rglob("*.py")):
        for node in _functions(ast.parse(path.read_text())):
            if _length(node) > MAX_FUNCTION_LINES and (path.name, node.name) not in LONG_FUNCTIONS:
                long[f"{path.relative_to(LAB)}:{node.lineno} {node.name}"] = _length(node)
    assert not long, f"over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_allowed_long_functions_still_exist():
    """An exception outlives no function: each one names a function of that file."""
    for name, function in LONG_FUNCTIONS:
        assert function in {node.name for node in _functions(ast.parse((LAB / name).read_text()))}, (name, function)


def test_the_length_rule_measures_decorators_docstrings_and_nested_functions():
    tree = ast.parse("@decorator\ndef outer():\n    '''doc'''\n\n    def inner():\n        pass\n    return inner\n")
    assert {node.name: _length(node) for node in _functions(tree)} == {"outer": 7, "inner": 2}


def test_no_lab_file_is_longer_than_400_lines():
    long = {
        str(path.relative_to(LAB)): lines
        for path in sorted(LAB.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"over {MAX_FILE_LINES} lines: {long}"
