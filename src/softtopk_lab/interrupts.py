"""Ctrl-C at a moment the run can name: a SIGINT during a checkpoint write is raised after it."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def interrupt_after() -> Iterator[None]:
    """Hold a SIGINT that arrives inside the block and raise its ``KeyboardInterrupt`` after it
    (only in the main thread, where Python runs signal handlers). A process that ignores SIGINT (a
    shell without job control starts its background commands so) keeps ignoring it here too."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (None, signal.SIG_IGN):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
