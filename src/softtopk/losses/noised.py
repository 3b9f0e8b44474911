"""Noised (stochastically smoothed) top-k hinge losses (Garcin et al., ICML 2022; pytopk).

The top-k calibrated hinge loss :math:`\\max(0, 1 + s_{[k+1]} - s_y)` is zero exactly when the
label's score beats the (k+1)-th largest score of the **full** score vector by the margin 1. Its
smoothed version replaces :math:`s_{[k+1]}` by the Monte-Carlo Gaussian smoothing of
:func:`softtopk.noised_kth_value`,

.. math::
    \\operatorname{top}_{k+1,\\epsilon}(s) = \\frac{1}{S} \\sum_{b=1}^{S} (s + \\epsilon Z_b)_{[k+1]},
    \\qquad Z_b \\sim \\mathcal N(0, I),

whose gradient is the exact gradient of the estimate (a mean of ``S`` one-hots): at most ``S + 1``
non-zero entries per row of the loss gradient. The hinge is applied to the Monte-Carlo average.

* balanced: :math:`\\ell = \\max(0, 1 + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y)`;
* imbalanced: LDAM margins :math:`m_c = m_{\\max}\\, n_c^{-1/4} / \\max_{c'} n_{c'}^{-1/4}` (the rarest
  class gets ``max_m``) and
  :math:`\\ell = \\max(0, \\mathrm{scale}\\,(m_y + \\operatorname{top}_{k+1,\\epsilon}(s) - s_y))`.

Noise: unless given (``noise``, of shape ``input.shape + (S,)``), it is drawn afresh at every call
from ``generator`` (the global RNG if ``None``), in one of two ways with the same law:

* on float32/float64 CPU rows with numba installed (eager, outside ``torch.func`` transforms), by a
  kernel (:mod:`softtopk.ops.noised_numba`) seeded with one integer from the generator: each row
  draws the Gaussians of the scores that can reach the (k+1)-th largest sum, and accounts for the
  others by the chance that one of them gets there, exactly in law, without the ``(N, C, S)``
  tensor of draws (the torch path's cost on a CPU: ``benchmarks/results/gpu_cpu.md``);
* elsewhere, as one ``torch.randn(input.shape + (S,), generator=generator)`` in float32 (cast to
  float64 for float64 inputs): for ``(N, C)`` input and the global RNG, pytopk 0.1.0's draw.

On CUDA with triton the torch draw's hinge runs as two Triton kernels
(:mod:`softtopk.ops.noised_triton`: the same draws, roundings that may differ in the last bits).
So a seeded call is reproducible on one machine and install, but gives other values with and
without numba, and on another device; :mod:`softtopk.compat.pytopk` passes pytopk's own draw as
``noise``, and gives its values bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from .._validation import (
    check_class_input,
    check_generator,
    check_int,
    check_noise,
    check_real,
    check_scale,
)
from ..ops import noised_numba, noised_triton, reduce_triton
from ..ops.compute import compute_dtype, owns_rows
from ..ops.noised_hinge import NoisedHinge
from ._base import ClassLoss, class_loss

__all__ = ["BalNoisedTopK", "bal_noised_topk"]


def noised_params(
    k: Any, epsilon: Any, n_samples: Any, generator: Any, classes: int | None = None
) -> tuple[int, float, int, torch.Generator | None]:
    """The family's parameters, checked once for the functions and their Modules (``k < C`` when known)."""
    if classes is None:
        k = check_int("k", k, low=1)
    else:
        k = check_int(
            "k",
            k,
            low=1,
            high=classes - 1,
            why=" (k < C, the number of classes: the loss uses the (k+1)-th largest score)",
        )
    return (
        k,
        check_real("epsilon", epsilon, low=0.0),
        check_int("n_samples", n_samples, low=1),
        check_generator("generator", generator),
    )


def _label_margins(margins: torch.Tensor | float, logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor | float:
    """The margin of each row's label (R,) from per-class ``margins`` (C,), or the one float."""
    return margins.to(logits)[label] if isinstance(margins, torch.Tensor) else margins


def noised_hinge(
    input: torch.Tensor,
    target: torch.Tensor,
    params: tuple[int, float, int, torch.Generator | None],
    *,
    noise: torch.Tensor | None,
    margins: torch.Tensor | float,
    scale: float | None,
    weight: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
) -> torch.Tensor:
    """``max(0, scale * (margin_y + top_{k+1,eps}(s) - s_y))``, reduced; pytopk's operation order (so
    pytopk's noise, given, gives its values bit for bit). ``params`` are ``(k, epsilon, n_samples, generator)`` as
    :func:`noised_params` returns them; the generator's device is checked here, and the noise is drawn
    after every other check."""
    k, epsilon, n_samples, generator = params
    check_generator("generator", generator, input.device)
    check_scale("epsilon", epsilon, input.dtype, zero=True)
    if scale is not None:
        check_scale("scale", scale, input.dtype)

    def per_row(logits: torch.Tensor, label: torch.Tensor, kept: torch.Tensor, reduction: str) -> torch.Tensor:
        fresh = None if noise is not None else noised_numba.fresh(logits, epsilon, n_samples, generator)
        if fresh is not None:  # CPU rows: the kernel draws what it needs
            return NoisedHinge.apply(logits, label, fresh, _label_margins(margins, logits, label), scale, k, kept)[0]
        given = noise
        if given is None:
            given = torch.randn(
                (*input.shape, n_samples), generator=generator, device=input.device, dtype=torch.float32
            )
        else:
            check_noise("noise", given, input.shape, samples=0)
        rows = given.movedim(1, -2).reshape(-1, input.shape[1], given.shape[-1])
        if noise is None and noised_triton.usable(logits, n_samples):  # CUDA: kernels on our own draws
            own = reduce_triton.kernel_reduction(logits.shape[0], reduction)  # reduced by one more kernel
            return noised_triton.hinge(logits, label, rows, epsilon, margins, scale, k, kept, own)
        margin = _label_margins(margins, logits, label)
        if epsilon == 0:  # exact (k+1)-th value; the RNG still advanced
            rows = rows[..., :1]
        if noise is not None or not owns_rows(rows):  # a caller's noise is never written
            scaled = epsilon * rows
        else:  # the draw is ours: scaled in place (the same rounding; times 1 is exact, so skipped)
            scaled = rows.mul_(epsilon) if epsilon != 1 else rows
        scaled = scaled.to(compute_dtype(input.dtype))
        return NoisedHinge.apply(logits, label, scaled, margin, scale, k, kept)[0]

    return class_loss(
        input, target, per_row, weight=weight, ignore_index=ignore_index, reduction=reduction, reduces=True
    )


def bal_noised_topk(
    input: torch.Tensor,
    target: torch.Tensor,
    *,
    k: int,
    epsilon: float,
    n_samples: int = 5,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Balanced noised top-k hinge loss. See :class:`BalNoisedTopK` for details.

    ``noise``: optional fixed standard noise ``input.shape + (S,)`` (then ``n_samples`` is ignored);
    by default drawn from ``generator`` (see the module's note: by a numba kernel on CPU rows,
    elsewhere as ``torch.randn(input.shape + (S,), generator=generator)`` in float32).

    Example:
        >>> import torch, softtopk
        >>> scores = torch.tensor([[2.0, 1.5, -3.0], [7.5, 4.0, -1.5]])
        >>> labels = torch.tensor([0, 2])
        >>> softtopk.bal_noised_topk(scores, labels, k=1, epsilon=0.0, reduction="none")  # 1 + s_[2] - s_y
        tensor([0.5000, 6.5000])
        >>> noise = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))  # fixed: the same everywhere
        >>> softtopk.bal_noised_topk(scores, labels, k=1, epsilon=1.0, noise=noise)
        tensor(2.9793)
    """
    params = noised_params(k, epsilon, n_samples, generator, check_class_input(input).shape[1])
    return noised_hinge(
        input,
        target,
        params,
        noise=noise,
        margins=1.0,
        scale=None,
        weight=weight,
        ignore_index=ignore_index,
        reduction=reduction,
    )


class BalNoisedTopK(ClassLoss):
    r"""Balanced noised top-k hinge loss (Garcin et al., ICML 2022): a drop-in for
    ``nn.CrossEntropyLoss`` that optimises top-k accuracy.

    .. math::
        \ell(s, y) = \max\big(0,\ 1 + \operatorname{top}_{k+1,\epsilon}(s) - s_y\big), \qquad
        \operatorname{top}_{k+1,\epsilon}(s) = \frac{1}{S}\sum_{b=1}^{S} (s + \epsilon Z_b)_{[k+1]}

    with :math:`v_{[j]}` the j-th largest entry of the full score vector (label included) and
    :math:`Z_b` iid standard Gaussian, drawn afresh at every call from ``generator`` (or the global
    RNG; on CPU rows with numba, by a kernel that draws only what can reach the (k+1)-th largest:
    the same law, other values, see :mod:`softtopk.losses.noised`). ``epsilon = 0`` is the exact
    top-k hinge :math:`\max(0, 1 + s_{[k+1]} - s_y)`. The functional form is
    :func:`softtopk.bal_noised_topk` (which also takes fixed ``noise``).

    Args:
        k: the loss targets top-k accuracy, ``1 <= k <= C - 1``.
        epsilon: noise scale, a finite number ``>= 0`` (the paper: 1 on Pl@ntNet-300K, 0.2 on CIFAR-100).
        n_samples: number of noise draws ``S`` per call. Default 5.
        generator: a :class:`torch.Generator` on the input's device type, or ``None`` (global RNG).
        weight: optional per-class weights ``(C,)`` (a buffer), as in ``nn.CrossEntropyLoss``.
        ignore_index: target value that contributes nothing. Default -100.
        reduction: ``'mean'`` (weighted mean over non-ignored targets), ``'sum'`` or ``'none'``.

    Shape:
        - input: ``(N, C)`` or ``(N, C, d1, ...)``, floating (float16/bfloat16 computed in float32).
        - target: ``(N)`` or ``(N, d1, ...)``, integer class indices in ``[0, C)``.
        - output: scalar, or the target's shape for ``reduction='none'``.

    Example:
        >>> import torch, softtopk
        >>> loss_fn = softtopk.BalNoisedTopK(2, epsilon=1.0, generator=torch.Generator().manual_seed(0))
        >>> logits = torch.tensor([[2.0, 1.5, -3.0, 0.5], [7.5, 4.0, -1.5, 0.0]], requires_grad=True)
        >>> noise = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))  # else drawn from the generator
        >>> loss = loss_fn(logits, torch.tensor([0, 2]), noise=noise)
        >>> loss
        tensor(1.1972, grad_fn=<DivBackward0>)
        >>> loss.backward()
        >>> logits.grad
        tensor([[ 0.0000,  0.0000,  0.0000,  0.0000],
                [ 0.0000,  0.0000, -0.3000,  0.3000]])

    Reference:
        C. Garcin, M. Servajean, A. Joly, J. Salmon, "Stochastic smoothing of the top-K calibrated
        hinge loss for deep imbalanced classification", ICML 2022.
    """

    _param_names = ("k", "epsilon", "n_samples")  # and the generator, passed on but not in the repr

    def __init__(
        self,
        k: int,
        *,
        epsilon: float,
        n_samples: int = 5,
        generator: torch.Generator | None = None,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction)
        self.k, self.epsilon, self.n_samples, self.generator = noised_params(k, epsilon, n_samples, generator)

    def forward(self, input: torch.Tensor, target: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        kwargs = self._family_kwargs()
        return bal_noised_topk(input, target, generator=self.generator, noise=noise, **kwargs, **self._class_kwargs())
