"""The ``softtopk`` console script: the demo runs, prints every method and writes its JSON."""

import argparse
import json
import subprocess
import sys

import pytest
import torch

import softtopk
from softtopk_lab.cli import main
from softtopk_lab.flags import build_parser


def test_demo_prints_every_method_trains_every_family_and_writes_json_and_plot(tmp_path, capsys):
    from softtopk_lab.demo import RUNS

    assert main(["demo", "--n_epochs", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "demo.json").read_text())
    for name in softtopk.methods():
        assert name in printed
        assert abs(sum(results["masks"][name]) - 3.0) < 1e-4
    assert set(results["runs"]) == set(RUNS)
    for name, run in results["runs"].items():
        assert name in printed
        # one epoch of a linear head on 148 classes is far above chance (top-5 chance: 3.4%)
        assert 0.2 < run["top5"] <= 1.0 and 0.0 < run["top1"] <= run["top5"]
        assert run["ms_per_step"] > 0 and run["command"].startswith("softtopk train-embeddings -d wordnet148")
    assert (tmp_path / "demo.png").stat().st_size > 0
    # the README command run a second time replaces the first run's output (same seed: same results)
    assert main(["demo", "--n_epochs", "1", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "demo.json").read_text())["runs"]
    for name, run in results["runs"].items():
        assert (again[name]["top1"], again[name]["top5"], again[name]["curve"]) == (
            run["top1"],
            run["top5"],
            run["curve"],
        )


def test_demo_rejects_non_positive_epochs(capsys):
    assert main(["demo", "--n_epochs", "0"]) == 2
    assert "--n_epochs must be >= 1, got 0" in capsys.readouterr().err


def test_unknown_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_info:
        main(["bogus"])
    assert exit_info.value.code == 2


# ---- train-embeddings and data: --help, one-line errors (exit 2, no traceback) ------------------


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for child, subsub in _subparsers(sub):
                    yield f"{name} {child}", subsub


@pytest.mark.parametrize("command", sorted(dict(_subparsers(build_parser()))))
def test_help_of_every_subcommand_lists_every_flag(command, capsys):
    assert command in {"demo", "train-embeddings", "train-cifar100", "knn", "sweep", "data", "data build-wordnet"}
    parsers = dict(_subparsers(build_parser()))
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for action in parsers[command]._actions:
        for flag in action.option_strings:
            assert flag in text, flag
        if action.option_strings and action.dest != "help":
            assert action.help, action.dest


def _file(path, **tensors):
    torch.save(tensors, path)
    return str(path)


def _good(n=40, classes=5, dim=4, **changes):
    data = {
        "train_embeddings": torch.randn(n, dim),
        "train_labels": torch.arange(n) % classes,
        "test_embeddings": torch.randn(10, dim),
        "test_labels": torch.arange(10) % classes,
    }
    data.update(changes)
    return data


def _error(tmp_path, capsys, data_path, *flags):
    argv = [
        "train-embeddings",
        "-d",
        data_path,
        "--method",
        "softsort",
        "--p_k",
        "1",
        "--n_epochs",
        "1",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
        *flags,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("softtopk train-embeddings: error: ") and "Traceback" not in err
    return err


def test_error_missing_file(tmp_path, capsys):
    assert "no such file" in _error(tmp_path, capsys, str(tmp_path / "missing.p"))


def test_error_not_a_torch_pickle(tmp_path, capsys):
    path = tmp_path / "junk.p"
    path.write_bytes(b"this is not a pickle at all")
    assert "not a readable torch pickle" in _error(tmp_path, capsys, str(path))


def test_error_not_a_dict(tmp_path, capsys):
    path = tmp_path / "list.p"
    torch.save([torch.zeros(2)], path)
    assert "expected a dict of tensors, got list" in _error(tmp_path, capsys, str(path))


def test_error_wrong_keys_names_found_and_accepted(tmp_path, capsys):
    path = _file(tmp_path / "k.p", x_train=torch.zeros(3, 2), y_train=torch.zeros(3))
    err = _error(tmp_path, capsys, path)
    assert "wrong keys ['x_train', 'y_train']" in err and "imagenet21k_val_labels" in err and "test_embeddings" in err


def test_error_negative_labels(tmp_path, capsys):
    labels = torch.arange(40) % 5 - 1
    assert "train_labels must be >= 0, got min -1" in _error(
        tmp_path, capsys, _file(tmp_path / "l.p", **_good(train_labels=labels))
    )


def test_error_test_labels_beyond_training_classes(tmp_path, capsys):
    err = _error(tmp_path, capsys, _file(tmp_path / "l.p", **_good(test_labels=torch.arange(10))))
    assert "test/val labels must be < 5" in err and "got max 9" in err


def test_error_non_integer_labels(tmp_path, capsys):
    err = _error(tmp_path, capsys, _file(tmp_path / "l.p", **_good(train_labels=torch.zeros(40))))
    assert "train_labels must be a 1-D integer tensor" in err and "float32" in err


def test_error_length_mismatch(tmp_path, capsys):
    err = _error(tmp_path, capsys, _file(tmp_path / "l.p", **_good(test_labels=torch.arange(9) % 5)))
    assert "test_embeddings has 10 rows but test_labels has 9 entries" in err


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
        (["--n_epochs", "0"], "--n_epochs must be >= 1, got 0"),
        (["--eval_freq", "-1"], "--eval_freq must be >= 1, got -1"),
        (["--p_k", ".5", ".4"], "--p_k: p_k must sum to 1"),
        (["--val_size", "40"], "--val_size must be in [1, 39]"),
        (["--method", "softmax_cross_entropy", "--p_k", "0", "1"], "softmax_cross_entropy requires p_k[0] == 1"),
        (["--method", "smooth_hard_topk", "--p_k", "1", "0"], "smooth_hard_topk requires p_k[-1] == 1"),
        (["--method", "bitonic", "--distribution", "bogus"], "--method bitonic: "),
        (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    ],
)
def test_error_bad_flag_values(tmp_path, capsys, flags, message):
    assert message in _error(tmp_path, capsys, _file(tmp_path / "ok.p", **_good()), *flags)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_error_cuda_unavailable(tmp_path, capsys):
    assert "CUDA is not available" in _error(tmp_path, capsys, _file(tmp_path / "ok.p", **_good()), "--device", "cuda")


def test_error_in_a_real_process_has_no_traceback(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "softtopk_lab.cli",
            "train-embeddings",
            "-d",
            str(tmp_path / "nope.p"),
            "--method",
            "bitonic",
            "--p_k",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == f"softtopk train-embeddings: error: -d/--data_path {tmp_path / 'nope.p'}: no such file\n"


def test_data_build_wordnet_calls_the_wordnet_module(tmp_path, monkeypatch):
    import types

    calls = []
    fake = types.ModuleType("softtopk_lab.wordnet")
    fake.build_wordnet = lambda out_dir, wordnet_dir=None: calls.append((out_dir, wordnet_dir))
    monkeypatch.setitem(sys.modules, "softtopk_lab.wordnet", fake)
    assert main(["data", "build-wordnet", "--out", str(tmp_path), "--wordnet-dir", "/usr/share/wordnet"]) == 0
    assert calls == [(tmp_path, __import__("pathlib").Path("/usr/share/wordnet"))]


def test_data_build_wordnet_missing_source_is_a_one_line_error(tmp_path, capsys):
    assert main(["data", "build-wordnet", "--out", str(tmp_path / "out"), "--wordnet-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("softtopk data build-wordnet: error: ") and err.count("\n") == 1
    assert "apt-get install wordnet-base" in err
