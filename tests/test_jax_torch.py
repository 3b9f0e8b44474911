"""One truth across frameworks: :mod:`softtopk.jax` against the torch operators on the same inputs.

Values and vector-Jacobian products (one random cotangent per case) of the sparse mask and
magnitude (both p, exact and Dykstra), the closed-form mask and the hard top-k, on rows with ties,
at scales 1e-6, 1 and 1e6, for k = 1 ... n: to 1e-9 in float64 (``jax_enable_x64``) and 1e-5 in
float32. λ (τ) carries the units of the scores (the magnitude's λ those of ``|x|^{1 - 1/r}``), so
every case has the same conditioning at every scale; float64 also runs a fixed λ = 0.1 at every
scale. Values are compared relative to the scale of the output (1 for masks, the scale for the
magnitude), gradients relative to their largest entry.
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


def _case(name: str, k: int, lam: float, p: float):
    """(torch function, jax function) of the operator ``name``."""
    if name == "mask":
        return (lambda t: softtopk.sparse_topk_mask(t, k, l=lam, p=p), lambda a: sj.sparse_topk_mask(a, k, l=lam, p=p))
    if name == "dykstra":
        return (
            lambda t: softtopk.sparse_topk_mask(t, k, l=lam, p=2, solver="dykstra", n_iter=200),
            lambda a: sj.sparse_topk_mask(a, k, l=lam, p=2, solver="dykstra", n_iter=200),
        )
    if name == "mag":
        return (lambda t: softtopk.sparse_topk_mag(t, k, l=lam, p=p), lambda a: sj.sparse_topk_mag(a, k, l=lam, p=p))
    if name == "laplace":
        return lambda t: softtopk.soft_topk(t, k, tau=lam), lambda a: sj.soft_topk(a, k, tau=lam)
    return lambda t: softtopk.hard_topk_mask(t, k), lambda a: sj.hard_topk_mask(a, k)


def _compare(name: str, x: np.ndarray, k: int, lam: float, p: float, tol: float, scale: float) -> None:
    torch_fn, jax_fn = _case(name, k, lam, p)
    if name in ("mag", "dykstra"):  # no -inf row: masking is the masks' (and Dykstra's iteration has none)
        x = np.delete(x, [3, 7], axis=0)
    if name == "hard":  # torch.topk and lax.top_k may choose differently among ties
        x = x[[0, 3, 4, 7]]
    g = np.random.default_rng(1).standard_normal(x.shape).astype(x.dtype)
    leaf = torch.tensor(x, requires_grad=True)
    out = torch_fn(leaf)
    grad = torch.autograd.grad((out * torch.tensor(g)).sum(), leaf, allow_unused=True)[0]
    grad = np.zeros_like(x) if grad is None else grad.numpy()
    value, vjp = jax.vjp(jax_fn, jnp.asarray(x))
    unit = scale if name == "mag" else 1.0
    where = f"{name} k={k} l={lam:g} p={p:.4g} scale={scale:g} {x.dtype}"
    np.testing.assert_allclose(np.asarray(value) / unit, out.detach().numpy() / unit, rtol=0, atol=tol, err_msg=where)
    jgrad = np.asarray(vjp(jnp.asarray(g))[0])
    gscale = max(1.0, float(np.abs(grad).max()))
    np.testing.assert_allclose(jgrad / gscale, grad / gscale, rtol=0, atol=tol, err_msg=where)


def _lam(name: str, scale: float, p: float, base: float) -> float:
    """λ in the units of the scores: the magnitude's λ scales as ``|x|^{1 - 1/r}`` (dimensionless at p = 2)."""
    if name == "mag":
        return base * scale ** (1.0 - (p - 1.0))
    return base * scale


NAMES = ("mask", "mag", "laplace", "dykstra", "hard")
# (n, k): every k of a short row, and a longer row's first, middle and last k
SIZES = ((1, 1), (6, 1), (6, 2), (6, 3), (6, 5), (6, 6), (17, 1), (17, 8), (17, 16))


def _p_values(name: str) -> tuple[float, ...]:
    return P_VALUES if name in ("mask", "mag") else (2.0,)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", SCALES)
def test_float64_agrees_to_1e_9(name, scale):
    with jax.enable_x64(True):
        for (n, k), p in itertools.product(SIZES, _p_values(name)):
            _compare(name, _rows(n, scale, np.float64), k, _lam(name, scale, p, 1.0), p, 1e-9, scale)
        if name in ("mask", "laplace"):  # the same λ at every scale: from near-hard to near-uniform
            for p in _p_values(name):
                _compare(name, _rows(17, scale, np.float64), 5, 0.1, p, 1e-9, scale)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scale", SCALES)
def test_float32_agrees_to_1e_5(name, scale):
    for k, p in itertools.product((1, 8, 16), _p_values(name)):
        _compare(name, _rows(17, scale, np.float32), k, _lam(name, scale, p, 1.0), p, 1e-5, scale)


def test_per_row_l_and_tau_and_k_agree():
    """Array λ (mask), τ and k (closed form), per row, with their gradients."""
    with jax.enable_x64(True):
        x = _rows(12, 1.0, np.float64)[:4]
        g = np.random.default_rng(4).standard_normal(x.shape)
        lam = np.array([0.05, 0.3, 2.0, 1.0])
        kk = np.array([1.5, 3.0, 7.25, 12.0])
        for p in P_VALUES:
            tx, tl = torch.tensor(x, requires_grad=True), torch.tensor(lam, requires_grad=True)
            (softtopk.sparse_topk_mask(tx, 3, l=tl, p=p) * torch.tensor(g)).sum().backward()
            grads = jax.grad(lambda a, b, p=p: (sj.sparse_topk_mask(a, 3, l=b, p=p) * g).sum(), (0, 1))(x, lam)
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
        _compare(name, _infinite_rows(), k, 0.5, 4 / 3, 1e-9, 1.0)
