"""Check commit messages against the convention of CONTRIBUTING.md.

A message is a subject of at most 72 characters in the imperative mood ("Add", "Fix", "Move", not
"Added" or "Fixes"; an ``area:`` prefix is allowed), without a final period, then a blank line, then
a body that says why. Merge commits are skipped.

Usage::

    python scripts/check_commits.py main..HEAD      # the commits of a branch
    python scripts/check_commits.py -n 5            # the last five commits

Exit status 1 and one line per problem when a message breaks the convention.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

MAX_SUBJECT = 72
_PREFIX = re.compile(r"^[\w./-]+: ")  # an optional area, e.g. "docs: " or "benchmarks/bench_gpu.py: "
# third-person forms whose final "s" is part of the stem, not the verb's ending
_STEM_S = ("ss", "us", "is", "ys")


def _not_imperative(word: str) -> bool:
    word = word.lower()
    if word.endswith(("ed", "ing")):
        return True
    return word.endswith("s") and not word.endswith(_STEM_S) and len(word) > 3


def problems(message: str) -> list[str]:
    """What is wrong with one commit ``message`` (empty when it follows the convention)."""
    lines = message.rstrip("\n").split("\n")
    subject = lines[0]
    found = []
    if not subject.strip():
        return ["empty subject"]
    if len(subject) > MAX_SUBJECT:
        found.append(f"subject has {len(subject)} characters (at most {MAX_SUBJECT})")
    if subject.rstrip().endswith("."):
        found.append("subject ends with a period")
    first = _PREFIX.sub("", subject).split()[0].strip(",:")
    if _not_imperative(first):
        found.append(f"subject starts with {first!r}: use the imperative mood ('Add', 'Fix', 'Move')")
    if len(lines) < 2 or lines[1].strip():
        found.append("no blank line after the subject")
    if not any(line.strip() for line in lines[2:]):
        found.append("no body saying why")
    return found


def _messages(args: list[str]) -> list[tuple[str, str]]:
    """``(short hash, message)`` of the non-merge commits ``git log args`` lists."""
    log = subprocess.run(
        ["git", "log", "--no-merges", "--format=%h%x00%B%x00", *args], capture_output=True, text=True, check=True
    ).stdout
    fields = log.split("\0")
    return [(fields[i].strip(), fields[i + 1]) for i in range(0, len(fields) - 1, 2)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("range", nargs="?", help="a git revision range, e.g. main..HEAD")
    parser.add_argument("-n", type=int, help="check the last N commits")
    args = parser.parse_args(argv)
    if args.range is None and args.n is None:
        parser.error("give a revision range (main..HEAD) or -n N")
    log_args = ([args.range] if args.range else []) + ([f"-{args.n}"] if args.n else [])
    bad = 0
    for commit, message in _messages(log_args):
        for problem in problems(message):
            print(f"{commit} {message.splitlines()[0][:60]!r}: {problem}")
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
