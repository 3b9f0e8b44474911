"""The loss each ``--method`` of the training tools builds (the choices: :data:`softtopk_lab.flags.TRAIN_METHODS`).

difftopk's names and parameter mapping: ``softmax_cross_entropy`` (``nn.CrossEntropyLoss``,
requires ``p_k[0] == 1``), the sorting networks and NeuralSort/SoftSort through
:class:`softtopk.compat.difftopk.TopKCrossEntropyLoss` (``inverse_temperature`` = ``steepness`` for
networks, ``tau = 1 / inverse_temperature`` for NeuralSort/SoftSort; ``distribution=None`` means
``cauchy``), ``smooth_hard_topk`` (Lapin/difftopk,
:func:`softtopk.compat.difftopk.smooth_hard_topk_loss`, ``k = len(p_k)``, ``tau =
inverse_temperature``, requires ``p_k[-1] == 1``). Ours in addition: every other ranks-capable
method of :func:`softtopk.methods` through :class:`softtopk.TopKCrossEntropyLoss` (``tau = 1 /
inverse_temperature``), ``smooth_topk`` (as ``smooth_hard_topk`` without the hard switch:
:func:`softtopk.smooth_topk_svm` with ``tau = inverse_temperature``; same requirement),
``smooth_topk_svm`` (Berrada, :func:`softtopk.smooth_topk_svm`; ``--tau``, ``--alpha``),
``bal_noised_topk`` and ``imbal_noised_topk`` (``--epsilon``, ``--n_samples``; imbalanced:
``--max_m``, ``--scale`` and the training class counts). The k of the SVM and noised losses is the
1-based index of the last nonzero ``p_k`` entry (``--p_k .25 0 0 0 .75`` → k = 5, ``--p_k 1 0 0 0
0`` → k = 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from softtopk import BalNoisedTopK, ImbalNoisedTopK, TopKCrossEntropyLoss, methods, smooth_topk_svm
from softtopk.compat.difftopk import TopKCrossEntropyLoss as DifftopkTopKCrossEntropyLoss
from softtopk.compat.difftopk import smooth_hard_topk_loss

from .config import LossConfig
from .errors import UsageError
from .flags import DIFFTOPK_RANKS, HINGE_LOSSES


def _last_nonzero_k(p_k: tuple[float, ...]) -> int:
    return max(i for i, p in enumerate(p_k) if p > 0) + 1


class FunctionalLoss(torch.nn.Module):
    """A functional loss ``function(logits, labels, **kwargs)`` as a module.

    Args:
        function: the loss, mapping ``(logits (B, C), labels (B,))`` to a scalar.
        kwargs: its keyword arguments.
    """

    def __init__(self, function: Callable[..., torch.Tensor], **kwargs: Any) -> None:
        super().__init__()
        self.function, self.kwargs = function, kwargs

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.function(logits, labels, **self.kwargs)

    def extra_repr(self) -> str:
        return ", ".join([self.function.__name__, *(f"{key}={value!r}" for key, value in self.kwargs.items())])


def _hinge(method: str, function: Callable[..., torch.Tensor], n_classes: int, **kwargs: Any) -> FunctionalLoss:
    """``function`` as a module, its parameters checked now on one zero row of ``n_classes`` scores."""
    if kwargs["k"] >= n_classes:
        raise UsageError(f"--method {method}: k = {kwargs['k']} must be < {n_classes} classes")
    loss = FunctionalLoss(function, **kwargs)
    loss(torch.zeros(1, n_classes), torch.zeros(1, dtype=torch.long))
    return loss


def _hinge_loss(
    loss: LossConfig, n_classes: int, class_counts: torch.Tensor, generator: torch.Generator
) -> torch.nn.Module:
    """The top-k hinge losses of :data:`softtopk_lab.flags.HINGE_LOSSES` (``k`` from ``--p_k``)."""
    method, p_k = loss.method, loss.p_k
    if method in ("smooth_hard_topk", "smooth_topk"):
        if p_k[-1] != 1:
            raise UsageError(f"--method {method} requires p_k[-1] == 1, got --p_k {list(p_k)}")
        function = smooth_hard_topk_loss if method == "smooth_hard_topk" else smooth_topk_svm
        return _hinge(method, function, n_classes, k=len(p_k), tau=float(loss.inverse_temperature), alpha=loss.alpha)
    k = _last_nonzero_k(p_k)
    if method == "smooth_topk_svm":
        return _hinge(method, smooth_topk_svm, n_classes, k=k, tau=loss.tau, alpha=loss.alpha)
    if method == "bal_noised_topk":
        return BalNoisedTopK(k=k, epsilon=loss.epsilon, n_samples=loss.n_samples, generator=generator)
    return ImbalNoisedTopK(  # imbal_noised_topk, the last of HINGE_LOSSES
        k=k,
        epsilon=loss.epsilon,
        max_m=loss.max_m,
        cls_num_list=class_counts.tolist(),
        scale=loss.scale,
        n_samples=loss.n_samples,
        generator=generator,
    )


def build_loss(
    loss: LossConfig, n_classes: int, class_counts: torch.Tensor, generator: torch.Generator
) -> torch.nn.Module:
    """The loss module of ``loss.method`` (see the module docstring for the mapping).

    Args:
        loss: the loss flags.
        n_classes: number of classes C.
        class_counts: ``(C,)`` training class counts (``imbal_noised_topk``).
        generator: the noise generator of stochastic losses (checkpointed by the caller).

    Returns:
        A module mapping ``(logits (B, C), labels (B,))`` to a scalar mean loss.

    Raises:
        UsageError: a flag value the method rejects (one line naming it).
    """
    method, p_k = loss.method, loss.p_k
    m = None if loss.m is None or loss.m >= n_classes else loss.m
    try:
        if method == "softmax_cross_entropy":
            if p_k[0] != 1:
                raise UsageError(f"--method softmax_cross_entropy requires p_k[0] == 1, got --p_k {list(p_k)}")
            return torch.nn.CrossEntropyLoss()
        if method in DIFFTOPK_RANKS:
            return DifftopkTopKCrossEntropyLoss(
                method,
                loss.inverse_temperature,
                p_k,
                n_classes,
                m=m,
                distribution=loss.distribution,
                art_lambda=loss.art_lambda,
                top1_mode=loss.top1_mode,
            )
        if method in HINGE_LOSSES:
            return _hinge_loss(loss, n_classes, class_counts, generator)
        params: dict[str, Any] = {"tau": 1.0 / loss.inverse_temperature}
        if methods()[method].stochastic:
            params["generator"] = generator
        if "relaxation" in methods()[method].params:
            params["relaxation"] = "subsets"  # gumbel: only the subsets relaxation has per-step ranks
        return TopKCrossEntropyLoss(p_k, method=method, m=m, top1_mode=loss.top1_mode, **params)
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise UsageError(f"--method {method}: {error}") from None
