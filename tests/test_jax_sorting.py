"""softtopk.jax.soft_rank and soft_sort: values and gradients (in x and a per-row strength) against
the torch functions in float64 (1e-9) on rows with ties and ±inf, both regularisations and both
directions; the JAX PAV against the NumPy oracle; NaN rows; jit, vmap, grad and jvp (the transpose
of the vjp); any axis; float32/bfloat16. Few shapes, each compiled once (the JAX tests' time
budget); the error messages are tests/test_jax_mirror.py's table."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

import permutahedron_reference as R  # noqa: E402
import softtopk  # noqa: E402
import softtopk.jax as sj  # noqa: E402
from softtopk.jax.ops import isotonic  # noqa: E402
from softtopk.jax.ops.isotonic import isotonic_kl, isotonic_l2  # noqa: E402

INF = np.inf
NAMES = ("soft_rank", "soft_sort")
# (function, regularization, descending, axis): each function, regularisation and direction at least once
CASES = [
    ("soft_rank", "l2", False, -1),
    ("soft_rank", "kl", True, -1),
    ("soft_sort", "l2", True, 0),
    ("soft_sort", "kl", False, -1),
]


def _rows() -> np.ndarray:
    """Six rows of 7 (padded to 8 by the solver): random; a tie; integers (many ties); +inf and
    -inf; -inf padding; large."""
    x = np.random.default_rng(0).standard_normal((6, 7)) * 2
    x[1, 2] = x[1, 6]
    x[2] = np.round(x[2])
    x[3, [1, 4]], x[3, 6] = INF, -INF
    x[4, 4:] = -INF
    x[5] *= 50
    return x


X = _rows()
EPS = np.array([0.05, 0.3, 1.0, 2.0, 0.7, 10.0])
G = np.random.default_rng(1).standard_normal(X.shape)


def _torch(name, reg, descending, x, eps):
    tx, te = torch.tensor(x, requires_grad=True), torch.tensor(eps, requires_grad=True)
    out = getattr(softtopk, name)(tx, regularization=reg, strength=te, descending=descending)
    (out * torch.tensor(G)).sum().backward()
    return out.detach().numpy(), tx.grad.numpy(), te.grad.numpy()


@pytest.mark.parametrize("name, reg, descending, axis", CASES)
def test_float64_values_and_gradients_agree_with_torch(name, reg, descending, axis):
    """Values and vjps to 1e-9 (x's rows along ``axis``: axis 0 of the transpose), and the jvp is
    the transpose of the vjp: ``<G, J t> = <J^T G, t>``."""
    want, want_x, want_eps = _torch(name, reg, descending, X, EPS)
    flip = (lambda a: a.T) if axis == 0 else (lambda a: a)
    tx, te = np.random.default_rng(2).standard_normal(X.shape), np.random.default_rng(3).standard_normal(6)

    def fn(a, e):
        return flip(getattr(sj, name)(flip(a), regularization=reg, strength=e, descending=descending, axis=axis))

    @jax.jit  # one program for the values (also with a float strength), the vjp and the jvp
    def derivatives(a, e, g, ta, te):
        out, vjp = jax.vjp(fn, a, e)
        return (out, *vjp(g), jax.jvp(fn, (a, e), (ta, te))[1], fn(a, 0.5))

    with jax.enable_x64(True):
        out, grad_x, grad_eps, tangent, at_half = derivatives(*(jnp.asarray(v) for v in (X, EPS, G, tx, te)))
        assert out.dtype == jnp.float64
    half = getattr(softtopk, name)(torch.tensor(X), regularization=reg, strength=0.5, descending=descending)
    np.testing.assert_allclose(np.asarray(at_half), half.numpy(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.asarray(out), want, rtol=0, atol=1e-9)  # ±inf where torch has them
    np.testing.assert_allclose(np.asarray(grad_x), want_x, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.asarray(grad_eps), want_eps, rtol=0, atol=1e-9)
    dual = float(np.sum(np.asarray(grad_x) * tx) + np.sum(np.asarray(grad_eps) * te))
    np.testing.assert_allclose(float(np.sum(np.asarray(tangent) * G)), dual, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("short", [isotonic.SHORT, 0], ids=["pairs", "searchsorted"])
def test_pav_is_exact(short, monkeypatch):
    """Rows of 7 (padded to 8): a trend with noise, ties, a cascade through every block, one
    block, soft-rank rows; the counts across the junction from all pairs or from searches."""
    monkeypatch.setattr(isotonic, "SHORT", short)
    g = np.random.default_rng(0)
    y = np.stack(
        [
            g.normal(size=7) * 3 + np.arange(7) * 0.3,
            np.round(g.normal(size=7) * 2),
            np.concatenate([-1.5 * np.arange(6.0), [1e3]]),
            np.arange(7.0),
            np.sort(g.normal(size=7))[::-1] / 0.05 - np.arange(7, 0, -1),
        ]
    )
    lw = g.normal(size=y.shape)
    with jax.enable_x64(True):
        solve = jax.jit(lambda a, b: (isotonic_l2(a), isotonic_kl(a, b)))  # traced anew: SHORT is read
        l2, kl = (np.asarray(v) for v in solve(jnp.asarray(y), jnp.asarray(lw)))
    for i in range(len(y)):
        np.testing.assert_allclose(l2[i], R.isotonic_l2_minmax(y[i]), rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(kl[i], R.isotonic_kl(y[i], lw[i]), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("x64", [True, False])
def test_kl_merges_take_no_overflowing_exponential(x64):
    """A merge weighs the part of a block above a threshold by ``log(e^g - 1)``, which overflowed
    for gaps ``g`` above 88 (float32) or 709 (float64) and pooled every point."""
    y = np.arange(5.0, 0.0, -1.0) / 0.7
    lw = np.array([283.0, 282.0, 0.0, 0.0, -433.0]) if x64 else np.array([48.0, 47.0, 0.0, 0.0, -48.0])
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        got = np.asarray(jax.jit(isotonic_kl)(jnp.asarray(y[None], dtype), jnp.asarray(lw[None], dtype)))[0]
    np.testing.assert_allclose(got, R.isotonic_kl(y, lw), rtol=1e-12 if x64 else 1e-5, atol=1e-10 if x64 else 1e-4)


@jax.jit
def _transformed(x, eps):
    """``grad`` of the ranks (in x and the strength) and ``vmap`` of the kl sort, in one program."""
    grads = jax.grad(lambda a, e: (sj.soft_rank(a, strength=e) * jnp.arange(7.0)).sum(), (0, 1))(x, eps)
    return *grads, jax.vmap(lambda row: sj.soft_sort(row, regularization="kl", descending=True))(x)


def test_jit_vmap_grad_and_nan_rows_in_float32():
    """``jit`` of ``grad`` and ``vmap`` against torch in float32; a row holding a NaN is NaN (values
    and gradients) and leaves the others alone."""
    x = X[:3].copy()
    x[1, 2] = np.nan
    eps = EPS[:3]
    grad_x, grad_eps, mapped = (
        np.asarray(v) for v in _transformed(jnp.asarray(x, jnp.float32), jnp.asarray(eps, jnp.float32))
    )
    tx, te = torch.tensor(x, dtype=torch.float32, requires_grad=True), torch.tensor(eps, requires_grad=True)
    (softtopk.soft_rank(tx, strength=te) * torch.arange(7.0)).sum().backward()
    np.testing.assert_allclose(grad_x, tx.grad.numpy(), rtol=1e-5, atol=1e-5)  # NaN in row 1 on both sides
    np.testing.assert_allclose(grad_eps, te.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert np.isnan(grad_x[1]).all() and np.isfinite(grad_x[[0, 2]]).all()
    want = softtopk.soft_sort(torch.tensor(x, dtype=torch.float32), regularization="kl", descending=True)
    np.testing.assert_allclose(mapped, want.numpy(), rtol=1e-5, atol=1e-5)
    assert np.isnan(mapped[1]).all()
    assert sj.soft_sort(jnp.zeros((3, 0))).shape == (3, 0) and sj.soft_rank(jnp.zeros((0, 3))).shape == (0, 3)


@jax.jit
def _both_kl(x):
    return sj.soft_rank(x, regularization="kl"), sj.soft_sort(x, regularization="kl")


def test_bfloat16_is_computed_in_float32():
    x = X[:3]
    for name, got in zip(NAMES, _both_kl(jnp.asarray(x, jnp.bfloat16)), strict=True):
        want = getattr(softtopk, name)(torch.tensor(x, dtype=torch.bfloat16), regularization="kl")
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(
            np.asarray(got, np.float64), want.double().numpy(), rtol=1e-2, atol=1e-2 * float(want.abs().max())
        )


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_ranks_where_x_over_strength_is_beyond_float64(reg):
    """``|x/ε|`` past float64's largest (NaN) or far above ``2^53`` (ties got distinct ranks): the
    exact ranks, as torch's (tests/test_soft_sort_extremes.py). One shape, the strength per row."""
    x = np.array([[1e300, -1e300, 0.0, 5.0], [3e37, 3e37, 3e37, 3e37], [2.0, 1.0, 1.0, 0.0]])
    want = np.array([[4.0, 1.0, 2.0, 3.0], [2.5, 2.5, 2.5, 2.5], [4.0, 2.5, 2.5, 1.0]])
    with jax.enable_x64(True):
        got = sj.soft_rank(jnp.asarray(x), regularization=reg, strength=jnp.asarray([1e-10, 1.0, 1e-16]))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
