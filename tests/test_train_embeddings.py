"""``softtopk train-embeddings``: every loss family, difftopk's README commands, errors, resume, DDP."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

import softtopk_lab
from softtopk_lab.cli import main

SEED_README = next((Path(__file__).resolve().parents[2] / "shared" / "seeds").glob("000_*.txt"), None)  # ../shared
SEED_MISSING = "needs difftopk's README with its published commands (shared/seeds/ beside the checkout)"
FAST = ["--n_epochs", "1", "--batch_size", "100", "--eval_freq", "2", "--nloglr", "2", "--no-progress"]


def _split(generator, means, n, classes):
    labels = torch.randint(0, classes, (n,), generator=generator)
    return means[labels] + torch.randn(n, means.shape[1], generator=generator), labels


def make_file(
    path: Path,
    *,
    keys: str = "test",
    dtype=torch.float32,
    classes: int = 20,
    dim: int = 16,
    n_train: int = 300,
    n_test: int = 100,
) -> Path:
    """A small difftopk-format embedding file (Gaussian classes)."""
    generator = torch.Generator().manual_seed(1)
    means = torch.randn(classes, dim, generator=generator) * 2
    x, y = _split(generator, means, n_train, classes)
    tx, ty = _split(generator, means, n_test, classes)
    y[:classes] = torch.arange(classes)  # every class present in train
    prefix = "imagenet21k_" if keys == "21k" else ""
    other = "test" if keys == "test" else "val"
    torch.save(
        {
            f"{prefix}train_embeddings": x.to(dtype),
            f"{prefix}train_labels": y,
            f"{prefix}{other}_embeddings": tx.to(dtype),
            f"{prefix}{other}_labels": ty,
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return make_file(tmp_path_factory.mktemp("data") / "emb.p")


def _results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


LOSSES = [
    ("softmax_cross_entropy", ["--p_k", "1", "0", "0", "0", "0"]),
    ("bitonic", ["--p_k", ".2", ".2", ".2", ".2", ".2", "--distribution", "logistic_phi"]),
    ("bitonic__non_sparse", ["--p_k", ".5", "0", "0", "0", ".5", "--distribution", "logistic"]),
    ("odd_even", ["--p_k", ".25", "0", "0", "0", ".75", "--distribution", "cauchy"]),
    ("splitter_selection", ["--p_k", ".2", ".2", ".2", ".2", ".2", "--distribution", "logistic_phi"]),
    ("neuralsort", ["--p_k", ".5", "0", "0", "0", ".5", "--inverse_temperature", ".5"]),
    ("softsort", ["--p_k", ".5", "0", "0", "0", ".5", "--inverse_temperature", ".5"]),
    ("gumbel", ["--p_k", ".5", "0", "0", "0", ".5"]),
    ("smooth_hard_topk", ["--p_k", "0", "0", "0", "0", "1"]),
    ("smooth_topk", ["--p_k", "0", "0", "0", "0", "1"]),
    ("smooth_topk_svm", ["--p_k", "0", "0", "0", "0", "1", "--tau", "1", "--alpha", "1"]),
    ("bal_noised_topk", ["--p_k", "0", "0", "0", "0", "1", "--epsilon", ".5", "--n_samples", "3"]),
    ("imbal_noised_topk", ["--p_k", "0", "0", "0", "0", "1", "--epsilon", ".5", "--max_m", ".5", "--scale", "10"]),
]


@pytest.mark.parametrize("method,flags", LOSSES, ids=[m for m, _ in LOSSES])
def test_every_loss_family_trains_and_writes_the_run_files(data_file, tmp_path, method, flags):
    out = tmp_path / "run"
    assert main(["train-embeddings", "-d", str(data_file), "--method", method, *flags, *FAST, "--out", str(out)]) == 0
    results = _results(out)
    assert results["steps"] == 3  # 240 training rows (60 validation), batch 100
    assert set(results["reported_test_at_best_valid"]) == {f"{a}top{k}" for a in ("", "macro_") for k in (1, 5, 10, 20)}
    assert results["final_test"]["top20"] == 1.0 and 0 <= results["final_test"]["top1"] <= 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2, 3] and records[1]["train_loss"] > 0
    config = json.loads((out / "config.json").read_text())
    assert config["flags"]["method"] == method and config["torch_version"] == torch.__version__
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert set(torch.load(out / "checkpoint.pt", weights_only=True)) >= {"model", "optimizer", "rng", "step", "best"}


@pytest.mark.parametrize("keys,dtype", [("val", torch.float16), ("21k", torch.float32), ("test", torch.float16)])
def test_key_variants_and_float16(tmp_path, keys, dtype):
    path = make_file(tmp_path / "emb.p", keys=keys, dtype=dtype)
    out = tmp_path / "run"
    argv = ["train-embeddings", "-d", str(path), "--method", "softsort", "--p_k", "1", *FAST, "--out", str(out)]
    assert main(argv) == 0
    results = _results(out)
    assert (results["n_train"], results["n_valid"], results["n_test"]) == (240, 60, 100)
    assert results["data"] == {"val": "train/val", "21k": "imagenet21k", "test": "train/test"}[keys]


def test_learning_improves_top1(data_file, tmp_path):
    out = tmp_path / "run"
    argv = [
        "train-embeddings",
        "-d",
        str(data_file),
        "--method",
        "softmax_cross_entropy",
        "--p_k",
        "1",
        "--n_epochs",
        "15",
        "--batch_size",
        "60",
        "--nloglr",
        "1.5",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    results = _results(out)
    assert results["final_test"]["top1"] > 0.5 and results["reported_test_at_best_valid"]["top5"] > 0.8


def test_normalized_last_layer_gives_cosine_scores(data_file, tmp_path):
    from softtopk_lab.embeddings import CosineLinear, build_model

    layer = CosineLinear(16, 5)
    x = torch.randn(7, 16) * 100
    scores = layer(x)
    expected = torch.nn.functional.cosine_similarity(x[:, None, :], layer.weight[None], dim=-1)
    assert torch.allclose(scores, expected, atol=1e-6) and scores.abs().max() <= 1 + 1e-6
    assert torch.equal(layer(torch.zeros(2, 16)), torch.zeros(2, 5))
    model = build_model(16, 5, [8], False, False, normalize_ll=True)
    assert isinstance(model[-1], CosineLinear) and model(x).abs().max() <= 1 + 1e-6
    out = tmp_path / "run"
    argv = [
        "train-embeddings",
        "-d",
        str(data_file),
        "--method",
        "imbal_noised_topk",
        "--p_k",
        "0",
        "0",
        "0",
        "0",
        "1",
        "--epsilon",
        ".01",
        "--max_m",
        ".2",
        "--scale",
        "60",
        "--normalize_ll",
        "--n_epochs",
        "10",
        "--batch_size",
        "60",
        "--nloglr",
        "2",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    state = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert set(state) == {"0.weight"}  # no bias
    results = _results(out)
    assert results["reported_test_at_best_valid"]["top5"] > 0.8  # the 20 Gaussian classes are learnt


def _readme_commands() -> list[list[str]]:
    """difftopk's README ``train_imagenet.py`` command lines, flags only (program and ``-d`` removed)."""
    text = SEED_README.read_text().replace("\\\n", " ").split("CIFAR-100 Training")[0]
    full = [
        shlex.split(line)[2:] for line in text.splitlines() if line.startswith("python experiments/train_imagenet.py")
    ]
    options = [shlex.split(line) for line in text.splitlines() if re.match(r"^--(method|p_k) ", line)]
    methods = [o for o in options if o[0] == "--method"]
    p_ks = {o[1]: o for o in options if o[0] == "--p_k"}
    tables_2_3 = [c for c in full if "--method" not in c]
    for method in methods:  # each method with a p_k difftopk's asserts accept
        p_k = (
            p_ks["1."]
            if method[1] == "softmax_cross_entropy"
            else p_ks["0."]
            if method[1] == "smooth_hard_topk"
            else p_ks[".2"]
        )
        full += [base + method + p_k for base in tables_2_3]
    return [c[2:] for c in full if "--method" in c]  # c[:2] is "-d <file>"


@pytest.mark.skipif(SEED_README is None, reason=SEED_MISSING)
def test_readme_commands_run_unchanged_apart_from_program_and_data(data_file, tmp_path, monkeypatch):
    commands = _readme_commands()
    assert len(commands) == 16 and all("--nloglr" in c for c in commands)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        assert main(["train-embeddings", "-d", str(data_file), *command]) == 0, command
    runs = sorted(Path("runs").iterdir())
    assert len(runs) == 16 and all((run / "results.json").exists() for run in runs)


def test_builtin_dataset_is_loaded_through_the_wordnet_module(tmp_path, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    fake = types.ModuleType("softtopk_lab.wordnet")
    fake.BUILTIN_DATASETS = ("wordnet148", "wordnet-plants150")
    split = {
        s: (torch.randn(n, 8, generator=generator), torch.arange(n) % 6)
        for s, n in (("train", 60), ("val", 30), ("test", 30))
    }
    fake.load_builtin = lambda name: {
        "class_names": [f"c{i}" for i in range(6)],
        "train_class_counts": torch.full((6,), 10),
        **{f"{s}_{part}": t for s, (x, y) in split.items() for part, t in (("embeddings", x), ("labels", y))},
    }
    monkeypatch.setitem(sys.modules, "softtopk_lab.wordnet", fake)
    # `from . import wordnet` reads the package attribute once the real module has been imported
    monkeypatch.setattr(softtopk_lab, "wordnet", fake, raising=False)
    out = tmp_path / "run"
    argv = [
        "train-embeddings",
        "-d",
        "wordnet-plants150",
        "--method",
        "imbal_noised_topk",
        "--p_k",
        "0",
        "1",
        *FAST,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert (_results(out)["n_train"], _results(out)["n_classes"], _results(out)["data"]) == (60, 6, "wordnet-plants150")


def test_real_builtin_wordnet148_if_built(tmp_path):
    wordnet = pytest.importorskip("softtopk_lab.wordnet")
    try:
        wordnet.load_builtin("wordnet148")
    except (FileNotFoundError, OSError) as error:
        pytest.skip(f"wordnet148 not built here: {error}")
    out = tmp_path / "run"
    argv = [
        "train-embeddings",
        "-d",
        "wordnet148",
        "--method",
        "bitonic",
        "--p_k",
        ".5",
        "0",
        "0",
        "0",
        ".5",
        "--distribution",
        "logistic_phi",
        *FAST,
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert _results(out)["n_classes"] == 148


def _cli(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "softtopk_lab.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def _comparable(run_dir: Path) -> tuple[dict, list]:
    results = _results(run_dir)
    for timing in ("elapsed", "train_seconds", "ms_per_step"):  # wall-clock, not results
        results.pop(timing)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        record.pop("elapsed")
    return results, records


def test_killed_run_resumes_to_the_same_results(data_file, tmp_path):
    # dropout (torch global RNG) and the noised loss (its own generator) check that every RNG state resumes
    flags = [
        "train-embeddings",
        "-d",
        str(data_file),
        "--method",
        "bal_noised_topk",
        "--p_k",
        "0",
        "0",
        "0",
        "0",
        "1",
        "--apply_dropout",
        "--hidden_dims",
        "12",
        "--n_epochs",
        "3",
        "--batch_size",
        "70",
        "--eval_freq",
        "3",
        "--nloglr",
        "2",
        "--no-progress",
    ]
    killed = _cli(*flags, "--out", str(tmp_path / "killed"), env={"SOFTTOPK_TEST_KILL_AT_STEP": "6"})
    assert killed.returncode == -signal.SIGKILL  # 4 steps per epoch: killed mid-epoch 2, after checkpoint 1
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["step"] == 4
    assert not (tmp_path / "killed" / "results.json").exists()
    resumed = _cli("train-embeddings", *flags[1:], "--resume", str(tmp_path / "killed"))
    assert resumed.returncode == 0, resumed.stderr
    assert main([*flags, "--out", str(tmp_path / "straight")]) == 0
    assert _comparable(tmp_path / "killed") == _comparable(tmp_path / "straight")


def test_resume_refuses_a_changed_flag(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["train-embeddings", "-d", str(data_file), "--method", "softsort", "--p_k", "1", *FAST]
    assert main([*flags, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main([*flags, "--nloglr", "3", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flag --nloglr differs from the stored run (stored 2.0, given 3.0)" in err


def _torchrun(flags: list[str], out: Path, logs: Path) -> tuple[subprocess.CompletedProcess, str]:
    """Two gloo ranks under torchrun; returns the run and every rank's stderr (each rank logs to a file)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "--log-dir",
        str(logs),
        "--redirects",
        "3",
        "-m",
        "softtopk_lab.cli",
        *flags,
        "--out",
        str(out),
    ]
    run = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    ranks = "".join(
        f"--- {path.relative_to(logs)}\n{path.read_text()[-3000:]}" for path in sorted(logs.rglob("stderr.log"))
    )
    return run, ranks


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo is tested on Linux")
def test_torchrun_two_processes_match_one_process(data_file, tmp_path):
    flags = [
        "train-embeddings",
        "-d",
        str(data_file),
        "--method",
        "neuralsort",
        "--p_k",
        ".5",
        "0",
        "0",
        "0",
        ".5",
        "--n_epochs",
        "2",
        "--batch_size",
        "70",
        "--eval_freq",
        "2",
        "--nloglr",
        "2",
        "--no-progress",
    ]
    ddp_dir = tmp_path / "ddp"
    ddp, ranks = _torchrun(flags, ddp_dir, tmp_path / "logs")
    if ddp.returncode != 0 and "Signal 6 (SIGABRT)" in ddp.stderr:
        # A rank aborted inside gloo's C++ transport (seen once in CI, never in 32 runs on a loaded machine
        # here): one more attempt, with the crash shown as a warning; a Python error or a wrong result still fails.
        warnings.warn(f"torchrun: a rank aborted in the first attempt; its logs:\n{ranks}", stacklevel=1)
        ddp_dir = tmp_path / "ddp_again"
        ddp, ranks = _torchrun(flags, ddp_dir, tmp_path / "logs_again")
    assert ddp.returncode == 0, f"{ddp.stderr[-1500:]}\n{ranks}"
    assert main([*flags, "--out", str(tmp_path / "single")]) == 0
    assert json.loads((ddp_dir / "config.json").read_text())["world_size"] == 2
    weights = [torch.load(d / "checkpoint.pt", weights_only=True)["model"] for d in (ddp_dir, tmp_path / "single")]
    for name in weights[0]:
        # the only difference is float32 summation order of the two ranks' gradient parts (allreduce)
        torch.testing.assert_close(weights[0][name], weights[1][name], rtol=0, atol=1e-5)
    ddp_results, single_results = _results(ddp_dir), _results(tmp_path / "single")
    for split in ("final_valid", "final_test"):
        for name, value in single_results[split].items():
            assert abs(ddp_results[split][name] - value) <= 0.011  # at most one sample of 100 test rows
