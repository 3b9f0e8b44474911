"""How the lab writes a file: never through a link, only a regular file, whole, with the user's umask.

* **No links.** :func:`open_for_writing` opens with ``O_NOFOLLOW`` (a planted symbolic link is an
  error naming it; its target is not touched) and ``O_NONBLOCK`` (a planted FIFO cannot hang the
  run), then refuses anything that is not a regular file. Where the platform has no ``O_NOFOLLOW``
  (Windows) the link is refused by a check before the open.
* **Whole files.** :func:`replace_atomic` and :func:`write_text_atomic` write a fresh temporary
  file beside the target (created with ``O_EXCL``: never an existing file or link), fsync it and
  ``os.replace`` it over the target (a link there is replaced, not followed), then fsync the
  directory: a reader sees the old file or the new one, never a torn one.
  :func:`remove_stale_temporaries` deletes what a killed writer left behind.
* **Permissions.** Every file is created with mode ``0o666`` less the umask, as ``open()`` does.
* **One line for a full disk.** ``OSError`` and torch's zip writer failures (``RuntimeError``
  ``[enforce fail at inline_container.cc] . unexpected pos``) become a :class:`UsageError`.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import UsageError

TEMPORARY = ".softtopk-tmp-"
_NOFOLLOW, _NONBLOCK = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_NONBLOCK", 0)
_EXTRA = _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
#: errno of an ``O_NOFOLLOW`` open of a link: ELOOP (Linux, macOS), EMLINK (FreeBSD), EFTYPE (NetBSD)
_LINK_ERRORS = {errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", errno.ELOOP)}
#: words of the RuntimeError torch's zip writer raises when a write fails (a full disk)
_TORCH_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "unexpected pos", "file write failed")


def open_for_writing(path: Path, flags: int) -> int:
    """``os.open(path, flags, 0o666)`` (umask applied) without following a link; a descriptor of a regular file.

    Raises:
        UsageError: ``path`` is a symbolic link or not a regular file (nothing was written).
        OSError: any other failure of the open (the caller names what it was writing).
    """
    if not _NOFOLLOW and os.path.islink(path):
        raise _link_error(path)
    try:
        handle = os.open(path, flags | _EXTRA, 0o666)
    except OSError as error:
        if error.errno in _LINK_ERRORS and os.path.islink(path):
            raise _link_error(path) from None
        raise
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise UsageError(f"{path} is not a regular file; softtopk writes only files it creates (remove it)")
    if _NONBLOCK:
        os.set_blocking(handle, True)
    return handle


def _link_error(path: Path) -> UsageError:
    return UsageError(f"{path} is a symbolic link; softtopk never writes through a link (remove it)")


def write_failure(path: Path, error: BaseException, after: str) -> UsageError:
    """The one-line error of a failed write of ``path`` (``after``: what the user can rely on)."""
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).strip().splitlines()[0]
    if isinstance(error, RuntimeError):
        reason = f"the disk is full or the file system refused the write ({reason[:120]})"
    return UsageError(f"cannot write {path}: {reason} ({after})")


def is_write_failure(error: BaseException) -> bool:
    """Whether ``error`` is a failed write: an ``OSError`` or torch's zip writer failing."""
    return isinstance(error, OSError) or (
        isinstance(error, RuntimeError) and any(word in str(error) for word in _TORCH_WRITE_FAILURES)
    )


def append_text(path: Path, text: Callable[[bool], str]) -> None:
    """Append ``text(empty)`` to ``path`` (created if missing; ``empty``: whether it is still empty)."""
    handle = open_for_writing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(handle, "a", encoding="utf-8") as stream:
        stream.write(text(os.fstat(handle).st_size == 0))


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened: Windows)."""
    if os.name == "nt":
        return
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def replace_atomic(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Create ``path`` by ``write(stream)`` into a fresh file beside it, then atomically put it in place.

    Raises:
        UsageError: the disk is full or the directory cannot be written (the old file stays).
    """
    path = Path(path)
    temporary, created = path.parent / f"{TEMPORARY}{path.name}.{secrets.token_hex(6)}", []

    def create(name: str, flags: int) -> int:
        handle = open_for_writing(Path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        created.append(name)
        return handle

    try:
        try:
            with open(temporary, "wb", opener=create) as stream:  # stream.name: the temporary's path
                write(stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        finally:
            if created and os.path.lexists(temporary):
                os.unlink(temporary)
        fsync_directory(path.parent)
    except (OSError, RuntimeError) as error:
        if not is_write_failure(error):
            raise
        raise write_failure(path, error, "the previous file, if any, is intact") from None


def write_text_atomic(path: Path, text: str) -> None:
    """``path.write_text(text)`` in UTF-8, atomically (see :func:`replace_atomic`)."""
    replace_atomic(path, lambda stream: stream.write(text.encode("utf-8")))


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete the temporary files a killed writer left in ``directory``; returns them.

    Raises:
        UsageError: something named like a temporary is a directory (softtopk never made it).
    """
    stale = sorted(Path(directory).glob(f"{TEMPORARY}*"))
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            raise UsageError(
                f"{path} is a directory named like a softtopk temporary file; softtopk did not make "
                "it and leaves it alone (move it out of the run directory)"
            )
    for path in stale:
        path.unlink(missing_ok=True)  # a link itself, never its target
    return stale
