"""Run directories a user can trust: ownership, one writer, whole files.

* **Ownership.** A run directory created by a ``softtopk`` command holds ``.softtopk-run``, a JSON
  marker with its run id and command (:func:`claim`). A command replaces or deletes only files in a
  directory that carries the marker (:func:`owned`), and only the names it writes itself
  (:data:`RUN_FILES`); anything else is an error naming the path.
* **One writer.** :class:`RunLock` holds an exclusive ``flock`` on ``.lock`` for the whole run; the
  operating system releases it when the process ends, however it ends. A second writer gets an
  error naming the holder's pid.
* **Whole files.** :func:`write_text_atomic` and :func:`replace_atomic` write to a temporary file in
  the same directory, fsync it and ``os.replace`` it over the target, then fsync the directory:
  a reader sees the old file or the new one, never a torn one. :func:`remove_stale_temporaries`
  deletes what a killed writer left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import UsageError

MARKER = ".softtopk-run"
LOCK = ".lock"
#: every file a training run writes into its directory (and may replace)
RUN_FILES = ("config.json", "metrics.jsonl", "metrics.csv", "checkpoint.pt", "best.pt", "results.json",
             "curves.png", MARKER, LOCK)
_TEMPORARY = ".softtopk-tmp-"


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[Path]:
    handle, name = tempfile.mkstemp(prefix=f"{_TEMPORARY}{path.name}.", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        yield temporary
    finally:
        temporary.unlink(missing_ok=True)


def replace_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Create ``path`` by ``write(temporary)`` (a file beside it), then atomically put it in place.

    Raises:
        UsageError: the disk is full or the directory cannot be written (the old file stays).
    """
    path = Path(path)
    try:
        with _temporary_beside(path) as temporary:
            write(temporary)
            with open(temporary, "rb+") as stream:
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        fsync_directory(path.parent)
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error} (the previous file, if any, is intact)") \
            from None


def write_text_atomic(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically (see :func:`replace_atomic`)."""
    replace_atomic(path, lambda temporary: temporary.write_text(text))


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files a killed writer left in ``directory``; returns them."""
    stale = sorted(Path(directory).glob(f"{_TEMPORARY}*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def owned(directory: Path) -> bool:
    """Whether ``directory`` carries a readable ``softtopk`` run marker."""
    try:
        return "run_id" in json.loads((Path(directory) / MARKER).read_text())
    except (OSError, ValueError, TypeError):
        return False


def claim(directory: Path, command: str) -> None:
    """Mark ``directory`` as a run of ``command`` written by softtopk (a fresh run id)."""
    marker = {"run_id": uuid.uuid4().hex, "command": command, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_text_atomic(Path(directory) / MARKER, json.dumps(marker) + "\n")


def check_new_run_directory(directory: Path, flag: str) -> None:
    """Refuse to start a run in ``directory`` over files it did not write.

    Raises:
        UsageError: ``directory`` is a file, holds a finished or started run, or holds a file a run
            would overwrite without the softtopk marker.
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{flag} {directory}: is a file, not a directory")
    if (directory / "checkpoint.pt").exists() or (directory / "results.json").exists():
        raise UsageError(f"{flag} {directory}: already holds a run (use --resume {directory} to continue it, "
                         f"or another {flag})")
    clashes = [name for name in RUN_FILES if name not in (MARKER, LOCK) and (directory / name).exists()]
    if clashes and not owned(directory):
        raise UsageError(f"{flag} {directory}: holds {', '.join(clashes)} not written by softtopk; "
                         f"choose another {flag}")


class RunLock:
    """An exclusive lock on a run directory for as long as this object lives (or :meth:`release`).

    Raises:
        UsageError: another process holds the lock (its pid is named).
    """

    def __init__(self, directory: Path, flag: str) -> None:
        path = Path(directory) / LOCK
        try:
            self._stream = open(path, "a+")
        except OSError as error:
            raise UsageError(f"{flag} {directory}: cannot be written ({error.strerror or error})") from None
        try:
            fcntl.flock(self._stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._stream.seek(0)
            holder = self._stream.read().strip() or "unknown"
            self._stream.close()
            raise UsageError(f"{flag} {directory}: in use by another softtopk process (pid {holder}); "
                             f"wait for it to end or choose another {flag}") from None
        self._stream.seek(0)
        self._stream.truncate()
        self._stream.write(f"{os.getpid()}\n")
        self._stream.flush()

    def release(self) -> None:
        """Release the lock (also done by the operating system when the process ends)."""
        if not self._stream.closed:
            fcntl.flock(self._stream.fileno(), fcntl.LOCK_UN)
            self._stream.close()
