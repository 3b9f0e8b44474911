"""softtopk.soft_sort and softtopk.soft_rank: oracle values and gradients (NumPy PAV and the
min-max formula), torchsort's published examples, gradcheck, properties, dtypes, shapes, tensor
strengths, compile, vmap, no host reads, the meta device, ±inf/NaN and every error message."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import permutahedron_reference as R
import softtopk
from dispatch_counter import count_call
from softtopk.ops import isotonic, isotonic_numba, permutahedron
from softtopk.ops.isotonic import isotonic_kl, isotonic_l2, levels_kl, levels_l2

# the three solvers: numba's PAV on a CPU tensor (where numba is installed), the CPU rounds of
# tensor operations (no numba), the fixed-shape level merges (accelerators, compile, vmap)
PATHS = ["cpu-pav", "cpu-rounds", "fixed-levels"]
FNS = {"rank": (softtopk.soft_rank, R.soft_rank_1d), "sort": (softtopk.soft_sort, R.soft_sort_1d)}
INF = float("inf")


def _rows(n: int, seed: int, batch: int = 4, scale: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, n)) * scale


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("strength", [0.1, 1.0, 10.0])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("n", [1, 2, 5, 13, 33])
@pytest.mark.parametrize("path", PATHS)
def test_matches_oracle_values_and_gradients(name, reg, strength, descending, n, path, monkeypatch):
    _take(path, monkeypatch)
    fn, ref = FNS[name]
    x = _rows(n, seed=n)
    upstream = np.random.default_rng(n + 1).normal(size=x.shape)
    leaf = torch.tensor(x, requires_grad=True)
    out = fn(leaf, regularization=reg, strength=strength, descending=descending)
    out.backward(torch.tensor(upstream))
    for i in range(x.shape[0]):
        want, want_grad = ref(x[i], strength, reg, descending, upstream[i])
        np.testing.assert_allclose(out[i].detach().numpy(), want, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(leaf.grad[i].numpy(), want_grad, rtol=1e-10, atol=1e-10)


def _isotonic_inputs():
    g = np.random.default_rng(0)
    yield g.normal(size=40) * 3 + np.arange(40) * 0.3
    yield np.round(g.normal(size=40) * 2)  # ties
    yield np.concatenate([-1.5 * np.arange(29.0), [1e3]])  # a cascade through every block
    yield np.arange(37.0)  # one block
    yield -(np.arange(37.0) ** 2)  # no pooling
    yield np.zeros(16)
    yield np.sort(g.normal(size=50))[::-1] / 0.05 - np.arange(50, 0, -1)  # soft-rank rows
    yield np.sort(g.normal(size=50))[::-1] / 5.0 - np.arange(50, 0, -1)


def _no_reads(monkeypatch) -> None:
    """The accelerator path on the CPU: values may not be read (as under compile, vmap or on a
    GPU), so the fixed-shape level merges run instead of the CPU's rounds of pooling, and rows are
    not checked for being finite first."""
    for module in (isotonic, permutahedron):
        monkeypatch.setattr(module, "can_inspect", lambda value: False)


def _take(path: str, monkeypatch) -> None:
    """Solve by ``path`` (one of ``PATHS``) on CPU tensors."""
    if path == "cpu-pav" and not isotonic_numba.available():
        pytest.skip("numba is not installed, so the CPU PAV kernels are not used (pip install numba)")
    if path != "cpu-pav":
        monkeypatch.setattr(isotonic_numba, "available", lambda: False)
    if path == "fixed-levels":
        _no_reads(monkeypatch)


@pytest.fixture
def read_free(monkeypatch):
    _no_reads(monkeypatch)


@pytest.mark.parametrize("y", list(_isotonic_inputs()), ids=range(8))
@pytest.mark.parametrize("path", PATHS)
def test_isotonic_solvers_are_exact(y, path, monkeypatch):
    _take(path, monkeypatch)
    l2, kl = (levels_l2, levels_kl) if path == "fixed-levels" else (isotonic_l2, isotonic_kl)
    got = l2(torch.tensor(y)[None])[0].numpy()
    np.testing.assert_allclose(got, R.isotonic_l2_minmax(y), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(got, R.isotonic_l2(y), rtol=1e-12, atol=1e-10)
    lw = np.random.default_rng(1).normal(size=len(y))
    got = kl(torch.tensor(y)[None], torch.tensor(lw)[None])[0].numpy()
    np.testing.assert_allclose(got, R.isotonic_kl(y, lw), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("path", PATHS)
def test_kl_merges_take_no_overflowing_exponential(path, monkeypatch):
    """A merge weighs the part of a block above a threshold by ``log(e^g - 1)``, which for the gap
    ``g`` of these rows (above 700) overflowed to ``inf`` and pooled every point: the kl sort of
    ``[0, 0, 433, -282, -283]`` at strength 0.7 came out 0.12 off on the fixed levels."""
    _take(path, monkeypatch)
    kl = levels_kl if path == "fixed-levels" else isotonic_kl
    y, lw = np.arange(5.0, 0.0, -1.0) / 0.7, np.array([283.0, 282.0, 0.0, 0.0, -433.0])
    got = kl(torch.tensor(y)[None], torch.tensor(lw)[None])[0].numpy()
    np.testing.assert_allclose(got, R.isotonic_kl(y, lw), rtol=1e-12, atol=1e-10)


def test_cpu_rounds_absorb_long_cascades_and_fall_back_to_the_fixed_solver():
    y = torch.cat([-1.5 * torch.arange(299.0), torch.tensor([1e6])]).double()[None]  # a cascade of 299 blocks
    want = torch.tensor(R.isotonic_l2(y[0].numpy()))[None]
    torch.testing.assert_close(isotonic._pooled_runs(y, None, rounds=1), want)  # one left-cascade step
    assert isotonic._pooled_runs(y, None, rounds=0) is None  # l2: the caller runs the fixed-shape solver
    # kl: the blocks left after the rounds go to the fixed-shape solver as points of their own
    y = torch.cat([y, y.flip(-1) / 1e4, torch.randn(1, 300, dtype=torch.float64)])
    lw = torch.randn(3, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    want = np.stack([R.isotonic_kl(a, b) for a, b in zip(y.numpy(), lw.numpy(), strict=False)])
    for rounds in (0, 1, None):
        np.testing.assert_allclose(isotonic._pooled_runs(y, lw, rounds).numpy(), want, rtol=1e-12, atol=1e-9)
    # rows spanning less than 600 pool in linear sums (their ratio), and go back to log-sum-exps
    y = y / 1e4
    assert float((y.amax(-1) - y.amin(-1)).max()) < isotonic._RATIO_SPAN < float((y * 1e4).amax() - (y * 1e4).amin())
    want = np.stack([R.isotonic_kl(a, b) for a, b in zip(y.numpy(), lw.numpy(), strict=False)])
    for rounds in (0, 1, None):
        np.testing.assert_allclose(isotonic._pooled_runs(y, lw, rounds).numpy(), want, rtol=1e-12, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), chain=st.integers(1, 60), spikes=st.integers(1, 30))
def test_cpu_rounds_match_pav_on_many_cut_cascades(seed, chain, spikes):
    """Decreasing chains broken by spikes: many left cascades in every row, windows cut short."""
    rng = np.random.default_rng(seed)
    y = -np.cumsum(rng.exponential(size=(3, chain * spikes)), -1)
    y[:, chain - 1 :: chain] += rng.exponential(size=(3, spikes)) * chain * rng.choice([0.1, 1, 10])
    lw = rng.normal(size=y.shape)
    got = isotonic._pooled_runs(torch.tensor(y), None)
    want = np.stack([R.isotonic_l2(a) for a in y])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-9 * np.abs(y).max())
    for span in (1e-3, 1.0):  # kl: linear sums (every row spans less than 600), log-sum-exps
        got = isotonic._pooled_runs(torch.tensor(y * span), torch.tensor(lw))
        want = np.stack([R.isotonic_kl(a, b) for a, b in zip(y * span, lw, strict=True)])
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("path", PATHS[1:])
def test_the_paths_agree(name, reg, path, monkeypatch):
    fn = FNS[name][0]
    x = torch.randn(6, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x[1, 7], x[2, :50] = INF, -INF
    finite = x[[0, 3, 4, 5]]
    want, want_finite = fn(x, regularization=reg, strength=0.3), fn(finite, regularization=reg, strength=0.3)
    _take(path, monkeypatch)
    torch.testing.assert_close(fn(x, regularization=reg, strength=0.3), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fn(finite, regularization=reg, strength=0.3), want_finite, rtol=1e-10, atol=1e-10)


def test_torchsort_readme_examples():
    x = torch.tensor([[8.0, 0.0, 5.0, 3.0, 2.0, 1.0, 6.0, 7.0, 9.0]])
    want = torch.tensor([[0.5556, 1.5556, 2.5556, 3.5556, 4.5556, 5.5556, 6.5556, 7.5556, 8.5556]])
    torch.testing.assert_close(softtopk.soft_sort(x, strength=1.0), want, atol=1e-4, rtol=0)
    torch.testing.assert_close(softtopk.soft_sort(x, strength=0.1), torch.tensor([[0.0, 1, 2, 3, 5, 6, 7, 8, 9]]))
    torch.testing.assert_close(softtopk.soft_rank(x), torch.tensor([[8.0, 1, 5, 4, 3, 2, 6, 7, 9]]))
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(softtopk.soft_sort(leaf)[0, 0], leaf)
    torch.testing.assert_close(grad, torch.full_like(x, 1 / 9))


def spearmanr(pred, target, **kw):
    pred, target = softtopk.soft_rank(pred, **kw), softtopk.soft_rank(target, **kw)
    pred, target = pred - pred.mean(), target - target.mean()
    return (pred / pred.norm() * target / target.norm()).sum()


def test_torchsort_readme_spearman():
    pred = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], requires_grad=True)
    value = spearmanr(pred, torch.tensor([[5.0, 6.0, 7.0, 8.0, 7.0]]))
    torch.testing.assert_close(value, torch.tensor(0.8321), atol=1e-4, rtol=0)
    (grad,) = torch.autograd.grad(value, pred)
    torch.testing.assert_close(
        grad, torch.tensor([[-5.5470e-02, 0.0, 5.5470e-02, 1.1094e-01, -1.1094e-01]]), atol=1e-6, rtol=1e-4
    )


def test_fast_soft_sort_readme_examples():
    v = torch.tensor([[5.0, 1.0, 2.0], [2.0, 1.0, 5.0]], dtype=torch.float64)
    torch.testing.assert_close(softtopk.soft_sort(v), torch.tensor([[5 / 3, 8 / 3, 11 / 3]] * 2, dtype=torch.float64))
    torch.testing.assert_close(
        softtopk.soft_sort(v, strength=0.1), torch.tensor([[1.0, 2, 5]] * 2, dtype=torch.float64)
    )
    want = torch.tensor([[3.0, 1.25, 1.75], [1.75, 1.25, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(softtopk.soft_rank(v, strength=2.0), want)


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("strength", [0.1, 1.0, 10.0])
@pytest.mark.parametrize("path", PATHS)
def test_gradcheck(name, reg, strength, path, monkeypatch):
    _take(path, monkeypatch)
    fn = FNS[name][0]
    x = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    eps = torch.full((3,), strength, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: fn(a, regularization=reg, strength=strength), (x,))
    assert torch.autograd.gradcheck(lambda a, e: fn(a, regularization=reg, strength=e, descending=True), (x, eps))


finite_rows = st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=24)


@settings(max_examples=60, deadline=None)
@given(finite_rows, st.sampled_from(["l2", "kl"]), st.floats(1e-2, 1e2))
def test_rank_and_sort_properties(row, reg, strength):
    x = torch.tensor([row], dtype=torch.float64)
    n = len(row)
    ranks = softtopk.soft_rank(x, regularization=reg, strength=strength)
    torch.testing.assert_close(ranks.sum(), torch.tensor(n * (n + 1) / 2, dtype=torch.float64))
    assert bool((ranks >= 1 - 1e-9).all() and (ranks <= n + 1e-9).all())
    order = x.argsort(-1)  # ranks follow the values' order
    assert bool((ranks.gather(-1, order).diff() >= -1e-9).all())
    sort = softtopk.soft_sort(x, regularization=reg, strength=strength)
    assert bool((sort.diff() >= -1e-9 * (1 + sort.abs().max())).all())
    if reg == "l2":
        torch.testing.assert_close(sort.sum(), x.sum(), atol=1e-7 * (1 + x.abs().sum()), rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=16, unique=True), st.sampled_from(["l2", "kl"]))
def test_limits_of_the_strength(values, reg):
    x = torch.tensor([values], dtype=torch.float64)
    n = len(values)
    hard_ranks = x.argsort(-1).argsort(-1).to(torch.float64) + 1
    torch.testing.assert_close(softtopk.soft_rank(x, regularization=reg, strength=1e-3), hard_ranks)
    torch.testing.assert_close(softtopk.soft_rank(x, regularization=reg, strength=1e9), torch.full_like(x, (n + 1) / 2))
    torch.testing.assert_close(softtopk.soft_sort(x, regularization=reg, strength=1e-3), x.sort(-1).values)
    torch.testing.assert_close(softtopk.soft_sort(x, strength=1e9), x.mean().expand_as(x), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_dtypes(dtype, name, reg):
    fn = FNS[name][0]
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    x = x.to(dtype)
    leaf = x.clone().requires_grad_()
    out = fn(leaf, regularization=reg)
    out.sum().backward()
    assert out.dtype == dtype and leaf.grad.dtype == dtype
    want = fn(x.double(), regularization=reg)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("name", sorted(FNS))
def test_any_dim_and_batch_shape(name):
    fn = FNS[name][0]
    x = torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = fn(x, dim=1, regularization="kl", strength=0.5)
    want = fn(x.movedim(1, -1), regularization="kl", strength=0.5).movedim(-1, 1)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(fn(x[0, :, 0, 0]), fn(x[0, :, 0, 0][None])[0])
    assert fn(torch.zeros(3, 0)).shape == (3, 0) and fn(torch.zeros(0, 3)).shape == (0, 3)


@pytest.mark.parametrize("name", sorted(FNS))
def test_tensor_strength_per_row(name):
    fn = FNS[name][0]
    x = torch.randn(2, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eps = torch.tensor([[0.1, 1.0, 3.0], [0.5, 2.0, 10.0]], dtype=torch.float64, requires_grad=True)
    got = fn(x, strength=eps)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(got[i, j], fn(x[i, j], strength=eps[i, j].item()))
    got.sum().backward()
    assert eps.grad.shape == eps.shape
    torch.testing.assert_close(fn(x, strength=torch.tensor(0.5)), fn(x, strength=0.5))  # 0-d: one for all


def test_compile_fullgraph_matches_eager(fresh_dynamo):
    def fn(x, eps):
        return softtopk.soft_rank(x, strength=eps) + softtopk.soft_sort(x, regularization="kl", strength=eps)

    x = torch.randn(4, 20, generator=torch.Generator().manual_seed(0))
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    results = []
    for f in (fn, compiled):
        leaf, eps = x.clone().requires_grad_(), torch.full((4,), 0.7, requires_grad=True)
        out = f(leaf, eps)
        (out * torch.arange(20.0)).sum().backward()
        results.append((out.detach(), leaf.grad, eps.grad))
    for got, want in zip(*results, strict=False):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(FNS))
def test_vmap(name):
    fn = FNS[name][0]
    x = torch.randn(5, 3, 9, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.vmap(lambda a: fn(a, regularization="kl"))(x), fn(x, regularization="kl"))
    grads = torch.vmap(torch.func.grad(lambda a: (fn(a) * torch.arange(9.0)).sum()))(x[:, 0])
    leaf = x[:, 0].clone().requires_grad_()
    (fn(leaf) * torch.arange(9.0)).sum().backward()
    torch.testing.assert_close(grads, leaf.grad)


def _extended_rows() -> torch.Tensor:
    x = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))
    x[1, 3] = -INF
    x[2, :] = -INF
    x[3, 5] = INF
    return x


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_no_host_read(name, reg, read_free):
    fn = FNS[name][0]
    assert count_call(lambda x: fn(x, regularization=reg), _extended_rows()).reads == 0
    # a tensor strength's values are checked on CPU only (positive, in range): two reads
    counts = count_call(lambda x: fn(x, regularization=reg, strength=torch.full((4,), 0.5)), _extended_rows())
    assert counts.reads <= 2


@pytest.mark.parametrize("name", sorted(FNS))
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_meta_device(name, reg):
    x = torch.randn(4, 10, device="meta", requires_grad=True)
    out = FNS[name][0](x, regularization=reg)
    assert out.device.type == "meta" and out.shape == x.shape
    out.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_infinite_entries_take_their_limits(reg):
    x = torch.tensor([[INF, 1.0, -INF, 3.0, INF, 2.0, -INF, -INF]], dtype=torch.float64, requires_grad=True)
    ranks = softtopk.soft_rank(x, regularization=reg, strength=0.5)
    finite = softtopk.soft_rank(torch.tensor([[1.0, 3.0, 2.0]], dtype=torch.float64), regularization=reg, strength=0.5)
    if reg == "l2":  # the finite entries on the ranks between the -inf (1..3) and +inf (7, 8) entries
        torch.testing.assert_close(ranks[0, [1, 3, 5]], finite[0] + 3)
    else:  # the exact limit: the projection onto the permutahedron of (6, 5, 4)
        torch.testing.assert_close(ranks[0, [1, 3, 5]].sum(), torch.tensor(15.0, dtype=torch.float64))
    torch.testing.assert_close(ranks[0, [0, 4]], torch.full((2,), 7.5, dtype=torch.float64))
    torch.testing.assert_close(ranks[0, [2, 6, 7]], torch.full((3,), 2.0, dtype=torch.float64))
    (grad,) = torch.autograd.grad(ranks.sum() + (ranks * torch.arange(8.0)).sum(), x)
    assert bool(grad.isfinite().all()) and bool((grad[0, [0, 2, 4, 6, 7]] == 0).all())
    sort = softtopk.soft_sort(x, regularization=reg, strength=0.5)
    want = softtopk.soft_sort(torch.tensor([[1.0, 3.0, 2.0]], dtype=torch.float64), regularization=reg, strength=0.5)
    torch.testing.assert_close(sort[0, 3:6], want[0])
    assert sort[0, :3].eq(-INF).all() and sort[0, 6:].eq(INF).all()


@pytest.mark.parametrize("name", sorted(FNS))
def test_nan_stays_in_its_row(name):
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    x[1, 2] = float("nan")
    leaf = x.clone().requires_grad_()
    out = FNS[name][0](leaf)
    assert out[1].isnan().all() and out[[0, 2]].isfinite().all()
    out[[0, 2]].sum().backward()
    assert leaf.grad[[0, 2]].isfinite().all()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"x": [1.0]}, TypeError, "x must be a torch.Tensor, got list"),
        ({"x": torch.tensor([1, 2])}, TypeError, "x must have a floating dtype"),
        ({"x": torch.tensor(1.0)}, ValueError, "x must have at least one dimension, got a 0-d tensor"),
        ({"dim": 2}, ValueError, "dim must be in [-2, 1] for a 2-d input, got 2"),
        ({"dim": 1.0}, TypeError, "dim must be an int, got float 1.0"),
        ({"regularization": "l1"}, ValueError, "regularization must be one of ('l2', 'kl'), got 'l1'"),
        ({"strength": 0.0}, ValueError, "strength must be a positive finite number, got 0.0"),
        ({"strength": float("nan")}, ValueError, "strength must be a positive finite number, got nan"),
        ({"strength": True}, TypeError, "strength must be a real number, got bool True"),
        ({"strength": "a"}, TypeError, "strength must be a real number, got str 'a'"),
        ({"strength": 1e-300}, ValueError, "strength must lie in [1.18e-38, 8.51e+37] for torch.float32 scores"),
        ({"strength": torch.tensor([1, 2])}, TypeError, "strength must be a floating tensor when given as a tensor"),
        ({"strength": torch.tensor([1.0, -2.0])}, ValueError, "strength must be positive and finite, got a tensor"),
        ({"strength": torch.ones(3)}, ValueError, "strength must be a scalar or broadcastable to the batch shape (2,)"),
        ({"descending": 1}, TypeError, "descending must be a bool, got int 1"),
    ],
)
@pytest.mark.parametrize("name", sorted(FNS))
def test_error_messages(kwargs, error, message, name):
    kwargs = dict(kwargs)
    x = kwargs.pop("x", torch.randn(2, 3))
    with pytest.raises(error) as info:
        FNS[name][0](x, **kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("name", sorted(FNS))
def test_l2_matches_softtorch_when_installed(name):
    """SoftTorch's ``fast_soft_sort`` (``mode="c0"``) solves the same l2 projection with anchors
    ``(0..n-1)/(n-1)``: softness ``(n - 1) ε`` for ranks, ``ε / (n - 1)`` for sorts."""
    softtorch = pytest.importorskip("softtorch", reason="SoftTorch is not installed (it needs Python >= 3.12)")
    n, strength = 40, 0.7
    x = torch.tensor(_rows(n, seed=5, batch=6), requires_grad=True)
    upstream = torch.tensor(_rows(n, seed=6, batch=6))
    softness = (n - 1) * strength if name == "rank" else strength / (n - 1)
    theirs = getattr(softtorch, name)(
        x, dim=-1, softness=softness, mode="c0", method="fast_soft_sort", descending=False, standardize=False
    )
    theirs = theirs if name == "rank" else theirs.values
    ours = FNS[name][0](x, strength=strength)
    want, got = (torch.autograd.grad((out * upstream).sum(), x)[0] for out in (theirs, ours))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
