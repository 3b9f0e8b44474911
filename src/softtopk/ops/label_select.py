"""Top-k cross-entropy's pre-selection (:mod:`softtopk.losses.topk_ce`): of each row of class
scores, the ``m`` that the relaxation sees, the label's always among them.

The torch path is one ``topk`` of the ``m - 1`` largest other scores (the label's key set to
``-inf``), a gather and a stable sort of those and the label's. On a CPU that ``topk``, a partial
sort with a row's worth of bookkeeping, is most of the selection's time on rows of a thousand
classes or more (``benchmarks/results/label_select.md``). Where numba is installed, float32 and
float64 CPU rows whose values may be read (eager, outside the ``torch.func`` transforms) take one
kernel instead (:mod:`softtopk.ops.label_select_kernels`) where it is faster (:func:`pays`): the
same scores, classes and positions, except that among equal scores at the boundary of the
selection it keeps the first in the row, where ``topk``'s choice is unspecified.
``triton_gate.torch_path()`` and ``SOFTTOPK_NUMBA=0`` turn it off; the tests hold it to the torch
path (``tests/test_label_select.py``). On CUDA with triton (:mod:`softtopk.ops.triton_gate`), rows
of at most :data:`MAX_CLASSES` classes and selections of at most :data:`MAX_M` take one Triton
kernel (:mod:`softtopk.ops.select_kernels`): the numba kernel's selection and order, in one launch
where the torch path dispatches about fifteen ops (``tests/test_label_select_triton.py``).
"""

from __future__ import annotations

import math

import torch

from . import isotonic_numba, triton_gate
from ._function import Function
from .compute import filled, put_rows, topk_rows
from .isotonic_numba import numpy_rows

INF_MARGIN = 2.0**27  # a +inf score's stand-in is the dtype's largest number over this
MAX_M = 64  # the kernel's insertions cost O(m) each: larger selections keep topk
MAX_CLASSES = 4096  # the Triton kernel holds a row in one program


def usable(logits: torch.Tensor, m: int) -> bool:
    """Whether the selection of ``m`` scores from rows ``logits`` (R, C) runs on the kernel."""
    return isotonic_numba.usable_rows(logits) and pays(logits.shape[-1], m)


def pays(classes: int, m: int) -> bool:
    """Whether the kernel is faster than the torch path (``benchmarks/results/label_select.md``).
    Its insertions cost ``O(m)`` each and it runs on one thread: with torch on one thread, up to 16
    scores, or up to :data:`MAX_M` from rows long enough for its bound (``4 m <= C``); with torch on
    several, up to 16 scores from rows of at most 4096 classes."""
    if torch.get_num_threads() > 1:  # torch's topk spreads the rows over its threads
        return m <= 16 and classes <= 4096
    return m <= 16 or (m <= MAX_M and 4 * m <= classes)


class LabelSelect(Function):
    """``(logits (R, C), label (R,), m)`` -> the ``m`` largest scores with the label's forced in
    (it replaces the m-th), ascending, the label last among scores equal to it; its position
    ``(R,)``; and where the label is ``-inf`` ``(R,)`` (fed as 0, a finite stand-in).

    The selected set is the label and the ``m - 1`` largest other scores; one stable sort orders
    them. Ascending order puts the score of rank ``r`` on the wire where the networks (max on the
    last wire, as in difftopk) output rank ``r``; fed descending, an odd-even network would have to
    carry every top score across all its wires, and a truly-top-5 label would keep little top-5
    mass. ``+inf`` scores (always in the top) enter as a huge finite stand-in, ``finfo.max /
    INF_MARGIN``: loss and gradients stay finite; for relaxations that depend on score magnitudes
    (NeuralSort, networks) the value is the stand-in's, not the limit. Backward: the selected
    scores' gradients scattered back to their classes."""

    generate_vmap_rule = True

    @staticmethod
    def forward(logits: torch.Tensor, label: torch.Tensor, m: int):
        cap = torch.finfo(logits.dtype).max / INF_MARGIN
        if usable(logits, m):
            return _kernel_select(logits, label, m, cap)
        if triton_usable(logits, m):
            return triton_select(logits, label, m)
        label = label.unsqueeze(-1)
        label_score = logits.gather(-1, label)
        masked = label_score == -math.inf
        # the label is the only -inf key: never among the m - 1 others, even beside masked classes
        key = put_rows(logits.clamp_min(torch.finfo(logits.dtype).min), label, -math.inf)
        index = topk_rows(key, m - 1)[1]
        top = logits.gather(-1, index)
        label_score = filled(label_score, masked, 0.0)
        scores, order = torch.cat([top, label_score], -1).sort(dim=-1, stable=True)
        scores = scores.clamp_max_(cap)
        index = torch.cat([index, label], -1).gather(-1, order)
        position = (top <= label_score).sum(-1)
        return scores, index, position, masked.squeeze(-1)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, index, position, masked = output
        ctx.mark_non_differentiable(index, position, masked)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(index)
        ctx.classes = inputs[0].shape[-1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor, *_unused):
        if grad is None:
            return None, None, None
        (index,) = ctx.saved_tensors
        return to_classes(grad, index, ctx.classes), None, None


def to_classes(grad: torch.Tensor, index: torch.Tensor, classes: int) -> torch.Tensor:
    """The selected scores' gradient ``grad`` (R, m) scattered to their classes ``index`` (R, m):
    the rows' gradient (R, C)."""
    return put_rows(grad.new_zeros(grad.shape[0], classes), index, grad)


def triton_usable(logits: torch.Tensor, m: int) -> bool:
    """Whether the selection of ``m`` scores from rows ``logits`` (R, C) runs on the Triton kernel."""
    return not usable(logits, m) and triton_gate.usable(logits, m) and m <= MAX_M and logits.shape[-1] <= MAX_CLASSES


def _kernel_select(logits: torch.Tensor, label: torch.Tensor, m: int, cap: float):
    from . import label_select_kernels as kernels  # imports numba: only once the kernel runs

    rows = logits.shape[0]
    scores = logits.new_empty((rows, m))
    index = torch.empty((rows, m), dtype=torch.int64)
    position = torch.empty(rows, dtype=torch.int64)
    masked = torch.empty(rows, dtype=torch.bool)
    arrays = (scores.numpy(), index.numpy(), position.numpy(), masked.numpy())
    kernels.select_rows(numpy_rows(logits), numpy_rows(label.to(torch.int64)), cap, *arrays)
    return scores, index, position, masked


def triton_select(logits: torch.Tensor, label: torch.Tensor, m: int):
    """:class:`LabelSelect`'s outputs by the Triton kernel, without autograd (where
    :func:`triton_usable`; top-k cross-entropy's one-node path, :mod:`softtopk.ops.topk_ce_triton`,
    calls it too)."""
    from . import select_kernels as kernels  # imports triton: only once the kernel runs

    rows, classes = logits.shape
    scores = logits.new_empty((rows, m))
    index = label.new_empty((rows, m), dtype=torch.int64)
    position = label.new_empty(rows, dtype=torch.int64)
    masked = label.new_empty(rows, dtype=torch.bool)
    if rows:
        width = triton_gate.lanes(classes)
        kernels.label_select[(rows,)](
            logits.contiguous(),
            label.to(torch.int64).contiguous(),
            scores,
            index,
            position,
            masked,
            classes,
            torch.finfo(logits.dtype).max / INF_MARGIN,
            M=m,
            MP=triton_gate.lanes(m - 1, 2),
            W=width,
            num_warps=4 if width <= 1024 else 8,
        )
    return scores, index, position, masked
