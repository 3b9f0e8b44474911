"""difftopk 0.2.0's smooth top-k SVM losses (Berrada et al., ICLR 2018, as difftopk ships them), computed
by softtopk's exact losses; re-exported by :mod:`softtopk.compat.difftopk`. See ``docs/compat.md``."""

from __future__ import annotations

import math

import torch

from .._validation import check_int, check_real, check_scores
from ..functional import smooth_topk_svm, topk_svm

__all__ = ["SmoothHardTopKLoss", "SmoothTopKLoss", "smooth_hard_topk_loss"]


def smooth_hard_topk_loss(
    input: torch.Tensor, target: torch.Tensor, k: int, *, tau: float = 1.0, alpha: float = 1.0
) -> torch.Tensor:
    r"""difftopk's ``SmoothHardTopKLoss`` rule on softtopk's exact losses, batch mean: per sample, the
    hard top-k hinge (:func:`softtopk.topk_svm`) where the k-th and (k+1)-th largest scores (label
    included) are at least :math:`k \tau \log 1000` apart, the smooth loss
    (:func:`softtopk.smooth_topk_svm`) elsewhere. The switch is a ``torch.where`` (no host sync); as in
    difftopk the loss jumps where it fires. ``input (N, C)``, ``target (N,)``.

    Example:
        >>> import torch
        >>> from softtopk.compat.difftopk import smooth_hard_topk_loss
        >>> logits = torch.tensor([[30.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]])
        >>> smooth_hard_topk_loss(logits, torch.tensor([1, 3]), 1)  # (30 + 2.9608) / 2
        tensor(16.4804)
    """
    input = check_scores("input", input, dims=2, shape="(N, C)")
    smooth = smooth_topk_svm(input, target, k=k, tau=tau, alpha=alpha, reduction="none")
    hard = topk_svm(input, target, k=k, alpha=alpha, reduction="none")
    top = input.detach().topk(k + 1, dim=1).values
    switch = (top[:, k - 1] - top[:, k]) >= k * tau * math.log(1e3)
    return torch.where(switch, hard, smooth).mean()


class SmoothTopKLoss(torch.nn.Module):
    """``difftopk.SmoothTopKLoss``: smooth top-k SVM loss (Lapin et al.; Berrada et al.), margin 1.

    ``forward(x (b, num_classes), y (b,))`` returns the batch mean. Maps to
    ``softtopk.smooth_topk_svm(x, y, k=k, tau=tau, alpha=1.0)``.

    Intended differences: correct gradients for ``k = 1`` (difftopk's hand-written backward is off
    by up to 0.06 there) and at small ``tau`` (difftopk: up to 4e-4 at tau = 0.1 from its
    asymptotic-series switch; softtopk: plain autograd through a log-space ESF, ~1e-8 from float64);
    any ``k < num_classes`` (difftopk needs ``num_classes >= k + 1 + k // 5``); ``labels``
    (``arange(num_classes)``, kept for attribute compatibility) is a buffer, so ``.to()`` moves it;
    any floating dtype and device.
    """

    def __init__(self, num_classes: int, k: int, tau: float = 1, device: str = "cpu") -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, low=2)
        self.k = check_int("k", k, low=1, high=self.num_classes - 1, why=" (k < num_classes)")
        self.tau = check_real("tau", tau, positive=True)
        self.register_buffer("labels", torch.arange(self.num_classes, device=device))

    def _check(self, x: torch.Tensor) -> None:
        x = check_scores("x", x)
        if x.dim() < 2 or x.shape[1] != self.num_classes:
            raise ValueError(f"x must have shape (batch, num_classes={self.num_classes}), got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return smooth_topk_svm(x, y, k=self.k, tau=self.tau)

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, k={self.k}, tau={self.tau}"


class SmoothHardTopKLoss(SmoothTopKLoss):
    """``difftopk.SmoothHardTopKLoss``: :class:`SmoothTopKLoss` with the per-sample hard switch.

    Samples whose k-th and (k+1)-th largest scores are at least ``k * tau * log(1000)`` apart use
    the hard top-k hinge ``max(0, 1 + (s_[k] without y - s_y) / k)``. Maps to
    :func:`smooth_hard_topk_loss` ``(x, y, k, tau=tau, alpha=1.0)``.
    Intended differences: as :class:`SmoothTopKLoss`; the switch is a ``torch.where`` (no host
    synchronisation, no boolean-mask gathers).
    """

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return smooth_hard_topk_loss(x, y, self.k, tau=self.tau)
