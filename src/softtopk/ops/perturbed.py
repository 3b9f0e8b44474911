"""Monte-Carlo perturbed top-k: a perturbed-optimizer mask and pytopk's noised k-th largest value.

* :func:`perturbed_topk` averages hard top-k masks of ``x + sigma * Z`` over ``S`` noise draws and
  differentiates the smoothed mask with the perturbed-optimizer estimator of Berthet et al. (2020)
  (a score-function estimator: it needs only the noise and the selected indices).
* :func:`noised_kth_value` is the smoothed k-th largest value of Garcin et al. (2022) (pytopk's
  ``NoisedTopK``): the mean over ``S`` draws of the k-th largest entry of ``x + epsilon * Z``, with
  the exact gradient of that Monte-Carlo estimate (one-hot of the perturbed k-th position).

Both draw ``O(B S n)`` noise (``B`` rows of ``n`` items, ``S`` samples): that memory is inherent in
the Monte-Carlo estimate. For backward, :func:`perturbed_topk` saves the noise and the ``O(B S k)``
selected indices and :func:`noised_kth_value` only the ``O(B S)`` k-th positions, never a dense
``(B, S, n)`` mask. Randomness comes from ``generator`` (a :class:`torch.Generator` on the input's
device type) or, when ``None``, from torch's global RNG. Under :func:`torch.func.vmap` pass
``randomness="different"`` or ``"same"`` (the default ``"error"`` refuses random draws). Under
:func:`torch.compile` both trace in one graph with ``generator=None``; a Generator object is a graph
break (it still runs).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from .._rows import along_rows
from .._validation import check_dim, check_k, check_real, check_scores, compute_dtype

NOISE_KINDS = ("gaussian", "gumbel")

__all__ = ["NOISE_KINDS", "check_generator", "check_n_samples", "check_noise_kind", "noised_kth_value",
           "perturbed_topk", "perturbed_topk_rows"]


# ---------------------------------------------------------------------------------- validation


def check_generator(name: str, value: Any, device: torch.device | None = None) -> torch.Generator | None:
    """``None`` or a :class:`torch.Generator` (on ``device``'s type when given)."""
    if value is not None and not isinstance(value, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(value).__name__} {value!r}")
    if value is not None and device is not None and value.device.type != device.type:
        raise ValueError(
            f"{name} must be on the input's device type ({device.type}), got a {value.device.type} generator"
        )
    return value


def check_noise_kind(name: str, value: Any) -> str:
    """One of :data:`NOISE_KINDS`."""
    if not isinstance(value, str) or value not in NOISE_KINDS:
        raise ValueError(f"{name} must be one of {NOISE_KINDS}, got {value!r}")
    return value


def check_n_samples(name: str, value: Any) -> int:
    """An int ``>= 1`` (TypeError for non-ints and bools)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


# ---------------------------------------------------------------------------- perturbed top-k mask


def _draw(shape: tuple[int, ...], kind: str, generator, like: torch.Tensor) -> torch.Tensor:
    """Standard Gaussian or Gumbel noise of ``shape`` in ``like``'s dtype, on its device."""
    if kind == "gaussian":
        return torch.randn(shape, generator=generator, device=like.device, dtype=like.dtype)
    uniform = torch.rand(shape, generator=generator, device=like.device, dtype=like.dtype)
    # -log(-log U), in place on the fresh draws; finite: no U = 0
    return uniform.clamp_min_(torch.finfo(like.dtype).tiny).log_().neg_().log_().neg_()


class _PerturbedTopK(torch.autograd.Function):
    """``(rows (B, n), noise (B, S, n))`` → mean hard top-k mask of ``rows + sigma * noise``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows, noise, k, sigma, kind):
        samples = noise.shape[1]
        index = torch.add(rows.unsqueeze(1), noise, alpha=sigma).topk(k, dim=-1, sorted=False).indices
        flat = index.flatten(1)  # (B, S k)
        counts = torch.zeros_like(rows).scatter_add(1, flat, torch.ones_like(flat, dtype=rows.dtype))
        return counts / samples, index

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, noise, _, ctx.sigma, ctx.kind = inputs
        ctx.save_for_backward(noise, output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _unused):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        noise, index = ctx.saved_tensors
        batch, samples, k = index.shape
        inner = grad.gather(1, index.flatten(1)).view(batch, samples, k).sum(-1)  # <g, y_s>  (B, S)
        # nabla nu(Z) for the noise density exp(-nu): z (Gaussian), 1 - exp(-z) (Gumbel)
        score = noise if ctx.kind == "gaussian" else -torch.expm1(-noise)
        grad_rows = torch.bmm(inner.unsqueeze(1), score).squeeze(1) / (ctx.sigma * samples)
        return grad_rows, None, None, None, None


def perturbed_topk_rows(
    rows: torch.Tensor, k: int, *, sigma: float = 1.0, n_samples: int = 100, noise: str = "gaussian",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Perturbed top-k mask ``(B, n)`` of validated rows ``(B, n)`` (already in the compute dtype)."""
    draws = _draw((rows.shape[0], n_samples, rows.shape[1]), noise, generator, rows)
    return _PerturbedTopK.apply(rows, draws, k, sigma, noise)[0]


def perturbed_topk(
    x: torch.Tensor, k: int, *, sigma: float = 1.0, n_samples: int = 100, noise: str = "gaussian",
    generator: torch.Generator | None = None, dim: int = -1,
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

    Returns:
        A tensor of ``x``'s shape and dtype: the perturbed mask.

    Example:
        >>> import torch, softtopk.ops.perturbed as P
        >>> x = torch.tensor([0.0, 3.0, 1.0, 2.0], requires_grad=True)
        >>> g = torch.Generator().manual_seed(0)
        >>> y = P.perturbed_topk(x, 2, sigma=0.5, n_samples=10000, generator=g)
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
    x = check_scores(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim], dim)
    sigma = check_real("sigma", sigma, positive=True)
    n_samples = check_n_samples("n_samples", n_samples)
    noise = check_noise_kind("noise", noise)
    generator = check_generator("generator", generator, x.device)
    return along_rows(
        x, dim,
        lambda rows: perturbed_topk_rows(rows, k, sigma=sigma, n_samples=n_samples, noise=noise, generator=generator),
        None,
    )


# ------------------------------------------------------------------------- noised k-th largest value


class _NoisedKthValue(torch.autograd.Function):
    """``(x, scaled noise x.shape + (S,))`` → mean over ``S`` of the k-th largest of ``x + noise`` along ``dim``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, noise, k, dim):
        values, index = (x.unsqueeze(-1) + noise).topk(k, dim=dim)
        return values.select(dim, k - 1).mean(-1), index.select(dim, k - 1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, _, _, ctx.dim = inputs
        ctx.x_shape = x.shape
        ctx.save_for_backward(output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _unused):
        (index,) = ctx.saved_tensors  # x.shape without dim, + (S,)
        dim, samples = ctx.dim, index.shape[-1]
        grad_x = grad_noise = None
        if ctx.needs_input_grad[0]:  # the S one-hots are counted straight into x's shape
            moved = index.movedim(-1, dim)
            counts = grad.new_zeros(ctx.x_shape).scatter_add(dim, moved, torch.ones_like(moved, dtype=grad.dtype))
            grad_x = counts / samples * grad.unsqueeze(dim)
        if ctx.needs_input_grad[1]:
            share = (grad / samples).unsqueeze(-1).expand(index.shape)
            grad_noise = grad.new_zeros((*ctx.x_shape, samples))
            grad_noise = grad_noise.scatter(dim, index.unsqueeze(dim), share.unsqueeze(dim))
        return grad_x, grad_noise, None, None


def _check_noise_tensor(noise: Any, x: torch.Tensor, n_samples: int | None) -> torch.Tensor:
    if not isinstance(noise, torch.Tensor) or not noise.is_floating_point():
        raise TypeError(f"noise must be a floating torch.Tensor or None, got {type(noise).__name__} "
                        f"{getattr(noise, 'dtype', noise)!r}")
    if n_samples is None and noise.dim() == x.dim() + 1 and noise.shape[-1] >= 1:
        n_samples = noise.shape[-1]
    if noise.shape != (*x.shape, n_samples):
        want = ", ".join(str(s) for s in (*x.shape, "n_samples" if n_samples is None else n_samples))
        raise ValueError(f"noise must have shape x.shape + (n_samples,) = ({want}), got {tuple(noise.shape)}")
    return noise


def noised_kth_value(
    x: torch.Tensor, k: int, *, epsilon: float = 1.0, n_samples: int | None = None, dim: int = -1,
    generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Smoothed k-th largest value along ``dim`` (pytopk's ``NoisedTopK``).

    .. math::
        \\operatorname{top}_{k,\\epsilon}(x) = \\frac{1}{S} \\sum_{s=1}^{S} (x + \\epsilon Z_s)_{[k]},
        \\qquad \\nabla_x = \\frac{1}{S} \\sum_{s=1}^{S} e_{\\arg (x + \\epsilon Z_s)_{[k]}}\\, g

    with :math:`v_{[k]}` the k-th largest entry, :math:`Z_s` iid standard Gaussian and :math:`g` the
    incoming gradient. The gradient is exact for the drawn noise and an unbiased estimate of
    :math:`\\nabla \\mathbb{E}[(x + \\epsilon Z)_{[k]}]`. ``epsilon = 0`` gives the exact k-th largest
    value with a one-hot subgradient (the noise is still drawn, so the RNG advances as for ``epsilon > 0``).

    The noise ``Z`` has shape ``x.shape + (n_samples,)`` (samples last) and is drawn as
    ``torch.randn(x.shape + (n_samples,), generator=generator, device=x.device)`` in float32, then
    cast to the compute dtype: with the same global RNG state, the values equal pytopk 0.1.0's.

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

    Returns:
        ``x``'s shape with ``dim`` removed, in ``x``'s dtype.

    Example:
        >>> import torch, softtopk.ops.perturbed as P
        >>> x = torch.tensor([[-1.5, 2.0, 0.7, 3.8], [-1.1, -5.4, 0.1, 2.3]], requires_grad=True)
        >>> P.noised_kth_value(x, 3, epsilon=0.0).detach()
        tensor([ 0.7000, -1.1000])
        >>> out = P.noised_kth_value(x, 3, generator=torch.Generator().manual_seed(0))
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
    x = check_scores(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim], dim)
    epsilon = check_real("epsilon", epsilon, positive=False)
    if epsilon < 0:
        raise ValueError(f"epsilon must be a non-negative finite number, got {epsilon!r}")
    if n_samples is not None:
        n_samples = check_n_samples("n_samples", n_samples)
    generator = check_generator("generator", generator, x.device)
    dtype = compute_dtype(x.dtype)
    if noise is None:
        shape = (*x.shape, 5 if n_samples is None else n_samples)
        noise = torch.randn(shape, generator=generator, device=x.device, dtype=torch.float32)
    else:
        noise = _check_noise_tensor(noise, x, n_samples)
    if epsilon == 0:  # exact k-th value (a mean of S copies can be off by an ulp); the RNG still advanced
        noise = noise[..., :1]
    # epsilon * noise is rounded in the noise's dtype before the cast, as in pytopk (bitwise equal values)
    return _NoisedKthValue.apply(x.to(dtype), (epsilon * noise).to(dtype), k, dim)[0].to(x.dtype)
