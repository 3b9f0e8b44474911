r"""Optional CPU kernels of the isotonic solver: Pool-Adjacent-Violators row by row, compiled by numba.

PAV is sequential and ``O(n)`` per row (Blondel et al., ICML 2020; torchsort's C++ kernel runs
the same algorithm). Where numba is installed and a tensor's values may be read
(:func:`softtopk.ops.compute.can_inspect`: a CPU tensor, eager, outside ``vmap``),
:mod:`softtopk.ops.isotonic` calls these kernels instead of its rounds of tensor operations;
everywhere else (accelerators, ``torch.compile``, ``vmap``, or no numba) the pure-torch solver
runs, and it is the reference the tests hold these kernels to. The environment variable
``SOFTTOPK_NUMBA=0`` (read at import) turns the kernels off. The first call in a process imports
numba and compiles the kernels, or loads them from numba's on-disk cache in later processes: a
one-time start-up of seconds (``docs/methods/sorting.md``), then one call per pass.

The kernels themselves are in :mod:`softtopk.ops.isotonic_kernels` (imported at the first call):

* :func:`pav_l2`, :func:`pav_kl`: the two isotonic problems of :mod:`softtopk.ops.isotonic`, solved
  row by row by PAV with a stack of blocks;
* :func:`run_sums`: the sum of ``values`` over each point's block (a run of equal block ids), the
  block reductions of the tensor backward on CPU rows;
* :func:`sorted_rows`: the rows sorted by a radix sort of their float bits, with no comparison
  to mispredict (``O(n)``; several times faster than ``torch.sort`` on a CPU,
  ``benchmarks/results/soft_sort.md``);
* :func:`rank`, :func:`rank_grad`, :func:`sort`, :func:`sort_grad`: the whole forward of
  :class:`softtopk.ops.permutahedron.SoftRankFn` and :class:`~softtopk.ops.permutahedron.SoftSortFn`
  on finite sorted rows, and their backward without a strength gradient, one pass each instead of
  a dozen tensor operations.

Adjacent blocks with equal values are pooled, as the torch solver pools them, so the blocks of a
solution are its runs of equal values either way.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import Any

import torch

from . import compute, triton_gate
from .compute import can_inspect

ENABLED = os.environ.get("SOFTTOPK_NUMBA") != "0"
_FLOATS = (torch.float32, torch.float64)  # the dtypes the kernels are compiled for


def _load() -> Any:
    return importlib.import_module(".isotonic_kernels", __package__)  # imports numba


@functools.cache
def _kernels() -> Any:
    if not ENABLED or importlib.util.find_spec("numba") is None:
        return None
    try:
        return _load()
    except (ImportError, RuntimeError, OSError) as error:  # e.g. a numba that does not support the
        # installed numpy, or no writable place for its cache: the tensor solver, with a word why
        warnings.warn(
            f"softtopk: numba is installed but its kernels could not be loaded ({type(error).__name__}: "
            f"{error}); soft_sort/soft_rank use the tensor solver (SOFTTOPK_NUMBA=0 silences this)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def available() -> bool:
    """Whether the kernels can run: numba is installed and importable, and ``SOFTTOPK_NUMBA`` is
    not ``"0"``. The callers decide where (:func:`softtopk.ops.compute.can_inspect` on their
    tensors)."""
    return _kernels() is not None


def usable_rows(x: torch.Tensor) -> bool:
    """Whether a CPU numba kernel may take the tensor ``x``: float32 or float64 rows that take the
    CPU steps (:func:`softtopk.ops.compute.on_cpu`), eager and of no ``torch.func`` transform (NumPy
    cannot see such a tensor's storage), values that may be read, no
    :func:`softtopk.ops.triton_gate.torch_path` block, and the kernels :func:`available`. What the
    numba kernels share (``lapsum_numba``, ``label_select``, ``networks_numba``, ``noised_numba``);
    each caller adds its scope and, last, its size rule (which may read the thread count, a call
    Dynamo cannot trace: this check says no while compiling first)."""
    if torch.compiler.is_compiling() or not (x.dtype in _FLOATS and compute.on_cpu(x)):
        return False
    if torch._C._functorch.is_functorch_wrapped_tensor(x):
        return False
    return triton_gate.KERNELS and can_inspect(x) and available()


def _kernel(name: str):
    kernels = _kernels()
    if kernels is None:  # a caller that skipped available(): a bug of the library, not of its user
        raise RuntimeError("softtopk.ops.isotonic_numba called without its kernels (check available() first)")
    return getattr(kernels, name)


def numpy_rows(t: torch.Tensor):
    """A CPU tensor's values as a C-contiguous NumPy array for the kernels (a view where it can be)."""
    return (t.detach() if t.requires_grad else t).contiguous().numpy()


def _per_row(value: float | torch.Tensor, rows: int):
    """A float or a (B, 1) tensor as a float64 array of one value per row."""
    if isinstance(value, torch.Tensor):
        return numpy_rows(value.to(torch.float64).reshape(-1).expand(rows))
    return torch.full((rows,), value, dtype=torch.float64).numpy()


def _out(like: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """An output of ``like``'s shape, in ``dtype`` where NumPy has it (float32 or float64)."""
    return torch.empty(like.shape, dtype=dtype if dtype in (torch.float32, torch.float64) else torch.float64)


# the shortest rows the radix sort takes: below, torch.sort's comparisons cost less than its passes
# over 256 buckets (one a byte: 4 for float32, 8 for float64; benchmarks/results/cpu_steps.md)
_RADIX_MIN = {torch.float32: 48, torch.float64: 160}


def radix_pays(x: torch.Tensor) -> bool:
    """Whether :func:`sorted_rows` may sort the rows ``x`` and is faster there than ``torch.sort``:
    the kernels are available, ``x``'s values may be read (:func:`~softtopk.ops.compute.can_inspect`)
    and its float32 or float64 rows are long enough."""
    return x.shape[-1] >= _RADIX_MIN.get(x.dtype, torch.inf) and can_inspect(x) and available()


def sorted_rows(x: torch.Tensor, sign: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``sign * x`` of the float32 or float64 CPU rows ``x`` (B, n) sorted in decreasing order, in
    float64, and the permutation: a radix sort of the float bits (``isotonic_kernels.sorted_rows``;
    ties in their order in the row)."""
    values = numpy_rows(x)
    s, perm = torch.empty(x.shape, dtype=torch.float64), torch.empty(x.shape, dtype=torch.int64)
    _kernel("sorted_rows")(*_kernel("sort_keys")(values), values, sign, perm.numpy(), s.numpy())
    return s, perm


def pav_l2(y: torch.Tensor) -> torch.Tensor:
    """The decreasing l2 isotonic fit of the float64 CPU rows ``y`` (B, n)."""
    out = _out(y)
    _kernel("pav_l2")(numpy_rows(y), out.numpy())
    return out


def pav_kl(y: torch.Tensor, lw: torch.Tensor) -> torch.Tensor:
    """The decreasing kl isotonic solution of the float64 CPU rows ``y``, ``lw`` (B, n)."""
    out = _out(y)
    _kernel("pav_kl")(numpy_rows(y), numpy_rows(lw), out.numpy())
    return out


def run_sums(values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The sum of the float64 CPU ``values`` (B, n) over each point's run of equal ``ids`` (B, n)."""
    out = _out(values)
    _kernel("run_sums")(numpy_rows(ids), numpy_rows(values), out.numpy())
    return out


def rank(s: torch.Tensor, perm: torch.Tensor, eps: float | torch.Tensor, kl: bool, dtype: torch.dtype):
    """Soft ranks of the finite float64 rows ``s`` (B, n) sorted decreasingly by ``perm``, with
    strength ``eps`` (a float or (B, 1)): the ranks in the rows' order (in ``dtype``, or float64
    where NumPy has no such dtype), and ``r``, ``v``, ``θ`` in sorted order, float64
    (:class:`softtopk.ops.permutahedron.SoftRankFn`)."""
    out, r, v, theta = _out(s, dtype), _out(s), _out(s), _out(s)
    arrays = (out.numpy(), r.numpy(), v.numpy(), theta.numpy())
    _kernel("rank_forward")(numpy_rows(s), numpy_rows(perm), _per_row(eps, s.shape[0]), kl, *arrays)
    return out, r, v, theta


def rank_grad(grad, perm, v, r, kl: bool, scale: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``∂x`` of :func:`rank` from ``grad`` (B, n) in the rows' order, times ``scale`` (``sign/ε``)."""
    out = _out(v, dtype)
    args = (numpy_rows(_wide(grad)), numpy_rows(perm), numpy_rows(v), numpy_rows(r), kl, _per_row(scale, v.shape[0]))
    _kernel("rank_backward")(*args, out.numpy())
    return out.to(dtype)


def sort(s: torch.Tensor, eps: float | torch.Tensor, kl: bool, sign: float, dtype: torch.dtype):
    """Soft sorts of the finite float64 rows ``s`` (B, n), sorted decreasingly: the values in
    sorted order times ``sign`` (in ``dtype`` as :func:`rank`), and ``v``
    (:class:`softtopk.ops.permutahedron.SoftSortFn`)."""
    h, v = _out(s, dtype), _out(s)
    _kernel("sort_forward")(numpy_rows(s), _per_row(eps, s.shape[0]), kl, sign, h.numpy(), v.numpy())
    return h, v


def sort_grad(grad, perm, v, s, kl: bool, dtype: torch.dtype) -> torch.Tensor:
    """``∂x`` of :func:`sort` from ``grad`` (B, n) in sorted order, in the rows' order."""
    out = _out(v, dtype)
    _kernel("sort_backward")(numpy_rows(_wide(grad)), numpy_rows(perm), numpy_rows(v), numpy_rows(s), kl, out.numpy())
    return out.to(dtype)


def _wide(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` as float32 or float64, the kernels' dtypes."""
    return grad if grad.dtype in (torch.float32, torch.float64) else grad.to(torch.float64)
