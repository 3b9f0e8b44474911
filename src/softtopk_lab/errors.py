"""The two errors the ``softtopk`` command line prints as one line ``softtopk <command>: error: <message>``
(exit status 2); any other exception keeps its traceback."""

from __future__ import annotations


class UsageError(Exception):
    """A flag value that is refused; the message names the flag."""


class DataError(ValueError):
    """A data file or package is missing or does not have the expected format; the message names the
    file or package, never a flag (the command line adds the flag where one gave the path)."""
