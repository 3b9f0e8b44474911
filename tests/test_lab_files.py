"""The lab writes and deletes only its own files, and every failure a user can cause is one line and
exit 2 (issue 22, part 1). The reproductions run the CLI on the built-in wordnet148 data."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from softtopk_lab import rundir
from softtopk_lab.cli import main
from softtopk_lab.interrupts import interrupt_after
from test_train_embeddings import make_file

#: plain cross-entropy on the built-in data, one epoch
BUILTIN = [
    "train-embeddings",
    "-d",
    "wordnet148",
    "--method",
    "softmax_cross_entropy",
    "--p_k",
    "1",
    "--n_epochs",
    "1",
    "--eval_freq",
    "1000",
    "--no-progress",
    "--quiet",
]
NOTES = "my notes\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished built-in run (copied by the tests that change it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main([*BUILTIN, "--out", str(out)]) == 0
    return out


@pytest.fixture
def run_copy(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


@pytest.fixture
def notes(tmp_path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(NOTES)
    return path


def _one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("softtopk "), err
    for word in words:
        assert word in err, err
    return err


def _tree(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


# ---- 1. no file written or deleted through a link or outside the command's own directory -----------


def test_resume_never_truncates_a_lock_that_links_elsewhere(run_copy, notes, capsys):
    (run_copy / ".lock").unlink()
    (run_copy / ".lock").symlink_to(notes)
    assert main([*BUILTIN, "--resume", str(run_copy), "--nloglr", "3"]) == 2
    _one_line(capsys, ".lock is a symbolic link")
    assert notes.read_text() == NOTES


@pytest.mark.parametrize("link", [False, True])
@pytest.mark.parametrize("command", ["train-embeddings", "demo"])
def test_a_users_lock_in_a_fresh_out_is_never_written(tmp_path, notes, capsys, command, link):
    out = tmp_path / "out"
    out.mkdir()
    if link:
        (out / ".lock").symlink_to(notes)
    else:
        (out / ".lock").write_text(NOTES)
    argv = [*BUILTIN, "--out", str(out)] if command != "demo" else ["demo", "--n_epochs", "1", "--out", str(out)]
    assert main(argv) == 2
    _one_line(capsys, ".lock")
    assert (notes if link else out / ".lock").read_text() == NOTES
    assert sorted(path.name for path in out.iterdir()) == [".lock"]


def _marked_sweep(tmp_path: Path) -> Path:
    """The tree of an earlier sweep of the cross_entropy setting (its suite directory marked)."""
    suite = tmp_path / "sweep" / "wordnet148"
    (suite / "cross_entropy").mkdir(parents=True)
    rundir.claim(suite, "sweep")
    return suite


SWEEP = ["sweep", "wordnet148", "--seeds", "0", "--only", "cross_entropy", "--n_epochs", "1", "--quiet"]


def test_the_sweep_never_writes_its_log_through_a_link(tmp_path, notes, capsys):
    suite = _marked_sweep(tmp_path)
    (suite / "cross_entropy" / "seed0.log").symlink_to(notes)
    assert main([*SWEEP, "--out", str(tmp_path / "sweep")]) == 2
    _one_line(capsys, "seed0.log is a symbolic link")
    assert notes.read_text() == NOTES


def test_the_sweep_never_writes_into_a_directory_it_did_not_mark(tmp_path, capsys):
    suite = tmp_path / "sweep" / "wordnet148"
    suite.mkdir(parents=True)
    (suite / "summary.md").write_text(NOTES)
    assert main([*SWEEP, "--out", str(tmp_path / "sweep")]) == 2
    _one_line(capsys, "summary.md, not written by softtopk sweep")
    assert (suite / "summary.md").read_text() == NOTES and not (suite / "cross_entropy").exists()


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return make_file(tmp_path_factory.mktemp("data") / "emb.p")


@pytest.mark.parametrize("name", [name for name in rundir.RUN_FILES if name not in ("checkpoint.pt", "results.json")])
def test_no_run_file_is_written_through_a_planted_link(data_file, tmp_path, notes, name):
    """A run killed before its first checkpoint is started again in its directory, where every file
    name the run writes is a link to a user's file: the user's file stays byte-identical."""
    out = tmp_path / "run"
    out.mkdir()
    rundir.claim(out, "train-embeddings")
    if name == rundir.MARKER:  # the marker itself: a link to a marker kept elsewhere
        notes.write_bytes((out / name).read_bytes())
        (out / name).unlink()
    before = notes.read_bytes()
    (out / name).symlink_to(notes)
    code = main(
        [
            "train-embeddings",
            "-d",
            str(data_file),
            "--method",
            "softmax_cross_entropy",
            "--p_k",
            "1",
            "--n_epochs",
            "1",
            "--batch_size",
            "100",
            "--no-progress",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert notes.read_bytes() == before
    assert code in (0, 2)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX's")
def test_a_planted_fifo_is_one_line_not_a_hang(data_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    rundir.claim(out, "train-embeddings")
    os.mkfifo(out / "metrics.csv")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "softtopk_lab.cli",
            "train-embeddings",
            "-d",
            str(data_file),
            "--method",
            "softmax_cross_entropy",
            "--p_k",
            "1",
            "--n_epochs",
            "1",
            "--quiet",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "metrics.csv" in done.stderr, done.stderr
    assert "no checkpoint was written yet" in done.stderr


def test_the_demo_deletes_no_run_it_did_not_start(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--n_epochs", "1", "--out", str(out)]) == 0
    mine = out / "cross_entropy"
    shutil.rmtree(mine)
    assert main([*BUILTIN, "--out", str(mine)]) == 0
    before = _tree(out)
    capsys.readouterr()
    assert main(["demo", "--n_epochs", "1", "--out", str(out)]) == 2
    _one_line(capsys, "cross_entropy holds a run this demo did not start")
    assert _tree(out) == before and (mine / "best.pt").exists()


def test_a_run_refuses_the_demos_directory(tmp_path, capsys):
    out = tmp_path / "demo"
    out.mkdir()
    rundir.claim(out, "demo")
    assert main([*BUILTIN, "--out", str(out)]) == 2
    _one_line(capsys, "belongs to another run (of softtopk demo)")


# ---- 2. a full disk inside torch.save --------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1088 vs 1002"),
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    ],
)
def test_a_full_disk_inside_torch_save_is_one_line(tmp_path, monkeypatch, capsys, failure):
    def full(obj, stream, *args, **kwargs):
        stream.write(b"partial")
        raise failure

    monkeypatch.setattr(torch, "save", full)
    assert main([*BUILTIN, "--out", str(tmp_path / "run")]) == 2
    err = _one_line(capsys, "cannot write", "previous file, if any, is intact")
    assert "disk is full" in err or "No space left on device" in err
    assert not list((tmp_path / "run").glob(".softtopk-tmp-*"))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 600 KiB tmpfs: room for a built-in run's config, metrics and best.pt, not its checkpoint."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root on Linux; the simulated full disk above covers the rest")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("this machine does not allow mounting a tmpfs; the simulated full disk above covers the rest")
    try:
        yield mount
    finally:  # lazily if a failed run still holds a file open there
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_tmpfs_is_one_line_and_exit_2(small_tmpfs, capsys):
    assert main([*BUILTIN, "--out", str(small_tmpfs / "run")]) == 2
    _one_line(capsys, "cannot write", "checkpoint.pt", "disk is full")
    assert not list((small_tmpfs / "run").glob(".softtopk-tmp-*"))


def test_another_runtime_error_in_torch_save_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(obj, stream, *args, **kwargs):
        raise RuntimeError("a bug, not a full disk")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main([*BUILTIN, "--out", str(tmp_path / "run")])


# ---- 3. crafted inputs -------------------------------------------------------------------------------


def _edit_checkpoint(run: Path, change) -> None:
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    change(state)
    torch.save(state, run / "checkpoint.pt")


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda state: state.pop("optimizer"), "missing or malformed: optimizer"),
        (lambda state: state.pop("train_seconds"), "missing or malformed: train_seconds"),
        (lambda state: state.update(losses_since_evaluation=["1"]), "missing or malformed: losses_since_evaluation"),
        (lambda state: state.update(best={"top1": {}}), "is not a best-validation entry"),
        (lambda state: state.update(last_evaluation=({"top1": "x"}, {"top1": 0.5})), "does not fit this run"),
        (
            lambda state: state.update(model={"0.weight": torch.zeros(3, 3), "0.bias": torch.zeros(3)}),
            "does not fit this run",
        ),
        (lambda state: state.update(epoch=98), "claims epoch 99 (step 21) of a run of 1 epochs"),
        (lambda state: state.update(last_evaluation=None), "does not fit this run"),
    ],
)
def test_a_crafted_checkpoint_is_one_line(run_copy, capsys, change, words):
    _edit_checkpoint(run_copy, change)
    assert main([*BUILTIN, "--resume", str(run_copy)]) == 2
    _one_line(capsys, words)


@pytest.mark.parametrize("content", [None, "{not json\n", '{"step": 0}\n[1, 2]\n', "\x80\x81\n"])
def test_a_damaged_or_missing_metrics_log_on_resume_is_one_line(run_copy, capsys, content):
    path = run_copy / "metrics.jsonl"
    if content is None:
        path.unlink()
    else:
        path.write_bytes(content.encode("latin-1"))
    assert main([*BUILTIN, "--resume", str(run_copy)]) == 2
    _one_line(capsys, "metrics.jsonl is missing or damaged")


def test_a_directory_named_like_a_temporary_is_one_line_and_kept(run_copy, capsys):
    (run_copy / ".softtopk-tmp-mine").mkdir()
    (run_copy / ".softtopk-tmp-mine" / "thesis.tex").write_text(NOTES)
    assert main([*BUILTIN, "--resume", str(run_copy)]) == 2
    _one_line(capsys, "is a directory named like a softtopk temporary file")
    assert (run_copy / ".softtopk-tmp-mine" / "thesis.tex").read_text() == NOTES


@pytest.mark.parametrize("content", ["", "[]", '{"ms_per_step": 1}'])
def test_a_damaged_results_file_in_a_sweep_tree_is_one_line(tmp_path, capsys, content):
    suite = _marked_sweep(tmp_path)
    (suite / "cross_entropy" / "seed0").mkdir()
    (suite / "cross_entropy" / "seed0" / "results.json").write_text(content)
    assert main([*SWEEP, "--out", str(tmp_path / "sweep")]) == 2
    _one_line(capsys, "seed0")


# ---- 4. permissions ------------------------------------------------------------------------------------


def test_run_files_are_written_with_the_users_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        assert main([*BUILTIN, "--out", str(tmp_path / "run")]) == 0
    finally:
        os.umask(previous)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "run").iterdir()}
    assert modes and set(modes.values()) == {0o640}, modes


# ---- 5. a portable lock --------------------------------------------------------------------------------


class _FakeMsvcrt:
    """``msvcrt.locking`` as Windows does it: a byte range locked per file, refused while held."""

    LK_NBLCK, LK_UNLCK = 2, 0

    def __init__(self) -> None:
        self.held: set[tuple[int, int]] = set()

    def locking(self, handle: int, mode: int, nbytes: int) -> None:
        key = (os.fstat(handle).st_ino, os.lseek(handle, 0, os.SEEK_CUR))
        if mode == self.LK_UNLCK:
            self.held.remove(key)
        elif key in self.held:
            raise OSError(errno.EACCES, "locked")
        else:
            self.held.add(key)


def test_the_lock_loads_and_works_without_fcntl(tmp_path, monkeypatch):
    """rundir on a platform without fcntl (Windows): msvcrt.locking, and the holder's pid readable."""
    spec = importlib.util.spec_from_file_location("softtopk_lab._rundir_on_windows", rundir.__file__)
    windows = importlib.util.module_from_spec(spec)
    with monkeypatch.context() as patch:
        patch.setattr(os, "name", "nt")
        patch.setitem(sys.modules, "fcntl", None)
        patch.setitem(sys.modules, "msvcrt", _FakeMsvcrt())
        spec.loader.exec_module(windows)
    first = windows.RunLock(tmp_path, "--out")
    with pytest.raises(windows.UsageError, match=f"in use by another softtopk process \\(pid {os.getpid()}\\)"):
        windows.RunLock(tmp_path, "--out")
    first.release()
    windows.RunLock(tmp_path, "--out").release()


# ---- 6. the lab's install and plain cross-entropy ---------------------------------------------------------


@pytest.mark.parametrize("package", ["tqdm", "matplotlib"])
def test_without_the_lab_extra_every_command_is_one_line_with_the_install_command(
    tmp_path, monkeypatch, capsys, package
):
    monkeypatch.setitem(sys.modules, package, None)
    assert main([*BUILTIN, "--out", str(tmp_path / "run")]) == 2
    _one_line(capsys, f"{package} not installed", "pip install 'softtopk[lab]'")
    assert not (tmp_path / "run").exists()


def test_plain_cross_entropy_needs_no_p_k_and_the_others_name_it(tmp_path, capsys):
    at = BUILTIN.index("--p_k")
    argv = [*BUILTIN[:at], *BUILTIN[at + 2 :], "--out"]
    assert main([*argv, str(tmp_path / "ce")]) == 0
    assert json.loads((tmp_path / "ce" / "config.json").read_text())["flags"]["p_k"] == [1.0]
    argv[argv.index("softmax_cross_entropy")] = "softsort"
    capsys.readouterr()
    assert main([*argv, str(tmp_path / "softsort")]) == 2
    _one_line(capsys, "--p_k is required for --method softsort")


def test_a_ctrl_c_during_a_checkpoint_write_is_raised_after_it():
    """So the interruption's line names the checkpoint on disk (it names the step set after the write)."""
    finished_write = []
    with pytest.raises(KeyboardInterrupt), interrupt_after():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        finished_write.append(True)
    assert finished_write == [True]


def test_an_ignored_sigint_stays_ignored_during_a_checkpoint_write():
    """A run started with SIGINT ignored (a background command of a shell without job control)
    was interrupted by a Ctrl-C that reached it during a checkpoint write, and only then."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt_after():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
