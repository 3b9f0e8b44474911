"""``softtopk train-cifar100``: run files for each loss family, README commands, label noise, errors, resume."""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from softtopk_lab.cifar100 import load_splits
from softtopk_lab.cli import main

SEED_README = next((Path(__file__).resolve().parents[2] / "shared" / "seeds").glob("000_*.txt"), None)  # ../shared
SEED_MISSING = "needs difftopk's README with its published commands (shared/seeds/ beside the checkout)"
N_TRAIN, N_TEST = 120, 40
# 120 train: 40 validation (5 batches of 8), 80 training rows = 10 steps of 8 per epoch
TINY = ["--val_size", "40", "--batch_size", "8", "--n_epochs", "1", "--device", "cpu", "--no-progress"]


def _records(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    train_labels = [int(v) for v in rng.permutation(np.arange(N_TRAIN) % 100)]  # every class present
    train = {
        b"data": rng.integers(0, 256, (N_TRAIN, 3072), dtype=np.uint8),
        b"fine_labels": train_labels,
        b"coarse_labels": [0] * N_TRAIN,
        b"filenames": [b"x.png"] * N_TRAIN,
    }
    test = {
        b"data": rng.integers(0, 256, (N_TEST, 3072), dtype=np.uint8),
        b"fine_labels": [int(v) for v in rng.integers(0, 100, N_TEST)],
    }
    meta = {b"fine_label_names": [f"class{i:02d}".encode() for i in range(100)], b"coarse_label_names": []}
    return {"train": train, "test": test, "meta": meta}


def make_archive(root: Path, records: dict | None = None) -> Path:
    """A tiny ``cifar-100-python.tar.gz`` of the real format (python pickles, protocol 2)."""
    base = root / "src" / "cifar-100-python"
    base.mkdir(parents=True)
    for name, record in (records or _records()).items():
        (base / name).write_bytes(record if isinstance(record, bytes) else pickle.dumps(record, protocol=2))
    archive = root / "cifar-100-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(base, arcname="cifar-100-python")
    return archive


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    return make_archive(tmp_path_factory.mktemp("cifar"))


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


LOSSES = [
    ("softmax_cross_entropy", ["--p_k", "1", "0", "0", "0", "0"]),
    (
        "splitter_selection",
        ["--p_k", ".2", ".2", ".2", ".2", ".2", "--distribution", "logistic_phi", "--inverse_temperature", ".5"],
    ),
    ("neuralsort", ["--p_k", ".5", "0", "0", "0", ".5", "--inverse_temperature", ".0625"]),
    ("smooth_hard_topk", ["--p_k", "0", "0", "0", "0", "1"]),
    ("smooth_topk_svm", ["--p_k", "0", "0", "0", "0", "1"]),
    ("bal_noised_topk", ["--p_k", "0", "0", "0", "0", "1", "--n_samples", "2"]),
]


@pytest.mark.parametrize("method,flags", LOSSES, ids=[m for m, _ in LOSSES])
def test_loss_families_train_and_write_the_run_files(archive, tmp_path, method, flags):
    out = tmp_path / "run"
    argv = [
        "train-cifar100",
        "-d",
        str(archive),
        "--method",
        method,
        *flags,
        *TINY,
        "--val_size",
        "104",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    results = _results(out)
    assert (
        results["steps"],
        results["n_train"],
        results["n_valid"],
        results["n_valid_evaluated"],
        results["n_test"],
    ) == (2, 16, 104, 104, 40)
    assert set(results["reported_test_at_best_valid"]) == {f"{a}top{k}" for a in ("", "macro_") for k in (1, 5, 10, 20)}
    assert all(0 <= v <= 1 for split in ("final_valid", "final_test") for v in results[split].values())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2] and np.isfinite(records[0]["train_loss"])
    config = json.loads((out / "config.json").read_text())
    assert config["flags"]["method"] == method and config["command"] == "train-cifar100"
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert set(checkpoint) >= {"model", "optimizer", "rng", "step", "best"}
    assert set(checkpoint["rng"]["generators"]) == {"augment", "loss_noise"}


def test_validation_drops_its_incomplete_last_batch(archive, tmp_path):
    out = tmp_path / "run"
    argv = [
        "train-cifar100",
        "-d",
        str(archive),
        "--method",
        "softmax_cross_entropy",
        "--p_k",
        "1",
        *TINY,
        "--val_size",
        "107",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    results = _results(out)
    assert (results["n_train"], results["n_valid"], results["n_valid_evaluated"], results["steps"]) == (13, 107, 104, 1)


def _readme_commands() -> list[list[str]]:
    """difftopk's README ``train_cifar100.py`` command lines, flags only (the program removed)."""
    text = SEED_README.read_text().replace("\\\n", " ").split("CIFAR-100 Training")[1]
    full = [
        shlex.split(line)[2:] for line in text.splitlines() if line.startswith("python experiments/train_cifar100.py")
    ]
    options = [shlex.split(line) for line in text.splitlines() if re.match(r"^--(method|p_k) ", line)]
    methods = [o for o in options if o[0] == "--method"]
    p_ks = [o for o in options if o[0] == "--p_k"]
    return [*[c for c in full if c], *[m + p for m in methods for p in p_ks]]


@pytest.mark.skipif(SEED_README is None, reason=SEED_MISSING)
def test_readme_commands_parse_and_the_examples_run(archive, tmp_path, monkeypatch):
    from softtopk_lab.config import Cifar100Config
    from softtopk_lab.errors import UsageError
    from softtopk_lab.flags import build_parser
    from softtopk_lab.train_losses import build_loss

    commands = _readme_commands()
    assert len(commands) == 2 + 6 * 6
    for command in commands:  # every Tables 1+4 combination parses; the loss builds unless difftopk's asserts refuse it
        config = Cifar100Config.from_args(build_parser().parse_args(["train-cifar100", "-d", str(archive), *command]))
        assert (
            config.n_epochs,
            config.nloglr,
            config.batch_size,
            config.device,
            config.loss.m,
            config.loss.top1_mode,
        ) == (200, 3.0, 128, "cuda", None, "smce")
        try:
            build_loss(config.loss, 100, torch.ones(100), torch.Generator())
        except UsageError as error:
            assert "requires p_k" in str(error), command
    monkeypatch.chdir(tmp_path)
    for command in commands[:2]:  # the two example lines run (1 epoch, 1 step) with flags appended after them
        argv = [
            "train-cifar100",
            *command,
            "-d",
            str(archive),
            "--n_epochs",
            "1",
            "--batch_size",
            "8",
            "--val_size",
            "112",
            "--device",
            "cpu",
            "--no-progress",
        ]
        assert main(argv) == 0, command
    runs = sorted(Path("runs").iterdir())
    assert len(runs) == 2 and all(_results(run)["steps"] == 1 for run in runs)


def test_label_noise_fraction_is_as_expected_and_deterministic(archive, tmp_path):
    clean = load_splits(str(archive), 0, 40, 0.0, 8)
    assert clean["changed_label_fraction"] == 0.0
    big = make_archive(
        tmp_path,
        {
            **_records(),
            "train": {
                **_records()["train"],
                b"data": np.zeros((5000, 3072), np.uint8),
                b"fine_labels": [i % 100 for i in range(5000)],
            },
        },
    )
    noisy = load_splits(str(big), 3, 1000, 0.5, 8)
    assert abs(noisy["changed_label_fraction"] - 0.5 * 4 / 5) < 0.03  # a redraw keeps the label 1 time in 5
    again = load_splits(str(big), 3, 1000, 0.5, 8)
    other = load_splits(str(big), 4, 1000, 0.5, 8)
    for split in ("train", "valid"):
        assert torch.equal(noisy[split][1], again[split][1])
    assert not torch.equal(noisy["train"][1], other["train"][1])
    full = load_splits(str(big), 3, 1000, 1.0, 8)
    clean_big = load_splits(str(big), 3, 1000, 0.0, 8)
    for split in ("train", "valid"):  # same split whatever the noise; noise stays within blocks of 5
        assert torch.equal(full[split][1] // 5, clean_big[split][1] // 5)
        assert not torch.equal(full[split][1], clean_big[split][1])  # validation labels are noisy too
    assert torch.equal(full["test"][1], clean_big["test"][1])  # test labels clean


def _cli(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "softtopk_lab.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


@pytest.mark.parametrize(
    "make_path,extra,message",
    [
        (lambda tmp, good: tmp / "absent.tar.gz", [], "absent.tar.gz"),
        (lambda tmp, good: make_archive(tmp, {**_records(), "test": b"not a pickle"}), [], "not a valid pickle"),
        (lambda tmp, good: good, ["--device", "cuda"], "CUDA is not available"),
        (lambda tmp, good: good, ["--label_noise", "1.5"], "--label_noise must be a probability in [0, 1], got 1.5"),
        (lambda tmp, good: good, ["--label_noise", "nan"], "--label_noise must be a probability"),
        (lambda tmp, good: good, ["--val_size", "116"], "fewer than one batch"),
    ],
    ids=["missing", "malformed", "cuda", "noise", "noise-nan", "val-size"],
)
def test_errors_are_one_line_exit_2(archive, tmp_path, capsys, make_path, extra, message):
    if "cuda" in extra and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    path = make_path(tmp_path, archive)
    flags = [f for f in TINY if f not in ("--device", "cpu")] if "--device" in extra else TINY
    argv = [
        "train-cifar100",
        "-d",
        str(path),
        "--method",
        "softmax_cross_entropy",
        "--p_k",
        "1",
        *flags,
        *extra,
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("softtopk train-cifar100: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_default_device_is_cuda_and_fails_cleanly_without_it(archive, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    done = _cli(
        "train-cifar100",
        "-d",
        str(archive),
        "--method",
        "softmax_cross_entropy",
        "--p_k",
        "1",
        "--out",
        str(tmp_path / "run"),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "softtopk train-cifar100: error: --device cuda: CUDA is not available on this machine (use --device cpu)"
    ]


def _comparable(run_dir: Path) -> tuple[dict, list]:
    results = _results(run_dir)
    results.pop("elapsed")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        record.pop("elapsed")
    return results, records


def test_killed_run_resumes_to_the_same_results(archive, tmp_path):
    # augmentation (own generator), the noised loss (own generator) and label noise must all replay exactly
    flags = [
        "train-cifar100",
        "-d",
        str(archive),
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
        *TINY,
        "--val_size",
        "104",
        "--n_epochs",
        "3",
    ]
    killed = _cli(*flags, "--out", str(tmp_path / "killed"), env={"SOFTTOPK_TEST_KILL_AT_STEP": "3"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # 2 steps per epoch: killed after checkpoint 1
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not (tmp_path / "killed" / "results.json").exists()
    resumed = _cli(*flags, "--resume", str(tmp_path / "killed"))
    assert resumed.returncode == 0, resumed.stderr
    assert main([*flags, "--out", str(tmp_path / "straight")]) == 0
    assert _comparable(tmp_path / "killed") == _comparable(tmp_path / "straight")


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train-cifar100", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "-eid",
        "--experiment_id",
        "-d",
        "--data_path",
        "--n_epochs",
        "--nloglr",
        "--batch_size",
        "--seed",
        "--device",
        "--method",
        "--p_k",
        "--inverse_temperature",
        "-m",
        "--distribution",
        "--art_lambda",
        "--top1_mode",
        "--label_noise",
        "--val_size",
        "--out",
        "--resume",
        "--no-progress",
        "--tau",
        "--alpha",
        "--epsilon",
        "--n_samples",
        "--max_m",
        "--scale",
    ):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", text), flag
    compact = " ".join(text.split())
    for default in ("default 200", "default 3)", "default 128", "default cuda", "default smce", "default 2,500"):
        assert default in compact, default
