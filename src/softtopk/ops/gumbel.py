"""Gumbel top-k: a relaxed sample of ``k`` items without replacement (Xie & Ermon, 2019).

Adding iid standard Gumbel noise to log-weights ``x`` and taking the top-k of the *keys*
``g = x + G`` draws a size-``k`` subset exactly as sampling ``k`` items one after another without
replacement with probabilities proportional to ``exp(x)`` (Gumbel-top-k, Kool et al. 2019).
:func:`softtopk.gumbel_topk` relaxes that top-k of the keys in one of two ways:

* ``relaxation="lapsum"`` (default): the closed-form Laplace soft top-k mask of the keys
  (:func:`softtopk.ops.lapsum.lapsum_mask`). Its entries lie in ``[0, 1]`` and sum to ``k`` exactly
  (the capped simplex, so ``1 - mask`` is an "unselected" mask), it costs ``O(n)`` per row instead
  of ``O(k n)``, has no sequential loop over ``k``, and tends to the hard top-k of the keys as
  ``tau -> 0``.
* ``relaxation="subsets"``: Xie & Ermon's ``k`` successive softmaxes (the ``SubsetOperator`` of their
  code): ``r = g``, ``a_0 = 0`` and for ``j = 1..k``: ``r <- r + log(1 - a_{j-1})``,
  ``a_j = softmax(r / tau)``, ``khot = Σ_j a_j``. Each step is a Gumbel-softmax argmax that damps the
  previous soft pick (odds times ``(1 - a)^{1/tau}``). Rows sum to ``k`` exactly, but **entries may
  exceed 1**: damping only rescales odds, so a dominant item keeps collecting mass at every step
  (for ``n = 2, k = 2, tau = 1`` the second softmax is always ``[1/2, 1/2]``, so a well-separated
  pair gives about ``[1.5, 0.5]``). This is structural, not rounding. ``log(1 - a)`` is computed
  exactly in log space (``log1p(-a)`` for entries with ``a <= 1/2``, a log-sum-exp over the other
  entries for the row's largest one), where the original clamps ``1 - a`` at a tiny number; the
  two agree wherever that clamp is inactive.

``hard=True`` returns the exact k-hot of the top-k of the keys ``g`` (a sample of the subset) in the
forward pass and the gradient of the relaxed mask in the backward pass (straight-through). The
original took the top-k of the relaxed subsets ``khot`` instead, which is not always the sample:
at small ``tau`` that ``khot`` can reorder the keys (e.g. ``x = [0.97, -3.85, -1.24, -3.34, -1.18,
-1.36]``, ``k = 3``, ``tau = 0.1``, no noise: the keys' top-3 is ``{0, 4, 2}``, the khot's ``{0, 5, 4}``).

Randomness: the noise is drawn as ``(rows, n)`` standard Gumbel values in the compute dtype
(float64 for float64 inputs, float32 otherwise) along the rows of ``x`` moved to ``dim``, from
``generator`` or torch's global RNG; alternatively pass the noise itself as a tensor.
"""

from __future__ import annotations

import torch

from ._straight_through import straight_through_ranks
from .perturbed import draw_noise

RELAXATIONS = ("lapsum", "subsets")


# ------------------------------------------------------------------------------------ relaxations


def _log1m_softmax(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a = softmax(z)`` and ``log(1 - a)`` along the last axis, both accurate for any ``z``.

    Only the row's largest entry can have ``a > 1/2``; there ``log(1 - a)`` is the log-sum-exp of
    the *other* entries minus that of all of them (never ``-inf`` for finite ``z`` and ``n >= 2``);
    elsewhere ``log1p(-a)`` is exact to rounding. The clamp keeps the unused branch finite (and its
    gradient zero) for the largest entry.
    """
    top = z.argmax(-1, keepdim=True)
    # measured from the maximum (exact for the entries near it, where it matters), so that the
    # normaliser is a small number and ``a`` sums to 1 to rounding however large ``z`` is
    z = z - z.gather(-1, top).detach()
    lse = z.logsumexp(-1, keepdim=True)
    a = (z - lse).exp()
    is_top = torch.zeros_like(z, dtype=torch.bool).scatter_(-1, top, True)
    others = z.masked_fill(is_top, float("-inf")).logsumexp(-1, keepdim=True) - lse
    return a, torch.where(is_top, others, torch.log1p(-a.clamp_max(0.5)))


def _subsets_steps(keys: torch.Tensor, k: int, tau: float) -> torch.Tensor:
    """The ``k`` successive softmaxes ``(B, n, k)`` of the subsets relaxation of ``keys`` (B, n).

    A ``-inf`` key (a row needs one finite key) becomes a floor ``800 τ`` below the smallest finite
    key: its weight underflows to exactly 0 while a finite key is left, and a row with fewer
    finite keys than steps never softmaxes an all ``-inf`` row (those later steps are finite)."""
    absent = keys == float("-inf")
    lowest = torch.where(absent, float("inf"), keys).amin(-1, keepdim=True).detach()
    floor = lowest - (800.0 * tau + lowest.abs() * 2.0**-10)
    r = torch.where(absent, floor, keys)
    steps = []
    for j in range(k):
        a, log1m = _log1m_softmax(r / tau)
        steps.append(a)
        if j + 1 < k:
            r = r + log1m
    return torch.stack(steps, -1)


def gumbel_keys(rows: torch.Tensor, noise: bool | torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Perturbed keys ``rows + G``: drawn (``noise=True``), given rows of draws, or none (``False``).

    Drawn keys are ``rows - log(-log U)`` (``U`` uniform, from ``generator`` or the global RNG),
    bitwise ``rows + G`` for the draws :func:`softtopk.ops.perturbed.draw_noise` gives."""
    if isinstance(noise, torch.Tensor):
        return rows + noise
    if noise:
        return rows - draw_noise(tuple(rows.shape), "gumbel", generator, rows, negated=True)
    return rows


# ---------------------------------------------------------------------------------- row functions


def gumbel_ranks_rows(
    rows: torch.Tensor,
    k: int,
    *,
    tau: float = 1.0,
    hard: bool = False,
    noise: bool | torch.Tensor = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Per-step soft picks ``(B, n, k)`` of the subsets relaxation of rows ``(B, n)``.

    Column ``j`` is the ``j``-th successive softmax (it sums to 1); the columns sum to the subsets
    ``khot``. ``hard=True``: forward the one-hot ranks of the keys' top-k (column ``j`` picks the
    ``j``-th largest key, i.e. the ``j``-th item drawn), backward the relaxed ranks' gradient. Only
    ``relaxation="subsets"`` has per-step ranks (the registry refuses ``"lapsum"`` for them); its
    mask is their sum. ``noise`` may be a tensor of draws of the rows' shape.
    """
    keys = gumbel_keys(rows, noise, generator)
    ranks = _subsets_steps(keys, k, tau)
    return straight_through_ranks(keys, ranks) if hard else ranks
