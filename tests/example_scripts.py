"""Shared by the examples' smoke tests: run a script of ``examples/`` from the repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<name>`` with ``flags`` (cwd: the repository root), capturing its output."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), *flags], cwd=EXAMPLES.parent, capture_output=True, text=True, timeout=120
    )
