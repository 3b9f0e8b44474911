"""What a benchmark result records about the machine and the code it ran on (shared by the scripts)."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info(*packages: str) -> dict:
    """CPU model, core count, torch/python versions and threads, git commit (and whether ``src`` was
    dirty), date, and the installed versions of softtopk and ``packages``."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **{name: dist_version(name) for name in ("softtopk", *packages)},
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_src_dirty": bool(git("status", "--porcelain", "src")),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
