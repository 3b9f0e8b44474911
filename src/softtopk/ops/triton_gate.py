"""When softtopk's optional Triton kernels run (:mod:`softtopk.ops.lapsum_triton`,
:mod:`softtopk.ops.sparse_triton`, :mod:`softtopk.ops.networks_triton`,
:mod:`softtopk.ops.neuralsort_triton`): on an NVIDIA GPU of compute capability 8.0 or more with
triton installed, for a CUDA tensor outside ``torch.compile`` (Inductor fuses the torch path
itself) and ``vmap``, unless the environment variable ``SOFTTOPK_TRITON`` is ``"0"``. The torch
path stays the reference and the path on every other device."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator

import torch


def switched_on(setting: str | None) -> bool:
    """Whether the kernels may run, from the value of ``SOFTTOPK_TRITON``: unless it is ``"0"``."""
    return setting != "0"


ENABLED = switched_on(os.environ.get("SOFTTOPK_TRITON"))


KERNELS = True  # False inside torch_path(): no Triton kernel, nor the CPU mask's numba kernels


@contextlib.contextmanager
def torch_path() -> Iterator[None]:
    """Within the block every operator takes the torch path (to compare it with the kernels): no
    Triton kernel, nor the Laplace mask's numba kernels (:mod:`softtopk.ops.lapsum_numba`)."""
    global ENABLED, KERNELS
    saved, ENABLED, KERNELS = (ENABLED, KERNELS), False, False
    try:
        yield
    finally:
        ENABLED, KERNELS = saved


# the modules of the Triton kernels (softtopk.ops.<name>, each importing triton), imported only by
# their launchers, where a kernel runs
KERNEL_MODULES = (
    "lapsum_kernels",
    "sparse_kernels",
    "networks_kernels",
    "neuralsort_kernels",
    "softsort_kernels",
    "svm_kernels",
    "pav_kernels",
    "permutahedron_kernels",
    "select_kernels",
    "ce_head_kernels",
    "noised_kernels",
    "reduce_kernels",
)
KERNEL_HELPERS = ("triton_steps",)  # triton.jit helpers those modules share, never launched

BLOCK = 1024  # entries per step of a row pass


def lanes(n: int, least: int = 16) -> int:
    """The lanes of a block holding ``n`` entries: the smallest power of 2 at least ``n`` and at
    least ``least`` (a power of 2)."""
    return 1 << (max(n, least) - 1).bit_length()


def rank_block(k: int) -> int:
    """Ranks a program takes at once, of ``k``: ``k`` rounded up to a power of 2 (at least 2), at
    most 16."""
    return min(16, lanes(k, 2))


def chunking(n: int, least: int) -> tuple[int, int]:
    """``(entries, chunks)``: rows of ``n`` entries cut into chunks of ``least`` entries, or of the
    power of 2 that keeps them at most 65535 (the limit of a grid's second and third axes)."""
    entries = max(least, 1 << (-(-n // 65535) - 1).bit_length())
    return entries, -(-n // entries)


def block_for(n: int) -> int:
    """Entries per step of a pass over rows of ``n``: ``n`` rounded up to a power of 2 (at least
    16), at most :data:`BLOCK` (short rows, e.g. 64 experts, waste no lanes)."""
    return min(BLOCK, lanes(n))


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _supported(device: torch.device) -> bool:
    """An NVIDIA GPU of compute capability 8.0 or more, the hardware Triton supports (the kernels
    were run on Hopper only; ROCm builds keep the torch path)."""
    return torch.version.hip is None and torch.cuda.get_device_capability(device) >= (8, 0)


def usable(x: torch.Tensor, k: object = 0, scale: object = 0.0) -> bool:
    """Whether an operator hands rows ``x`` to its kernels: enabled, triton installed, a CUDA
    tensor outside compile and vmap on a supported GPU, an int ``k`` and a float scale (the Laplace
    mask's ``τ``, the sparse mask's ``λ``, the networks' steepness; an operator with neither, such
    as PAV, leaves them out)."""
    if not (ENABLED and x.is_cuda and isinstance(k, int) and isinstance(scale, float)):
        return False
    if torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(x):
        return False
    return _has_triton() and _supported(x.device)
