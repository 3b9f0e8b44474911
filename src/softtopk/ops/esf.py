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

So :func:`log_esf` loops over ``j = 1..k`` (not over ``n``) and each step is one vectorised
cumulative sum over the whole batch: ``O(n k)`` work, ``k`` tensor operations, plain autograd.

Numerics. The entries are shifted by their maximum
(:math:`\\log e_j(c\\,x) = j \\log c + \\log e_j(x)`) and the ``k`` largest are put first, in
decreasing order (followed by all ``n`` entries with those ``k`` replaced by ``x = 0``: a ``topk``
instead of a full sort). Then every prefix value that is used (``i >= j``) lies between
:math:`\\prod_{l \\le j} x_l` (its first term, the largest ``j``-product) and
:math:`\\binom{n}{j}` times that, so each prefix sum is accumulated in linear space relative to its
first term: nothing that matters can underflow, and the running sum stays below
:math:`\\binom{n}{j}`. Where :math:`\\binom{n}{j}` would overflow the compute dtype (float32:
e.g. ``n = 1000, k >= 19``; float64: ``n = 1000, k >= ~150``) the prefix sums are taken with
``torch.logcumsumexp`` instead, which is exact in log space but slower. Which path runs depends only
on ``(n, k, dtype)``, never on the data.

This form was the fastest of three candidates in a one-thread CPU comparison during development
(the others: ``logcumsumexp`` for every degree, and a loop over ``n`` of ``logaddexp`` on
``(B, k+1)``); that comparison is not kept in ``benchmarks/``. ``tests/test_esf.py`` checks it
against float64 and brute force.

Reference: L. Berrada, A. Zisserman, M. P. Kumar, "Smooth Loss Functions for Deep Top-k
Classification", ICLR 2018 (Sec. 4: the loss as a ratio of ESFs, computed in log space; they use a
divide-and-conquer product with a hand-written backward).
"""

from __future__ import annotations

import math
import numbers

import torch

from .._validation import check_scores, compute_dtype

__all__ = ["log_esf"]


def _largest_log_binomial(n: int, k: int) -> float:
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


def log_esf(log_x: torch.Tensor, k: int) -> torch.Tensor:
    """Log elementary symmetric polynomials :math:`\\log e_j(\\exp a)` for ``j = 0..k``.

    .. math::
        \\mathrm{out}[\\ldots, j] = \\log \\sum_{|S| = j} \\exp\\Big(\\sum_{i \\in S} a_i\\Big)

    Args:
        log_x: ``a`` of shape ``(*, n)``, the logarithms of the positive values ``x``. Entries may be
            ``-inf`` (``x_i = 0``) if every row keeps at least ``k`` finite entries.
        k: highest degree, an int ``>= 0``. Degrees above ``n`` give ``-inf`` (``e_j = 0``).

    Returns:
        ``(*, k + 1)``, in ``log_x``'s dtype (float16/bfloat16 are computed in float32). Shift
        equivariant: ``log_esf(a + c, k)[..., j] = log_esf(a, k)[..., j] + j c``. Differentiable
        with plain autograd; :math:`\\partial \\log e_j / \\partial a_i = x_i\\, e_{j-1}(x_{\\setminus i}) / e_j`.

    Example:
        >>> import torch
        >>> from softtopk.ops.esf import log_esf
        >>> log_esf(torch.tensor([1.0, 2.0, 3.0]).log(), 3).exp().round()  # 1, 1+2+3, 2+3+6, 6
        tensor([ 1.,  6., 11.,  6.])

    Reference:
        Berrada, Zisserman & Kumar, "Smooth Loss Functions for Deep Top-k Classification",
        ICLR 2018.
    """
    log_x = check_scores(log_x, "log_x")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k must be an int, got {type(k).__name__} {k!r}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    k, n = int(k), log_x.shape[-1]
    if n == 0:
        raise ValueError("log_x must have at least one entry along its last dim")
    degree = min(k, n)
    a = log_x.to(compute_dtype(log_x.dtype))
    if degree > 0:
        # the `degree` largest entries first (descending), then all n entries with those set to
        # x = 0: only the first terms of each prefix sum need an order (module doc), no full sort
        top = a.topk(degree, dim=-1)
        a = torch.cat([top.values, a.scatter(-1, top.indices, -math.inf)], dim=-1)
    largest = a.amax(dim=-1, keepdim=True).detach()
    a = a - largest
    fits = _largest_log_binomial(n, degree) < math.log(torch.finfo(a.dtype).max) - 1.0
    prefix_log_sums = _linear_prefix_log_sums if fits else _relative_logcumsumexp

    length = a.shape[-1]
    prefix = torch.zeros_like(a[..., :1]).expand(*a.shape[:-1], length + 1)  # log e_0 of every prefix
    coefficients = [prefix[..., -1]]
    for j in range(1, degree + 1):
        # prefix holds log e_{j-1} of the prefixes of length j-1..length; keep lengths j.. for e_j
        prefix = prefix_log_sums(a[..., j - 1 :] + prefix[..., :-1])
        coefficients.append(prefix[..., -1])
    out = torch.stack(coefficients, dim=-1) + largest * torch.arange(degree + 1, dtype=a.dtype, device=a.device)
    if k > n:
        out = torch.cat([out, out.new_full((*out.shape[:-1], k - n), -math.inf)], dim=-1)
    return out.to(log_x.dtype)
