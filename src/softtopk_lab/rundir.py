"""Run directories a user can trust: ownership, one writer (how files are written: :mod:`.files`).

* **Ownership.** A directory a ``softtopk`` command creates holds ``.softtopk-run``, a JSON marker
  naming its run: a fresh run id, the command and, for a run started by another command (the
  demo's runs), that command's run id as ``parent`` (:func:`claim`). A command writes only into a
  directory it marked, replaces only the names it writes itself (:data:`RUN_FILES`), and deletes
  only a run whose marker names it as the parent; anything else is an error naming the path.
* **One writer.** :class:`RunLock` holds an exclusive lock on ``.lock`` for the whole run; the
  operating system releases it when the process ends, however it ends. A second writer gets an
  error naming the holder's pid. The lock is ``flock`` on POSIX and ``msvcrt.locking`` (of one
  byte far past the pid) on Windows. ``.lock`` is opened without following a link; in a directory
  without the marker an existing ``.lock`` is written only if it holds nothing but a pid (one a
  killed softtopk process left): a user's own ``.lock`` is never written.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

from .errors import UsageError
from .files import open_for_writing, write_text_atomic

if os.name == "nt":  # pragma: no cover - Windows
    import msvcrt

    _WINDOWS_LOCK_OFFSET = 1 << 30  # past any pid text, so a second writer can still read the pid

    def _try_lock(handle: int) -> bool:
        os.lseek(handle, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(handle, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def _unlock(handle: int) -> None:
        os.lseek(handle, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(handle, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _try_lock(handle: int) -> bool:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _unlock(handle: int) -> None:
        fcntl.flock(handle, fcntl.LOCK_UN)


MARKER = ".softtopk-run"
LOCK = ".lock"
#: what a softtopk ``.lock`` holds: the pid of its last holder (nothing if it died before writing it)
_PID = re.compile(r"[0-9]*\n?")
#: every file a training run writes into its directory (and may replace)
RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "metrics.csv",
    "checkpoint.pt",
    "best.pt",
    "results.json",
    "curves.png",
    MARKER,
    LOCK,
)


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The marker of ``directory`` (``None``: none, a link, or not one softtopk wrote)."""
    path = Path(directory) / MARKER
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        marker = json.loads(os.read(handle, 1 << 16)) if stat.S_ISREG(os.fstat(handle).st_mode) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(handle)
    return marker if isinstance(marker, dict) and isinstance(marker.get("run_id"), str) else None


def owned(directory: Path) -> bool:
    """Whether ``directory`` carries a readable ``softtopk`` run marker."""
    return read_marker(directory) is not None


def claim(directory: Path, command: str, parent: str | None = None) -> str:
    """Mark ``directory`` as a run of ``command`` (started by the run ``parent``); returns its new run id."""
    run_id = uuid.uuid4().hex
    marker = {"run_id": run_id, "command": command, "parent": parent, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_text_atomic(Path(directory) / MARKER, json.dumps(marker) + "\n")
    return run_id


def check_new_run_directory(directory: Path, flag: str, command: str, parent: str | None = None) -> None:
    """Refuse to start a run of ``command`` in ``directory`` over files it did not write.

    Raises:
        UsageError: ``directory`` is a file, holds a finished or started run, is marked by another
            command, or holds a file a run would overwrite without the softtopk marker.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{flag} {directory}: is a file, not a directory")
    if (directory / "checkpoint.pt").exists() or (directory / "results.json").exists():
        raise UsageError(
            f"{flag} {directory}: already holds a run (use --resume {directory} to continue it, or another {flag})"
        )
    marker = read_marker(directory)
    if marker is not None and (marker.get("command"), marker.get("parent")) != (command, parent):
        raise UsageError(
            f"{flag} {directory}: belongs to another run (of softtopk {marker.get('command')}); choose another {flag}"
        )
    clashes = [name for name in RUN_FILES if name not in (MARKER, LOCK) and os.path.lexists(directory / name)]
    if clashes and marker is None:
        raise UsageError(
            f"{flag} {directory}: holds {', '.join(clashes)} not written by softtopk; choose another {flag}"
        )


class RunLock:
    """An exclusive lock on a run directory for as long as this object lives (or :meth:`release`).

    Raises:
        UsageError: another process holds the lock (its pid is named); ``.lock`` is a link or not a
            regular file; or the directory has no marker and a ``.lock`` softtopk did not create.
    """

    def __init__(self, directory: Path, flag: str) -> None:
        path = Path(directory) / LOCK
        created = True
        try:
            try:
                self._handle = open_for_writing(path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                created = False
                self._handle = open_for_writing(path, os.O_RDWR)
        except OSError as error:
            raise UsageError(f"{flag} {directory}: cannot be written ({error.strerror or error})") from None
        # a writer that just created the file locks it at once: wait briefly for that
        for _ in range(20 if created else 1):
            if _try_lock(self._handle):
                break
            time.sleep(0.05)
        else:
            holder = self._content().strip()
            os.close(self._handle)
            raise UsageError(
                f"{flag} {directory}: in use by another softtopk process (pid {holder or 'unknown'}); "
                f"wait for it to end or choose another {flag}"
            )
        self._stream = os.fdopen(self._handle, "r+b", buffering=0)  # closed, so unlocked, when collected
        if not created and not owned(directory) and not _PID.fullmatch(self._content()):
            self.release()
            raise UsageError(f"{flag} {directory}: holds {LOCK} not written by softtopk; choose another {flag}")
        try:
            os.ftruncate(self._handle, 0)
            os.lseek(self._handle, 0, os.SEEK_SET)
            os.write(self._handle, f"{os.getpid()}\n".encode())
        except OSError as error:
            self.release()
            raise UsageError(f"{flag} {directory}: cannot be written ({error.strerror or error})") from None

    def _content(self) -> str:
        os.lseek(self._handle, 0, os.SEEK_SET)
        return os.read(self._handle, 64).decode(errors="replace")

    def release(self) -> None:
        """Release the lock (also done by the operating system when the process ends)."""
        if not self._stream.closed:
            _unlock(self._handle)
            self._stream.close()
