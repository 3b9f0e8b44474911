"""The Laplace mask of :mod:`softtopk.ops.lapsum` on CPU rows as two numba kernels (optional).

On a CPU the torch path's cost is its tens of small tensor operations, each a pass over the rows
with its own dispatch and buffers, not its arithmetic. Where numba is installed, for float32 and
float64 CPU tensors outside ``torch.compile`` and the ``torch.func`` transforms, with an int ``k``
and a float ``τ`` (the scope of the Triton kernels, :mod:`softtopk.ops.lapsum_triton`), the mask is
one ``topk`` of the ``K`` candidates, the row's terms ``e^{(±x - s_K)/τ}`` in four vectorised tensor
ops (as the torch path makes them), and one kernel forward, one kernel backward
(:mod:`softtopk.ops.lapsum_numba_kernels`): the torch path's solve in float64 and in its order of
sums, the row's mask and slope from its terms, the candidates' from their exact scores. Everywhere
else, and at the sizes where these kernels are slower (:func:`pays`), the torch path runs; it is
the reference the tests hold these kernels to (``tests/test_lapsum_numba.py``).
``SOFTTOPK_NUMBA=0`` (read at import) turns them off with the other numba kernels
(:mod:`softtopk.ops.isotonic_numba`, whose loader brings numba in at the first call: a one-time
start-up, then one call a pass).
"""

from __future__ import annotations

import torch

from . import isotonic_numba
from .compute import LOG2E, topk_rows
from .isotonic_numba import numpy_rows
from .lapsum_triton import ImplicitMask, candidates, hard_forward, implicit_backward


def usable(x: torch.Tensor, k: object, tau: object) -> bool:
    """Whether the Laplace mask of rows ``x`` (B, n) runs on these kernels: an int ``k`` and a
    float ``τ``, float32 or float64 CPU rows whose values may be read (eager, outside every
    ``torch.func`` transform: their tensors have no storage NumPy can see), numba available, no
    :func:`softtopk.ops.triton_gate.torch_path` block around the call, and a size where they are
    faster (:func:`pays`)."""
    return isinstance(k, int) and isinstance(tau, float) and isotonic_numba.usable_rows(x) and pays(x, k)


def pays(x: torch.Tensor, k: int) -> bool:
    """Whether the kernels are faster than the torch path for rows ``x`` (B, n) and ``k``
    (``benchmarks/results/lapsum_cpu.md``). Small inputs, where the torch path's cost is its
    dispatches: always. Otherwise the kernels' cost is their candidates' exponentials one by one
    (the torch path's are vectorised) and one thread: they run while the ``K`` candidates are at
    most a quarter of the row, and, beyond ``2^16`` entries, an eighth with torch on one thread."""
    n, size = x.shape[-1], x.numel()
    big = candidates(n, k)[1]
    if size <= 1 << 15:
        return True
    return 4 * big <= n and (size <= 1 << 16 or (8 * big <= n and torch.get_num_threads() == 1))


class NumbaLaplaceMask(ImplicitMask):
    """:class:`~softtopk.ops.lapsum_triton.TritonLaplaceMask` on CPU rows: ``(x (B, n), τ, k, K,
    negate, hard, C, floor)`` → the mask (B, n) and ``d``, saved for the backward."""

    @staticmethod
    def forward(x: torch.Tensor, tau: float, k: int, big: int, negate: bool, hard: int, clamp: float, floor: float):
        from . import lapsum_numba_kernels as kernels  # imports numba: only once a kernel runs

        x = x.contiguous()
        vals, idx = topk_rows(x, big, largest=not negate)
        info = torch.finfo(x.dtype)
        terms = x[:, :0]
        if big < x.shape[-1]:  # the row's exponentials, vectorised by torch (numba's are one by one)
            last = vals[:, -1:].clamp(info.min, info.max)
            terms = (torch.sub(last, x) if negate else torch.sub(x, last)).mul_(LOG2E / tau).clamp_(max=0.0).exp2_()
        mask, d = torch.empty_like(x), torch.empty_like(x)
        arrays = (numpy_rows(vals), numpy_rows(idx), numpy_rows(terms), mask.numpy(), d.numpy())
        kernels.mask_forward(*arrays, k, tau, info.min, info.max, negate, clamp, floor)
        return hard_forward(x, mask, hard), d

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises instead of being 0
    def backward(ctx, grad: torch.Tensor, _d):
        return implicit_backward(ctx, grad, _rows_backward)


def _rows_backward(d: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    from . import lapsum_numba_kernels as kernels

    out = torch.empty_like(d)  # the mask's dtype, which is grad's
    kernels.mask_backward(numpy_rows(d), numpy_rows(grad), out.numpy(), torch.finfo(d.dtype).tiny)
    return out
