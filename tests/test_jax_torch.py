"""One truth across frameworks: :mod:`softtopk.jax` against the torch operators on the same inputs.

Values and vector-Jacobian products (one random cotangent per case) of the sparse mask and
magnitude (both p, exact and Dykstra), the closed-form mask and the hard top-k, on rows with ties,
at scales 1e-6, 1 and 1e6, for k = 1 ... n: to 1e-9 in float64 (``jax_enable_x64``) and 1e-5 in
float32. λ (τ) carries the units of the scores (the magnitude's λ those of ``|x|^{1 - 1/r}``), so
every case has the same conditioning at every scale; float64 also runs a fixed λ = 0.1 at every
scale. Values are compared relative to the scale of the output (1 for masks, the scale for the
magnitude), gradients relative to their largest entry at that scale.

Each call stacks the rows of the three scales (λ per row), so that each shape compiles once; the
magnitude's λ is a float, so at p = 4/3 it runs one call per scale (λ is traced: no new compile).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import softtopk  # noqa: E402
import softtopk.jax as sj  # noqa: E402

SCALES = (1e-6, 1.0, 1e6)
P_VALUES = (2.0, 4.0 / 3.0)


def _rows(n: int, scale: float, dtype) -> np.ndarray:
    """Eight rows: random; two ties inside; integers (many ties); random with one -inf (when n > 3);
    the same again from another seed."""
    x = np.random.default_rng(n).standard_normal((8, n))
    if n > 2:
        x[1::4, 1] = x[1::4, 2]
    x[2::4] = np.round(2 * x[2::4])
    if n > 3:
        x[3::4, 0] = -np.inf
    return (x * scale).astype(dtype)


def _case(name: str, k: int, lam, p: float):
    """(torch function, jax function) of the operator ``name``; ``lam`` a float or an array per row."""
    tl, jl = (torch.tensor(lam), jnp.asarray(lam)) if isinstance(lam, np.ndarray) else (lam, lam)
    if name == "mask":
        return (lambda t: softtopk.sparse_topk_mask(t, k, l=tl, p=p), lambda a: sj.sparse_topk_mask(a, k, l=jl, p=p))
    if name == "dykstra":
        return (
            lambda t: softtopk.sparse_topk_mask(t, k, l=tl, p=2, solver="dykstra", n_iter=200),
            lambda a: sj.sparse_topk_mask(a, k, l=jl, p=2, solver="dykstra", n_iter=200),
        )
    if name == "mag":
        return (lambda t: softtopk.sparse_topk_mag(t, k, l=tl, p=p), lambda a: sj.sparse_topk_mag(a, k, l=jl, p=p))
    if name == "laplace":
        return lambda t: softtopk.soft_topk(t, k, tau=tl), lambda a: sj.soft_topk(a, k, tau=jl)
    return lambda t: softtopk.hard_topk_mask(t, k), lambda a: sj.hard_topk_mask(a, k)


def _lam(name: str, scale: float, p: float, base: float) -> float:
    """λ in the units of the scores: the magnitude's λ scales as ``|x|^{1 - 1/r}`` (dimensionless at p = 2)."""
    if name == "mag":
        return base * scale ** (1.0 - (p - 1.0))
    return base * scale


def _compare(name: str, x: np.ndarray, block: np.ndarray, scales, lams, k: int, p: float, tol: float) -> None:
    """Values and vector-Jacobian products of both frameworks on ``x``, whose row ``i`` is at scale
    ``scales[block[i]]`` with λ ``lams[block[i]]``: values relative to each row's output scale,
    gradients relative to the largest entry of each scale's rows."""
    if name == "mag":  # λ is a float: one for all rows (p = 2: dimensionless)
        assert len(set(lams)) == 1, "the magnitude's λ is a float: compare one λ at a time"
        lam = float(lams[0])
    else:
        lam = np.asarray(lams, x.dtype)[block]
    torch_fn, jax_fn = _case(name, k, lam, p)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)
    leaf = torch.tensor(x, requires_grad=True)
    out = torch_fn(leaf)
    grad = torch.autograd.grad((out * torch.tensor(g)).sum(), leaf, allow_unused=True)[0]
    grad = np.zeros_like(x) if grad is None else grad.numpy()
    value, vjp = jax.vjp(jax_fn, jnp.asarray(x))
    unit = np.asarray(scales)[block][:, None] if name == "mag" else 1.0
    where = f"{name} k={k} l={list(lams)} p={p:.4g} scales={list(scales)} {x.dtype}"
    np.testing.assert_allclose(np.asarray(value) / unit, out.detach().numpy() / unit, rtol=0, atol=tol, err_msg=where)
    jgrad = np.asarray(vjp(jnp.asarray(g))[0])
    largest = np.array([np.abs(grad[block == b]).max(initial=0.0) for b in range(len(scales))])
    gscale = np.maximum(1.0, largest)[block][:, None]
    np.testing.assert_allclose(jgrad / gscale, grad / gscale, rtol=0, atol=tol, err_msg=where)


def _compare_stacked(name: str, n: int, k: int, p: float, scales, dtype, tol: float, base: float | None = 1.0):
    """:func:`_compare` on :func:`_rows` of every scale in ``scales``, stacked into one call (λ per
    row, in the units of its scale; ``base=None``: λ = 0.1 at every scale)."""
    blocks = [_rows(n, scale, dtype) for scale in scales]
    x, block = np.concatenate(blocks), np.repeat(np.arange(len(scales)), len(blocks[0]))
    keep = np.ones(len(x), bool)
    if name in ("mag", "dykstra"):  # no -inf row: masking is the masks' (and Dykstra's iteration has none)
        keep = np.arange(len(x)) % 4 != 3
    if name == "hard":  # torch.topk and lax.top_k may choose differently among ties: rows 0, 3 of 4
        keep = np.arange(len(x)) % 4 % 3 == 0
    lams = [0.1 if base is None else _lam(name, scale, p, base) for scale in scales]
    _compare(name, x[keep], block[keep], scales, lams, k, p, tol)


NAMES = ("mask", "mag", "laplace", "dykstra", "hard")
# (n, k): every k of a short row, and a longer row's first, middle and last k
SIZES = ((1, 1), (6, 1), (6, 2), (6, 3), (6, 5), (6, 6), (17, 1), (17, 8), (17, 16))


def _p_values(name: str) -> tuple[float, ...]:
    return P_VALUES if name in ("mask", "mag") else (2.0,)


def _scale_groups(p: float, name: str) -> list[tuple[float, ...]]:
    """The scales of each call: all in one call, except for the magnitude at p = 4/3, whose λ (a
    float) differs per scale."""
    return [(scale,) for scale in SCALES] if name == "mag" and p != 2.0 else [SCALES]


@pytest.mark.parametrize("name", NAMES)
def test_float64_agrees_to_1e_9(name):
    with jax.enable_x64(True):
        for p in _p_values(name):
            for scales, (n, k) in itertools.product(_scale_groups(p, name), SIZES):
                _compare_stacked(name, n, k, p, scales, np.float64, 1e-9)
        if name in ("mask", "laplace"):  # the same λ at every scale: from near-hard to near-uniform
            for p in _p_values(name):
                _compare_stacked(name, 17, 5, p, SCALES, np.float64, 1e-9, base=None)


@pytest.mark.parametrize("name", NAMES)
def test_float32_agrees_to_1e_5(name):
    for p in _p_values(name):
        for scales, k in itertools.product(_scale_groups(p, name), (1, 8, 16)):
            _compare_stacked(name, 17, k, p, scales, np.float32, 1e-5)


def test_float32_magnitude_with_its_k_th_entry_far_below_lambda():
    """p = 4/3 magnitude in float32 with ``λ`` far above ``s_k^{2/3}``: solved in units of ``s_k``, the
    top of the bracket cubed left float32's range and the two 1.0 entries came out 6e-8 (a case
    hypothesis found); in units of the bracket's top they are kept, as torch keeps them."""
    row = np.array([[0, 0, 0, 0, 0, 1, 1, 7.06e-22, 2.8e-28], [3.0, 2.0, 1e-30, 0, 0, 0, 0, 0, 1e-35]], np.float32)
    got = np.asarray(sj.sparse_topk_mag(jnp.asarray(row), 3, l=0.3))
    want = softtopk.sparse_topk_mag(torch.tensor(row), 3, l=0.3).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    ("row", "k", "l", "p"),
    [
        # fewer than k nonzero magnitudes and a tiny λ: s_k = 0, whose saturation knot was NaN
        # (σ³ = 1e-45 flushed to 0 in the cubic's q/σ³): every entry came out 0
        ([0, 3.7e20, 0, 9e-4, 3e-11, 9e-26, 0, 0, 0], 5, 1e-30, 4 / 3),
        # magnitudes near float32's largest: XLA divided by c = 1e38 as a product with 1/c, a
        # subnormal flushed to 0, and every entry was kept
        ([3e37, -3.7e37, 1.09e38, 3.6e37, 2.6e37, -9.7e37, 4.1e37, 1.07e38, 8.4e37], 2, 1e-6, 2.0),
    ],
)
def test_float32_magnitude_at_the_ends_of_the_range(row, k, l, p):
    """The float32 magnitude (no x64) where the scaled solve left float32's range: torch's values."""
    x = np.array([row], np.float32)
    got = np.asarray(sj.sparse_topk_mag(jnp.asarray(x), k, l=l, p=p))
    want = softtopk.sparse_topk_mag(torch.tensor(x), k, l=l, p=p).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_float32_magnitude_with_a_scale_above_the_reciprocal_of_tiny():
    """p = 2 magnitude with ``λ θ`` of 1e38: XLA multiplied by ``1/(λ θ)``, a subnormal flushed to 0,
    so the kept entries lost their ``θ u`` (half their value) and the derivative its ``1/(λ θ)``."""
    row = np.array([[5.6e36, -1.42e38, 1.63e38, -6.5e36, -1.17e38, 1.58e37, 4.9e36, -4.6e37, 1.4e37]], np.float32)
    cotangent = np.random.default_rng(0).standard_normal(row.shape).astype(np.float32)
    got, vjp = jax.vjp(lambda x: sj.sparse_topk_mag(x, 1, l=1.0, p=2), jnp.asarray(row))
    leaf = torch.tensor(row, requires_grad=True)
    want = softtopk.sparse_topk_mag(leaf, 1, l=1.0, p=2)
    (want_grad,) = torch.autograd.grad(want, leaf, torch.tensor(cotangent))
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-6, atol=0)
    np.testing.assert_allclose(np.asarray(vjp(jnp.asarray(cotangent))[0]), want_grad.numpy(), rtol=1e-5, atol=1e-6)


def test_per_row_l_and_tau_and_k_agree():
    """Array λ (mask), τ and k (closed form), per row, with their gradients."""
    with jax.enable_x64(True):
        x = _rows(12, 1.0, np.float64)[:6]  # the shape and k of test_infinite_rows_agree: compiled once
        g = np.random.default_rng(4).standard_normal(x.shape)
        lam = np.array([0.05, 0.3, 2.0, 1.0, 0.7, 5.0])
        kk = np.array([1.5, 3.0, 7.25, 12.0, 0.5, 6.0])
        for p in P_VALUES:
            tx, tl = torch.tensor(x, requires_grad=True), torch.tensor(lam, requires_grad=True)
            (softtopk.sparse_topk_mask(tx, 2, l=tl, p=p) * torch.tensor(g)).sum().backward()
            grads = jax.grad(lambda a, b, p=p: (sj.sparse_topk_mask(a, 2, l=b, p=p) * g).sum(), (0, 1))(x, lam)
            np.testing.assert_allclose(np.asarray(grads[0]), tx.grad.numpy(), rtol=0, atol=1e-9)
            np.testing.assert_allclose(np.asarray(grads[1]), tl.grad.numpy(), rtol=0, atol=1e-9)
        tx, tt, tk = (torch.tensor(v, requires_grad=True) for v in (x, lam, kk))
        (softtopk.soft_topk(tx, tk, tau=tt) * torch.tensor(g)).sum().backward()
        grads = jax.grad(lambda a, b, c: (sj.soft_topk(a, c, tau=b) * g).sum(), (0, 1, 2))(x, lam, kk)
        for mine, theirs in zip(grads, (tx.grad, tt.grad, tk.grad), strict=False):
            np.testing.assert_allclose(np.asarray(mine), theirs.numpy(), rtol=0, atol=1e-9)


def _infinite_rows() -> np.ndarray:
    """Rows of 12 for k = 2 (4 candidates): more +inf entries than candidates; +inf between k and the
    candidates; one +inf and two -inf; one entry above -inf; all at -inf but two; finite."""
    inf = np.inf
    rows = np.random.default_rng(7).standard_normal((6, 12))
    rows[0, [0, 2, 3, 5, 7, 11]] = inf
    rows[1, [1, 4, 9]] = inf
    rows[2, 3], rows[2, [0, 8]] = inf, -inf
    rows[3, :] = -inf
    rows[3, 6] = 0.5
    rows[4, 2:] = -inf
    return rows


@pytest.mark.parametrize("k", [2, 5, 6, 10])
@pytest.mark.parametrize("name", ["laplace", "mask"])
def test_infinite_rows_agree(name, k):
    """±inf rows, degenerate or not, for k below, at and above n/2: the same values and gradients."""
    with jax.enable_x64(True):
        _compare(name, _infinite_rows(), np.zeros(6, int), (1.0,), (0.5,), k, 4 / 3, 1e-9)
