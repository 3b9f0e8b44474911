"""Limits on the extended reals that the probes of issue 22 found missing: the sparse magnitude with
infinite entries (torch and JAX), and the top-k SVM losses with a class at ``+inf``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import softtopk

INF = float("inf")
SOLVERS = (("pav", 4 / 3), ("pav", 2.0), ("dykstra", 2.0))

# rows of the magnitude: (x, k, expected output, expected gradient of the sum) or None where the
# finite part is the kernel's (checked against the row without its infinite entries)
MAG_ROWS = [
    # the issue's row: four infinite magnitudes for k = 2, the finite entries are outside the top 2
    ([1.0, INF, -INF, INF, -1.0, INF], 2, [0.0, INF, -INF, INF, 0.0, INF], [0.0, 0.5, 0.5, 0.5, 0.0, 0.5]),
    ([INF, -INF, 1.0, 2.0], 2, [INF, -INF, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]),  # P = k: both kept exactly
    ([-INF, 3.0, 1.0, 2.0, 0.5], 1, [-INF, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]),
]


def _mag(x: torch.Tensor, k: int, solver: str, p: float) -> torch.Tensor:
    return softtopk.sparse_topk_mag(x, k, l=0.5, p=p, solver=solver, n_iter=2000)


@pytest.mark.parametrize(("solver", "p"), SOLVERS)
@pytest.mark.parametrize(("row", "k", "want", "want_grad"), MAG_ROWS)
def test_magnitude_with_k_or_more_infinite_entries(solver, p, row, k, want, want_grad):
    x = torch.tensor([row], dtype=torch.float64, requires_grad=True)
    out = _mag(x, k, solver, p)
    out.backward(torch.ones_like(out))
    assert torch.equal(out.detach(), torch.tensor([want], dtype=torch.float64))
    assert torch.equal(x.grad, torch.tensor([want_grad], dtype=torch.float64))


@pytest.mark.parametrize(("solver", "p"), SOLVERS)
@pytest.mark.parametrize("k", [2, 3])
def test_magnitude_with_fewer_than_k_infinite_entries(solver, p, k):
    """``P < k`` infinite magnitudes are kept (output ``x``, gradient 1); the finite entries get the
    magnitude of the finite entries alone with ``k - P``."""
    finite = torch.tensor([[1.0, 3.0, -2.0, 0.5, -0.25]], dtype=torch.float64)
    x = torch.cat([finite[:, :2], torch.tensor([[-INF]], dtype=torch.float64), finite[:, 2:]], -1)
    x.requires_grad_(True)
    out = _mag(x, k, solver, p)
    upstream = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).unsqueeze(0)
    out.backward(upstream)
    reference = finite.clone().requires_grad_(True)
    alone = _mag(reference, k - 1, solver, p)
    alone.backward(torch.cat([upstream[:, :2], upstream[:, 3:]], -1))
    assert out[0, 2] == -INF and x.grad[0, 2] == upstream[0, 2]
    kept = [0, 1, 3, 4, 5]
    torch.testing.assert_close(out.detach()[:, kept], alone.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(x.grad[:, kept], reference.grad, atol=1e-9, rtol=0)


def test_magnitude_infinite_rows_match_jax():
    jax = pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
    import softtopk.jax as sj

    rows = [
        [1.0, INF, -INF, INF, -1.0, INF],
        [INF, -INF, 1.0, 2.0, 0.0, -3.0],
        [1.0, -INF, 3.0, -2.0, 0.5, 0.25],
        [0.5, -1.0, 2.0, -0.25, 1.5, 3.0],
    ]
    x = np.array(rows)
    upstream = np.linspace(-1.0, 1.0, x.size).reshape(x.shape)
    with jax.enable_x64(True):
        # k = 1, 3: the first row's 3 infinite entries are more than k and exactly k, the second's 1
        # at most k
        for (solver, p), k in itertools.product(SOLVERS, [1, 3]):
            t = torch.tensor(x, requires_grad=True)
            out = _mag(t, k, solver, p)
            out.backward(torch.tensor(upstream))
            jax_solver = "exact" if solver == "pav" else solver

            def fn(v, k=k, p=p, jax_solver=jax_solver):
                return sj.sparse_topk_mag(v, k, l=0.5, p=p, solver=jax_solver, n_iter=2000)

            value, vjp = jax.vjp(fn, jax.numpy.asarray(x))
            np.testing.assert_allclose(np.asarray(value), out.detach().numpy(), atol=1e-6)
            np.testing.assert_allclose(np.asarray(vjp(jax.numpy.asarray(upstream))[0]), t.grad.numpy(), atol=1e-8)


SVM_LOSSES = [
    ("smooth_topk_svm", {"k": 1}),
    ("smooth_topk_svm", {"k": 2}),
    ("smooth_topk_svm", {"k": 5}),
    ("smooth_topk_svm", {"k": 10}),  # the log-space ESF path (k above the subset path's 8)
    ("smooth_top1_svm", {}),
    ("topk_svm", {"k": 1}),
    ("topk_svm", {"k": 5}),
    ("topk_svm", {"k": 10}),
]


def _svm(name: str, params: dict, x: torch.Tensor, label: int):
    x = x.clone().requires_grad_(True)
    loss = getattr(softtopk, name)(x, torch.tensor([label]), reduction="none", **params)
    loss.sum().backward()
    return loss.detach()[0], x.grad[0]


@pytest.mark.parametrize(("name", "params"), SVM_LOSSES)
@pytest.mark.parametrize("label_inf", [False, True])
@pytest.mark.parametrize("extra", [-1, 0, 2])  # P = k + extra other classes at +inf
def test_svm_losses_take_the_limit_at_plus_inf(name, params, label_inf, extra):
    """A class at ``+inf`` gives the limit of scores at ``M → ∞`` (all infinite scores tied): with
    ``P < k`` others there the finite hinge over the rest, with ``P >= k`` ``inf`` (gradient 0), or
    with the label at ``+inf`` too the tied value; never NaN."""
    k = params.get("k", 1)
    count = k + extra
    if count < 1:
        pytest.skip("no class at +inf")
    x = 2 * torch.randn(1, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
    infinite = list(range(3, 3 + count)) + ([0] if label_inf else [])
    finite = [i for i in range(30) if i not in infinite]
    got, grad = _svm(name, params, x.index_fill(-1, torch.tensor(infinite), INF), 0)
    want, want_grad = _svm(name, params, x.index_fill(-1, torch.tensor(infinite), 1e4), 0)
    assert not grad.isnan().any()
    assert torch.equal(grad[infinite], torch.zeros(len(infinite), dtype=torch.float64))
    if count >= k and not label_inf:
        assert got == INF and torch.equal(grad, torch.zeros_like(grad))
        return
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad[finite], want_grad[finite], rtol=1e-9, atol=1e-12)


def test_smooth_topk_svm_issue_reproduction():
    """The issue's probe: ``SmoothTopKSVM(k=5)`` with another class at ``+inf`` was NaN; its limit is
    the hinge over the other classes with 4 places left, as the hard loss's."""
    x = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
    x[0, 3] = INF
    target = torch.tensor([0, 1, 2])
    for loss in (softtopk.SmoothTopKSVM(k=5), softtopk.SmoothTop1SVM(), softtopk.TopKSVM(k=5)):
        leaf = x.clone().requires_grad_(True)
        value = loss(leaf, target)
        value.backward()
        assert not value.isnan() and not leaf.grad.isnan().any(), loss


@pytest.mark.parametrize("method", ["splitter_selection", "bitonic", "neuralsort", "softsort"])
@pytest.mark.parametrize("top1_mode", ["sm", "smce", "sort"])
@pytest.mark.parametrize("m", [None, 16])
def test_topk_cross_entropy_with_plus_inf_classes(method, top1_mode, m):
    """Rows with one, two (the label among them) and three classes at ``+inf``: no NaN in the loss
    or its gradient; with ``'smce'`` a label below a ``+inf`` class has the cross-entropy's limit,
    ``inf`` (gradient 0)."""
    x = torch.randn(4, 20, generator=torch.Generator().manual_seed(0))
    x[0, 3] = x[1, 1] = x[1, 5] = INF
    x[2, 7:10] = INF
    x.requires_grad_(True)
    loss = softtopk.TopKCrossEntropyLoss(
        [0.5, 0, 0, 0, 0.5], method=method, top1_mode=top1_mode, m=m, reduction="none"
    )(x, torch.tensor([0, 1, 2, 3]))
    loss.sum().backward()
    assert not loss.isnan().any() and not x.grad.isnan().any()
    assert loss[1].isfinite() and loss[3].isfinite()
    beaten = loss[[0, 2]]
    if top1_mode == "smce":
        assert (beaten == INF).all() and (x.grad[[0, 2]] == 0).all()
    else:
        assert beaten.isfinite().all()


@pytest.mark.parametrize("p", [2.0, 4 / 3])
@pytest.mark.parametrize(
    ("row", "k", "upstream"),
    [
        ([3.0, 0.0, 0.0, -1.0], 1, [0.0, 1.0, -1.0, 0.0]),  # a tie at mask 0
        ([5.0, 5.0, 0.0, -1.0], 2, [1.0, -1.0, 0.0, 0.0]),  # a tie at mask 1
    ],
)
def test_compat_sparse_ties_at_zero_or_one_have_the_mask_derivative(p, row, k, upstream):
    """``docs/compat.md``: tied entries both at 0 (or both at 1) have gradient 0, the one-sided
    derivatives of the mask in every direction; the original pools them into a PAV block and
    returns ``(g_i - mean g)/l`` there (10 and -10 here for p = 2)."""
    from softtopk.compat.sparse_soft_topk import sparse_soft_topk_mask_pav

    x = torch.tensor(row, dtype=torch.float64, requires_grad=True)
    g = torch.tensor(upstream, dtype=torch.float64)
    (sparse_soft_topk_mask_pav(x, k, l=0.1, p=p) * g).sum().backward()
    assert torch.equal(x.grad, torch.zeros(4, dtype=torch.float64))
    for i, step in itertools.product(range(4), (1e-6, -1e-6)):
        moved = x.detach().clone()
        moved[i] += step
        change = (
            sparse_soft_topk_mask_pav(moved, k, l=0.1, p=p) - sparse_soft_topk_mask_pav(x.detach(), k, l=0.1, p=p)
        ) @ g
        assert abs(float(change)) < 1e-12


@pytest.mark.parametrize(("solver", "p"), SOLVERS)
@pytest.mark.parametrize("k", [1, 3])
def test_sparse_near_the_largest_float32(solver, p, k):
    """Scores near 3e38 (gaps of 1e39 λ): the exact mask is the k-hot one (it was NaN: its offset
    overflowed float32), Dykstra's truncated iteration stays finite (its pair means overflowed)."""
    x = torch.tensor([[3e38, -3e38, 1.0, 2.0, 0.0, -1.0]], requires_grad=True)
    mask = softtopk.sparse_topk_mask(x, k, p=p, solver=solver, n_iter=50)
    mag = softtopk.sparse_topk_mag(x, k, p=p, solver=solver, n_iter=50)
    (mask.sum() + mag.sum()).backward()
    assert mask.isfinite().all() and mag.isfinite().all() and x.grad.isfinite().all()
    if solver != "dykstra":
        assert torch.equal(mask, softtopk.hard_topk_mask(x, k))


def test_sparse_near_the_largest_float32_in_jax():
    pytest.importorskip("jax", reason="the jax extra is not installed: pip install 'softtopk[jax]'")
    import jax.numpy as jnp

    import softtopk.jax as sj

    row = [[3e38, -3e38, 1.0, 2.0, 0.0, -1.0]]
    for k, p in itertools.product((1, 3), (2.0, 4 / 3)):
        got = np.asarray(sj.sparse_topk_mask(jnp.asarray(row, jnp.float32), k, p=p))
        np.testing.assert_array_equal(got, softtopk.hard_topk_mask(torch.tensor(row), k).numpy())


@pytest.mark.parametrize(("name", "params"), SVM_LOSSES)
def test_svm_losses_near_the_largest_float32(name, params):
    """Scores at ±3e38: differences overflow float32. The losses equal float64's where that is
    finite in float32 (overflowing to inf otherwise), with no NaN in the gradient."""
    x = 3e38 * torch.randn(4, 12, generator=torch.Generator().manual_seed(1)).sign()
    target = torch.tensor([0, 3, 5, 9])
    leaf = x.clone().requires_grad_(True)
    got = getattr(softtopk, name)(leaf, target, reduction="none", **params)
    got.sum().backward()
    want = getattr(softtopk, name)(x.double(), target, reduction="none", **params)
    assert not leaf.grad.isnan().any()
    representable = want.abs() < torch.finfo(torch.float32).max
    torch.testing.assert_close(got[representable].double(), want[representable], rtol=1e-4, atol=1e-6)
    assert (got[~representable] == INF).all()


@pytest.mark.parametrize("name", ["SmoothTopKSVM", "SmoothTop1SVM", "TopKSVM", "Top1SVM"])
def test_a_nan_logit_makes_its_own_svm_row_nan_even_with_k_classes_at_inf(name):
    """A row with a NaN is NaN (not the ``inf`` of ``k`` other classes at ``+inf``), and no other row is."""
    inf, nan = float("inf"), float("nan")
    logits = torch.tensor([[0.0, inf, inf, nan, 1.0], [0.0, inf, inf, 2.0, 1.0], [nan, 0.0, 1.0, 2.0, 3.0]])
    loss = getattr(softtopk, name)(reduction="none", **({} if "Top1" in name else {"k": 2}))(
        logits, torch.tensor([0, 0, 1])
    )
    assert loss[0].isnan() and loss[2].isnan() and loss[1] == inf
