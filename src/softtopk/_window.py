r"""The sparse soft top-k's closed forms on a window of candidates, written once for the torch kernel
(:mod:`softtopk.ops.sparse`) and the JAX kernel (``softtopk/jax/ops/sparse.py``).

Between two breakpoints of the threshold, the entries fall into three groups: saturated (at 1),
zero, and the window of ``c`` centred candidates ``u_i`` strictly in between, where the mask
contributes :math:`(u_i - a)^r` (``r = 1/(p-1)``: 1 for p = 2, 3 for p = 4/3) at the centred threshold
``a``. The window's part of the sum is a polynomial in ``a`` whose coefficients are the window's
power sums :math:`m_j = \sum_i u_i^j`: :func:`window_power` evaluates it and :func:`window_root`
solves for the ``a`` at which it equals what the saturated entries leave of ``k``.

Python arithmetic only, so both run on torch tensors and JAX arrays alike, with the same operations
in the same order (the kernels agree to the last bit where they compute in the same dtype); the two
steps whose spelling differs, a clamp at 0 and the real root of a cubic, are passed in. Pure Python:
importing it loads no framework.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["window_power", "window_root"]


def window_power(moments: Sequence[Any], count: Any, at: Any, r: int) -> Any:
    r""":math:`\sum_i (u_i - a)^r` over a window from its power sums ``moments`` (:math:`m_1, \dots, m_r`)
    and its size ``count``, at the centred threshold ``at``."""
    if r == 1:
        return moments[0] - at * count
    m1, m2, m3 = moments
    return m3 - 3 * at * m2 + 3 * at * at * m1 - at * at * at * count


def window_root(
    moments: Sequence[Any],
    count: Any,
    safe: Any,
    deficit: Any,
    sk: Any,
    lam: Any,
    r: int,
    magnitude: bool,
    *,
    nonnegative: Callable[[Any], Any],
    cubic_root: Callable[[Any, Any], Any],
) -> Any:
    r"""The centred threshold ``a`` at which the window's part of the sum equals ``deficit`` (``k``
    less the saturated count), in closed form.

    Mask, :math:`\sum_i (u_i - a)^r = \delta` with ``u`` in units of λ (``lam`` is 1 there);
    magnitude, :math:`\sum_i (u_i - a)^r = \lambda^r (a + s_k)\,\delta` with ``u`` centred on
    ``s_k`` (``sk``), i.e. :math:`\theta = a + s_k`. ``r = 1``: linear; ``r = 3``: with the window's
    mean :math:`\mu`, :math:`v_2 = \sum (u_i - \mu)^2` and :math:`v_3 = \sum (u_i - \mu)^3`,
    :math:`y = a - \mu` solves the depressed cubic :math:`y^3 + P y + Q = 0` (one real root, as
    :math:`P \ge 0`), whose root ``cubic_root(P, Q)`` gives. ``safe`` is ``count`` with 0 raised to 1
    (rows with an empty window are replaced by the caller); ``nonnegative`` clamps at 0."""
    if r == 1:
        m1 = moments[0]
        return (m1 - deficit) / safe if not magnitude else (m1 + count * sk) / (count + lam * deficit) - sk
    m1, m2, m3 = moments
    mu = m1 / safe
    v2 = nonnegative(m2 - m1 * mu)
    v3 = m3 - 3 * mu * m2 + 3 * mu * mu * m1 - mu * mu * mu * count
    load = lam**3 * deficit
    if magnitude:
        return mu + cubic_root((3 * v2 + load) / safe, (load * (mu + sk) - v3) / safe)
    return mu + cubic_root(3 * v2 / safe, (load - v3) / safe)
