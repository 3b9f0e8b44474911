"""difftopk 0.2.0 / diffsort 0.2.0 names and signatures, computed by softtopk.

Every class keeps the original constructor signature, defaults and output layout (ascending ranks,
last column = top-1; SoftSort rows = ranks), so ``from softtopk.compat.difftopk import ...`` replaces
``from difftopk import ...`` / ``from diffsort import ...``. Common to all of them, unlike the
originals: float16/bfloat16/float32/float64 inputs on any device (the output follows the input;
the ``device`` argument is accepted and not needed), bad arguments raise ``ValueError``/``TypeError``
instead of failing an ``assert``, and no ``torch_sparse`` is needed. See ``docs/compat.md``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .._validation import check_choice, check_int, check_real, check_scores
from ..functional import soft_permutation, soft_topk_ranks, topk_cross_entropy
from ..nn import SoftTopKRanks
from ..nn import TopKCrossEntropyLoss as _NativeTopKCE
from .difftopk_svm import SmoothHardTopKLoss, SmoothTopKLoss, smooth_hard_topk_loss

__all__ = [
    "DiffSortNet",
    "DiffTopkNet",
    "NeuralSort",
    "SmoothHardTopKLoss",
    "SmoothTopKLoss",
    "SoftSort",
    "TopKCrossEntropyLoss",
    "smooth_hard_topk_loss",
]

_NETWORK_NAMES = {"steepness": "steepness", "art_lambda": "art_lambda", "distribution": "distribution"}
_LOSS_METHODS = {name: name for name in ("bitonic", "splitter_selection", "odd_even", "neuralsort", "softsort")}
_LOSS_METHODS["bitonic__non_sparse"] = "bitonic"


def _distribution(distribution: str | None, interpolation_type: str | None) -> str:
    """The original rule for the deprecated alias; ``None`` means ``'cauchy'`` (difftopk crashed)."""
    if interpolation_type is None:
        return "cauchy" if distribution is None else distribution
    if distribution not in (None, "cauchy", interpolation_type):
        raise ValueError(
            f"distribution={distribution!r} and interpolation_type={interpolation_type!r} disagree; "
            "interpolation_type is a deprecated alias of distribution: pass distribution only"
        )
    warnings.warn("interpolation_type is deprecated, use distribution", DeprecationWarning, stacklevel=3)
    return interpolation_type


def _art_lambda(art_lambda: float | None, distribution: str | None) -> float:
    """``art_lambda=None`` (difftopk's README passes it): unused, as in the originals, except by
    ``logistic_phi``, where the originals fail (``pow(None)``) and this raises."""
    if art_lambda is not None:
        return art_lambda
    if distribution == "logistic_phi":
        raise ValueError("art_lambda must be a float for distribution='logistic_phi', got None")
    return 0.25


class _Hyper(torch.nn.Module):
    """Hyper-parameters as plain attributes (the originals' names): assigning one, e.g. a steepness
    or temperature schedule, changes the next forward, which checks them."""

    _method: str
    _names: dict[str, str]  # attribute -> softtopk parameter

    @property
    def params(self) -> dict[str, Any]:
        """The softtopk parameters of the next forward, checked."""
        values = {native: getattr(self, name) for name, native in self._names.items()}
        if "distribution" in values:
            values["distribution"] = values["distribution"] or "cauchy"
            values["art_lambda"] = _art_lambda(values["art_lambda"], values["distribution"])
        return _checked_params(self._method, values)

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names)

    def _network(
        self,
        kind: str,
        kinds: tuple[str, ...],
        size: int,
        steepness: float,
        art_lambda: float | None,
        distribution: str,
        interpolation_type: str | None,
    ) -> None:
        """A network's type, size and comparator hyper-parameters as attributes, checked."""
        self.sorting_network_type = check_choice("sorting_network_type", kind, kinds)
        self.size = check_int("size", size, low=1)
        self._method, self._names = self.sorting_network_type, _NETWORK_NAMES
        self.steepness, self.art_lambda = steepness, art_lambda
        self.distribution = _distribution(distribution, interpolation_type)
        self.params  # noqa: B018 -- the property checks them


def _rows(x: Any, size: int, name: str) -> torch.Tensor:
    x = check_scores(name, x, dims=2, shape=f"(batch, {size})")
    if x.shape[1] != size:
        raise ValueError(f"{name} must have shape (batch, {size}), got {tuple(x.shape)}")
    return x


def _checked_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` of a ranks (and permutation) ``method`` with its defaults, checked as the native
    Module checks them."""
    return SoftTopKRanks(1, method=method, **params).params


class DiffTopkNet(_Hyper):
    """``difftopk.DiffTopkNet``: relaxed top-k of a sorting/selection network.

    ``forward(vectors (b, n))`` returns ``(None, P_topk)`` with ``P_topk (b, n, k)``;
    ``P_topk[b, i, j]`` is the weight of input ``i`` at ascending sorted position ``n - k + j``
    (the last column is the top-1). Maps to
    ``softtopk.soft_topk_ranks(vectors, k, method=sorting_network_type, steepness=...,
    distribution=..., art_lambda=...).flip(-1)``.

    ``steepness``, ``art_lambda`` and ``distribution`` are attributes: assigning one changes the next
    forward, as in difftopk. ``art_lambda=None`` is accepted (used by ``logistic_phi`` only).

    Intended differences: bitonic networks sort for every ``n`` (difftopk's layout, used wherever it
    sorts, does not for n = 22, 38, 42-46, 54, ...); ``sparse`` has no effect and every type (``bitonic``, ``odd_even``,
    ``splitter_selection``) works with either value, without ``torch_sparse`` and without dense
    ``n x n`` layer matrices; any floating dtype (difftopk: float32 only); ``distribution=None``
    means ``'cauchy'``; ``logistic_phi`` differs near ties (``|d| < 0.1``, see
    :mod:`softtopk.ops.swaps`); ``interpolation_type`` warns (``DeprecationWarning``) instead of
    printing.

    Example:
        >>> import torch
        >>> from softtopk.compat.difftopk import DiffTopkNet
        >>> net = DiffTopkNet("bitonic", size=4, k=2, steepness=100.0)
        >>> _, P_topk = net(torch.tensor([[0.0, 3.0, 1.0, 2.0]]))
        >>> P_topk.round(decimals=1)  # input 3 (score 2) is 2nd largest, input 1 (score 3) largest
        tensor([[[0., 0.],
                 [0., 1.],
                 [0., 0.],
                 [1., 0.]]])
    """

    def __init__(
        self,
        sorting_network_type: str,
        size: int,
        k: int,
        sparse: bool = False,
        device: str = "cpu",
        steepness: float = 10.0,
        art_lambda: float | None = 0.25,
        interpolation_type: str | None = None,
        distribution: str = "cauchy",
    ) -> None:
        super().__init__()
        self._network(
            sorting_network_type,
            ("bitonic", "odd_even", "splitter_selection"),
            size,
            steepness,
            art_lambda,
            distribution,
            interpolation_type,
        )
        self.k = check_int("k", k, low=1, high=self.size, why=" (k <= size)")
        self.sparse = sparse

    def forward(self, vectors: torch.Tensor) -> tuple[None, torch.Tensor]:
        vectors = _rows(vectors, self.size, "vectors")
        ranks = soft_topk_ranks(vectors, self.k, method=self.sorting_network_type, **self.params)
        return None, ranks.flip(-1)

    def extra_repr(self) -> str:
        return f"{self.sorting_network_type!r}, size={self.size}, k={self.k}, {super().extra_repr()}"


class DiffSortNet(_Hyper):
    """``diffsort.DiffSortNet``: relaxed full sort by a sorting network.

    ``forward(vectors (b, n))`` returns ``(sorted, P)``: ``sorted (b, n)`` ascending and ``P (b, n, n)``
    with ``P[b, i, j]`` the weight of input ``i`` at ascending position ``j``, so
    ``sorted = vectors @ P`` row by row. Maps to ``softtopk.soft_permutation(vectors,
    method=sorting_network_type, ...).flip(-1)``; ``sorted`` is computed as ``vectors @ P``.

    ``steepness``, ``art_lambda`` and ``distribution`` are attributes, as in diffsort (assigning one
    changes the next forward); ``art_lambda=None`` is accepted (used by ``logistic_phi`` only).

    Intended differences: bitonic networks sort for every ``n`` (diffsort's layout where it sorts,
    see :class:`DiffTopkNet`); ``distribution=None`` means ``'cauchy'``; ``logistic_phi`` differs
    near ties; float16/bfloat16 are computed in float32.
    """

    def __init__(
        self,
        sorting_network_type: str,
        size: int,
        device: str = "cpu",
        steepness: float = 10.0,
        art_lambda: float | None = 0.25,
        interpolation_type: str | None = None,
        distribution: str = "cauchy",
    ) -> None:
        super().__init__()
        self._network(
            sorting_network_type, ("bitonic", "odd_even"), size, steepness, art_lambda, distribution, interpolation_type
        )

    def forward(self, vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        vectors = _rows(vectors, self.size, "vectors")
        permutation = soft_permutation(vectors, method=self.sorting_network_type, **self.params).flip(-1)
        return (vectors.unsqueeze(-2) @ permutation).squeeze(-2), permutation

    def extra_repr(self) -> str:
        return f"{self.sorting_network_type!r}, size={self.size}, {super().extra_repr()}"


class NeuralSort(_Hyper):
    """``difftopk.NeuralSort`` (Grover et al., ICLR 2019).

    ``forward(scores (b, n))`` returns ``(b, n, n)``: rows = inputs, columns = ranks ascending
    (the last column is the largest). Maps to ``softtopk.soft_permutation(scores,
    method='neuralsort', tau=tau, hard=hard).flip(-1)``.

    ``tau`` and ``hard`` are attributes (assigning one changes the next forward). The gradient at
    tied scores is the original's (symmetric in the tied entries).

    Intended differences: ``hard=True`` gives the exact permutation of the scores in the forward
    pass (difftopk takes an argmax over ranks for each input, which is often not a permutation:
    ``docs/compat.md`` counts how often); the backward is the same straight-through gradient. Any
    floating dtype (difftopk: float32 only).
    """

    _method, _names = "neuralsort", {"tau": "tau", "hard": "hard"}

    def __init__(self, tau: float = 1.0, hard: bool = False) -> None:
        super().__init__()
        self.tau, self.hard = tau, hard
        self.params  # noqa: B018 -- checked at construction too

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        scores = check_scores("scores", scores, dims=2, shape="(batch, n)")
        return soft_permutation(scores, method="neuralsort", **self.params).flip(-1)


class SoftSort(_Hyper):
    """``difftopk.SoftSort`` (Prillo & Eisenschlos, ICML 2020).

    ``forward(scores (b, n))`` returns ``(b, n, n)``: rows = ranks descending, columns = inputs
    (the transpose of NeuralSort's layout). Maps to ``softtopk.soft_permutation(scores,
    method='softsort', tau=tau, hard=hard, power=pow).transpose(-1, -2)``.

    ``tau``, ``hard`` and ``pow`` are attributes (assigning one changes the next forward).

    Intended differences: ``pow`` must be ``>= 1`` (smaller powers have unbounded gradients at
    ties); float16/bfloat16 are computed in float32.
    """

    _method, _names = "softsort", {"tau": "tau", "hard": "hard", "pow": "power"}

    def __init__(self, tau: float = 1.0, hard: bool = False, pow: float = 1.0) -> None:
        super().__init__()
        self.tau, self.hard, self.pow = tau, hard, pow
        self.params  # noqa: B018 -- checked at construction too

    @property
    def params(self) -> dict[str, Any]:
        check_real("pow", self.pow, low=1.0)  # named as the original names it
        return super().params

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        scores = check_scores("scores", scores, dims=2, shape="(batch, n)")
        return soft_permutation(scores, method="softsort", **self.params).transpose(-1, -2)


class TopKCrossEntropyLoss(torch.nn.Module):
    """``difftopk.TopKCrossEntropyLoss``: top-k cross-entropy, batch mean.

    ``forward(outputs (b, n), labels (b,))`` returns a scalar. Maps to
    ``softtopk.functional.topk_cross_entropy(outputs, labels, p_k, method=..., m=m,
    top1_mode=top1_mode, reduction='mean', ...)`` with ``method`` = ``diffsort_method`` (both
    ``bitonic`` and ``bitonic__non_sparse`` map to ``'bitonic'``) and ``inverse_temperature`` =
    ``steepness`` for networks, ``1 / tau`` for ``neuralsort`` / ``softsort``.

    ``m=None`` (difftopk's default) relaxes every class; the native loss defaults to ``m=16``.

    Intended differences: ``distribution=None`` (the default) means ``'cauchy'`` (difftopk raised
    ``NotImplementedError`` in forward for every network); unknown methods fail at construction.
    For networks, softtopk feeds the (pre-selected) scores in ascending order, each on the wire of
    its rank, whereas difftopk feeds them in class order (the label first when ``m`` is set);
    networks are not permutation equivariant, so network losses differ from difftopk's (they equal
    difftopk's loss on the classes sorted ascending, ``m=None``). NeuralSort/SoftSort are
    equivariant and agree with difftopk.
    Inputs ``(N, C, d1, ...)``, any floating dtype and device.
    """

    def __init__(
        self,
        diffsort_method: str,
        inverse_temperature: float,
        p_k: Sequence[float],
        n: int,
        m: int | None = None,
        distribution: str | None = None,
        art_lambda: float | None = 0.25,
        device: str = "cpu",
        top1_mode: str = "sm",
    ) -> None:
        super().__init__()
        self.diffsort_method = check_choice("diffsort_method", diffsort_method, tuple(_LOSS_METHODS))
        self.method = _LOSS_METHODS[diffsort_method]
        self.inverse_temperature = inverse_temperature
        if self.method in ("neuralsort", "softsort"):
            params: dict[str, Any] = {"tau": 1 / check_real("inverse_temperature", inverse_temperature, positive=True)}
        else:
            distribution = _distribution(distribution, None)
            params = {
                "steepness": inverse_temperature,
                "art_lambda": _art_lambda(art_lambda, distribution),
                "distribution": distribution,
            }
        native = _NativeTopKCE(p_k, method=self.method, m=m, top1_mode=top1_mode, **params)
        self.p_k, self.m, self.top1_mode, self.params = native.p_k, native.m, native.top1_mode, native.params
        self.k = len(self.p_k)
        self.n = check_int("n", n, low=self.k, why=" (n >= k = len(p_k))")
        if self.m is not None:
            check_int("m", self.m, low=self.k + 1, high=self.n - 1, why=" (k = len(p_k) < m < n)")

    def forward(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        outputs = check_scores("outputs", outputs)
        if outputs.dim() < 2 or outputs.shape[1] != self.n:
            raise ValueError(f"outputs must have shape (batch, n={self.n}, ...), got {tuple(outputs.shape)}")
        return topk_cross_entropy(
            outputs, labels, self.p_k, method=self.method, m=self.m, top1_mode=self.top1_mode, **self.params
        )

    def extra_repr(self) -> str:
        return (
            f"{self.diffsort_method!r}, inverse_temperature={self.inverse_temperature}, p_k={list(self.p_k)}, "
            f"n={self.n}, m={self.m}, top1_mode={self.top1_mode!r}"
        )
