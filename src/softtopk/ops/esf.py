"""Elementary symmetric polynomials (ESF) in log space, for smooth top-k SVM losses.

The ``j``-th elementary symmetric polynomial of :math:`x \\in \\mathbb{R}_{>0}^n` is

.. math::
    e_j(x) = \\sum_{S \\subseteq \\{1..n\\},\\ |S| = j} \\ \\prod_{i \\in S} x_i ,
    \\qquad e_0 = 1, \\qquad e_j = 0 \\ (j > n).

With :math:`e^{(i)}_j` the polynomial of the first ``i`` entries, the recurrence
:math:`e^{(i)}_j = e^{(i-1)}_j + x_i\\, e^{(i-1)}_{j-1}` unrolls, for fixed ``j``, into a prefix sum
over ``i``:

.. math::
    e^{(i)}_j = \\sum_{i' \\le i} x_{i'}\\, e^{(i'-1)}_{j-1} .

So the ``j``-th degree is one cumulative sum over the previous degree's prefix values: ``O(n k)``
work and ``k`` vectorised tensor operations over the whole batch.

Numerics and speed. With ``m`` the ``k``-th largest entry, the ``k`` largest entries (*top*, all
``>= m``) and the others (*tail*, all ``<= m``) are treated apart, and

.. math::
    e_j(x) = \\sum_{a + b = j} e_a(\\mathrm{top})\\, e_b(\\mathrm{tail}) .

- *Tail*: relative to ``m`` every tail value lies in ``[0, 1]``, so its polynomials are summed in
  linear space (one ``exp`` in all, then one multiply and one ``cumsum`` per degree), bounded by
  :math:`\\binom{n}{b}`. A value that underflows changes :math:`e_j` by at most ``j`` times itself,
  relative (every tail value is at most every top value), so nothing that matters is lost. The
  backward is analytic, :math:`\\partial e_b / \\partial x_i = e_{b-1}(x_{\\setminus i})`, from the
  deflation :math:`e_c(x_{\\setminus i}) = e_c(x) - x_i\\, e_{c-1}(x_{\\setminus i})`: ``O(n k)``
  fused multiply-adds and no reverse scans. Deflation cancels where :math:`x_i` dominates, but the
  absolute error it leaves in :math:`\\partial \\log e_j / \\partial \\log x_i` stays within a few
  ``k`` ulps because tail values never exceed top values. A second derivative (``create_graph``)
  differentiates the forward recursion with autograd instead.
- *Top* (``k`` values): the log-space recursion below, in decreasing order, relative to the
  largest.
- The ``(k + 1)^2`` products of the convolution are combined with ``logsumexp``.

Where :math:`\\binom{n}{k}` would overflow the compute dtype (float32: e.g. ``n = 1000, k >= 19``;
float64: ``n = 1000, k >= ~150``) the whole sequence (top first, in decreasing order, then the
tail) runs through the log-space recursion with ``torch.logcumsumexp``; each prefix sum is taken
relative to its first term, the largest ``j``-product, so it lies in
:math:`[0, \\log\\binom{n}{j}]`. Which path runs depends only on ``(n, k, dtype)``, never on the
data. ``tests/test_esf.py`` checks both against float64 and brute force; ``benchmarks/bench_losses.py``
times the smooth SVM loss built on it.

Reference: L. Berrada, A. Zisserman, M. P. Kumar, "Smooth Loss Functions for Deep Top-k
Classification", ICLR 2018 (Sec. 4: the loss as a ratio of ESFs, computed in log space; they use a
divide-and-conquer product with a hand-written backward).
"""

from __future__ import annotations

import math

import torch

from ._function import Function
from .compute import compute_dtype

__all__ = ["log_esf", "log_esf_of_split"]


def largest_log_binomial(n: int, k: int) -> float:
    """``max_{j <= k} log C(n, j)``: the largest prefix sum the linear path can meet."""
    j = min(k, n // 2)
    return math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)


def _relative_logcumsumexp(t: torch.Tensor) -> torch.Tensor:
    """``logcumsumexp`` along the last dim, taken relative to the (detached) first entry.

    ``torch.logcumsumexp``'s backward adds ``log(grad)`` to the output in the compute dtype; where the
    outputs are large (``|log e_j|`` reaches ``1e9`` for scores of ``1e6`` at ``tau = 1e-3``) float32
    drops that term and the gradient loses its upstream scale. Relative to the first entry the
    outputs lie in ``[0, log C(n, j)]`` and the backward keeps it.
    """
    first = t[..., :1].detach()
    return torch.logcumsumexp(t - first, dim=-1) + first


def _linear_prefix_log_sums(t: torch.Tensor) -> torch.Tensor:
    """``log(cumsum(exp(t)))`` along the last dim, relative to the first entry (see module doc)."""
    first = t[..., :1].detach()
    return torch.log(torch.cumsum(torch.exp(t - first), dim=-1)) + first


def _sorted_log_esf(a: torch.Tensor, degree: int, prefix_log_sums) -> torch.Tensor:
    """``log e_j`` for ``j = 0..degree`` of entries whose first ``degree`` are the largest, in
    decreasing order (the rest in any order): the prefix recursion in log space, ``(*, degree + 1)``."""
    largest = a[..., :1].detach()
    a = a - largest
    prefix = torch.zeros_like(a[..., :1]).expand(*a.shape[:-1], a.shape[-1] + 1)  # log e_0 of every prefix
    coefficients = [prefix[..., -1]]
    for j in range(1, degree + 1):
        # prefix holds log e_{j-1} of the prefixes of length j-1..n; keep lengths j.. for e_j
        prefix = prefix_log_sums(a[..., j - 1 :] + prefix[..., :-1])
        coefficients.append(prefix[..., -1])
    return torch.stack(coefficients, dim=-1) + largest * torch.arange(degree + 1, dtype=a.dtype, device=a.device)


def _tail_esf(y: torch.Tensor, degree: int) -> torch.Tensor:
    """Linear ``e_b(y)``, ``b = 0..degree``, of values ``y`` in ``[0, 1]``: ``(*, degree + 1)``."""
    prefix = torch.cumsum(y, dim=-1)  # e_1 of the prefixes of length 1..n
    coefficients = [torch.ones_like(y[..., 0]), prefix[..., -1]]
    for b in range(2, degree + 1):
        # e_b of the prefixes of length b..n: entry i times e_{b-1} of the i entries before it; the
        # last degree needs only the whole row's sum
        terms = y[..., b - 1 :] * prefix[..., :-1]
        prefix = torch.cumsum(terms, dim=-1) if b < degree else terms.sum(-1, keepdim=True)
        coefficients.append(prefix[..., -1])
    return torch.stack(coefficients, dim=-1)


def _log_or_minus_inf(e: torch.Tensor) -> torch.Tensor:
    """``log e`` with ``-inf`` where ``e == 0``, and a zero (not NaN) gradient there."""
    positive = e > 0
    return torch.where(positive, torch.log(torch.where(positive, e, torch.ones_like(e))), -math.inf)


class _TailLogESF(Function):
    """``log e_b(exp t)``, ``b = 0..degree``, for ``t <= 0``, with the deflation backward (module doc)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(t: torch.Tensor, degree: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = torch.exp(t)
        e = _tail_esf(y, degree)
        return _log_or_minus_inf(e), y, e

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, y, e = output
        ctx.mark_non_differentiable(y, e)
        ctx.save_for_backward(inputs[0], y, e)
        ctx.degree = inputs[1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _grad_y: torch.Tensor, _grad_e: torch.Tensor):
        t, y, e = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: differentiate the forward recursion itself
            out = _log_or_minus_inf(_tail_esf(torch.exp(t), ctx.degree))
            return torch.autograd.grad(out, t, grad, create_graph=True)[0], None
        # d log e_b / d t_i = y_i e_{b-1}(y without i) / e_b. Deflation,
        # e_c(y without i) = sum_m (-y_i)^m e_{c-m}(y), collects into one polynomial in y_i with
        # per-row coefficients c_m = sum_b (grad_b / e_b) e_{b-1-m}, evaluated by Horner's rule
        ratio = torch.where(e > 0, grad / torch.where(e > 0, e, torch.ones_like(e)), torch.zeros_like(e))
        degree = ctx.degree
        coefficient = [
            sum(ratio[..., b] * e[..., b - 1 - m] for b in range(m + 1, degree + 1)).unsqueeze(-1)
            for m in range(degree)
        ]
        minus_y = -y
        total = coefficient[-1].expand_as(y).clone()
        for m in range(degree - 2, -1, -1):
            total.mul_(minus_y).add_(coefficient[m])
        return total.mul_(y), None


def log_esf(log_x: torch.Tensor, k: int) -> torch.Tensor:
    """Log elementary symmetric polynomials :math:`\\log e_j(\\exp a)` for ``j = 0..k``.

    .. math::
        \\mathrm{out}[\\ldots, j] = \\log \\sum_{|S| = j} \\exp\\Big(\\sum_{i \\in S} a_i\\Big)

    Args:
        log_x: ``a`` of shape ``(*, n)``, the logarithms of the positive values ``x``. Entries may be
            ``-inf`` (``x_i = 0``) if every row keeps at least ``k`` finite entries.
        k: highest degree, an int ``>= 0`` (unchecked: a kernel). Degrees above ``n >= 1`` give ``-inf``.

    Returns:
        ``(*, k + 1)``, in ``log_x``'s dtype (float16/bfloat16 are computed in float32). Shift
        equivariant: ``log_esf(a + c, k)[..., j] = log_esf(a, k)[..., j] + j c``. Differentiable
        (twice; ``vmap`` and ``torch.compile`` work):
        :math:`\\partial \\log e_j / \\partial a_i = x_i\\, e_{j-1}(x_{\\setminus i}) / e_j`.

    Example:
        >>> import torch
        >>> from softtopk.ops.esf import log_esf
        >>> log_esf(torch.tensor([1.0, 2.0, 3.0]).log(), 3).exp().round()  # 1, 1+2+3, 2+3+6, 6
        tensor([ 1.,  6., 11.,  6.])

    Reference:
        Berrada, Zisserman & Kumar, "Smooth Loss Functions for Deep Top-k Classification",
        ICLR 2018.
    """
    n = log_x.shape[-1]
    degree = min(k, n)
    a = log_x.to(compute_dtype(log_x.dtype))
    if degree == 0:
        out = torch.zeros_like(a[..., :1])
    else:
        # the `degree` largest entries in decreasing order, and all entries with those set to x = 0
        top = a.topk(degree, dim=-1)
        out = log_esf_of_split(top.values, a.scatter(-1, top.indices, -math.inf), degree)
    if k > n:
        out = torch.cat([out, out.new_full((*out.shape[:-1], k - n), -math.inf)], dim=-1)
    return out.to(log_x.dtype)


def log_esf_of_split(top: torch.Tensor, rest: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`log_esf` ``(*, k + 1)`` of the entries ``top`` (the ``k >= 1`` largest, decreasing,
    ``(*, k)``) and ``rest`` (``(*, n)``, every other entry; those of ``top`` set to ``-inf``), in the
    compute dtype, for callers that already hold the top ``k`` (one ``topk`` instead of two)."""
    n = rest.shape[-1]
    if largest_log_binomial(n, k) < math.log(torch.finfo(top.dtype).max) - 1.0:
        return _split_log_esf(top, rest, k)
    return _sorted_log_esf(torch.cat([top, rest], dim=-1), k, _relative_logcumsumexp)  # log space (module doc)


def _split_log_esf(top: torch.Tensor, rest: torch.Tensor, degree: int) -> torch.Tensor:
    """``log e_j``, ``j = 0..degree``, from the ``degree`` largest entries ``top`` (decreasing) and the
    tail ``rest`` (every entry, those of ``top`` set to ``-inf``) (module doc)."""
    kth = top[..., -1:].detach()
    log_top = _sorted_log_esf(top, degree, _linear_prefix_log_sums)
    log_tail = _TailLogESF.apply(rest - kth, degree)[0]
    log_tail = log_tail + kth * torch.arange(degree + 1, dtype=top.dtype, device=top.device)
    # out_j = logsumexp_b (log_top[j - b] + log_tail[b]), b = 0..j
    j = torch.arange(degree + 1, device=top.device)
    offsets = j.unsqueeze(-1) - j  # [j, b] -> j - b
    terms = log_top[..., offsets.clamp_min(0)] + log_tail.unsqueeze(-2)
    return torch.logsumexp(terms.masked_fill(offsets < 0, -math.inf), dim=-1)
