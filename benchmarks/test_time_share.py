"""The JAX tests' share of the test suite's time, from per-test durations (issue 23: under 20%).

Usage::

    python benchmarks/test_time_share.py                 # runs the suite (~7 min) -> results/test_time_share.md
    python benchmarks/test_time_share.py --junit run.xml  # reads a finished run's JUnit report

Runs the suite as the README's test command does (``pytest -n 2``) with a JUnit report, then adds
up each test file's durations (a test's setup, call and teardown, as pytest reports them). The
share is the JAX files' sum over the whole suite's sum: the durations of the two workers add up,
so it is the share of the CPU time the suite's tests hold, whichever worker ran them. The table
lists the JAX files and the files that take longest. XLA compiles with the suite's options
(tests/conftest.py) unless ``XLA_FLAGS`` is set (``XLA_FLAGS= python ...``: XLA's defaults).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from _machine import machine_info, provenance
from jax_test_compiles import FILES

ROOT = Path(__file__).resolve().parent.parent


def file_seconds(junit: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Seconds and test counts per test file (``tests/test_x.py``) in a JUnit report."""
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").split(".")
        name = f"{'/'.join(path[:2])}.py" if len(path) >= 2 else case.get("file", "?")
        seconds[name] += float(case.get("time", 0.0))
        count[name] += 1
    return seconds, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, help="a finished run's JUnit XML (default: run the suite)")
    parser.add_argument("--top", type=int, default=10, help="slowest files listed besides the JAX ones")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "test_time_share.md")
    args = parser.parse_args()
    info = machine_info("jax")
    junit = args.junit
    if junit is not None:
        how = f"read from `{junit.name}`"
    else:
        junit = Path(tempfile.mkdtemp()) / "suite.xml"
        command = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        code = subprocess.run(command, cwd=ROOT).returncode
        flags = os.environ.get("XLA_FLAGS")
        options = "tests/conftest.py's" if flags is None else f"`XLA_FLAGS={flags!r}`"
        how = f"`pytest -n 2 -q` run by the script (exit code {code}), XLA compiler options {options}"
    seconds, count = file_seconds(junit)
    total = sum(seconds.values())
    jax = sum(seconds[f"tests/{name}"] for name in FILES)
    lines = [
        "# The JAX tests' share of the suite's time",
        "",
        f"{provenance(info, 'jax')}; {how}.",
        "",
        f"Tests' durations add up to {total:.0f} s over {sum(count.values())} tests; the five JAX files "
        f"take {jax:.0f} s, **{100 * jax / total:.1f}%** (issue 23's target: under 20%).",
        "",
        "| file | tests | seconds | share |",
        "|---|---:|---:|---:|",
    ]
    listed = [f"tests/{name}" for name in FILES]
    listed += [name for name, _ in seconds.most_common() if name not in listed][: args.top]
    for name in listed:
        lines.append(f"| `{name}` | {count[name]} | {seconds[name]:.1f} | {100 * seconds[name] / total:.1f}% |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
