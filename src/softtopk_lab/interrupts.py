"""Ctrl-C at a moment the run can name: a SIGINT during a checkpoint write is raised after it, and
one that Python drops is raised at the next step."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

# a SIGINT seen by :func:`ctrl_c_checked`'s handler (or held by :func:`interrupt_after`)
_PENDING = threading.Event()


@contextlib.contextmanager
def interrupt_after() -> Iterator[None]:
    """Hold a SIGINT that arrives inside the block and raise its ``KeyboardInterrupt`` after it
    (only in the main thread, where Python runs signal handlers)."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    caught: list[int] = []

    def hold(signum: int, frame: object) -> None:
        caught.append(signum)
        _PENDING.set()

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _raise_and_remember(signum: int, frame: object) -> None:
    _PENDING.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_checked() -> Iterator[None]:
    """Within the block a SIGINT raises ``KeyboardInterrupt`` as Python's default handler does, and
    is remembered, so that :func:`raise_pending` raises it again at the next step when Python
    dropped it: an exception raised inside a finaliser (``__del__``, a weakref callback) is printed
    as "Exception ignored" and lost, and the run would go on. Only in the main thread, and only
    over Python's default handler (another handler is the embedding program's business)."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _PENDING.clear()
    previous = signal.signal(signal.SIGINT, _raise_and_remember)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _PENDING.clear()


def raise_pending() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT arrived inside :func:`ctrl_c_checked` (a no-op after
    one that propagated: the run has stopped by then)."""
    if _PENDING.is_set():
        raise KeyboardInterrupt
