"""Perturbed top-k mask and noised k-th largest value (:mod:`softtopk.ops.perturbed`).

Monte-Carlo checks are probabilistic statements evaluated with a fixed seed (so deterministic);
their tolerances are a few standard errors, derived from a bound on each estimator's variance.
"""

from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softtopk.ops import perturbed as P
from softtopk.ops import triton_gate
from softtopk.stochastic import noised_kth_value, perturbed_topk

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FEW = settings(max_examples=20, deadline=None)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _match(*parts: str) -> str:
    return ".*".join(re.escape(part) for part in parts)


@st.composite
def _problems(draw, max_dims: int = 3):
    """(x float64 of a random shape without ties, k, dim)."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=max_dims))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    k = draw(st.integers(1, shape[dim]))
    x = torch.randn(shape, generator=_gen(draw(st.integers(0, 2**16))), dtype=torch.float64)
    return x, k, dim


# ---------------------------------------------------------------------------- noised_kth_value


@FEW
@given(_problems(), st.integers(1, 4), st.sampled_from([0.0, 0.3, 2.0]))
def test_noised_kth_value_gradcheck(problem, samples, epsilon):
    x, k, dim = problem
    noise = torch.randn(*x.shape, samples, generator=_gen(1), dtype=torch.float64)
    inputs = (x.requires_grad_(), noise.requires_grad_())
    assert torch.autograd.gradcheck(lambda x, z: noised_kth_value(x, k, epsilon=epsilon, noise=z, dim=dim), inputs)


@FEW
@given(_problems())
def test_noised_kth_value_epsilon_zero_is_kth_largest(problem):
    x, k, dim = problem
    x.requires_grad_()
    out = noised_kth_value(x, k, epsilon=0.0, dim=dim, generator=_gen(0))
    values, index = x.detach().topk(k, dim=dim)
    assert out.shape == values.select(dim, 0).shape
    assert torch.equal(out.detach(), values.select(dim, k - 1))
    out.sum().backward()  # one-hot subgradient at the k-th largest position
    onehot = torch.zeros_like(x).scatter(dim, index.narrow(dim, k - 1, 1), 1.0)
    assert torch.equal(x.grad, onehot)


def test_noised_kth_value_shape_and_dim():
    x = torch.randn(3, 5, 7, generator=_gen(0))
    out = noised_kth_value(x, 2, epsilon=0.0, dim=1)
    assert out.shape == (3, 7)
    assert torch.equal(out, x.topk(2, dim=1).values[:, 1])
    assert noised_kth_value(x, 4, n_samples=3, dim=-1, generator=_gen(0)).shape == (3, 5)


@pytest.mark.parametrize("dim", [-1, 0, 1, -2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_noised_kth_value_noise_layout_matches_global_rng_draw(dim, dtype):
    """Z = randn(x.shape + (S,)) float32 from the global RNG, samples last: the same values
    (bitwise) as the k-th largest of x.unsqueeze(-1) + eps * Z taken with kthvalue (pytopk's recipe).
    The torch path's draw (on CPU rows with numba the call draws in a kernel: test_noised_draws.py)."""
    x = torch.randn(3, 5, 4, generator=_gen(2)).to(dtype).requires_grad_()
    torch.manual_seed(7)
    with triton_gate.torch_path():
        out = noised_kth_value(x, 2, epsilon=0.7, n_samples=6, dim=dim)
    torch.manual_seed(7)
    z = torch.randn(*x.shape, 6)
    noised = x.detach().unsqueeze(-1) + 0.7 * z
    axis = dim if dim >= 0 else dim - 1
    values, index = torch.kthvalue(-noised, k=2, dim=axis)
    assert out.dtype == dtype and torch.equal(out, (-values).mean(-1).to(dtype))
    out.backward(torch.ones_like(out))
    # (pytopk's one-hots are float32 even for float64 x; here they are in the compute dtype)
    hits = torch.zeros_like(noised).scatter_(axis, index.unsqueeze(axis), 1.0).mean(-1)
    assert x.grad.dtype == dtype and torch.equal(x.grad, hits.to(dtype))


def test_noised_kth_value_given_noise():
    x = torch.randn(4, 6, generator=_gen(0))
    noise = torch.randn(4, 6, 7, generator=_gen(1))
    expected = (x.unsqueeze(-1) + 0.5 * noise).topk(3, dim=1).values[:, 2].mean(-1)
    for n_samples in (None, 7):  # default: S from the noise; an explicit n_samples must agree
        out = noised_kth_value(x, 3, epsilon=0.5, n_samples=n_samples, noise=noise, generator=_gen(5))
        torch.testing.assert_close(out, expected)
    assert torch.equal(noised_kth_value(x, 3, noise=noise, generator=_gen(1)), noised_kth_value(x, 3, noise=noise))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_noised_kth_value_half_computed_in_float32(dtype):
    x = torch.randn(5, 9, generator=_gen(0)).to(dtype).requires_grad_()
    noise = torch.randn(5, 9, 4, generator=_gen(1))
    out = noised_kth_value(x, 3, noise=noise)
    reference = noised_kth_value(x.detach().float(), 3, noise=noise)
    assert out.dtype == dtype and torch.equal(out, reference.to(dtype))
    out.sum().backward()
    assert x.grad.dtype == dtype


def test_noised_kth_value_seeded():
    x = torch.randn(6, 10, generator=_gen(0))
    a, b = (noised_kth_value(x, 2, n_samples=8, generator=_gen(3)) for _ in range(2))
    assert torch.equal(a, b) and not torch.equal(a, noised_kth_value(x, 2, n_samples=8, generator=_gen(4)))


# ------------------------------------------------------------------------------ perturbed_topk


@FEW
@given(_problems(), st.sampled_from(FLOATS), st.integers(1, 40), st.sampled_from(P.NOISE_KINDS))
def test_perturbed_topk_is_an_average_of_masks(problem, dtype, samples, noise):
    x, k, dim = problem
    x = x.to(dtype).requires_grad_()
    y = perturbed_topk(x, k, n_samples=samples, noise=noise, dim=dim, generator=_gen(0))
    assert y.shape == x.shape and y.dtype == dtype
    y64 = y.detach().double()
    assert y64.min() >= 0 and y64.max() <= 1
    ulp = torch.finfo(dtype).eps  # count / S is rounded once in the output dtype
    counts = y64 * samples
    assert (counts - counts.round()).abs().max() <= samples * ulp
    torch.testing.assert_close(y64.sum(dim), torch.full_like(y64.sum(dim), k), rtol=0, atol=x.shape[dim] * ulp)
    y.backward(torch.ones_like(y))
    assert x.grad.dtype == dtype and torch.isfinite(x.grad.double()).all()


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_perturbed_topk_any_dim_is_the_last_dim_moved(dim):
    x = torch.randn(3, 4, 5, generator=_gen(0))
    y = perturbed_topk(x, 2, n_samples=10, dim=dim, generator=_gen(1))
    last = perturbed_topk(x.movedim(dim, -1), 2, n_samples=10, generator=_gen(1)).movedim(-1, dim)
    assert torch.equal(y, last)


@pytest.mark.parametrize("noise", P.NOISE_KINDS)
def test_perturbed_topk_seeded_generator(noise):
    x = torch.randn(8, 12, generator=_gen(0))
    w = torch.randn(8, 12, generator=_gen(1))

    def run(seed):
        leaf = x.clone().requires_grad_()
        y = perturbed_topk(leaf, 3, sigma=0.5, n_samples=30, noise=noise, generator=_gen(seed))
        (y * w).sum().backward()
        return y.detach(), leaf.grad

    (y1, g1), (y2, g2), (y3, g3) = run(5), run(5), run(6)
    assert torch.equal(y1, y2) and torch.equal(g1, g2)
    assert not torch.equal(y1, y3) and not torch.equal(g1, g3)


def test_perturbed_topk_global_rng():
    x = torch.randn(4, 9, generator=_gen(0))
    torch.manual_seed(11)
    a = perturbed_topk(x, 2, n_samples=10)
    torch.manual_seed(11)
    assert torch.equal(a, perturbed_topk(x, 2, n_samples=10))


@pytest.mark.parametrize("noise", P.NOISE_KINDS)
@pytest.mark.parametrize("dim", [0, -1])
def test_perturbed_topk_small_sigma_is_hard_topk(noise, dim):
    order = torch.stack([torch.randperm(9, generator=_gen(s)) for s in range(6)]).double()  # gaps of 1
    x = order.T.contiguous() if dim == 0 else order
    y = perturbed_topk(x, 4, sigma=1e-6, n_samples=20, noise=noise, dim=dim, generator=_gen(0))
    hard = torch.zeros_like(x).scatter(dim, x.topk(4, dim=dim).indices, 1.0)
    assert torch.equal(y, hard)


@pytest.mark.parametrize("noise", P.NOISE_KINDS)
def test_perturbed_topk_huge_sigma_is_uniform(noise):
    """Probabilistic (fixed seed): with sigma >> the spread of x every item is picked with
    probability k/n; each y_i = Binomial(S, k/n) / S, so |y_i - k/n| <= 5 binomial std devs."""
    rows, n, k, samples = 8, 10, 3, 2000
    x = torch.randn(rows, n, generator=_gen(0))
    y = perturbed_topk(x, k, sigma=1e6, n_samples=samples, noise=noise, generator=_gen(1))
    p = k / n
    assert (y - p).abs().max() <= 5 * math.sqrt(p * (1 - p) / samples)


def test_perturbed_topk_gaussian_gradient_matches_closed_form():
    """n = 2, k = 1: E[y_1] = Phi(d) and dE[y_1]/dx_1 = phi(d) / (sigma sqrt 2) = -dE[y_1]/dx_2, with
    d = (x_1 - x_2) / (sigma sqrt 2). Each sample of the estimate of dE[y_1]/dx is y_1 Z / sigma,
    of std <= 1 / sigma: tolerance 4 / (sigma sqrt S) (probabilistic, fixed seed)."""
    sigma, samples = 0.7, 200_000
    x = torch.tensor([[0.3, -0.2]], dtype=torch.float64, requires_grad=True)
    y = perturbed_topk(x, 1, sigma=sigma, n_samples=samples, generator=_gen(0))
    scale = sigma * math.sqrt(2)
    d = (0.3 + 0.2) / scale
    mean = 0.5 * (1 + math.erf(d / math.sqrt(2)))
    assert abs(y[0, 0].item() - mean) <= 4 * math.sqrt(mean * (1 - mean) / samples)
    y[0, 0].backward()
    slope = math.exp(-d * d / 2) / math.sqrt(2 * math.pi) / scale
    expected = torch.tensor([[slope, -slope]], dtype=torch.float64)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=4 / (sigma * math.sqrt(samples)))


def test_perturbed_topk_gumbel_k1_matches_softmax_jacobian():
    """k = 1, Gumbel noise: E[y] = softmax(x / sigma), Jacobian J = (diag(p) - p p^T) / sigma.
    Each sample of the estimate of J^T v is <v, y_s> (1 - e^{-Z_s}) / sigma, with
    1 - e^{-Z} = 1 - Exp(1) of variance 1: std <= max|v| / sigma; tolerance 4 standard errors."""
    sigma, samples = 0.8, 200_000
    x = torch.tensor([[0.5, -0.3, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    v = torch.tensor([[1.0, -0.5, 0.25, 2.0]], dtype=torch.float64)
    y = perturbed_topk(x, 1, sigma=sigma, n_samples=samples, noise="gumbel", generator=_gen(0))
    p = torch.softmax(x.detach() / sigma, dim=-1)
    torch.testing.assert_close(y.detach(), p, rtol=0, atol=4 * math.sqrt(0.25 / samples))
    (y * v).sum().backward()
    jacobian = (torch.diag(p[0]) - p[0, :, None] * p[0, None, :]) / sigma
    bound = 4 * v.abs().max().item() / (sigma * math.sqrt(samples))
    torch.testing.assert_close(x.grad, v @ jacobian, rtol=0, atol=bound)


def test_perturbed_topk_rows_and_gumbel_draw_of_zero_stay_finite(monkeypatch):
    """The row-level entry point, and a uniform draw of exactly 0 (clamped: finite Gumbel noise)."""
    monkeypatch.setattr(torch, "rand", lambda shape, **kw: torch.zeros(shape, dtype=kw["dtype"]))
    rows = torch.randn(3, 5, generator=_gen(0), requires_grad=True)
    y = P.perturbed_topk_rows(rows, 2, sigma=1.0, n_samples=4, noise="gumbel", generator=None)
    assert y.shape == (3, 5)
    y.backward(torch.ones_like(y))
    assert torch.isfinite(rows.grad).all()


@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("n,k", [(1, 1), (6, 1), (6, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_at_extreme_scales(scale, n, k, dtype):
    x = (torch.randn(4, n, generator=_gen(0), dtype=dtype) * scale).requires_grad_()
    for sigma in (1e-3, 1.0, 1e3):
        for noise in P.NOISE_KINDS:
            y = perturbed_topk(x, k, sigma=sigma, n_samples=16, noise=noise, generator=_gen(1))
            (grad,) = torch.autograd.grad((y * torch.arange(n, dtype=dtype)).sum(), x)
            assert torch.isfinite(y).all() and torch.isfinite(grad).all()
            torch.testing.assert_close(y.sum(-1), torch.full((4,), float(k), dtype=dtype))
        out = noised_kth_value(x, k, epsilon=sigma, n_samples=4, generator=_gen(1))
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(out).all() and torch.isfinite(grad).all()


# ------------------------------------------------------------------------------- vmap, compile


def test_vmap_needs_a_randomness_flag():
    x = torch.randn(4, 6, generator=_gen(0))
    for fn in (lambda r: perturbed_topk(r, 2), lambda r: noised_kth_value(r, 2)):
        with pytest.raises(RuntimeError, match="randomness"):
            torch.func.vmap(fn)(x)
    y = torch.func.vmap(lambda r: perturbed_topk(r, 2, n_samples=8), randomness="different")(x)
    torch.testing.assert_close(y.sum(-1), torch.full((4,), 2.0))
    grad = torch.func.vmap(torch.func.grad(lambda r: perturbed_topk(r, 2)[0]), randomness="different")(x)
    assert grad.shape == x.shape
    noise = torch.randn(4, 6, 5, generator=_gen(1))  # fixed noise: no randomness flag needed
    per_row = torch.func.vmap(torch.func.grad(lambda r, z: noised_kth_value(r, 2, noise=z)))(x, noise)
    x.requires_grad_()
    noised_kth_value(x, 2, noise=noise).sum().backward()
    assert torch.equal(per_row, x.grad)


def test_compile_fullgraph_matches_eager():
    """Dynamo traces both functions in one graph (``generator=None``; a Generator object is a graph
    break); aot_eager draws the same global-RNG noise as eager on the torch path (a compiled call
    takes it; eager CPU calls with numba draw noised_kth_value's noise in a kernel instead)."""
    torch._dynamo.reset()
    x = torch.randn(3, 8, generator=_gen(0))
    for fn in (lambda r: perturbed_topk(r, 3, n_samples=20), lambda r: noised_kth_value(r, 3, n_samples=6)):
        results = []
        for run in (torch.compile(fn, fullgraph=True, backend="aot_eager"), fn):
            leaf = x.clone().requires_grad_()
            torch.manual_seed(3)
            with triton_gate.torch_path() if run is fn else contextlib.nullcontext():
                out = run(leaf)
            out.sum().backward()
            results.append((out.detach(), leaf.grad))
        torch.testing.assert_close(results[0], results[1])
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------- validation

X = torch.randn(3, 5)
BOTH = {"perturbed_topk": perturbed_topk, "noised_kth_value": noised_kth_value}


@pytest.mark.parametrize("fn", BOTH.values(), ids=BOTH)
def test_x_checks(fn):
    with pytest.raises(TypeError, match=_match("x must be a torch.Tensor", "list")):
        fn([1.0, 2.0], 1)
    with pytest.raises(TypeError, match=_match("x must have a floating dtype", "torch.int64")):
        fn(torch.arange(5), 1)
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        fn(torch.tensor(1.0), 1)
    with pytest.raises(ValueError, match=_match("dim must be in [-2, 1]", "got 2")):
        fn(X, 1, dim=2)


@pytest.mark.parametrize("fn", BOTH.values(), ids=BOTH)
@pytest.mark.parametrize("k", [0, 6, -1])
def test_k_out_of_range(fn, k):
    with pytest.raises(ValueError, match=_match("k must satisfy 1 <= k <= n = 5", f"got {k}")):
        fn(X, k)


@pytest.mark.parametrize("fn", BOTH.values(), ids=BOTH)
@pytest.mark.parametrize("k,shown", [(2.0, "float 2.0"), (True, "bool True"), ("2", "str '2'")])
def test_k_not_an_int(fn, k, shown):
    with pytest.raises(TypeError, match=_match("k must be an int", shown)):
        fn(X, k)


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.nan, math.inf])
def test_sigma_not_positive_finite(sigma):
    with pytest.raises(ValueError, match=_match("sigma must be a positive finite number", f"got {sigma!r}")):
        perturbed_topk(X, 2, sigma=sigma)


@pytest.mark.parametrize("sigma,shown", [(True, "bool True"), ("1", "str '1'"), (None, "NoneType None")])
def test_sigma_not_a_number(sigma, shown):
    with pytest.raises(TypeError, match=_match("sigma must be a real number", shown)):
        perturbed_topk(X, 2, sigma=sigma)


@pytest.mark.parametrize("fn", BOTH.values(), ids=BOTH)
def test_n_samples_checks(fn):
    with pytest.raises(ValueError, match=_match("n_samples must be >= 1", "got 0")):
        fn(X, 2, n_samples=0)
    for value, shown in ((10.0, "float 10.0"), (True, "bool True")):
        with pytest.raises(TypeError, match=_match("n_samples must be an int", shown)):
            fn(X, 2, n_samples=value)


@pytest.mark.parametrize("noise", ["normal", "Gaussian", 1, None])
def test_noise_kind_unknown(noise):
    with pytest.raises(ValueError, match=_match("noise must be one of ('gaussian', 'gumbel')", repr(noise))):
        perturbed_topk(X, 2, noise=noise)


@pytest.mark.parametrize("fn", BOTH.values(), ids=BOTH)
@pytest.mark.parametrize("generator,shown", [(0, "int 0"), ("cpu", "str 'cpu'"), (torch.randn(2), "Tensor")])
def test_generator_wrong_type(fn, generator, shown):
    with pytest.raises(TypeError, match=_match("generator must be a torch.Generator or None", shown)):
        fn(X, 2, generator=generator)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_generator_wrong_device():
    with pytest.raises(ValueError, match=_match("generator must be on the input's device type (cuda)", "cpu")):
        perturbed_topk(X.cuda(), 2, generator=torch.Generator())


@pytest.mark.parametrize(
    "shape,n_samples,expected",
    [
        ((3, 5), None, "(3, 5, S)"),
        ((3, 5, 4, 1), None, "(3, 5, S)"),
        ((5, 3, 4), None, "(3, 5, S)"),
        ((3, 5, 0), None, "(3, 5, S)"),
        ((3, 5, 4), 5, "(3, 5, 5)"),
        ((3, 5), 4, "(3, 5, 4)"),
    ],
)
def test_noise_tensor_wrong_shape(shape, n_samples, expected):
    with pytest.raises(
        ValueError,
        match=_match(
            "noise must have shape " + expected, "one noise draw per entry and sample, S >= 1", f"got {shape}"
        ),
    ):
        noised_kth_value(X, 2, noise=torch.randn(shape), n_samples=n_samples)


@pytest.mark.parametrize("noise,shown", [(torch.zeros(3, 5, 2, dtype=torch.long), "torch.int64"), ([0.0], "list")])
def test_noise_tensor_wrong_type(noise, shown):
    with pytest.raises(TypeError, match=_match("noise must be a floating torch.Tensor", shown)):
        noised_kth_value(X, 2, noise=noise)


@pytest.mark.parametrize("epsilon", [-1e-3, math.nan, -math.inf])
def test_epsilon_negative_or_not_finite(epsilon):
    with pytest.raises(ValueError, match=_match("epsilon must be a", "finite number", f"got {epsilon!r}")):
        noised_kth_value(X, 2, epsilon=epsilon)


def test_epsilon_not_a_number():
    with pytest.raises(TypeError, match=_match("epsilon must be a real number", "bool True")):
        noised_kth_value(X, 2, epsilon=True)


def test_helpers_name_the_argument():
    from softtopk._validation import check_choice, check_generator, check_int

    assert check_generator("gen", None) is None and check_int("s", 3, low=1) == 3
    assert check_choice("kind", "gumbel", P.NOISE_KINDS) == "gumbel"
    with pytest.raises(TypeError, match="gen must be a torch.Generator"):
        check_generator("gen", 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        check_choice("kind", "cauchy", P.NOISE_KINDS)
    with pytest.raises(ValueError, match="s must be >= 1, got -2"):
        check_int("s", -2, low=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_noised_kth_value_near_the_dtypes_max_is_finite(dtype):
    # the mean over the samples of values near 3e38 overflowed its float32 sum to inf
    x = torch.tensor([[3e38, 1e38, 2.0, 1.0], [3e38, 3e38, 2.0, 1.0]], dtype=dtype)
    out = noised_kth_value(x, 2, epsilon=1.0, generator=torch.Generator().manual_seed(0))
    assert out.isfinite().all()
    torch.testing.assert_close(out.float(), x[:, 1].float(), rtol=1e-2, atol=0)
