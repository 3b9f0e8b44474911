"""The numba kernels of the Laplace mask on CPU rows against the torch path, values and gradients,
and where they run (``softtopk.ops.lapsum_numba``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import isotonic_numba, lapsum_numba, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import accelerator_steps  # noqa: E402
from extended_rows import EXTENDED_ROWS  # noqa: E402

pytestmark = pytest.mark.skipif(
    not isotonic_numba.available(), reason="numba is not installed, so there are no kernels to test (pip install numba)"
)


@pytest.fixture
def any_size(monkeypatch):
    """The kernels at every size, not only where they are faster."""
    monkeypatch.setattr(lapsum_numba, "pays", lambda x, k: True)


def _mask_and_grad(x: torch.Tensor, k: int, tau: float, hard: bool, kernels: bool):
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    leaf = x.detach().clone().requires_grad_()
    assert lapsum_numba.usable(leaf, k, tau) or not kernels
    if kernels:
        mask = softtopk.soft_topk(leaf, k, tau=tau, hard=hard)
    else:
        with triton_gate.torch_path():
            assert not lapsum_numba.usable(leaf, k, tau)
            mask = softtopk.soft_topk(leaf, k, tau=tau, hard=hard)
    (mask * g).sum().backward()
    return mask.detach(), leaf.grad


def _close(x: torch.Tensor, k: int, tau: float, hard: bool = False):
    m0, g0 = _mask_and_grad(x, k, tau, hard, kernels=False)
    m1, g1 = _mask_and_grad(x, k, tau, hard, kernels=True)
    tol = 1e-12 if x.dtype == torch.float64 else 2e-6
    torch.testing.assert_close(m1, m0, rtol=0, atol=tol, equal_nan=True)
    # the gradient grows as 1 / tau: its rounding is relative to its largest entry, not to 1
    scale = max(1.0, float(g0.abs().nan_to_num(posinf=0.0).amax()))
    torch.testing.assert_close(g1, g0, rtol=5 * tol, atol=50 * tol * scale, equal_nan=True)
    return m1, g1


@pytest.mark.usefixtures("any_size")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("n", "k", "tau"),
    [(50, 5, 1.0), (50, 25, 0.3), (50, 30, 0.3), (7, 2, 1e-3), (3000, 10, 0.5), (9, 8, 2.0), (2, 1, 1.0), (64, 8, 1e3)],
)
def test_kernels_equal_the_torch_path(dtype, n, k, tau):
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n + k), dtype=dtype)
    mask, _ = _close(x, k, tau)
    torch.testing.assert_close(mask.sum(-1), torch.full_like(mask[:, 0], float(k)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_extreme_scales(scale):
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(3)) * scale
    _close(x, 4, 1.0)
    _close(x, 4, scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [2, 3, 6])
def test_infinite_and_tied_rows_follow_the_extended_reals(k, dtype):
    mask, grad = _close(torch.tensor(EXTENDED_ROWS, dtype=dtype), k, 0.7)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()


def test_nan_stays_in_its_row():
    x = torch.tensor([[1.0, float("nan"), 0.0, 2.0, 5.0], [1.0, 3.0, 0.0, 2.0, 5.0]])
    mask, _ = _close(x, 2, 1.0)
    assert mask[0].isnan().all() and not mask[1].isnan().any()


def test_hard_forward_with_the_soft_gradient():
    _close(torch.randn(4, 50, generator=torch.Generator().manual_seed(5)), 5, 1.0, hard=True)


def test_topk_weights_equal_the_torch_path():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    g = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    for hard in (False, True):
        results = []
        for kernels in (True, False):
            leaf = x.clone().requires_grad_()
            with triton_gate.torch_path() if not kernels else torch.enable_grad():
                values, indices, weights = softtopk.topk(leaf, 4, hard=hard, tau=0.5)
            (weights * g).sum().backward()
            results.append((values.detach(), indices, weights.detach(), leaf.grad))
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def test_an_empty_batch_and_any_dim():
    x = torch.empty(0, 10, requires_grad=True)
    mask = softtopk.soft_topk(x, 3)
    mask.sum().backward()
    assert mask.shape == (0, 10) and x.grad.shape == (0, 10)
    y = torch.randn(5, 30, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = softtopk.soft_topk(y, 4, dim=1)
    with triton_gate.torch_path():
        want = softtopk.soft_topk(y, 4, dim=1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_float64_gradcheck():
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(6), dtype=torch.float64, requires_grad=True)
    assert lapsum_numba.usable(x, 3, 0.5)
    assert torch.autograd.gradcheck(lambda v: softtopk.soft_topk(v, 3, tau=0.5), (x,))


def test_a_second_derivative_raises_instead_of_being_zero():
    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(8), dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad((softtopk.soft_topk(x, 4, tau=0.5) ** 2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


def test_where_the_kernels_run(monkeypatch):
    x = torch.randn(4, 50)
    assert lapsum_numba.usable(x, 5, 1.0) and lapsum_numba.usable(x.double(), 45, 0.1)
    assert not lapsum_numba.usable(x.half(), 5, 1.0)  # NumPy has no bfloat16: the torch path, float32 inside
    assert not lapsum_numba.usable(x, torch.tensor([[5.0]]), 1.0)  # a tensor k
    assert not lapsum_numba.usable(x, 5, torch.tensor(1.0))  # a tensor tau
    assert not lapsum_numba.usable(x.to("meta"), 5, 1.0)
    with triton_gate.torch_path():
        assert not lapsum_numba.usable(x, 5, 1.0)
    with accelerator_steps():  # the launch counts of the tests and count_launches.py: an accelerator's path
        assert not lapsum_numba.usable(x, 5, 1.0)
    seen = []
    torch.func.vmap(lambda row: seen.append(lapsum_numba.usable(row[None], 5, 1.0)) or row)(x)
    assert seen == [False]
    monkeypatch.setattr(isotonic_numba, "available", lambda: False)  # no numba, or SOFTTOPK_NUMBA=0
    assert not lapsum_numba.usable(x, 5, 1.0)


def test_the_kernels_run_where_they_pay(monkeypatch):
    small, wide = torch.empty(64, 100), torch.empty(64, 10_000)
    assert lapsum_numba.pays(small, 10) and lapsum_numba.pays(small, 50)  # dispatch-bound: always
    assert lapsum_numba.pays(torch.empty(1024, 64), 8)  # 2^16 entries, candidates a quarter of the row
    assert not lapsum_numba.pays(torch.empty(64, 1000), 500)  # every entry a candidate
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert lapsum_numba.pays(wide, 10) and not lapsum_numba.pays(torch.empty(16384, 64), 8)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)  # torch's threads against one kernel thread
    assert not lapsum_numba.pays(wide, 10)


def test_torch_func_transforms_take_the_torch_path():
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    w = torch.randn(2, 8, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    got = torch.func.grad(lambda v: (softtopk.soft_topk(v, 2) * w).sum())(x)
    leaf = x.clone().requires_grad_()
    (softtopk.soft_topk(leaf, 2) * w).sum().backward()  # the kernels
    torch.testing.assert_close(got, leaf.grad, rtol=1e-12, atol=1e-12)
