"""The ``--method`` choices of the training tools and the loss each one builds.

difftopk's names and parameter mapping: ``softmax_cross_entropy`` (``nn.CrossEntropyLoss``,
requires ``p_k[0] == 1``), the sorting networks and NeuralSort/SoftSort through
:class:`softtopk.compat.difftopk.TopKCrossEntropyLoss` (``inverse_temperature`` = ``steepness`` for
networks, ``tau = 1 / inverse_temperature`` for NeuralSort/SoftSort; ``distribution=None`` means
``cauchy``), ``smooth_hard_topk`` (Lapin/difftopk, ``k = len(p_k)``, ``tau = inverse_temperature``,
requires ``p_k[-1] == 1``). Ours in addition: every other ranks-capable method of
:func:`softtopk.methods` through :class:`softtopk.TopKCrossEntropyLoss` (``tau = 1 /
inverse_temperature``), ``smooth_topk`` (as ``smooth_hard_topk`` without the hard switch; same
requirement), ``smooth_topk_svm`` (Berrada; ``--tau``, ``--alpha``), ``bal_noised_topk`` and
``imbal_noised_topk`` (``--epsilon``, ``--n_samples``; imbalanced: ``--max_m``, ``--scale`` and the
training class counts). The k of the SVM and noised losses is the 1-based index of the last nonzero
``p_k`` entry (``--p_k .25 0 0 0 .75`` → k = 5, ``--p_k 1 0 0 0 0`` → k = 1).
"""

from __future__ import annotations

from typing import Any

import torch

from softtopk import (
    BalNoisedTopK,
    ImbalNoisedTopK,
    SmoothTopkSVM,
    TopKCrossEntropyLoss,
    methods,
)
from softtopk.compat.difftopk import TopKCrossEntropyLoss as DifftopkTopKCrossEntropyLoss
from softtopk.losses.smooth_topk import smooth_hard_topk_loss, smooth_topk_loss
from softtopk.losses.topk_ce import check_p_k
from .runner import UsageError

DIFFTOPK_RANKS = ("bitonic", "bitonic__non_sparse", "odd_even", "splitter_selection", "neuralsort", "softsort")
OTHER_LOSSES = ("smooth_hard_topk", "smooth_topk", "smooth_topk_svm", "bal_noised_topk", "imbal_noised_topk")


def method_choices() -> tuple[str, ...]:
    """Every valid ``--method``: difftopk's, every other ranks method of the registry, and the SVM/noised losses."""
    extra = tuple(name for name, info in methods().items() if "ranks" in info.outputs and name not in DIFFTOPK_RANKS)
    return ("softmax_cross_entropy", *DIFFTOPK_RANKS, *extra, *OTHER_LOSSES)


def add_loss_arguments(parser: Any) -> None:
    """The flags of the SVM and noised losses (shared by the training tools)."""
    p = parser.add_argument
    p("--tau", type=float, default=1.0, help="temperature of smooth_topk_svm (default 1)")
    p("--alpha", type=float, default=1.0, help="margin of smooth_topk_svm, smooth_topk, smooth_hard_topk (default 1)")
    p("--epsilon", type=float, default=1.0, help="noise scale of bal/imbal_noised_topk (default 1)")
    p("--n_samples", type=int, default=5, help="noise samples of bal/imbal_noised_topk (default 5)")
    p("--max_m", type=float, default=0.5, help="largest LDAM margin of imbal_noised_topk (default 0.5)")
    p("--scale", type=float, default=50.0, help="logit scale of imbal_noised_topk (default 50)")


def check_p_k_flag(p_k: list[float]) -> tuple[float, ...]:
    """``--p_k`` as checked floats (non-negative, summing to 1 ± 1e-4), else :class:`UsageError`."""
    try:
        return check_p_k(list(p_k))
    except (TypeError, ValueError) as error:
        raise UsageError(f"--p_k: {error}") from None


def _last_nonzero_k(p_k: tuple[float, ...]) -> int:
    return max(i for i, p in enumerate(p_k) if p > 0) + 1


class _Smooth(torch.nn.Module):
    def __init__(self, hard: bool, k: int, tau: float, alpha: float) -> None:
        super().__init__()
        self.function = smooth_hard_topk_loss if hard else smooth_topk_loss
        self.k, self.tau, self.alpha = k, tau, alpha

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.function(logits, labels, self.k, tau=self.tau, alpha=self.alpha)


def build_loss(args: Any, n_classes: int, class_counts: torch.Tensor, generator: torch.Generator) -> torch.nn.Module:
    """The loss module of ``args.method`` (see the module docstring for the mapping).

    Args:
        args: parsed flags (``method``, ``p_k``, ``inverse_temperature``, ``m``, ``distribution``,
            ``art_lambda``, ``top1_mode``, ``tau``, ``alpha``, ``epsilon``, ``n_samples``, ``max_m``, ``scale``).
        n_classes: number of classes C.
        class_counts: ``(C,)`` training class counts (``imbal_noised_topk``).
        generator: the noise generator of stochastic losses (checkpointed by the caller).

    Returns:
        A module mapping ``(logits (B, C), labels (B,))`` to a scalar mean loss.

    Raises:
        UsageError: a flag value the method rejects (one line naming it).
    """
    method, p_k = args.method, check_p_k_flag(args.p_k)
    m = None if args.m is None or args.m >= n_classes else args.m
    try:
        if method == "softmax_cross_entropy":
            if p_k[0] != 1:
                raise UsageError(f"--method softmax_cross_entropy requires p_k[0] == 1, got --p_k {list(p_k)}")
            return torch.nn.CrossEntropyLoss()
        if method in DIFFTOPK_RANKS:
            return DifftopkTopKCrossEntropyLoss(method, args.inverse_temperature, p_k, n_classes, m=m,
                                                distribution=args.distribution, art_lambda=args.art_lambda,
                                                top1_mode=args.top1_mode)
        if method in ("smooth_hard_topk", "smooth_topk"):
            if p_k[-1] != 1:
                raise UsageError(f"--method {method} requires p_k[-1] == 1, got --p_k {list(p_k)}")
            if len(p_k) >= n_classes:
                raise UsageError(f"--method {method}: k = len(p_k) = {len(p_k)} must be < {n_classes} classes")
            return _Smooth(method == "smooth_hard_topk", len(p_k), float(args.inverse_temperature), args.alpha)
        k = _last_nonzero_k(p_k)
        if method == "smooth_topk_svm":
            return SmoothTopkSVM(n_classes, k=k, tau=args.tau, alpha=args.alpha)
        if method == "bal_noised_topk":
            return BalNoisedTopK(k, epsilon=args.epsilon, n_samples=args.n_samples, generator=generator)
        if method == "imbal_noised_topk":
            return ImbalNoisedTopK(k, epsilon=args.epsilon, max_m=args.max_m, cls_num_list=class_counts.tolist(),
                                   scale=args.scale, n_samples=args.n_samples, generator=generator)
        params: dict[str, Any] = {"tau": 1.0 / args.inverse_temperature}
        if methods()[method].stochastic:
            params["generator"] = generator
        if "relaxation" in methods()[method].params:
            params["relaxation"] = "subsets"  # gumbel: only the subsets relaxation has per-step ranks
        return TopKCrossEntropyLoss(p_k, method=method, m=m, top1_mode=args.top1_mode, **params)
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise UsageError(f"--method {method}: {error}") from None
