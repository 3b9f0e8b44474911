"""Where the JAX tests' time goes: XLA compiles per test, counted with ``jax.monitoring``.

Usage::

    python benchmarks/jax_test_compiles.py          # ~3 min -> results/jax_test_compiles.md

Runs the JAX test files in this process, serially (no xdist), with a pytest plugin that adds up,
per test, the backend compiles JAX reports (``/jax/core/compile/backend_compile_duration``) and
their seconds; the table lists the wall time of the run, the compile total, how the compiles
split by duration, and the tests that compile longest. Compiles are what make the JAX tests
slow (issue 23 asks for them to take under 20% of the suite's time); each operator compiles once
per shape, dtype and static argument (``benchmarks/bench_jax_compile.py`` times single programs).
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import pytest
from _machine import machine_info, provenance

ROOT = Path(__file__).resolve().parent.parent
FILES = ("test_jax.py", "test_jax_compat.py", "test_jax_mirror.py", "test_jax_sorting.py", "test_jax_torch.py")
_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileCounter:
    """A pytest plugin: backend compiles and their seconds per test (node id)."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.count: collections.Counter[str] = collections.Counter()
        self.durations: list[float] = []
        self.current = "(collection)"

    def pytest_configure(self, config) -> None:
        from jax import monitoring

        monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **_) -> None:
        if event == _EVENT:
            self.seconds[self.current] += duration
            self.count[self.current] += 1
            self.durations.append(duration)

    def pytest_runtest_setup(self, item) -> None:
        self.current = item.nodeid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15, help="tests listed (most compile time first)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "jax_test_compiles.md")
    args = parser.parse_args()
    counter = CompileCounter()
    start = time.perf_counter()
    paths = [str(ROOT / "tests" / name) for name in FILES]
    code = pytest.main(["-q", "-p", "no:xdist", *paths], plugins=[counter])
    wall = time.perf_counter() - start
    total = sum(counter.durations)
    info = machine_info("jax")
    lines = [
        "# The JAX tests' XLA compiles",
        "",
        f"{provenance(info, 'jax')}. The five JAX test files, serially in one process (pytest exit code {int(code)}).",
        "",
        f"Wall time {wall:.1f} s; {len(counter.durations)} backend compiles, {total:.1f} s.",
        "",
        "| compile duration | compiles | seconds |",
        "|---|---:|---:|",
    ]
    for low, high in ((0.0, 0.05), (0.05, 0.3), (0.3, 1.0), (1.0, float("inf"))):
        picked = [d for d in counter.durations if low <= d < high]
        lines.append(f"| {low:g}–{high:g} s | {len(picked)} | {sum(picked):.1f} |")
    lines += ["", "| test | compiles | seconds |", "|---|---:|---:|"]
    for test, seconds in counter.seconds.most_common(args.top):
        lines.append(f"| `{test}` | {counter.count[test]} | {seconds:.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
