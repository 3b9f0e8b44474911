"""smooth-topk (``topk.svm``, oval-group/smooth-topk 1.0) names and signatures, computed by softtopk.

``from softtopk.compat.smooth_topk import SmoothTopkSVM`` replaces ``from topk.svm import SmoothTopkSVM``
(Berrada, Zisserman & Kumar, "Smooth Loss Functions for Deep Top-k Classification", ICLR 2018):

* ``SmoothTop1SVM(n_classes, alpha=None, tau=1.)``
* ``SmoothTopkSVM(n_classes, alpha=None, tau=1., k=5)``
* ``MaxTop1SVM(n_classes, alpha=None)``
* ``MaxTopkSVM(n_classes, alpha=None, k=5)``

with the original's positional order and defaults; ``alpha=None`` means ``alpha = 1`` (the original's
``_SVMLoss.__init__``: ``self.alpha = alpha if alpha is not None else 1``). ``forward(x, y)`` takes
scores ``(B, C)`` and labels ``(B,)`` and returns the 0-d mean of the per-sample losses over the
batch, like the original (which sums the smooth and hard rows and divides by ``B``). The losses are
:func:`softtopk.smooth_topk_svm`, :func:`softtopk.smooth_top1_svm`, :func:`softtopk.topk_svm` and
:func:`softtopk.top1_svm`; the classes subclass softtopk's Modules (:class:`softtopk.SmoothTopKSVM`,
:class:`softtopk.SmoothTop1SVM`, and ``MaxTop*SVM`` of :class:`softtopk.TopKSVM`/:class:`softtopk.Top1SVM`),
adding the original's ``n_classes``.

Intended differences from the original:

* the smooth losses are the **exact** smooth loss :math:`L_{k,\\tau}` for every input, with no per-row
  switch to the hard loss (the original's ``thresh = 1e3`` routing, which makes the loss jump and
  costs two host syncs per call): the loss is continuous everywhere and its float32 gradients stay
  finite for large ``|s| / (k tau)``; there is no ``thresh`` attribute;
* ``SmoothTopkSVM(k=1)`` has the correct gradient (the original's custom backward is wrong for
  ``k = 1``; its experiments route ``k = 1`` to ``SmoothTop1SVM``); its value equals ``SmoothTop1SVM``'s;
* shift invariant: adding a constant to a row does not change the loss (the original's float32
  renormalisation does);
* any device and dtype: ``.cpu()`` works (the original's raises ``TypeError``), ``.to()``/``.cuda()``
  need no rebuilding of closures, float64 is computed in float64 and float16/bfloat16 in float32;
* ``n_classes >= k + 1`` suffices (the original's polynomial needs ``n_classes >= k + 1 + k // 5``
  and fails with a bare ``AssertionError`` otherwise);
* ``k``, ``tau`` and ``alpha`` are plain attributes read at every forward: assigning ``.alpha`` or
  ``.tau`` later takes effect (the original freezes ``alpha`` and ``k`` into closures, and its ``tau``
  setter prints); no ``labels`` buffer;
* bad arguments raise ``TypeError``/``ValueError`` naming them (``k < 1``, ``k >= n_classes``,
  ``tau <= 0``, ``alpha < 0``, non-int ``n_classes``, an input whose class count is not
  ``n_classes``) where the original asserts or fails later;
* ``forward`` also accepts ``(N, C, d1, ...)`` scores with ``(N, d1, ...)`` labels (mean over all).

For ``weight``, ``ignore_index`` and ``reduction`` use the native losses (:class:`softtopk.SmoothTopKSVM`, ...).
"""

from __future__ import annotations

import torch

from .._validation import check_classes_match, check_int
from ..nn import SmoothTop1SVM as _SmoothTop1
from ..nn import SmoothTopKSVM as _SmoothTopK
from ..nn import Top1SVM as _Top1
from ..nn import TopKSVM as _TopK

__all__ = ["MaxTop1SVM", "MaxTopkSVM", "SmoothTop1SVM", "SmoothTopkSVM"]

#: the margin the original uses for ``alpha=None`` (``topk/svm.py``, ``_SVMLoss.__init__``)
DEFAULT_ALPHA = 1.0


def _alpha(alpha: float | None) -> float:
    return DEFAULT_ALPHA if alpha is None else alpha


class _OriginalClasses:
    """The original's ``n_classes``: checked at construction (``k < n_classes``) and against every
    input; its ``labels`` buffer (``arange(n_classes)``) is kept for its state_dict."""

    n_classes: int

    def _set_classes(self, n_classes: int, k: int = 1) -> None:
        self.n_classes = check_int("n_classes", n_classes, low=2)
        check_int("k", k, low=1, high=self.n_classes - 1, why=" (k < n_classes)")
        # the original's buffer, so that state_dicts load both ways (unused here)
        self.register_buffer("labels", torch.arange(self.n_classes))  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().forward(check_classes_match(x, self.n_classes), y)  # type: ignore[misc]

    def extra_repr(self) -> str:
        return f"n_classes={self.n_classes}, {super().extra_repr()}"  # type: ignore[misc]


class SmoothTopkSVM(_OriginalClasses, _SmoothTopK):
    """``topk.svm.SmoothTopkSVM``: the smooth top-k SVM loss :math:`L_{k,\\tau}`, exact, batch mean.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        alpha: margin ``>= 0``; ``None`` (default) means 1, as in the original.
        tau: temperature ``> 0`` (default 1).
        k: the ``k`` of top-k, ``1 <= k < n_classes`` (default 5).

    Example:
        >>> import torch
        >>> from softtopk.compat.smooth_topk import SmoothTopkSVM
        >>> loss = SmoothTopkSVM(4, k=2)
        >>> loss(torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]]), torch.tensor([0, 3]))
        tensor(0.9880)
    """

    def __init__(self, n_classes: int, alpha: float | None = None, tau: float = 1.0, k: int = 5) -> None:
        super().__init__(k=k, tau=tau, alpha=_alpha(alpha))
        self._set_classes(n_classes, self.k)


class SmoothTop1SVM(_OriginalClasses, _SmoothTop1):
    """``topk.svm.SmoothTop1SVM``: :math:`\\tau \\log \\sum_j e^{(s_j + \\alpha [j \\ne y] - s_y)/\\tau}`,
    batch mean.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        alpha: margin ``>= 0``; ``None`` (default) means 1, as in the original.
        tau: temperature ``> 0`` (default 1).

    Example:
        >>> import torch
        >>> from softtopk.compat.smooth_topk import SmoothTop1SVM
        >>> SmoothTop1SVM(4, alpha=0.0)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))
        tensor(2.1852)
    """

    def __init__(self, n_classes: int, alpha: float | None = None, tau: float = 1.0) -> None:
        super().__init__(tau=tau, alpha=_alpha(alpha))
        self._set_classes(n_classes)


class MaxTopkSVM(_OriginalClasses, _TopK):
    """``topk.svm.MaxTopkSVM``: the hard top-k hinge :math:`\\max(0, \\alpha + (s_{\\setminus y,[k]} - s_y)/k)`,
    batch mean.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        alpha: margin ``>= 0``; ``None`` (default) means 1, as in the original.
        k: the ``k`` of top-k, ``1 <= k < n_classes`` (default 5).

    Example:
        >>> import torch
        >>> from softtopk.compat.smooth_topk import MaxTopkSVM
        >>> MaxTopkSVM(4, k=2)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([2]))
        tensor(1.5000)
    """

    def __init__(self, n_classes: int, alpha: float | None = None, k: int = 5) -> None:
        super().__init__(k=k, alpha=_alpha(alpha))
        self._set_classes(n_classes, self.k)


class MaxTop1SVM(_OriginalClasses, _Top1):
    """``topk.svm.MaxTop1SVM``: the Crammer–Singer hinge :math:`\\max(0, \\alpha + \\max_{j \\ne y} s_j - s_y)`,
    batch mean.

    Args:
        n_classes: the number of classes ``C`` (checked against the input at forward).
        alpha: margin ``>= 0``; ``None`` (default) means 1, as in the original.

    Example:
        >>> import torch
        >>> from softtopk.compat.smooth_topk import MaxTop1SVM
        >>> MaxTop1SVM(4)(torch.tensor([[3.0, 1.0, 0.0, -1.0]]), torch.tensor([1]))
        tensor(3.)
    """

    def __init__(self, n_classes: int, alpha: float | None = None) -> None:
        super().__init__(alpha=_alpha(alpha))
        self._set_classes(n_classes)
