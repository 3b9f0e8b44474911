"""Triton kernels of top-k cross-entropy's head (see :mod:`softtopk.ops.ce_head_triton`, which
launches them; importing this module imports triton): from the ``m`` selected scores and the
label's relaxed ranks, each row's loss forward, and backward the gradients of both, recomputing the
softmax. A program holds ``ROWS`` rows; the formulas are the torch path's
(``softtopk.losses.topk_ce._Head``)."""

import triton
import triton.language as tl

from . import triton_steps as steps


@triton.jit
def _row_terms(
    scores_ptr, ranks_ptr, weights_ptr, position_ptr, rows, m, k, ROWS: tl.constexpr, MP: tl.constexpr, KP: tl.constexpr
):
    """This program's rows ``(ROWS, 1)``, columns ``(1, MP)``, the softmax ``q (ROWS, MP)`` of the
    scores with its log at the label ``(ROWS,)``, the label's column ``(ROWS, MP)`` and the
    weighted mass ``w . ranks (ROWS,)``."""
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    src = tl.minimum(r, rows - 1)  # the last program's spare rows read the last row (never stored)
    cols = tl.arange(0, MP)[None, :]
    s = tl.load(scores_ptr + src * m + cols, mask=cols < m, other=float("-inf"))
    top = tl.max(s, 1)
    e = tl.exp(s - top[:, None])
    total = tl.sum(e, 1)
    at = cols == tl.load(position_ptr + src)
    log_q_y = tl.sum(tl.where(at, s, 0.0), 1) - top - tl.log(total)
    ranks = tl.arange(0, KP)[None, :]
    given = tl.load(ranks_ptr + src * k + ranks, mask=ranks < k, other=0.0)
    mass = tl.sum(given * tl.load(weights_ptr + ranks, mask=ranks < k, other=0.0), 1)
    return r, cols, e / total[:, None], log_q_y, at, mass


@triton.jit
def head_forward(
    scores_ptr,  # (R, m) the selected scores
    ranks_ptr,  # (R, K) the label's relaxed ranks
    weights_ptr,  # (K,) the ranks' weights w_r
    position_ptr,  # (R,) the label's column
    kept_ptr,  # (R,) the rows that count: the others (ignored targets) have loss 0, gradient 0
    masked_ptr,  # (R,) rows whose label is -inf: loss inf, gradient 0
    loss_ptr,  # (R,) out
    rows,
    m,
    k,
    p1: tl.float64,  # the softmax's weight p_1
    keep: tl.float64,  # the floor's 1 - 2e-7 and 1e-7
    floor: tl.float64,
    MODE: tl.constexpr,  # 0 'sort' (no softmax term), 1 'sm', 2 'smce'
    ROWS: tl.constexpr,
    MP: tl.constexpr,
    KP: tl.constexpr,
):
    r, cols, q, log_q_y, at, mass = _row_terms(
        scores_ptr, ranks_ptr, weights_ptr, position_ptr, rows, m, k, ROWS, MP, KP
    )
    if MODE == 1:
        mass = mass + steps.in_dtype(p1, mass) * tl.sum(tl.where(at, q, 0.0), 1)
    loss = -tl.log(mass * steps.in_dtype(keep, mass) + steps.in_dtype(floor, mass))
    if MODE == 2:
        loss = loss * steps.in_dtype(1.0 - p1, mass) - steps.in_dtype(p1, mass) * log_q_y
    row = tl.reshape(r, (ROWS,))
    masked = tl.load(masked_ptr + row, mask=row < rows, other=0) != 0
    kept = tl.load(kept_ptr + row, mask=row < rows, other=0) != 0
    loss = tl.where(kept, tl.where(masked, float("inf"), loss), 0.0)
    tl.store(loss_ptr + row, loss, mask=row < rows)


@triton.jit
def head_backward(
    grad_ptr,  # (R,) the loss's gradient, or (SCALAR) the reduced loss's ()
    weight_ptr,  # () with SCALAR: the weight the reduction gave each kept row (reduce_kernels)
    scores_ptr,
    ranks_ptr,
    weights_ptr,
    position_ptr,
    kept_ptr,
    masked_ptr,
    grad_scores_ptr,  # (R, m) out
    grad_ranks_ptr,  # (R, K) out
    rows,
    m,
    k,
    p1: tl.float64,
    keep: tl.float64,
    floor: tl.float64,
    MODE: tl.constexpr,
    SCALAR: tl.constexpr,
    ROWS: tl.constexpr,
    MP: tl.constexpr,
    KP: tl.constexpr,
):
    r, cols, q, log_q_y, at, mass = _row_terms(
        scores_ptr, ranks_ptr, weights_ptr, position_ptr, rows, m, k, ROWS, MP, KP
    )
    row = tl.reshape(r, (ROWS,))
    stop = (tl.load(masked_ptr + row, mask=row < rows, other=1) != 0) | (
        tl.load(kept_ptr + row, mask=row < rows, other=0) == 0
    )
    grad = tl.where(stop, 0.0, steps.row_grad(grad_ptr, weight_ptr, row, row < rows, SCALAR))
    q_y = tl.sum(tl.where(at, q, 0.0), 1)
    if MODE == 1:
        mass = mass + steps.in_dtype(p1, mass) * q_y
    c = grad * steps.in_dtype(-keep, mass) / (mass * steps.in_dtype(keep, mass) + steps.in_dtype(floor, mass))
    d = c * q_y * steps.in_dtype(p1, mass)  # the weight of (e_y - q) in the scores' gradient
    if MODE == 2:
        d = grad * steps.in_dtype(-p1, mass)  # the cross-entropy's
        c = c * steps.in_dtype(1.0 - p1, mass)
    ranks = tl.arange(0, KP)[None, :]
    w = tl.load(weights_ptr + ranks, mask=ranks < k, other=0.0)
    tl.store(grad_ranks_ptr + r * k + ranks, c[:, None] * w, mask=(r < rows) & (ranks < k))
    if MODE != 0:  # 'sort': the scores have no gradient of their own
        grad_scores = tl.where(at, d[:, None], 0.0) - d[:, None] * q
        tl.store(grad_scores_ptr + r * m + cols, grad_scores, mask=(r < rows) & (cols < m))
