r"""Mixture-of-experts routing: a top-k router whose gate is any soft top-k method, and the standard
load-balancing auxiliary loss.

A router maps tokens ``(*, d_model)`` to logits ``(*, E)`` over ``E`` experts and dispatches each
token to ``k`` of them with weights. Frameworks ship a hard top-k with softmax gates (Shazeer et al.
2017, Mixtral); with softtopk the gate can be a soft or sparse top-k mask (Sander et al. 2023), or
the exact k-hot dispatch with the soft mask's gradient (``hard=True``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ._registry import resolve
from ._validation import check_int, check_scores, values_checked
from .operators import topk

__all__ = ["Routing", "TopKRouter", "load_balancing_loss"]


class Routing(NamedTuple):
    """What :class:`TopKRouter` returns: ``weights`` and expert ``indices``, each ``(*, k)``."""

    weights: torch.Tensor
    indices: torch.Tensor


def load_balancing_loss(logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    r"""The load-balancing auxiliary loss of the Switch Transformer (Fedus et al., JMLR 2022, eq. 4),
    for top-k dispatch:

    .. math::
        L = E \sum_{e=1}^{E} f_e P_e = \frac{E}{T k} \sum_{t, j} P_{\mathrm{indices}_{t j}}, \qquad
        f_e = \frac{1}{T k} \sum_{t, j} [\mathrm{indices}_{t j} = e], \qquad
        P_e = \frac{1}{T} \sum_t \mathrm{softmax}(\mathrm{logits}_t)_e,

    over the ``T`` tokens (every leading axis). ``L = 1`` when dispatch and probabilities are uniform
    over the experts, and it grows as both concentrate on the same experts; the gradient flows
    through ``P`` (the counts ``f`` are constants). Experts masked with ``-inf`` logits have ``P = 0``.
    An empty batch (``T = 0``) or ``k = 0`` gives 0, as the class losses do. The softmax is taken
    in float32; the loss has the logits' dtype.

    The second form is what is computed: a gather of ``P`` at the dispatched experts, with no
    histogram (a histogram's size would be read on the host on a GPU). That the indices lie in
    ``[0, E)`` is checked for CPU tensors only (outside ``torch.compile``), as PyTorch's losses check
    class targets; elsewhere an out-of-range index is the gather's device error.

    Args:
        logits: router logits ``(*, E)``.
        indices: dispatched experts ``(*, k)``, integers in ``[0, E)``.

    Returns:
        A scalar tensor.

    Example:
        >>> import torch
        >>> logits = torch.zeros(4, 3)
        >>> load_balancing_loss(logits, torch.tensor([[0], [1], [2], [0]]))
        tensor(1.)
    """
    logits = check_scores("logits", logits)
    if (
        not isinstance(indices, torch.Tensor)
        or indices.is_floating_point()
        or indices.is_complex()
        or (indices.dtype == torch.bool)
    ):
        raise TypeError(f"indices must be an integer tensor, got {getattr(indices, 'dtype', type(indices).__name__)}")
    if indices.dim() != logits.dim() or indices.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"indices must be an integer tensor of shape {tuple(logits.shape[:-1])} + (k,), got "
            f"{indices.dtype} {tuple(indices.shape)}"
        )
    experts = logits.shape[-1]
    if values_checked(indices):
        bad = (indices < 0) | (indices >= experts)
        if bool(bad.any()):
            raise ValueError(f"indices must lie in [0, {experts - 1}] (the experts), got {indices[bad][0].item()}")
    return _balance(logits, indices)


def _balance(logits: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """:func:`load_balancing_loss` without the checks: a softmax, a column sum, a gather and a sum."""
    experts = logits.shape[-1]
    tokens, picks = logits.numel() // max(experts, 1), indices.numel()
    total = logits.float().softmax(-1).reshape(-1, experts).sum(0)  # T P
    scale = experts / (max(tokens, 1) * max(picks, 1))  # empty batch: 0, not 0/0
    return (total.gather(0, indices.reshape(-1)).sum() * scale).to(logits.dtype)


class TopKRouter(torch.nn.Module):
    r"""Top-k router for a mixture of experts: ``logits = W x + b``, the ``k`` experts of largest logit,
    and their weights from a soft top-k mask.

    ``method="hard"``: ``torch.topk`` dispatch with softmax gates over the ``k`` chosen logits
    (Mixtral's router). Any mask method of :func:`softtopk.methods` (``"lapsum"``, ``"sparse"``, ...):
    the dispatch is ``torch.topk`` of the logits (:func:`softtopk.topk`) and the weights are that
    method's mask at the chosen experts, in [0, 1]; ``hard=True`` makes them exactly 1 forward, with
    the soft mask's gradient backward (straight-through). After each call, ``aux_loss`` holds
    :func:`load_balancing_loss` of the call (add ``alpha * router.aux_loss`` to the training loss).

    Args:
        d_model: token size.
        n_experts: number of experts ``E``.
        k: experts per token, ``1 <= k <= E``.
        method: ``"hard"`` or a mask method (default ``"lapsum"``).
        **params: the method's parameters (``tau``, ``l``, ``p``, ``hard``, ...).

    Shapes: ``forward(x, mask=None)`` takes tokens ``(*, d_model)`` and an optional boolean ``mask``
    broadcastable to ``(*, E)`` (``False``: expert unavailable, its logit set to ``-inf`` and never
    chosen; every token needs ``k`` available experts, which is checked for a CPU mask outside
    ``torch.compile`` only, so that no call reads values on a GPU) and returns :class:`Routing` with
    ``weights`` and ``indices`` of shape ``(*, k)``.

    Cost: ``method="hard"`` is the gate's matmul, one ``torch.topk``, a softmax over the ``k`` chosen
    logits and the auxiliary loss's softmax, column sum, gather and sum. The router reads no tensor
    values on the host (forward, backward or ``aux_loss``; the mask check aside); a mask method adds
    the cost of :func:`softtopk.topk` with that method.

    Example:
        >>> import torch, softtopk
        >>> router = TopKRouter(16, 8, 2, method="sparse", l=0.5)
        >>> weights, indices = router(torch.randn(32, 16))
        >>> weights.shape, indices.shape, bool(router.aux_loss > 0)
        (torch.Size([32, 2]), torch.Size([32, 2]), True)
    """

    def __init__(self, d_model: int, n_experts: int, k: int, *, method: str = "lapsum", **params: Any) -> None:
        super().__init__()
        self.d_model = check_int("d_model", d_model, low=1)
        self.n_experts = check_int("n_experts", n_experts, low=1)
        self.k = check_int("k", k, low=1, high=self.n_experts, why=" (the number of experts)")
        if method == "hard":
            if params:
                raise TypeError(f"method 'hard' takes no parameters, got {sorted(params)}")
        else:
            resolve(method, params, "mask")  # checked once, here
        self.method, self.params = method, params
        self.gate = torch.nn.Linear(self.d_model, self.n_experts)
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Routing:
        x = check_scores("x", x)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (*, d_model = {self.d_model}), got {tuple(x.shape)}")
        if x.device != self.gate.weight.device:
            raise ValueError(f"x must be on the router's device ({self.gate.weight.device}), got {x.device}")
        logits = self.gate(x)
        if mask is not None:
            logits = self._masked(logits, mask)
        if self.method == "hard":
            top = logits.topk(self.k, dim=-1)
            routing = Routing(top.values.softmax(-1), top.indices)
        else:
            chosen = topk(logits, self.k, method=self.method, **self.params)
            routing = Routing(chosen.weights, chosen.indices)
        self.aux_loss = _balance(logits, routing.indices)
        return routing

    def _masked(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask).__name__)}")
        try:
            mask = mask.expand(logits.shape)
        except RuntimeError:
            raise ValueError(
                f"mask must be broadcastable to {tuple(logits.shape)} (*, n_experts), got {tuple(mask.shape)}"
            ) from None
        if values_checked(mask):
            available = mask.sum(-1)
            if bool((available < self.k).any()):
                raise ValueError(
                    f"mask must leave at least k = {self.k} experts available to every token, got a "
                    f"token with {int(available.min())}"
                )
        return torch.where(mask, logits, float("-inf"))

    def extra_repr(self) -> str:
        params = "".join(f", {name}={value!r}" for name, value in self.params.items())
        return f"d_model={self.d_model}, n_experts={self.n_experts}, k={self.k}, method={self.method!r}{params}"
