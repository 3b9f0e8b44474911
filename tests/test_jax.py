"""softtopk.jax on its own: the float64 oracle, ``check_grads``, jit/vmap/jvp, axes and dtypes, the
invariants (hypothesis), ``±inf`` scores, the exact fallback of the candidate search, extreme
scales, and no torch needed. The agreement with the torch operators is tests/test_jax_torch.py (values
and gradients) and tests/test_jax_mirror.py (values and every error message)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import softtopk.jax as sj  # noqa: E402
import xla_options_probe  # noqa: E402
from pav_reference import pav_mag, pav_mask  # noqa: E402
from softtopk.jax import operators as _operators  # noqa: E402
from softtopk.jax.ops import sparse as _sparse  # noqa: E402

P_VALUES = (2.0, 4.0 / 3.0)
PROPERTY = settings(max_examples=25, deadline=None)
# The operators compile once per shape, dtype and static argument: the tests share a few shapes,
# float32 (2, 9) rows and (2, 3, 12) arrays, float64 (2, 8) rows, so that a new test adds few compiles.
ROWS = (2, 9)
ARRAY = (2, 3, 12)


def _x(shape, seed=0, scale=1.0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * scale)


def test_import_softtopk_does_not_import_jax():
    code = "import sys, softtopk; softtopk.soft_topk; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# a Python where ``import torch`` fails, as in a venv with the jax extra only
NO_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoTorch())
"""


def test_softtopk_jax_needs_no_torch():
    """The JAX quick start runs without torch, loads none, and a torch name says how to install it."""
    code = (
        NO_TORCH
        + """
import jax.numpy as jnp
import softtopk
import softtopk.jax as sj
import softtopk.jax.compat.sparse_soft_topk
print([round(float(v), 3) for v in sj.soft_topk(jnp.array([0.0, 3.0, 1.0, 2.0]), 2, tau=0.1)])
assert "torch" not in sys.modules
try:
    softtopk.soft_topk
except ImportError as error:
    print(error)
"""
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "[0.0, 1.0, 0.003, 0.997]",
        (
            "softtopk.soft_topk is part of softtopk's PyTorch API, which needs torch: "
            "pip install 'softtopk[torch]' (softtopk.jax needs no torch)"
        ),
    ]


# ----------------------------------------------------------------------------------- oracle, grads


@pytest.mark.parametrize("p", P_VALUES)
def test_float64_equals_the_pav_oracle(p):
    with jax.enable_x64(True):
        x = np.array(_x((6, 11), seed=1))
        x[1, 3] = x[1, 7]  # a tie
        for k, lam in ((1, 0.3), (4, 1.0), (10, 0.05), (5, 5.0)):
            np.testing.assert_allclose(
                np.asarray(sj.sparse_topk_mask(jnp.asarray(x), k, l=lam, p=p)),
                pav_mask(x, k, lam, p),
                rtol=0,
                atol=1e-10,
            )
            np.testing.assert_allclose(
                np.asarray(sj.sparse_topk_mag(jnp.asarray(x), k, l=lam, p=p)), pav_mag(x, k, lam, p), rtol=0, atol=1e-10
            )


X64 = [[0.3, -1.2, 2.0, 0.9, 1.4, -0.1, 0.75, 1.1], [1.0, 0.2, -0.4, 2.2, 0.5, 0.6, 1.9, -2.0]]


def _grads_cases():
    yield "mask", lambda x, l: sj.sparse_topk_mask(x, 3, l=l, p=4 / 3), 0.7
    yield "mask p2", lambda x, l: sj.sparse_topk_mask(x, 3, l=l, p=2), 0.7
    yield "mag", lambda x: sj.sparse_topk_mag(x, 3, l=0.5, p=4 / 3), None
    yield "mag p2", lambda x: sj.sparse_topk_mag(x, 3, l=0.7, p=2), None
    yield "laplace", lambda x, t: sj.soft_topk(x, 3, tau=t), 0.8
    yield "laplace k>n/2", lambda x, t: sj.soft_topk(x, 6, tau=t), 0.8
    yield "dykstra", lambda x: sj.sparse_topk_mask(x, 3, l=0.7, p=2, solver="dykstra", n_iter=4000), None
    yield "dykstra mag", lambda x: sj.sparse_topk_mag(x, 3, l=0.7, p=2, solver="dykstra", n_iter=4000), None
    yield "hard", lambda x: sj.hard_topk_mask(x, 3), None
    yield "hard mag", lambda x: sj.hard_topk_mag(x, 3), None


# the soft operators whose jvp is also checked to be the transpose of the vjp
TRANSPOSED = ("mask", "mag", "laplace", "dykstra")


@pytest.mark.parametrize("case", list(_grads_cases()), ids=lambda c: c[0])
def test_check_grads_float64(case):
    """Order 1, forward and reverse mode, in x and in the scale parameter (l, tau); for the soft
    operators also ``<u, J v> = <J^T u, v>`` to 1e-10, and the jvp under vmap equals the batched one
    (on check_grads' arguments: its compiled jvp and vjp serve)."""
    name, fn, scale = case
    with jax.enable_x64(True):
        x = jnp.asarray(X64)
        args = (x,) if scale is None else (x, jnp.asarray([[scale], [scale * 1.3]])[:, 0])
        check_grads(fn, args, order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
        if name not in TRANSPOSED:
            return
        v, u = tuple(_x(a.shape, seed) for a, seed in zip(args, (7, 9), strict=False)), _x((2, 8), 8)
        jv = jax.jvp(fn, args, v)[1]
        jtu = jax.vjp(fn, *args)[1](u)
        assert abs(float((u * jv).sum() - sum((a * b).sum() for a, b in zip(jtu, v, strict=True)))) < 1e-10
        batched = jax.vmap(lambda *ab: jax.jvp(fn, ab[: len(args)], ab[len(args) :])[1])(*args, *v)
        np.testing.assert_allclose(np.asarray(batched), np.asarray(jv), atol=1e-12)


def test_check_grads_per_row_k():
    with jax.enable_x64(True):
        x = _x((3, 7), seed=2)
        check_grads(
            lambda x, k: sj.soft_topk(x, k, tau=0.5),
            (x, jnp.asarray([1.5, 3.0, 6.2])),
            order=1,
            modes=("fwd", "rev"),
            atol=1e-6,
            rtol=1e-6,
        )


def test_hard_has_zero_gradient_and_hard_true_has_the_soft_one():
    x = _x(ROWS, seed=3)
    hard_mask = sj.hard_topk_mask(x, 3)
    assert not np.asarray(
        jax.grad(lambda v: (sj.hard_topk_mask(v, 3) * v).sum())(x) - jnp.where(hard_mask > 0, 1.0, 0.0)
    ).any()
    g = _x(ROWS, seed=4)
    for fn in (lambda v, **kw: sj.soft_topk(v, 3, tau=0.5, **kw), lambda v, **kw: sj.sparse_topk_mask(v, 3, **kw)):
        # the value and the gradient of (fn(v, hard=True) * g).sum() from one vjp (one compile)
        hard, hard_vjp = jax.vjp(lambda v, fn=fn: fn(v, hard=True), x)
        assert np.array_equal(np.asarray(hard), np.asarray(hard_mask))
        soft_vjp = jax.vjp(fn, x)[1]
        np.testing.assert_allclose(np.asarray(hard_vjp(g)[0]), np.asarray(soft_vjp(g)[0]), atol=1e-6)


# ------------------------------------------------------------------------- transforms, axes, dtypes

FUNCTIONS = {
    "mask": lambda v, **kw: sj.sparse_topk_mask(v, 3, l=0.5, **kw),
    "mag": lambda v, **kw: sj.sparse_topk_mag(v, 3, l=0.5, **kw),
    "laplace": lambda v, **kw: sj.soft_topk(v, 3, tau=0.5, **kw),
    "dykstra": lambda v, **kw: sj.sparse_topk_mask(v, 3, l=0.5, p=2, solver="dykstra", **kw),
    "hard": lambda v, **kw: sj.hard_topk_mask(v, 3, **kw),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_jit_vmap_and_any_axis(name):
    fn = FUNCTIONS[name]
    x = _x(ARRAY, seed=5)
    eager = fn(x)
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(x)), np.asarray(eager), atol=1e-6)
    np.testing.assert_allclose(np.asarray(jax.vmap(fn)(x)), np.asarray(eager), atol=1e-6)
    moved = fn(jnp.moveaxis(x, -1, 0), axis=0)
    np.testing.assert_allclose(np.asarray(jnp.moveaxis(moved, 0, -1)), np.asarray(eager), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_dtypes(name, dtype):
    """Shape and dtype kept; half types computed in float32 and rounded once."""
    x = _x(ARRAY, seed=9).astype(dtype)
    out = FUNCTIONS[name](x)
    assert out.shape == x.shape and out.dtype == dtype
    ref = FUNCTIONS[name](x.astype(jnp.float32)).astype(dtype)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=1e-6)


def test_largest_false_is_the_mask_of_minus_x():
    x = _x(ROWS, seed=10)
    for name in ("mask", "laplace", "hard"):
        np.testing.assert_allclose(np.asarray(FUNCTIONS[name](x, largest=False)), np.asarray(FUNCTIONS[name](-x)))


# ----------------------------------------------------------------------------------- invariants


@PROPERTY
@given(
    st.lists(st.floats(-50, 50, width=32), min_size=9, max_size=9),
    st.sampled_from([1e-2, 0.3, 3.0]),
    st.sampled_from(P_VALUES),
)
def test_sparse_mask_invariants(values, lam, p):
    """In [0, 1], sums to k, exact zeros below the threshold, permutation equivariant (the second
    row is the first one permuted)."""
    order = np.random.default_rng(int(abs(values[0]) * 100)).permutation(9)
    x = jnp.asarray([values, np.asarray(values)[order]], jnp.float32)
    mask = np.asarray(sj.sparse_topk_mask(x, 3, l=lam, p=p))
    assert mask.min() >= 0 and mask.max() <= 1 and (abs(mask.sum(-1) - 3) < 1e-4).all()
    np.testing.assert_allclose(mask[1], mask[0, order], atol=1e-5)
    assert (mask[np.asarray(x) < np.sort(np.asarray(x))[:, -3:-2] - lam] == 0).all()


def test_float32_mask_at_a_saturation_knot():
    """Found by hypothesis: the top entries saturate exactly where the zeros start (3 - λ = 0), and
    the sum there exceeds k by 7e-6, inside the float32 search's slack; the threshold is the
    solved one (the zeros at 1.13e-6, as in float64), not the flat one (they were 0, the sum 2.969)."""
    x = jnp.asarray([[0.0] * 6 + [3.0, 3.0, 2.96875]] * 2, jnp.float32)  # the shape of ROWS
    mask = np.asarray(sj.sparse_topk_mask(x, 3, l=3.0))
    assert (abs(mask.sum(-1) - 3) < 1e-5).all()
    np.testing.assert_allclose(mask[:, :6], 1.1295e-6, rtol=1e-2)


@PROPERTY
@given(st.lists(st.floats(-50, 50, width=32), min_size=9, max_size=9), st.sampled_from([1e-2, 0.3, 3.0]))
def test_laplace_and_magnitude_invariants(values, tau):
    x = jnp.asarray([values, values[::-1]], jnp.float32)
    mask = np.asarray(sj.soft_topk(x, 3, tau=tau))
    assert mask.min() >= 0 and mask.max() <= 1 and (abs(mask.sum(-1) - 3) < 1e-4).all()
    mag = np.asarray(sj.sparse_topk_mag(x, 3, l=tau))
    assert (np.abs(mag) <= np.abs(np.asarray(x)) + 1e-5).all() and (np.sign(mag) * np.sign(x) >= 0).all()
    assert ((mag != 0).sum(-1) >= np.minimum(3, (np.asarray(x) != 0).sum(-1))).all()


# ----------------------------------------------------------------------------- ±inf, fallback, scales


@pytest.mark.parametrize("name", ["mask", "laplace", "dykstra"])
def test_infinite_scores(name):
    """-inf never selected while more than k entries lie above it (mask and gradient 0); +inf always;
    a row with at most k entries above -inf selects them all and shares the rest of k."""
    fn = FUNCTIONS[name]
    x = jnp.asarray(
        [
            [0.3, -jnp.inf, 1.2, 0.5, -jnp.inf, 0.9],
            [jnp.inf, 0.1, -0.2, 0.4, 0.0, -1.0],
            [1.0, -jnp.inf, -jnp.inf, 2.0, -jnp.inf, -jnp.inf],
            [jnp.inf, jnp.inf, jnp.inf, jnp.inf, 0.0, 1.0],
        ]
    )
    out, vjp = jax.vjp(fn, x)  # the mask and the gradient of (fn(v) * arange(6)).sum(): one compile
    mask = np.asarray(out)
    assert mask[0, 1] == 0 and mask[0, 4] == 0 and abs(mask[0].sum() - 3) < 1e-5
    assert mask[1, 0] == 1 and abs(mask[1].sum() - 3) < 1e-5
    np.testing.assert_allclose(mask[2], [1, 0.25, 0.25, 1, 0.25, 0.25], atol=1e-6)
    np.testing.assert_allclose(mask[3], [0.75, 0.75, 0.75, 0.75, 0, 0], atol=1e-6)
    grad = np.asarray(vjp(jnp.broadcast_to(jnp.arange(6.0), x.shape))[0])
    assert np.isfinite(grad).all() and grad[0, 1] == 0 and grad[1, 0] == 0 and not grad[2:].any()


def test_candidate_fallback_equals_the_full_sort():
    """5000 entries tied at the k-th value with l = 1: the 2k + 8 candidates are not enough; the
    lax.cond fallback gives the threshold of the fully sorted row."""
    with jax.enable_x64(True):
        x = np.array(_x((2, 20000), seed=11))
        kth = np.sort(x, -1)[:, -100:-99]
        rng = np.random.default_rng(12)
        for row in range(2):
            x[row, rng.permutation(20000)[:5000]] = kth[row]
        size = _sparse.candidates(20000, 100)
        for magnitude in (False, True):
            scores = jnp.abs(jnp.asarray(x)) if magnitude else jnp.asarray(x)
            lam = jnp.ones((2, 1))
            # compiled (op by op, each call would compile the lax.cond's branches anew)
            found = jax.jit(lambda s, l, m=magnitude: _sparse.threshold(s, 100, l, 3, m, size))(scores, lam)
            full = jax.jit(lambda s, l, m=magnitude: _sparse._solve(-jnp.sort(-s, -1), 100, l, 3, m))(scores, lam)
            for a, b in zip(jax.tree.leaves(found), jax.tree.leaves(full), strict=False):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)
        mask = sj.sparse_topk_mask(jnp.asarray(x), 100, l=1.0)
        np.testing.assert_allclose(np.asarray(mask.sum(-1)), [100.0, 100.0], atol=1e-8)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_extreme_scales_and_temperatures_are_finite(dtype):
    """Scores at scales 1e-6, 1 and 1e6 (with a tie) under temperatures 1e-6, 1 and 1e6: finite
    values and gradients, rows summing to k. Each (scale, temperature) pair is a block of 3 rows of
    one call, with λ (τ) per row; the magnitude, whose λ is a float, one call per temperature."""
    temperatures = (1e-6, 1.0, 1e6)
    with jax.enable_x64(dtype == jnp.float64):
        blocks = [_x((3, 12), seed=13, scale=scale).astype(dtype) for scale in (1e-6, 1.0, 1e6)]
        x = jnp.concatenate([b.at[1, 4].set(b[1, 7]) for b in blocks])  # (9, 12): 3 scales
        g = jnp.tile(_x((3, 12), seed=14).astype(dtype), (3, 1))
        every = jnp.tile(x, (3, 1))  # (27, 12): 3 temperatures x 3 scales
        per_row = jnp.repeat(jnp.asarray(temperatures, dtype), 9)
        cases = [
            ("mask", lambda v: sj.sparse_topk_mask(v, 4, l=per_row), every),
            ("mask p2", lambda v: sj.sparse_topk_mask(v, 4, l=per_row, p=2), every),
            ("laplace", lambda v: sj.soft_topk(v, 4, tau=per_row), every),
        ] + [(f"mag l={t:g}", lambda v, t=t: sj.sparse_topk_mag(v, 4, l=t), x) for t in temperatures]
        for name, fn, scores in cases:
            out, vjp = jax.vjp(fn, scores)
            upstream = jnp.tile(g, (len(scores) // len(g), 1))
            assert np.isfinite(np.asarray(out)).all() and np.isfinite(np.asarray(vjp(upstream)[0])).all(), name
            if not name.startswith("mag"):
                np.testing.assert_allclose(np.asarray(out.sum(-1), np.float64), 4, atol=1e-3, err_msg=name)


def test_ties_with_a_tiny_l_share_exactly():
    """Two tied maxima, l far below their spacing to the rest: each gets 1/2 (not 0: t is kept as
    (s_k, (t - s_k)/l), which does not round to s_k)."""
    for scale in (1.0, 1e6):
        x = jnp.asarray([[1.0, 1.0, 0.0, 0.5]]) * scale
        for p in P_VALUES:
            np.testing.assert_array_equal(np.asarray(sj.sparse_topk_mask(x, 1, l=1e-30, p=p)), [[0.5, 0.5, 0, 0]])


# ------------------------------------------------------------------------ traced arguments, empty batch


def test_traced_l_and_tau_are_not_inspected_and_need_no_recompile():
    x = _x(ROWS, seed=15)
    traces = []

    def both(v, value):
        traces.append(1)  # runs once per trace
        return sj.sparse_topk_mask(v, 3, l=value), sj.soft_topk(v, 3, tau=value)

    f = jax.jit(both)
    for value in (0.1, 0.5, 2.0):
        mask, soft = f(x, value)
        np.testing.assert_allclose(np.asarray(mask), np.asarray(sj.sparse_topk_mask(x, 3, l=value)), atol=1e-6)
        np.testing.assert_allclose(np.asarray(soft), np.asarray(sj.soft_topk(x, 3, tau=value)), atol=1e-6)
    assert len(traces) == 1


def test_arrays_closed_over_under_jit_are_checked_as_concrete():
    """A concrete ``tau`` or ``k`` array captured by a jitted function is read on the host, as in an
    eager call (its check is not staged into the trace)."""
    x, tau, k = _x((2, 4), seed=16), jnp.asarray([0.5, 2.0]), jnp.asarray([1.5, 3.0])
    np.testing.assert_allclose(np.asarray(jax.jit(lambda v: sj.soft_topk(v, k, tau=tau))(x).sum(-1)), k, atol=1e-5)
    for bad in ({"k": k, "tau": -tau}, {"k": k + 2, "tau": tau}):
        with pytest.raises(ValueError) as eager:
            sj.soft_topk(x, bad["k"], tau=bad["tau"])
        with pytest.raises(ValueError, match=re.escape(str(eager.value))):
            jax.jit(lambda v, bad=bad: sj.soft_topk(v, bad["k"], tau=bad["tau"]))(x)


@pytest.mark.parametrize("solver", ["pav", "dykstra"])
def test_a_new_l_or_k_compiles_nothing(solver):
    """λ (the magnitude's: a float checked on the host) and k are traced: on rows of 9, where every
    k solves on all 9 entries, one compile serves every λ and k."""
    x = _x(ROWS, seed=15)
    pairs = ((sj.sparse_topk_mag, _operators._sparse_topk_mag), (sj.sparse_topk_mask, _operators._soft_topk))
    for fn, compiled in pairs:
        sizes = set()
        for lam, k in ((0.1, 3), (0.5, 1), (2.0, 8)):
            fn(x, k, l=lam, p=2, solver=solver)
            sizes.add(compiled._cache_size())
        assert len(sizes) == 1, fn.__name__


@pytest.mark.parametrize("fn", ["sparse_topk_mask", "sparse_topk_mag"])
def test_dykstra_on_an_empty_batch(fn):
    x = jnp.ones((0, 5))
    op = getattr(sj, fn)
    assert op(x, 2, p=2, solver="dykstra").shape == (0, 5)
    assert jax.grad(lambda v: op(v, 2, p=2, solver="dykstra").sum())(x).shape == (0, 5)


# ------------------------------------------------------------------------------ compiler options


def test_the_test_compiler_options_agree_with_the_defaults(tmp_path):
    """The compiler options this suite runs XLA with (tests/conftest.py) give the values and
    gradients of XLA's defaults, to a few roundings (tests/xla_options_probe.py's cases): 1e-12 of
    the scale in float64, 1e-5 in float32."""
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    probe = Path(__file__).with_name("xla_options_probe.py")
    default = subprocess.Popen([sys.executable, str(probe), str(tmp_path / "default.npz")], env=env)
    ours = xla_options_probe.values()  # while the other process compiles its own
    assert default.wait(timeout=600) == 0
    theirs = np.load(tmp_path / "default.npz")
    assert set(ours) == set(theirs.files)
    for name, value in ours.items():
        tol = 1e-12 if "float64" in name else 1e-5
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(value, theirs[name], rtol=0, atol=tol * scale, err_msg=name)
