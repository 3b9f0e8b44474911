"""Stochastic soft top-k operators, each with explicit randomness (``generator`` or given noise):
the perturbed-optimizer mask (Berthet et al.), the noised k-th largest value (pytopk) and Gumbel
top-k subset sampling (Xie & Ermon). Same seed, same output. The estimators and their memory are
described in :mod:`softtopk.ops.perturbed` and :mod:`softtopk.ops.gumbel`.
"""

from __future__ import annotations

import torch

from ._layout import along_rows
from ._registry import resolve
from ._validation import (
    check_bool,
    check_generator,
    check_int,
    check_noise,
    check_real,
    check_scale,
    check_scales,
    check_scores,
    check_topk_args,
)
from .operators import soft_topk
from .ops import noised_numba
from .ops.compute import compute_dtype
from .ops.perturbed import fresh_kth_value, noised_kth_value_of

__all__ = ["gumbel_topk", "noised_kth_value", "perturbed_topk"]


def perturbed_topk(
    x: torch.Tensor,
    k: int,
    *,
    sigma: float = 1.0,
    n_samples: int = 100,
    noise: str = "gaussian",
    generator: torch.Generator | None = None,
    dim: int = -1,
    largest: bool = True,
    hard: bool = False,
) -> torch.Tensor:
    """Perturbed top-k mask: the Monte-Carlo mean of hard top-k masks of noisy scores.

    .. math::
        y(x) = \\frac{1}{S} \\sum_{s=1}^{S} \\operatorname{topk}_k(x + \\sigma Z_s), \\qquad
        \\nabla_x \\approx \\frac{1}{\\sigma S} \\sum_{s=1}^{S}
        \\langle g, \\operatorname{topk}_k(x + \\sigma Z_s) \\rangle\\, \\nabla\\nu(Z_s)

    where :math:`\\operatorname{topk}_k` is the 0/1 indicator of the ``k`` largest entries,
    :math:`Z_s` are iid standard Gaussian (:math:`\\nabla\\nu(z) = z`) or standard Gumbel
    (:math:`\\nabla\\nu(z) = 1 - e^{-z}`) vectors and :math:`g` is the incoming gradient. The
    gradient is Berthet et al.'s unbiased estimator of the Jacobian of :math:`\\mathbb{E}[y]`
    (for the same noise as the forward pass), not the derivative of the piecewise-constant
    :math:`y`. Each row of the mask sums to ``k`` (up to rounding of ``count / S``) and its entries
    are multiples of ``1 / S`` in ``[0, 1]``. With Gumbel noise and ``k = 1``,
    :math:`\\mathbb{E}[y] = \\operatorname{softmax}(x / \\sigma)`.

    Memory: the ``x.numel() * n_samples`` noise values are drawn and kept for backward (with the
    ``x.numel() / n * n_samples * k`` selected indices); the noise is unavoidable for this estimator.

    Args:
        x: scores, floating tensor of any shape (float16/bfloat16 computed in float32).
        k: number of selected entries, ``1 <= k <= x.shape[dim]``.
        sigma: noise scale, a positive finite number. Default ``1.0``.
        n_samples: number of noise draws ``S``, an int ``>= 1``. Default ``100``.
        noise: ``"gaussian"`` (default) or ``"gumbel"``.
        generator: a :class:`torch.Generator` on ``x``'s device type, or ``None`` (global RNG).
            The noise ``(rows, S, n)`` is drawn in the compute dtype (float64 for float64 inputs,
            float32 otherwise) along the rows of ``x`` moved to ``dim``.
        dim: the axis to select along. Default ``-1``.
        largest: ``False`` selects the ``k`` smallest entries (the mask of ``-x``). Default ``True``.
        hard: ``True``: forward the exact k-hot mask of ``x``, backward the estimator above
            (straight-through). Default ``False``.

    Returns:
        A tensor of ``x``'s shape and dtype: the perturbed mask.

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([0.0, 3.0, 1.0, 2.0], requires_grad=True)
        >>> g = torch.Generator().manual_seed(0)
        >>> y = softtopk.perturbed_topk(x, 2, sigma=0.5, n_samples=10000, generator=g)
        >>> y.detach()
        tensor([9.0000e-04, 9.9910e-01, 7.7900e-02, 9.2210e-01])
        >>> y[3].backward()  # exact: about (0, 0, -0.21, 0.21)
        >>> x.grad.round(decimals=2) + 0.0
        tensor([-0.0200,  0.0000, -0.2400,  0.1900])

    References:
        Q. Berthet, M. Blondel, O. Teboul, M. Cuturi, J.-P. Vert, F. Bach, "Learning with
        Differentiable Perturbed Optimizers", NeurIPS 2020. C. Garcin, M. Servajean, A. Joly,
        J. Salmon, "Stochastic smoothing of the top-K calibrated hinge loss for deep imbalanced
        classification", ICML 2022.
    """
    x = check_scores("x", x)
    check_generator("generator", generator, x.device)
    return soft_topk(
        x,
        k,
        method="perturbed",
        dim=dim,
        largest=largest,
        sigma=sigma,
        n_samples=n_samples,
        noise=noise,
        generator=generator,
        hard=hard,
    )


def noised_kth_value(
    x: torch.Tensor,
    k: int,
    *,
    epsilon: float = 1.0,
    n_samples: int | None = None,
    dim: int = -1,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    largest: bool = True,
) -> torch.Tensor:
    """Smoothed k-th largest value along ``dim`` (pytopk's ``NoisedTopK``).

    .. math::
        \\operatorname{top}_{k,\\epsilon}(x) = \\frac{1}{S} \\sum_{s=1}^{S} (x + \\epsilon Z_s)_{[k]},
        \\qquad \\nabla_x = \\frac{1}{S} \\sum_{s=1}^{S} e_{\\arg (x + \\epsilon Z_s)_{[k]}}\\, g

    with :math:`v_{[k]}` the k-th largest entry, :math:`Z_s` iid standard Gaussian and :math:`g` the
    incoming gradient. The gradient is exact for the drawn noise and an unbiased estimate of
    :math:`\\nabla \\mathbb{E}[(x + \\epsilon Z)_{[k]}]`. ``epsilon = 0`` gives the exact k-th largest
    value with a one-hot subgradient (the noise is still drawn, so the RNG advances as for ``epsilon > 0``).

    Unless given, the noise is drawn afresh at every call from ``generator``, in one of two ways
    with the same law (as the noised losses draw theirs, :mod:`softtopk.losses.noised`): on
    float32/float64 CPU tensors with numba (eager, outside ``torch.func`` transforms), by a kernel
    seeded with one integer from the generator, which draws only the Gaussians of the entries that
    can reach the k-th largest sum and accounts for the others by their chance of getting there;
    elsewhere as ``torch.randn(x.shape + (n_samples,), generator=generator, device=x.device)`` in
    float32, cast to the compute dtype, where the global RNG gives pytopk 0.1.0's values
    (:class:`softtopk.compat.pytopk.NoisedTopK` passes that draw as ``noise`` on every device).

    Args:
        x: scores, floating tensor of any shape (float16/bfloat16 computed in float32).
        k: which largest value, ``1 <= k <= x.shape[dim]``.
        epsilon: noise scale, a finite number ``>= 0``. Default ``1.0``.
        n_samples: number of draws ``S`` (int ``>= 1``). Default ``None``: 5, or the last axis of
            ``noise``; when given together with ``noise`` it must equal ``noise.shape[-1]``.
        dim: the axis to select along (an axis of ``x``). Default ``-1``.
        generator: a :class:`torch.Generator` on ``x``'s device type, or ``None`` (global RNG).
            Type-checked but unused when ``noise`` is given.
        noise: optional fixed noise of shape ``x.shape + (S,)``, treated as data (its gradient is
            ``epsilon`` times the per-sample one-hots).
        largest: ``False`` gives the smoothed k-th *smallest* value, ``-top_{k,eps}(-x)`` (with the
            noise negated, so the same draws give mirrored samples). Default ``True``.

    Returns:
        ``x``'s shape with ``dim`` removed, in ``x``'s dtype.

    Example:
        >>> import torch, softtopk
        >>> x = torch.tensor([[-1.5, 2.0, 0.7, 3.8], [-1.1, -5.4, 0.1, 2.3]], requires_grad=True)
        >>> softtopk.noised_kth_value(x, 3, epsilon=0.0).detach()
        tensor([ 0.7000, -1.1000])
        >>> noise = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))  # else drawn by the call
        >>> out = softtopk.noised_kth_value(x, 3, noise=noise)
        >>> out.detach()
        tensor([ 0.9234, -1.1458])
        >>> out.sum().backward()
        >>> x.grad
        tensor([[0.0000, 0.4000, 0.6000, 0.0000],
                [0.8000, 0.0000, 0.2000, 0.0000]])

    References:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022. Q. Berthet et al., "Learning with
        Differentiable Perturbed Optimizers", NeurIPS 2020.
    """
    x, dim, k = check_topk_args(x, k, dim)
    epsilon = check_scale("epsilon", check_real("epsilon", epsilon, low=0.0), x.dtype, zero=True)
    if n_samples is not None:
        n_samples = check_int("n_samples", n_samples, low=1)
    generator = check_generator("generator", generator, x.device)
    scores = x.to(compute_dtype(x.dtype))
    largest = check_bool("largest", largest)
    if noise is None:
        samples = 5 if n_samples is None else n_samples
        fresh = noised_numba.fresh(scores, epsilon, samples, generator)
        if fresh is not None:  # CPU rows: the kernel draws what can matter (same law, its own values)
            rows = scores.movedim(dim, -1)
            flat = rows.reshape(-1, rows.shape[-1])
            out = fresh_kth_value(flat if largest else -flat, fresh, k)
            return (out if largest else -out).reshape(rows.shape[:-1]).to(x.dtype)
        noise = torch.randn((*x.shape, samples), generator=generator, device=x.device, dtype=torch.float32)
    else:
        noise = check_noise("noise", noise, x.shape, samples=n_samples or 0)
    if epsilon == 0:  # exact k-th value (a mean of S copies can be off by an ulp); the RNG still advanced
        noise = noise[..., :1]
    # epsilon * noise is rounded in the noise's dtype before the cast, as in pytopk (bitwise equal values)
    scaled = (epsilon * noise).to(scores.dtype)
    if largest:
        return noised_kth_value_of(scores, scaled, k, dim).to(x.dtype)
    return (-noised_kth_value_of(-scores, -scaled, k, dim)).to(x.dtype)


def gumbel_topk(
    x: torch.Tensor,
    k: int,
    *,
    tau: float = 1.0,
    hard: bool = False,
    relaxation: str = "lapsum",
    noise: bool | torch.Tensor = True,
    generator: torch.Generator | None = None,
    dim: int = -1,
    largest: bool = True,
) -> torch.Tensor:
    """Relaxed k-hot sample of ``k`` items without replacement, with probabilities ``∝ exp(x)``.

    .. math::
        g = x + G, \\quad G_i \\overset{iid}{\\sim} \\operatorname{Gumbel}(0, 1), \\qquad
        \\operatorname{topk}_k(g) \\sim \\text{draw } k \\text{ without replacement}, \\qquad
        P(i \\text{ next}) \\propto e^{x_i}

    The top-k indicator of the keys ``g`` is relaxed with temperature ``tau``:

    * ``"lapsum"`` (default): :math:`m_i = F((g_i - t)/\\tau)` with ``F`` the Laplace CDF and ``t``
      solved in closed form so that :math:`\\sum_i m_i = k`. Entries in ``[0, 1]``, the sum exactly
      ``k`` (the capped simplex), ``O(n)`` per row. This is the default because it is a genuine
      relaxed k-hot: ``1 - mask`` is a valid "unselected" mask, no entry exceeds 1, and it needs
      no sequential loop over ``k``.
    * ``"subsets"``: Xie & Ermon's successive softmaxes :math:`a_j = \\operatorname{softmax}(r_j/\\tau)`,
      :math:`r_1 = g`, :math:`r_{j+1} = r_j + \\log(1 - a_j)`, mask :math:`\\sum_{j=1}^k a_j`.
      Sums to ``k`` exactly, ``O(k n)`` per row; **entries can exceed 1** (structurally: damping
      rescales odds only, so a dominant item collects mass at every step).

    Both tend to the exact k-hot of the top-k of ``g`` as ``tau -> 0``.

    Args:
        x: log-weights (scores), floating tensor of any shape (float16/bfloat16 computed in float32).
        k: subset size, ``1 <= k <= x.shape[dim]``.
        tau: temperature, a positive finite number. Default ``1.0``.
        hard: ``True``: forward the exact k-hot of the top-k of the keys ``g`` (a sample), backward
            the gradient of the relaxed mask (straight-through). Default ``False``.
        relaxation: ``"lapsum"`` (default) or ``"subsets"``.
        noise: ``True`` (default) draws the Gumbel noise; ``False`` uses ``g = x`` (deterministic);
            a floating tensor of ``x``'s shape is used as the standard Gumbel draws themselves
            (``generator`` is then ignored; gradients flow into it if it requires them).
        generator: a :class:`torch.Generator` on ``x``'s device type, or ``None`` (global RNG).
            The noise ``(rows, n)`` is drawn in the compute dtype along the rows of ``x`` moved to
            ``dim``.
        dim: the axis to select along. Default ``-1``.
        largest: ``False`` samples with probabilities ``∝ exp(-x)`` (the subset of ``-x``). Default
            ``True``.

    Returns:
        A tensor of ``x``'s shape and dtype: the relaxed (or hard) k-hot mask; each slice along
        ``dim`` sums to ``k``.

    Example:
        >>> import torch
        >>> from softtopk import gumbel_topk
        >>> x = torch.tensor([2.0, 0.0, 1.0, -1.0], requires_grad=True)
        >>> g = torch.Generator().manual_seed(0)
        >>> gumbel_topk(x, 2, tau=0.5, generator=g).detach().round(decimals=4)
        tensor([0.9818, 0.8591, 0.1550, 0.0041])
        >>> gumbel_topk(x, 2, relaxation="subsets", noise=False).detach().round(decimals=4)
        tensor([1.0843, 0.2399, 0.5841, 0.0917])
        >>> y = gumbel_topk(x, 2, hard=True, generator=torch.Generator().manual_seed(0))
        >>> y.detach()  # a sample: the exact k-hot of the top-2 keys
        tensor([1., 1., 0., 0.])
        >>> (y * torch.tensor([1.0, 0.0, 0.0, 0.0])).sum().backward()  # the relaxed mask's gradient
        >>> x.grad.round(decimals=4)
        tensor([ 0.0784, -0.0332, -0.0389, -0.0063])

    References:
        S. M. Xie, S. Ermon, "Reparameterizable Subset Sampling via Continuous Relaxations",
        IJCAI 2019. W. Kool, H. van Hoof, M. Welling, "Stochastic Beams and Where to Find Them:
        The Gumbel-Top-k Trick for Sampling Sequences Without Replacement", ICML 2019.
    """
    x, dim, k = check_topk_args(x, k, dim)
    draws = None if isinstance(noise, bool) else check_noise("noise", noise, x.shape)
    params = {
        "tau": tau,
        "hard": hard,
        "relaxation": relaxation,
        "noise": noise if draws is None else True,
        "generator": generator,
    }
    spec, params = resolve("gumbel", params, "mask")
    check_scales(params, x.dtype)
    check_generator("generator", generator, x.device)
    if draws is not None:  # the draws, as rows in the compute dtype
        moved = draws.movedim(dim, -1)
        params["noise"] = moved.reshape(-1, moved.shape[-1]).to(compute_dtype(x.dtype))
    largest = check_bool("largest", largest)
    return along_rows(x, dim, lambda rows: spec.mask_kernel()(rows if largest else -rows, k, **params), None)
