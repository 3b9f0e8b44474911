"""Row kernels of the top-k SVM losses (:mod:`softtopk.losses.smooth_svm`; Berrada et al., ICLR
2018): per-row losses ``(logits (R, C), label (R,)) -> (R,)`` of the smooth top-k and top-1 SVMs
and of the hard top-k hinge, and the limits at ``+inf`` logits around them."""

from __future__ import annotations

import math

import torch

from . import svm_triton
from .compute import topk_rows
from .esf import log_esf_of_split
from .svm_subsets import FAR, fits_subset_path, smooth_topk_rows, svm_softplus


def split_label(logits: torch.Tensor, label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The label's score ``(R,)``, the other scores ``(R, C)`` (label's entry ``-inf``) and where the
    label's score is ``-inf`` (its loss is ``inf``, as cross-entropy's; the score is fed as 0, a
    finite stand-in that keeps the rest of the computation, and the gradient, finite)."""
    label = label.unsqueeze(-1)
    label_score = logits.gather(-1, label).squeeze(-1)
    masked = label_score == -math.inf
    return label_score.masked_fill(masked, 0.0), logits.scatter(-1, label, -math.inf), masked


def half_gap(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a - b)/2``, halved first: finite for any finite ``a``, ``b`` (``a - b`` overflows for scores
    near the dtype's largest), with the rounding of ``a - b`` (halving is exact)."""
    return torch.add(a * 0.5, b, alpha=-0.5)


def extended_svm_rows(logits: torch.Tensor, label: torch.Tensor, k: int, rows_fn) -> torch.Tensor:
    """``rows_fn(logits, label)`` ``(R,)`` with ``+inf`` scores given their limits (scores at ``±M``,
    ``M → ∞``, the infinite ones tied as in ``softtopk._extended``), for ``P`` other classes at ``+inf``:

    * ``P < k``: the ``+inf`` classes take ``P`` of the ``k`` places; the loss tends to the finite
      one of the other classes with ``k - P`` places (``log e_k - log e_{k-1}`` tends to theirs);
      0 when the label is at ``+inf`` too.
    * ``P >= k``, label finite: the label is out of the top k for good: ``inf``, gradient 0.
    * ``P >= k``, label at ``+inf``: the tied limit, which the finite classes leave.

    ``+inf`` enters as the dtype's largest value (gradient 0 there): every kernel treats a score that
    far above the others as ``+inf`` (its differences are halved, or clamped at ``FAR``), and the
    infinite scores tie, which gives all three limits but the ``inf`` of the second case, set here
    (NaN where the row holds a NaN). No value is read on the host."""
    positive = torch.isposinf(logits)
    label_inf = positive.gather(-1, label.unsqueeze(-1)).squeeze(-1)
    beaten = (positive.sum(-1) >= k) > label_inf  # k others at +inf, label below (bool a > b: a and not b)
    loss = rows_fn(logits.clamp_max(torch.finfo(logits.dtype).max), label)
    loss = torch.where(beaten, loss.detach() + math.inf, loss)
    return torch.where(logits.isnan().any(-1), math.nan, loss)  # a NaN stays NaN, in its own row


def smooth_topk_svm_rows(logits: torch.Tensor, label: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    """The smooth top-k SVM's rows with the limits at ``±inf`` and NaN rows of :func:`extended_svm_rows`
    (the subset kernel takes them in its own pass)."""
    if fits_subset_path(logits.shape[-1] - 1, k, logits.dtype):
        if svm_triton.usable(logits, k, tau, alpha):
            return svm_triton.triton_rows(logits, label, k, tau, alpha)
        return smooth_topk_rows(logits, label, k, tau, alpha)
    return extended_svm_rows(logits, label, k, lambda s, y: _log_space_svm_rows(s, y, k, tau, alpha))


def _log_space_svm_rows(logits: torch.Tensor, label: torch.Tensor, k: int, tau: float, alpha: float) -> torch.Tensor:
    # one topk of the other scores gives the ESF's top part, the shift (the k-th largest) and whether
    # k of them are above -inf; the special rows are fixed on (R, k) and (R,) tensors, never (R, C)
    label_score, others, masked = split_label(logits, label)
    top_scores, top_index = topk_rows(others, k)
    kth = top_scores[:, -1:].detach()
    # fewer than k other classes above -inf: the label is surely among the top k, the loss is 0
    # (the limit); those rows are computed on a zero stand-in so that nothing is NaN
    enough = kth.squeeze(-1) > -math.inf
    shift = kth.masked_fill(~enough.unsqueeze(-1), 0.0)
    scale = 1.0 / (k * tau)
    # an entry FAR above the k-th counts as +inf (its difference may overflow): exact to rounding
    top_values = (top_scores - shift).mul_(scale).clamp_(0.0, FAR).masked_fill_(~enough.unsqueeze(-1), 0.0)
    rest = others.scatter(-1, top_index, -math.inf).sub_(shift).mul_(scale)
    log_e = log_esf_of_split(top_values, rest, k)[:, k - 1 :]  # log e_{k-1}, log e_k
    loss = svm_softplus(log_e[:, 1] - log_e[:, 0], half_gap(shift.squeeze(-1), label_score) * (2.0 / k), tau, alpha)[0]
    return loss.masked_fill(~enough, 0.0).masked_fill(masked, math.inf)


def smooth_top1_svm_rows(logits: torch.Tensor, label: torch.Tensor, tau: float, alpha: float) -> torch.Tensor:
    label_score, others, masked = split_label(logits, label)
    # tau * log(1 + sum_{j != y} exp(d_j / tau)), d_j = alpha + s_j - s_y; the 1 is the label's own
    # term. With m = max(0, max d) it is m + tau * log(e^(-m/tau) + sum_j e^((d_j - m)/tau)), whose
    # exponents are <= 0: finite whenever the loss is, for any tau (d/tau may overflow). A d_j beyond
    # the dtype (scores near its largest) is an infinite loss, with gradient 0 (an infinite term
    # would make the gradient NaN)
    gaps = half_gap(others, label_score.unsqueeze(-1)).mul_(2.0).add_(alpha)
    beyond = gaps.amax(-1) == math.inf
    terms = torch.nn.functional.pad(gaps.clamp_max(torch.finfo(gaps.dtype).max), (0, 1))  # the label's 0
    m = terms.amax(-1, keepdim=True).detach()  # >= 0
    lse = torch.logsumexp(terms.sub(m).div_(tau), dim=-1)
    return torch.add(m.squeeze(-1), lse, alpha=tau).masked_fill(beyond | masked, math.inf)


def hard_svm_rows(logits: torch.Tensor, label: torch.Tensor, k: int, alpha: float) -> torch.Tensor:
    label_score, others, masked = split_label(logits, label)
    kth_other = topk_rows(others, k)[0][:, k - 1]  # -inf with fewer than k others: the loss is 0
    hinge = alpha + half_gap(kth_other, label_score) * (2.0 / k)
    return torch.where(masked, math.inf, torch.clamp(hinge, min=0.0))
