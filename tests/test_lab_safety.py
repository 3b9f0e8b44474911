"""The lab never runs code from a file, deletes a user's files, lets two writers share a run, or
leaves a torn result (issue 13, items 1-4)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from softtopk_lab import rundir
from softtopk_lab.checkpoint import FORMAT, load_checkpoint, save_atomic
from softtopk_lab.cli import main
from softtopk_lab.errors import UsageError
from test_train_embeddings import make_file

FAST = ["--n_epochs", "2", "--batch_size", "100", "--eval_freq", "2", "--nloglr", "2", "--no-progress"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return make_file(tmp_path_factory.mktemp("data") / "emb.p")


def _flags(data_file: Path) -> list[str]:
    return ["train-embeddings", "-d", str(data_file), "--method", "softsort", "--p_k", "1", *FAST]


class _Planted:
    """A pickle that creates a file when it is unpickled with ``weights_only=False``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def _tree(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


# ---- 1. no code from a checkpoint -------------------------------------------------------------


def test_a_planted_checkpoint_runs_no_code_and_is_a_one_line_error(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    assert torch.load(out / "checkpoint.pt", weights_only=True)["format"] == FORMAT  # the whole checkpoint
    marker = tmp_path / "pwned"
    torch.save({"format": FORMAT, "payload": _Planted(marker)}, out / "checkpoint.pt")
    capsys.readouterr()
    assert main([*_flags(data_file), "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert err.count("\n") == 1 and "is not a softtopk checkpoint (refused by torch.load(weights_only=True)" in err


@pytest.mark.parametrize("content", [b"", b"not a zip", None])
def test_damaged_or_foreign_checkpoints_are_one_line_errors(tmp_path, content):
    path = tmp_path / "checkpoint.pt"
    if content is None:
        torch.save({"model": {}}, path)  # a torch file of another format
    else:
        path.write_bytes(content)
    with pytest.raises(UsageError, match="checkpoint") as error:
        load_checkpoint(path)
    assert "\n" not in str(error.value)


def test_resume_refuses_a_directory_without_the_run_marker(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    (out / rundir.MARKER).unlink()
    capsys.readouterr()
    assert main([*_flags(data_file), "--resume", str(out)]) == 2
    assert "not a run directory of this softtopk version" in capsys.readouterr().err


# ---- 2. no deletions -------------------------------------------------------------------------


def test_the_demo_leaves_a_planted_user_directory_byte_identical(tmp_path, capsys):
    planted = tmp_path / "cross_entropy"
    planted.mkdir()
    (planted / "config.json").write_text('{"mine": true}')
    (planted / "thesis.tex").write_text("years of work")
    before = _tree(tmp_path)
    assert main(["demo", "--n_epochs", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "cross_entropy" in err
    assert _tree(tmp_path) == before


def test_the_demo_refuses_to_replace_a_user_file_in_one_of_its_run_directories(tmp_path, capsys):
    assert main(["demo", "--n_epochs", "1", "--out", str(tmp_path)]) == 0
    (tmp_path / "cross_entropy" / "notes.txt").write_text("mine")
    before = _tree(tmp_path)
    capsys.readouterr()
    assert main(["demo", "--n_epochs", "1", "--out", str(tmp_path)]) == 2
    assert "notes.txt, which softtopk did not write" in capsys.readouterr().err
    assert _tree(tmp_path) == before


def test_a_new_run_never_overwrites_files_it_did_not_write(data_file, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "metrics.jsonl").write_text("my metrics\n")
    assert main([*_flags(data_file), "--out", str(out)]) == 2
    assert "holds metrics.jsonl not written by softtopk" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == "my metrics\n"


# ---- 3. one writer ---------------------------------------------------------------------------

HOLD = """
import sys, time
from pathlib import Path
from softtopk_lab.rundir import RunLock
lock = RunLock(Path(sys.argv[1]), "--out")
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_writer_gets_the_holders_pid(data_file, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert main([*_flags(data_file), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"in use by another softtopk process (pid {holder.pid})" in err
    finally:
        holder.kill()
        holder.wait()
    # the operating system released the killed holder's lock
    assert main([*_flags(data_file), "--out", str(out)]) == 0


def test_two_concurrent_runs_on_one_directory_exactly_one_succeeds(data_file, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "softtopk_lab.cli", *_flags(data_file), "--out", str(out)]
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(process.wait(timeout=300) for process in processes)
    assert codes == [0, 2]
    config = json.loads((out / "config.json").read_text())
    results = json.loads((out / "results.json").read_text())
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert config["flags"]["method"] == "softsort"
    assert steps == sorted(set(steps)) and steps[-1] == results["steps"]  # one run's metrics, none doubled


STOPPED_CHILD = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "from softtopk_lab.sweep import stop_with_parent; "
                          "stop_with_parent(); import time; time.sleep(60)"],
                         env={**os.environ, "SOFTTOPK_SWEEP_PID": str(os.getpid())})
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_sweep_leaves_no_running_child():
    parent = subprocess.Popen([sys.executable, "-c", STOPPED_CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has set its death signal
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):  # reap it if it became our zombie (init's child: this only waits)
            os.waitpid(child, os.WNOHANG)
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the sweep's child outlived it")


# ---- 4. whole files ----------------------------------------------------------------------------


def test_resume_finishes_what_a_kill_left_undone_and_removes_stale_temporaries(data_file, tmp_path):
    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    # killed after the last checkpoint, before the result files; a torn temporary left behind
    (out / "results.json").unlink()
    (out / "curves.png").unlink()
    stale = out / ".softtopk-tmp-checkpoint.pt.abc123"
    stale.write_bytes(b"torn")
    assert main([*_flags(data_file), "--resume", str(out)]) == 0
    assert not stale.exists() and (out / "curves.png").stat().st_size > 0
    again = json.loads((out / "results.json").read_text())
    assert again["reported_test_at_best_valid"] == results["reported_test_at_best_valid"]


def test_a_full_disk_is_one_line_and_the_checkpoint_stays_loadable(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_atomic({"step": 1}, path)

    def full(obj, target):
        target.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(UsageError, match="No space left on device") as error:
        save_atomic({"step": 2}, path)
    assert "\n" not in str(error.value)
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert not list(tmp_path.glob(".softtopk-tmp-*"))


def test_an_unwritable_out_is_a_one_line_error(data_file, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*_flags(data_file), "--out", str(blocker / "run")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_full_disk_during_a_run_is_one_line_and_resumable(data_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    calls = []
    real_save = torch.save

    def fills_up(obj, target, *args, **kwargs):
        if Path(target.name).name.startswith(".softtopk-tmp-checkpoint.pt"):
            calls.append(target)
        if len(calls) == 2 and calls[-1] is target:  # the second epoch's checkpoint
            target.write(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, target, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fills_up)
    assert main([*_flags(data_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    monkeypatch.undo()
    assert load_checkpoint(out / "checkpoint.pt")["epoch"] == 0  # the first epoch's checkpoint, intact
    assert main([*_flags(data_file), "--resume", str(out)]) == 0


@pytest.mark.parametrize("damage", ["config", "marker"])
def test_a_damaged_run_directory_is_a_one_line_error(data_file, tmp_path, capsys, damage):
    out = tmp_path / "run"
    assert main([*_flags(data_file), "--out", str(out)]) == 0
    (out / ("config.json" if damage == "config" else rundir.MARKER)).write_text("{not json")
    capsys.readouterr()
    assert main([*_flags(data_file), "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("config.json is damaged" in err or "not a run directory" in err)


def test_a_second_sweep_on_one_directory_is_refused(tmp_path, capsys):
    suite_dir = tmp_path / "out" / "wordnet148"
    suite_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(suite_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = [
            "sweep",
            "wordnet148",
            "--seeds",
            "0",
            "--only",
            "cross_entropy",
            "--n_epochs",
            "1",
            "--out",
            str(tmp_path / "out"),
        ]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"in use by another softtopk process (pid {holder.pid})" in err
        assert not (suite_dir / "cross_entropy").exists()  # nothing ran
    finally:
        holder.kill()
        holder.wait()
