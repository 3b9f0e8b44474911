"""What a benchmark result records about the machine and the code it ran on (shared by the scripts)."""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, glibc's malloc.h
_STEADY_BYTES = 1 << 30


def steady_malloc() -> str:
    """Keep glibc from returning freed tensor memory to the kernel; returns what was set.

    With its default, adaptive thresholds glibc may unmap or trim a freed 1 MB tensor and fault the
    next one in page by page. On this machine's VM that costs about 0.8 ms per 1 MB allocation
    (measured while writing this: 468 page faults per two-operation step), a cost that comes and
    goes between runs and dwarfs the kernels. Fixed thresholds of 1 GiB keep freed memory in the
    heap, as PyTorch's CPU tuning guide's advice to use jemalloc/tcmalloc does; every candidate of
    a run, the baseline included, runs under the same setting. A no-op without glibc.
    """
    name = ctypes.util.find_library("c")
    if name is None or not hasattr(ctypes.CDLL(name), "mallopt"):
        return "default (no glibc mallopt)"
    libc = ctypes.CDLL(name)
    ok = libc.mallopt(_M_MMAP_THRESHOLD, _STEADY_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, _STEADY_BYTES)
    return "glibc mmap and trim thresholds 1 GiB (mallopt)" if ok else "default (mallopt refused)"


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
        # a copied tree (benchmarks/run_gpu.sh on a lent GPU) names its commit in SOFTTOPK_COMMIT: its
        # .git, if any, may be an older one's
        "git_commit": os.environ.get("SOFTTOPK_COMMIT") or git("rev-parse", "--short", "HEAD"),
        "git_src_dirty": bool(git("status", "--porcelain", "src")),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def provenance(info: dict, *packages: str) -> str:
    """The opening of a result's first line, from :func:`machine_info`: the command as run, the CPU,
    the versions of ``packages`` (keys of ``info``), softtopk's commit (``(src modified)`` where
    ``src`` was dirty) and the date."""
    dirty = " (src modified)" if info["git_src_dirty"] else ""
    command = " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    versions = "".join(f", {name} {info[name]}" for name in packages)
    return f"`{command}`: {info['cpu_model']}{versions}, softtopk commit {info['git_commit']}{dirty}, {info['date']}"
