"""What users expect of the training tools (issue 13, items 5-8 and 10): the best model kept,
resume from the run directory alone, one clear line on Ctrl-C, feedback without a terminal, clear
errors for bad data, defaults that work on the built-in data."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from softtopk_lab.cli import main
from softtopk_lab.config import BUILTIN_DEFAULTS, BUILTIN_NAMES, FILE_DEFAULTS, EmbeddingConfig
from softtopk_lab.embedding_data import load_data
from softtopk_lab.flags import build_parser
from softtopk_lab.metrics import evaluate
from test_train_embeddings import make_file

LOSS = ["--method", "softsort", "--p_k", "1"]
FAST = ["--n_epochs", "3", "--batch_size", "100", "--eval_freq", "2", "--nloglr", "2", "--no-progress"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return make_file(tmp_path_factory.mktemp("data") / "emb.p")


def _flags(data_file: Path, *extra: str) -> list[str]:
    return ["train-embeddings", "-d", str(data_file), "--method", "softsort", "--p_k", "1", *FAST, *extra]


# ---- 5. the best model -----------------------------------------------------------------------


def test_best_pt_holds_the_weights_whose_test_value_is_reported(data_file, tmp_path):
    out = tmp_path / "run"
    assert main([*_flags(data_file, "--hidden_dims", "8"), "--out", str(out)]) == 0
    from softtopk_lab.embeddings import build_model

    state = torch.load(out / "best.pt", weights_only=True)  # the README's two lines
    model = build_model(**state["model_args"])
    model.load_state_dict(state["model"])  # noqa: E702
    results = json.loads((out / "results.json").read_text())
    test_x, test_y = load_data(str(data_file))["test"]
    assert state["step"] == results["best"]["top1"]["step"]
    assert (
        evaluate(model, test_x, test_y, batch_size=100, device=torch.device("cpu"))["top1"]
        == results["reported_test_at_best_valid"]["top1"]
    )


# ---- 6. resume from the run directory alone, Ctrl-C ------------------------------------------


def test_resume_needs_only_the_run_directory(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    (out / "results.json").unlink()
    assert main(["train-embeddings", "--resume", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["best"] == results["best"]
    capsys.readouterr()
    assert main(["train-embeddings", "--resume", str(out), "--nloglr", "3"]) == 2
    assert "flag --nloglr differs from the stored run (stored 2.0, given 3.0)" in capsys.readouterr().err
    assert main(["knn", "--resume", str(out)]) == 2
    assert "holds a run of softtopk train-embeddings, not knn" in capsys.readouterr().err
    assert main(["train-embeddings", "--resume", str(tmp_path / "nothing")]) == 2
    assert "no config.json there" in capsys.readouterr().err


def test_ctrl_c_is_one_line_with_the_command_that_resumes(data_file, tmp_path):
    out = tmp_path / "run"
    flags = [
        "train-embeddings",
        "-d",
        str(data_file),
        "--method",
        "softsort",
        "--p_k",
        "1",
        "--n_epochs",
        "400",
        "--batch_size",
        "100",
        "--eval_freq",
        "1000",
        "--no-progress",
        "--out",
        str(out),
    ]
    # the child must not inherit an ignored SIGINT: a shell without job control starts background
    # commands with SIGINT ignored, and so would a suite run that way; a Python handler is reset to
    # the default at exec, so the child installs its KeyboardInterrupt as a terminal's run does
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "softtopk_lab.cli", *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"continue with: softtopk train-embeddings --resume {out}" in err


# ---- 7. feedback without a terminal ------------------------------------------------------------


def test_one_line_per_evaluation_without_a_terminal_and_quiet_silences_it(data_file, tmp_path, capsys):
    assert main([*_flags(data_file), "--out", str(tmp_path / "a")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    records = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(records) >= 3
    assert lines[-1].startswith("step 9/9, loss ") and "valid top1 " in lines[-1] and "ETA 0s" in lines[-1]
    assert main([*_flags(data_file, "--quiet"), "--out", str(tmp_path / "b")]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]


# ---- 8. clear errors for bad data -------------------------------------------------------------


def test_a_huge_label_is_refused_before_anything_is_allocated(tmp_path, capsys):
    path = make_file(tmp_path / "emb.p")
    data = torch.load(path, weights_only=True)
    data["train_labels"][0] = 2**40
    torch.save(data, path)
    assert main(["train-embeddings", "-d", str(path), *LOSS, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "imply 1099511627777 classes (max label + 1) for only 300 training rows" in err


def test_nan_or_inf_embeddings_are_refused_with_the_row_count(tmp_path, capsys):
    path = make_file(tmp_path / "emb.p")
    data = torch.load(path, weights_only=True)
    data["test_embeddings"][[3, 7], 0] = torch.tensor([float("nan"), float("inf")])
    torch.save(data, path)
    assert main(["train-embeddings", "-d", str(path), *LOSS, "--out", str(tmp_path / "run")]) == 2
    assert "2 of the 100 test embedding rows hold NaN or inf (first: row 3)" in capsys.readouterr().err


def test_a_cifar_archive_declaring_a_huge_member_is_not_expanded(tmp_path, capsys):
    import tarfile

    path = tmp_path / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        info = tarfile.TarInfo("cifar-100-python/train")
        info.size = 1 << 40  # a header promising a terabyte; only the header is written
        archive.fileobj.write(info.tobuf(archive.format, archive.encoding, archive.errors))
    assert main(["train-cifar100", "-d", str(path), *LOSS, "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "declares 1,099,511,627,776 bytes" in err


# ---- 10. defaults on the built-in data ---------------------------------------------------------


@pytest.mark.parametrize("data_path", [*BUILTIN_NAMES, "embeddings.p"])
def test_defaults_follow_the_data(data_path):
    parser = build_parser()
    config = EmbeddingConfig.from_args(parser.parse_args(["train-embeddings", "-d", data_path, *LOSS]))
    want = BUILTIN_DEFAULTS if data_path in BUILTIN_NAMES else FILE_DEFAULTS
    assert {name: getattr(config, name) for name in want} == want
    given = EmbeddingConfig.from_args(parser.parse_args(["train-embeddings", "-d", data_path, *LOSS, "--nloglr", "3"]))
    assert given.nloglr == 3.0 and given.n_epochs == want["n_epochs"]


def test_builtin_names_match_the_wordnet_module():
    from softtopk_lab import wordnet

    assert BUILTIN_NAMES == wordnet.BUILTIN_DATASETS


def test_help_says_which_defaults_apply(capsys):
    with pytest.raises(SystemExit):
        main(["train-embeddings", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "20 for an embedding file, as difftopk; 30 for a built-in dataset" in text


def test_the_readme_snippet_of_best_pt_matches_this_file():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "lab.md").read_text()
    assert 'state = torch.load("RUN/best.pt", weights_only=True)' in readme
    assert 'model = build_model(**state["model_args"]); model.load_state_dict(state["model"])' in readme


# ---- 9. metrics people can consume ---------------------------------------------------------------


def test_metrics_csv_has_the_rows_of_metrics_jsonl_also_after_a_resume(data_file, tmp_path):
    import csv

    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    (out / "results.json").unlink()
    assert main(["train-embeddings", "--resume", str(out)]) == 0  # replays nothing, trims and rewrites
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    with open(out / "metrics.csv") as stream:
        rows = list(csv.DictReader(stream))
    assert [int(row["step"]) for row in rows] == [record["step"] for record in records]
    assert float(rows[-1]["valid_top5"]) == records[-1]["valid"]["top5"]
    assert float(rows[-1]["test_macro_top1"]) == records[-1]["test"]["macro_top1"]


def test_tensorboard_scalars(data_file, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (test extra)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main([*_flags(data_file, "--tensorboard"), "--out", str(out)]) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    top1 = events.Scalars("valid/top1")
    assert [event.step for event in top1] == [record["step"] for record in records]
    assert top1[-1].value == pytest.approx(records[-1]["valid"]["top1"], abs=1e-6)
    assert {"train/loss", "test/top5", "test/macro_top1"} <= set(events.Tags()["scalars"])


def test_topk_accuracy_agrees_with_torchmetrics_including_a_class_missing_from_the_split():
    torchmetrics = pytest.importorskip("torchmetrics", reason="torchmetrics is not installed (test extra)")
    from softtopk_lab.metrics import topk_metrics

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(400, 12, generator=generator)
    labels = torch.randint(0, 12, (400,), generator=generator)
    labels[labels == 7] = 3  # class 7 is missing from this split
    ours = topk_metrics(logits, labels)
    present = torch.bincount(labels, minlength=12) > 0
    for k in (1, 5, 10):
        micro = torchmetrics.classification.MulticlassAccuracy(num_classes=12, top_k=k, average="micro")
        per_class = torchmetrics.classification.MulticlassAccuracy(num_classes=12, top_k=k, average="none")
        assert ours[f"top{k}"] == pytest.approx(micro(logits, labels).item(), abs=1e-6)
        # softtopk's macro average is over the classes present in the split (torchmetrics' own "macro"
        # also counts, as 0, a missing class that was predicted)
        assert ours[f"macro_top{k}"] == pytest.approx(per_class(logits, labels)[present].mean().item(), abs=1e-6)


# ---- 11. plots that say something ----------------------------------------------------------------


def _captured_figure(monkeypatch, draw):
    import matplotlib.figure

    captured = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda figure, *args, **kwargs: captured.append(figure))
    draw()
    (figure,) = captured
    figure.canvas.draw()
    return figure


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_demo_plot_zooms_to_its_values_shows_top1_and_top5_and_its_legend_hides_nothing(monkeypatch, tmp_path):
    from softtopk_lab.demo import _plot

    runs = {
        "a": {"curve": [(0, 0.01, 0.05), (50, 0.55, 0.84), (100, 0.58, 0.86)]},
        "b": {"curve": [(0, 0.02, 0.04), (50, 0.60, 0.87), (100, 0.61, 0.88)]},
    }
    figure = _captured_figure(monkeypatch, lambda: _plot(runs, tmp_path / "demo.png"))
    top1, top5 = figure.axes
    assert "top-1" in top1.get_title() and "top-5" in top5.get_title()
    low, high = top1.get_ylim()
    assert 50 < low <= 55 and 61 <= high < 65  # the untrained evaluation (1-2 %) is left out
    (legend,) = figure.legends
    extent = legend.get_window_extent()
    assert not any(_overlaps(extent, axis.get_window_extent()) for axis in figure.axes)


def test_curves_legend_is_beside_the_panel(data_file, tmp_path, monkeypatch):
    import softtopk_lab.runner as runner

    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    run = types.SimpleNamespace(dir=out)  # what the plot reads of a run: its metrics.jsonl
    figure = _captured_figure(monkeypatch, lambda: runner.Run._plot(run, out / "again.png"))
    right = figure.axes[1]
    legend = right.get_legend()
    assert legend is not None and not _overlaps(legend.get_window_extent(), right.get_window_extent())


def test_demo_prints_the_parameters_of_its_mask_table(capsys):
    from softtopk_lab.demo import EXAMPLE_PARAMS, _print_masks

    _print_masks(0)
    printed = capsys.readouterr().out
    assert "(tau=0.25)" in printed and "(distribution=logistic, steepness=4.0)" in printed
    assert len(EXAMPLE_PARAMS) == printed.count("sum=")
