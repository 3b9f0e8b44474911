"""The NeuralSort mask of :mod:`softtopk.ops.neuralsort` as two Triton kernels (optional, CUDA),
and the label's row of its ranks (top-k cross-entropy's) as two more.

The torch path sorts the row, then builds every rank's logits from prefix sums and
``searchsorted`` (:mod:`softtopk.ops.neuralsort`'s formula), takes a softmax per rank, sums them
and puts the row back in its order: about twenty ops forward and twenty backward. Here one sort
is followed by one program per row that computes the same quantities in float64 (``searchsorted``
by bisection over the sorted row, the prefix sums by a scan), sums the ``k`` softmaxes and writes
the mask in the row's order; the backward kernel recomputes each rank's column and applies the
hand-written backward of the torch path (``α``, ``β`` and the prefix sums of ``α``). ``±inf``
entries follow the torch path's rule (``M`` and ``-M/2`` in the logits; a row with at most ``k``
entries above ``-inf`` selects them, with gradient 0); a NaN makes its row NaN. The label's
kernels compute the ranks' column of the label's item only (no rule for those rows: the ranks
have none), and the backward of that row alone.

Masks of long rows or many ranks (``n > MAX_ENTRIES`` or ``n k`` above :data:`ROW_WORK`) take
the tiled kernels instead, which spread a few long rows, or a thousand ranks, over the whole GPU:
torch ops compute the logits' pieces of the sorted row (:mod:`softtopk.ops.neuralsort_rows`), then
programs of ``RB`` ranks over :data:`CHUNK` entries each rank's softmax maximum and sum (chunks
combined by a few ops), programs of ``BLOCK`` entries the mask over every rank; backward, the same
two layouts give ``ḡ_r`` and then ``α`` and ``β``, whose prefix sums torch ops take as the torch
path does. Memory O(n) per row (the torch path's is O(n k)).

Scope: an int ``k < n`` and a float ``τ``; the label's ranks only for rows of at most
:data:`MAX_ENTRIES`. :func:`~softtopk.ops.neuralsort.neuralsort_mask` and
:func:`~softtopk.ops.neuralsort.neuralsort_label_ranks` keep the torch path for a tensor ``τ``,
the full ranks, under ``torch.compile`` and ``vmap`` and off CUDA (:mod:`softtopk.ops.triton_gate`),
and the label's ranks for longer rows. The tests run the kernels under ``TRITON_INTERPRET=1`` on the
CPU against the torch path, values and gradients; on a GPU they are timed by
``benchmarks/bench_gpu.py`` (``benchmarks/results/gpu_runs.md``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from . import triton_gate
from ._function import Function
from .compute import sort_rows, unsort
from .neuralsort_rows import logit_pieces, scores_grad

MAX_ENTRIES = 2048  # a row held in one program
ROW_WORK = 1 << 15  # n k of the rows one program takes each; above, the tiled kernels
CHUNK = 4096  # entries of a rank sum's program in the tiled kernels
TILE = 2048  # float64 entries of a tiled program's (ranks, entries) tile


def _launch(x: torch.Tensor) -> dict:
    """The kernels' compile-time arguments for rows ``x`` (B, n)."""
    n = x.shape[-1]
    return {"STEPS": n.bit_length(), "W": triton_gate.lanes(n), "WIDE": x.dtype == torch.float64}


class Stage(NamedTuple):
    """The row kernels' launches for ``k`` ranks at ``τ``, without autograd (:class:`TritonNeuralSort`
    and top-k cross-entropy's one-node path, :mod:`softtopk.ops.topk_ce_triton`, wrap them);
    ``big`` is ``M``, the torch path's stand-in for ``+inf`` in the logits."""

    k: int
    tau: float
    big: float

    def forward(self, x: torch.Tensor, position: torch.Tensor | None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The mask (B, n) of rows ``x`` (B, n) for ``position`` None, else ``P[b, position[b], :k]``
        (B, k) (``position`` contiguous), where each row's label lands (top-k cross-entropy's
        NeuralSort); and what the backward reads: the sorted rows and their permutation."""
        from . import neuralsort_kernels as kernels  # imports triton: only once a kernel runs

        ordered, order = sort_rows(x)
        ordered, order = ordered.contiguous(), order.contiguous()
        args: tuple[torch.Tensor, ...]
        if position is None:
            out = torch.empty_like(x)
            kernel, args = kernels.mask_forward, (ordered, order, out)
        else:
            out = x.new_empty((x.shape[0], self.k))
            kernel, args = kernels.label_forward, (ordered, order, position, out)
        if x.shape[0]:
            kernel[(x.shape[0],)](*args, x.shape[-1], self.k, self.tau, self.big, **_launch(x))
        return out, (ordered, order)

    def backward(
        self, grad: torch.Tensor, x: torch.Tensor, position: torch.Tensor | None, saved: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The rows' gradient (B, n) from the output's ``grad``."""
        from . import neuralsort_kernels as kernels

        ordered, order = saved
        grad_x = torch.empty_like(ordered)
        if ordered.shape[0]:
            label = position is not None
            kernels.backward[(ordered.shape[0],)](
                *(ordered, order, position if label else order, grad.contiguous(), grad_x),
                *(ordered.shape[-1], self.k, self.tau, self.big),
                **_launch(ordered),
                LABEL=label,
            )
        return grad_x


class TritonNeuralSort(Function):
    """``(x (B, n), position (B,) or None, stage)`` → the :class:`Stage`'s output, and the sorted
    rows and their permutation, saved."""

    @staticmethod
    def forward(x: torch.Tensor, position: torch.Tensor | None, stage: Stage):
        out, (ordered, order) = stage.forward(x, None if position is None else position.contiguous())
        return out, ordered, order

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, position, ctx.stage = inputs
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(output[1], output[2], None if position is None else position.contiguous())

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, *_):
        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None
        ordered, order, position = ctx.saved_tensors
        return ctx.stage.backward(grad, ordered, position, (ordered, order)), None, None


class TiledNeuralSort(Function):
    """``(x (B, n), τ, k, M)`` → the mask (B, n) by the tiled kernels (module docstring), with what
    the backward recomputes from: the sorted rows, their permutation, the logits' pieces ``s'``,
    ``ℓ`` and ``C - ℓ s'``, and each rank's softmax maximum and sum."""

    @staticmethod
    def forward(x: torch.Tensor, tau: float, k: int, big: float):
        from . import neuralsort_kernels as kernels

        ordered, order = sort_rows(x)
        ordered, order = ordered.contiguous(), order.contiguous()
        far, below, sums = logit_pieces(ordered, big)
        base = torch.addcmul(sums, below, far, value=-1)
        top, norm = _softmax_stats(kernels, ordered, order, base, far, tau, k)
        mask = torch.empty_like(x)
        if x.shape[0]:
            tile = _tile(x, k)
            kernels.entry_sums[(x.shape[0], -(-x.shape[-1] // tile["BLOCK"]))](
                *(ordered, order, base, far, top, norm, top, ordered, mask, mask, x.shape[-1], k, tau),
                GRAD=False,
                **tile,
            )
        return mask, ordered, order, far, below, base, top, norm

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, ctx.tau, ctx.k, _ = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*output[1:])

    @staticmethod
    @torch.autograd.function.once_differentiable  # a kernel's output: a second derivative raises
    def backward(ctx, grad, *_):
        from . import neuralsort_kernels as kernels

        if grad is None or not ctx.needs_input_grad[0]:
            return None, None, None, None
        ordered, order, far, below, base, top, norm = ctx.saved_tensors
        (rows, n), k, grad = ordered.shape, ctx.k, grad.contiguous()
        alpha, beta = base.new_empty((rows, n)), base.new_empty((rows, n))
        if rows:
            mean = _rank_parts(kernels, (ordered, order, base, far, top, norm, grad), ctx.tau, k, True)[1]
            tile = _tile(ordered, k)
            kernels.entry_sums[(rows, -(-n // tile["BLOCK"]))](
                *(ordered, order, base, far, top, norm, mean, grad, alpha, beta, n, k, ctx.tau), GRAD=True, **tile
            )
        grad_x = scores_grad(ordered, far, below, alpha, beta).div_(-ctx.tau)
        return unsort(grad_x.masked_fill_(ordered.isinf(), 0.0).to(ordered.dtype), order), None, None, None


def _tile(x: torch.Tensor, k: int) -> dict:
    """The tiled kernels' tile for rows ``x``: ``RB`` ranks (at most 16) by ``BLOCK`` entries, and
    whether the scores are float64 (``WIDE``: the weights' ``exp`` in float64)."""
    ranks = triton_gate.rank_block(k)
    return {
        "RB": ranks,
        "BLOCK": min(triton_gate.block_for(x.shape[-1]), TILE // ranks),
        "WIDE": x.dtype == torch.float64,
    }


def _rank_parts(kernels, tensors: tuple, tau: float, k: int, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each chunk's share of the ranks' sums (B, chunks, k): the softmax's maxima and sums, or
    (``grad``, with the stats and the mask's gradient in ``tensors``) ``ḡ_r`` summed over them."""
    ordered, order, base, far, top, norm, g = tensors
    n, tile = ordered.shape[-1], _tile(ordered, k)
    chunk, chunks = triton_gate.chunking(n, CHUNK)
    maxima, sums = (base.new_empty((ordered.shape[0], chunks, k)) for _ in range(2))
    grid = (ordered.shape[0], -(-k // tile["RB"]), chunks)
    kernels.rank_parts[grid](
        ordered, order, base, far, top, norm, g, maxima, sums, n, k, tau, GRAD=grad, CHUNK=chunk, **tile
    )
    return maxima, sums.sum(1) if grad else sums


def _softmax_stats(kernels, ordered, order, base, far, tau: float, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's largest ``y`` and ``Σ_i exp(2 (y_ri - max)/τ)`` (B, k), float64: the chunks'
    running ones, combined."""
    if not ordered.shape[0]:
        return base.new_empty((0, k)), base.new_empty((0, k))
    maxima, sums = _rank_parts(kernels, (ordered, order, base, far, base, base, ordered), tau, k, False)
    if maxima.shape[1] == 1:
        return maxima[:, 0], sums[:, 0]
    top = maxima.amax(1)
    return top, sums.mul_(maxima.sub_(top.unsqueeze(1)).mul_(2.0 / tau).exp_()).sum(1)


def usable(x: torch.Tensor, k: int, tau: object) -> bool:
    """Whether the NeuralSort mask of rows ``x`` runs on the kernels."""
    return triton_gate.usable(x, k, tau) and 0 < k < x.shape[-1]  # k an int first


def label_usable(x: torch.Tensor, k: int, tau: object, n: int | None = None) -> bool:
    """Whether the label's NeuralSort ranks of rows ``x`` (of ``n`` entries, if given: rows like
    ``x``) run on the kernels."""
    return triton_gate.usable(x, k, tau) and 0 < k < (x.shape[-1] if n is None else n) <= MAX_ENTRIES


def triton_mask(x: torch.Tensor, k: int, tau: float, big: float) -> torch.Tensor:
    """The NeuralSort mask of rows ``x`` (B, n) by the kernels, ``M = big``: the tiled ones for
    long rows or many ranks."""
    if x.shape[-1] > MAX_ENTRIES or x.shape[-1] * k > ROW_WORK:
        return TiledNeuralSort.apply(x, tau, k, big)[0]
    return TritonNeuralSort.apply(x, None, Stage(k, tau, big))[0]


def triton_label_ranks(x: torch.Tensor, position: torch.Tensor, stage: Stage) -> torch.Tensor:
    """``P[b, position[b], :k]`` (B, k) of rows ``x`` (B, n) by the ``stage``'s kernels."""
    return TritonNeuralSort.apply(x, position, stage)[0]
