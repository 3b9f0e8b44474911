r"""Random numbers inside the numba kernels (imported only by them: this module imports numba).

A kernel that draws its own noise needs no ``(R, C, S)`` tensor of draws, and may draw only the
values that can matter (:func:`softtopk.ops.noised_numba_kernels.kth_of_fresh_draws`). A call's
seed is one integer the caller draws from a :class:`torch.Generator` (so the call is reproducible
under ``torch.manual_seed``), and each row index of the call has its own stream of that seed: a
row's draws do not depend on the order, or the thread, in which rows are drawn.

* :func:`seed`: a row's xoshiro256** state from ``(seed, stream)`` through splitmix64
  (D. Blackman, S. Vigna, "Scrambled Linear Pseudorandom Number Generators", ACM TOMS 2021);
* :func:`uniform`: a double in ``(0, 1]`` from the top 53 bits of one output;
* :func:`normal`: a standard Gaussian by the 256-layer ziggurat (G. Marsaglia, W. W. Tsang,
  "The Ziggurat Method for Generating Random Variables", J. Stat. Softw. 2000), with Marsaglia's
  exact sampler beyond its base layer;
* :func:`upper_tail`: :math:`Q(a) = P(Z > a)`;
* :func:`normal_above`: a Gaussian conditioned on ``Z > a``: rejection from :func:`normal` for
  small ``a``, otherwise C. P. Robert's translated-exponential sampler ("Simulation of truncated
  normal variables", Stat. Comput. 1995).
"""

from __future__ import annotations

import math

import numpy as np

from .order_kernels import jit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ONE = np.uint64(1)
_LAYER_BITS = np.uint64(255)
_ULP = 2.0**-53
_SQRT_HALF = math.sqrt(0.5)
_SMALL_TAIL = 0.75  # below this lower end, plain rejection accepts at least one draw in five

_R = 3.6541528853610088  # the base layer's edge and the layers' common area (Marsaglia-Tsang)
_AREA = 4.92867323399e-3


def _layers() -> tuple[np.ndarray, np.ndarray]:
    """The ziggurat's layer edges ``x`` (257,), from ``x[0] = area / f(R)`` (the base layer with its
    tail) down to ``x[256] = 0``, and ``f(x) = exp(-x² / 2)`` at each: layer ``i`` covers
    ``[0, x[i]] × [f(x[i]), f(x[i + 1])]``."""
    x = np.empty(257)
    x[0], x[1] = _AREA / math.exp(-0.5 * _R * _R), _R
    for i in range(1, 255):
        x[i + 1] = math.sqrt(-2.0 * math.log(_AREA / x[i] + math.exp(-0.5 * x[i] * x[i])))
    x[256] = 0.0
    return x, np.exp(-0.5 * x * x)


_X, _F = _layers()


@jit
def _mix(x):
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


@jit
def _rotate(x, bits):
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


@jit
def seed(state, base, stream):
    """Fill ``state`` (4,) uint64 with stream ``stream`` of the seed ``base`` (both uint64)."""
    x = base + stream * _GOLDEN
    for i in range(4):
        x = x + _GOLDEN
        state[i] = _mix(x)


@jit
def _next(s):
    out = _rotate(s[1] * np.uint64(5), 7) * np.uint64(9)
    shifted = s[1] << np.uint64(17)
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= shifted
    s[3] = _rotate(s[3], 45)
    return out


@jit
def uniform(s):
    """A uniform double in ``(0, 1]``."""
    return ((_next(s) >> np.uint64(11)) + _ONE) * _ULP


@jit
def normal(s):
    """A standard Gaussian: the layer from the low 8 bits, the sign from the 9th (applied without a
    branch: a coin flip mispredicts half the time), the abscissa from the top 53; nearly every draw
    is one output, one multiply and one comparison."""
    while True:
        bits = _next(s)
        layer = np.int64(bits & _LAYER_BITS)
        z = np.int64(bits >> np.uint64(11)) * _ULP * _X[layer]
        if z < _X[layer + 1]:  # inside the layer's rectangle under the curve
            break
        if layer == 0:  # the tail beyond R, exactly
            while True:
                tail = -math.log(uniform(s)) / _R
                if -2.0 * math.log(uniform(s)) > tail * tail:
                    break
            z = _R + tail
            break
        if _F[layer] + uniform(s) * (_F[layer + 1] - _F[layer]) < math.exp(-0.5 * z * z):
            break
    return z * (1.0 - 2.0 * np.float64((bits >> np.uint64(8)) & _ONE))


@jit
def upper_tail(a):
    """``P(Z > a)`` for a standard Gaussian ``Z``."""
    return 0.5 * math.erfc(a * _SQRT_HALF)


@jit
def normal_above(s, a):
    """A standard Gaussian conditioned on exceeding ``a`` (``-inf`` allowed)."""
    if a < _SMALL_TAIL:
        while True:
            z = normal(s)
            if z > a:
                return z
    rate = 0.5 * (a + math.sqrt(a * a + 4.0))  # the exponential proposal's optimal rate
    while True:
        z = a - math.log(uniform(s)) / rate
        gap = z - rate
        if uniform(s) <= math.exp(-0.5 * gap * gap):
            return z
