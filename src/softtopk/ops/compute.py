"""How the row kernels compute: the compute dtype of a score dtype, whether a tensor's values may
be read on the host for an argument check, the largest entries of rows, writing entries into fresh
rows, putting sorted rows back in order, scans that compile on every backend, constants kept on
the device, and functions marked as constant for ``torch.compile``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

# e^z = 2^(z log2 e): on the CPU ATen's exp2 kernel is vectorised where its exp is not; a scale the
# kernel applies anyway takes the factor, so the roundings stay those of e^z
LOG2E = 1.0 / math.log(2.0)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype scores are computed in: float64 stays float64, every other float becomes float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def can_inspect(value: torch.Tensor) -> bool:
    """Whether values of a tensor may be read on the host: only for a CPU tensor (on an
    accelerator a read is a synchronisation), and not while compiling or inside vmap. Argument
    checks ask it; so do the CPU shortcuts that read (the sparse solver's candidate count, the
    isotonic solver's rounds of pooling or numba kernels), whose fixed-shape paths read nothing, on
    any device. Both vmaps count: ``torch.func.vmap`` and the one of ``autograd.grad(...,
    is_grads_batched=True)`` and ``jacobian(..., vectorize=True)``."""
    if value.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(value):  # e.g. vmap(grad(f)): a batch inside a grad level
        if functorch.is_batchedtensor(value):
            return False
        value = functorch.get_unwrapped(value)
    return not functorch.is_legacy_batchedtensor(value)


def on_cpu(x: torch.Tensor) -> bool:
    """Whether a step takes its CPU variant: the same values by other ATen calls, faster on a CPU
    and more launches on an accelerator (:func:`topk_rows`, :func:`sort_rows`, :func:`row_dot`,
    :func:`muladd_rows`)."""
    return x.device.type == "cpu"


def topk_rows(x: torch.Tensor, k: int, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, -1, largest)``'s ``(values, indices)``, sorted.

    On the CPU, where it pays (:func:`_block_group`), through strided blocks: the row as ``w = n / g``
    blocks ``{j, j + w, ..., j + (g - 1) w}`` of ``g`` entries, the ``k`` blocks with the largest
    maxima, and the top ``k`` of their ``g k`` entries. The kept maxima are ``k`` distinct entries,
    so the k-th largest is at least the smallest of them, which bounds every entry of the other
    blocks: the same values, ties in either order. A NaN ranks first as in ``topk``; with
    ``largest`` false (through ``-x``, NaN as ``-inf``) last, tied with ``+inf``."""
    n = x.shape[-1]
    group = _block_group(n, k) if on_cpu(x) else None
    if group is None:
        values, index = x.topk(k, -1, largest=largest)
        return values, index
    scores = x if largest else torch.nan_to_num(x.neg(), nan=-torch.inf, posinf=torch.inf, neginf=-torch.inf)
    width = n // group
    kept = scores.unflatten(-1, (group, width)).amax(-2).topk(k, -1, sorted=False).indices
    candidates = (kept.unsqueeze(-1) + torch.arange(0, n, width, device=x.device)).flatten(-2)
    index = candidates.gather(-1, scores.gather(-1, candidates).topk(k, -1).indices)
    return x.gather(-1, index), index


def kth_largest(x: torch.Tensor, k: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k``-th largest entries along ``dim`` (``k`` from 1) and their indices, ``dim`` removed.

    On the CPU the last of ``topk(k)``, several times faster there than ``kthvalue``
    (``benchmarks/results/host_cpu.md``); elsewhere ``kthvalue`` of the ``(n - k + 1)``-th smallest,
    whose launch returns to a CUDA host long before ``topk``'s along a strided ``dim``, which waits
    for the device (``benchmarks/results/host_5c0d181.md``). Equal values; tied entries may give
    either index."""
    if on_cpu(x):
        top = x.topk(k, dim=dim)
        return top.values.select(dim, k - 1), top.indices.select(dim, k - 1)
    return torch.kthvalue(x, x.shape[dim] - k + 1, dim=dim)


def _block_group(n: int, k: int) -> int | None:
    """The entries per block ``g`` of :func:`topk_rows` (a divisor of ``n`` leaving at least ``4 k``
    blocks), or None where one ``topk`` is as fast (measured in ``benchmarks/results/cpu_steps.md``).

    ATen's CPU ``topk`` keeps a partial sort while ``64 k <= n`` and takes ``nth_element``, several
    times slower, above: the blocks pay where the row's own ``topk`` would take ``nth_element``,
    where the ``topk`` of the block maxima keeps the partial sort, and from ``k = 15`` on."""
    for group in (16, 8, 4) if n >= 65536 else (8, 4):
        if n % group == 0 and n >= 4 * group * k:
            return group if 64 * k > n or 64 * k <= n // group or k >= 15 else None
    return None


_KEYS = {torch.float32: torch.int32, torch.float64: torch.int64}


_KEY_SORT_MIN = 64  # shorter rows: the keys' own passes cost more than they save (cpu_steps.md)


def sort_rows(
    x: torch.Tensor, descending: bool = False, stable: bool = False, finite: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.sort(-1, descending, stable)``'s ``(values, indices)``; on the CPU (eager, float32 and
    float64) by sorting integer keys in the same order, which ATen does faster than floats (its
    float comparator places NaN): the bits of ``x + 0`` (``-0`` made ``+0``) with the magnitude
    bits of negative numbers flipped, NaN as the largest key (``finite``: the caller knows ``x``
    holds no NaN); rows shorter than 64 by ``torch.sort`` itself. The same values, and the same
    order among ties as ``torch.sort``'s with ``stable``."""
    keys = _KEYS.get(x.dtype)
    if keys is None or not on_cpu(x) or torch.compiler.is_compiling() or x.shape[-1] < _KEY_SORT_MIN:
        values, index = x.sort(dim=-1, descending=descending, stable=stable)
        return values, index
    largest = torch.iinfo(keys).max
    bits = (x + 0.0).view(keys)
    key = bits ^ ((bits >> (keys.itemsize * 8 - 1)) & largest)
    if not finite:
        key = key.masked_fill_(x.isnan(), largest)
    index = key.sort(dim=-1, descending=descending, stable=stable).indices
    return x.gather(-1, index), index


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``Σ_i a_i b_i`` over the last dim of ``(B, n)`` rows, as ``(B, 1)``: one batched product off
    the CPU, a product and a sum on it (its batched BLAS is slow for one-row products)."""
    if on_cpu(a):
        return torch.linalg.vecdot(a, b).unsqueeze(-1)
    return torch.bmm(a.unsqueeze(-2), b.unsqueeze(-1)).squeeze(-1)


_MULADD_ENTRIES = 1 << 22


def muladd_rows(terms: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, value: float = 1.0) -> torch.Tensor:
    """``shift + value * terms * scale`` for rows ``terms`` (B, n) and per-row ``scale``, ``shift``
    (B, 1): one ``addcmul``, except on the CPU up to ``2^22`` entries, where a product and an
    in-place sum are faster (ATen's CPU ``addcmul`` is slow with two broadcast operands; past the
    cache, its single pass wins)."""
    if on_cpu(terms) and terms.numel() <= _MULADD_ENTRIES:
        return (terms * (scale if value == 1.0 else scale * value)).add_(shift)
    return torch.addcmul(shift, terms, scale, value=value)


_BLOCK_ENTRIES = 1 << 16  # float64 entries of a block of rows of power_sums on the CPU (512 KiB)


def power_sums(y: torch.Tensor, degree: int) -> torch.Tensor:
    """``p_m = Σ_i y_i^m``, ``m = 1..degree``, over the last dim of rows ``y`` ``(R, n)``, in float64:
    ``(R, degree)``, a product and a sum per power. On the CPU (not compiling) by blocks of rows of
    at most ``_BLOCK_ENTRIES`` entries, each power raised in place in one buffer: float64 buffers of
    a whole batch come back from the system page by page, which costs more than the products."""
    in_place = on_cpu(y) and not torch.compiler.is_compiling()
    block = max(1, _BLOCK_ENTRIES // max(1, y.shape[-1]))  # rows
    if in_place and y.dim() == 2 and y.shape[0] > block:
        return torch.cat([power_sums(rows, degree) for rows in y.split(block)])
    base = y.to(torch.float64)
    power = base.clone() if in_place and degree > 1 else base
    sums = [base.sum(-1)]
    for _ in range(1, degree):
        power = power.mul_(base) if in_place else power * base
        sums.append(power.sum(-1))
    return torch.stack(sums, -1)


def horner_step(shift: torch.Tensor, acc: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``shift + acc * y`` for rows ``y`` ``(R, n)`` and per-row ``shift`` ``(R, 1)``, ``acc`` ``(R, 1)``
    or a ``(R, n)`` buffer the caller owns: one ``addcmul``; on the CPU a product and an in-place sum,
    into ``acc`` once it is ``(R, n)`` (a fresh buffer per step of a Horner scheme costs more in
    first-touch page faults than the step)."""
    if not on_cpu(y):
        return torch.addcmul(shift, acc, y)
    return acc.mul_(y).add_(shift) if acc.shape == y.shape else muladd_rows(y, acc, shift)


def owns_rows(fresh: torch.Tensor) -> bool:
    """Whether a tensor the caller has just made may be written in place: not inside a functorch
    transform (``vmap``: its operands may be batched where the buffer is not) and not under
    ``torch.compile``, whose graphs are functional anyway."""
    return not (torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(fresh))


def add_product_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``target += a * b`` in place: one ``addcmul_``; for a tensor of a ``torch.func`` transform a
    product and an ``add_``, since ``addcmul_`` has no batching rule (``vmap`` would run it example
    by example, with a warning)."""
    if not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(target):
        return target.add_(a * b)
    return target.addcmul_(a, b)


def label_row(ranks: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``ranks[b, position[b], :]`` ``(B, k)`` of ranks ``(B, n, k)``: where each row's item at
    ``position`` (B,) lands (top-k cross-entropy's label)."""
    return ranks.gather(-2, position.view(-1, 1, 1).expand(-1, 1, ranks.shape[-1])).squeeze(-2)


def put_rows(fresh: torch.Tensor, index: torch.Tensor, values: torch.Tensor | float, dim: int = -1) -> torch.Tensor:
    """``fresh`` with ``values`` written at ``index`` along ``dim``, for a tensor the caller has just
    made and owns: in place (no copy of the row), except inside a functorch transform (``vmap``),
    where ``scatter_`` has no batching rule, and under ``torch.compile``, whose graphs are
    functional anyway: there the out-of-place ``scatter``."""
    if not owns_rows(fresh):
        return torch.scatter(fresh, dim, index, values)
    return fresh.scatter_(dim, index, values)


def unsort(values: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Put sorted ``values`` back at the positions ``perm`` they came from along the last dim
    (``out[perm] = values``; ``perm`` a permutation per row, so every entry is written): one
    scatter, with no zero-filled buffer to start from."""
    return values.scatter(-1, perm, values)


_SCAN_TILE = 1024


def scan_rows(x: torch.Tensor, op: str = "sum", dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x.cumsum(-1, dtype=dtype)`` (``op="sum"``) or ``x.logcumsumexp(-1)`` (``op="logsumexp"``).

    Under ``torch.compile``, a row of 64-bit values longer than a tile (1024) is scanned as tiles,
    then the running totals of the tiles are added: two short scans. Inductor splits a long scan
    over few rows across thread blocks, and its split scan carries only 32-bit values (a 64-bit one
    fails in its CUDA code generation). Eager calls take the one-line scan."""
    n = x.shape[-1]
    wide = (x.dtype if dtype is None else dtype).itemsize == 8
    if not (torch.compiler.is_compiling() and wide and n > _SCAN_TILE):
        return x.cumsum(-1, dtype=dtype) if op == "sum" else x.logcumsumexp(-1)
    x = x if dtype is None else x.to(dtype)
    tiles = -(-n // _SCAN_TILE)
    empty = 0 if op == "sum" else -torch.inf
    t = torch.nn.functional.pad(x, (0, tiles * _SCAN_TILE - n), value=empty).unflatten(-1, (tiles, _SCAN_TILE))
    if op == "sum":
        inner = t.cumsum(-1)
        before = torch.nn.functional.pad(inner[..., :-1, -1].cumsum(-1), (1, 0))  # the tiles before
        out = inner + before.unsqueeze(-1)
    else:
        inner = t.logcumsumexp(-1)
        before = torch.nn.functional.pad(inner[..., :-1, -1].logcumsumexp(-1), (1, 0), value=-torch.inf)
        out = torch.logaddexp(inner, before.unsqueeze(-1))
    return out.flatten(-2)[..., :n]


def overflow_free_mean(values: torch.Tensor, plus: torch.Tensor | float | None = None) -> torch.Tensor:
    """``plus + values.mean(-1)`` (``plus`` a tensor, a float or None), with the roundings of that
    mean and sum bit for bit (unless ``values`` are subnormal) but no overflow of the mean's sum for
    values near the dtype's largest (where ``mean`` gives ``inf``): the mean is taken of
    ``values / 2^c`` (``2^c >= S``) and scaled back inside the sum, and powers of 2 commute with every
    rounding. Three ops; a float ``plus`` is a constant kept on the device."""
    scale = 2.0 ** math.ceil(math.log2(max(1, values.shape[-1])))
    mean = (values * (1.0 / scale)).mean(-1)
    if plus is None:
        return mean.mul_(scale)
    if not isinstance(plus, torch.Tensor):
        plus = constant((plus,), mean)
    return torch.add(plus, mean, alpha=scale)


def filled(x: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    """``x.masked_fill(mask, value)`` (``mask`` broadcastable to ``x``) in one kernel: ``torch.where``
    with the value kept on the device (:func:`constant`). An out-of-place ``masked_fill`` is a copy of
    ``x`` and a fill, two launches on an accelerator; the gradient is the same, 0 under ``mask``."""
    return torch.where(mask, constant((value,), x), x)


def zero_unless(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` where ``mask``, 0 elsewhere (NaN and ``inf`` of ``x`` included), in one kernel; the
    gradient is 0 outside ``mask``. The complement of :func:`filled` with 0, without negating ``mask``."""
    return torch.where(mask, x, constant((0,), x))


def constant(values: tuple[float, ...], like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` as a tensor ``(len(values),)`` in ``dtype`` (default ``like``'s), on ``like``'s device.

    Made once per ``(values, device, dtype)`` and kept: on an accelerator a copy from host memory at
    every call would wait for the host and could not be captured in a CUDA graph. Under
    ``torch.compile`` it is a constant of the graph, made at the call; on ``meta``, too."""
    dtype = like.dtype if dtype is None else dtype
    if like.device.type == "meta" or torch.compiler.is_compiling():
        return like.new_tensor(values, dtype=dtype)
    return _on_device(tuple(values), like.device, dtype)


@functools.lru_cache(maxsize=64)
def _on_device(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    with torch.inference_mode(False):  # usable by later calls that record autograd
        return torch.tensor(values, dtype=dtype).to(device)


def constant_result(fn: F) -> F:
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` at import
    time (seconds, paid at an operator's first call even where nothing compiles): that decorator
    only marks ``fn`` with this attribute, which Dynamo reads when it traces a call
    (``tests/test_compile.py`` checks that the decorator still does just this)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn
