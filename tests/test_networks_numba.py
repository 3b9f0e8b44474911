"""The numba kernels of the networks' label sweep (top-k cross-entropy's relaxation) on CPU rows
against the torch path, values and gradients, and where they run (``softtopk.ops.networks_numba``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import isotonic_numba, networks_numba, sorting_networks, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import recorded, topk_ce_paths  # noqa: E402
from dispatch_counter import accelerator_steps  # noqa: E402
from extended_rows import sweep_rows  # noqa: E402

pytestmark = pytest.mark.skipif(
    not isotonic_numba.available(), reason="numba is not installed, so there is no kernel to test (pip install numba)"
)

INF = float("inf")
CAUCHY = {"distribution": "cauchy", "art_lambda": 0.25}


def _ranks_and_grad(x, position, k, network, steepness, kernel):
    """The label's ranks and the gradient of ``<ranks, g>`` by the kernel or the torch path."""
    leaf = x.detach().clone().requires_grad_()
    with pytest.MonkeyPatch.context() as patch, torch.enable_grad() if kernel else triton_gate.torch_path():
        seen = recorded(patch, networks_numba)
        ranks = sorting_networks.network_label_ranks(leaf, position, k, network=network, steepness=steepness, **CAUCHY)
        g = torch.randn(ranks.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
        (ranks * g).sum().backward()
    assert seen == [kernel, kernel]  # the forward's choice, and its record for the backward
    return ranks.detach(), leaf.grad


def _close(x, position, k, network="splitter_selection", steepness=10.0):
    """The kernels' ranks and gradient equal the torch path's: to float64 rounding, and in float32
    as close to the float64 torch path as the float32 torch path is (the kernels take ``atan`` and
    the lerps in float64), up to a few ulps of the largest entry."""
    r0, g0 = _ranks_and_grad(x, position, k, network, steepness, kernel=False)
    r1, g1 = _ranks_and_grad(x, position, k, network, steepness, kernel=True)
    scale = max(1.0, float(g0.abs().nan_to_num().amax())) if g0.numel() else 1.0
    if x.dtype == torch.float64:
        torch.testing.assert_close(r1, r0, rtol=0, atol=1e-13, equal_nan=True)
        torch.testing.assert_close(g1, g0, rtol=0, atol=1e-13 * scale, equal_nan=True)
        return r1, g1
    r64, g64 = _ranks_and_grad(x.double(), position, k, network, steepness, kernel=False)
    for mine, theirs, truth, unit in ((r1, r0, r64, 1.0), (g1, g0, g64, scale)):
        torch_error = float((theirs.double() - truth).abs().max())
        assert float((mine.double() - truth).abs().max()) <= 4 * torch_error + 1e-6 * unit
    return r1, g1


def _rows(rows, n, dtype, seed=0):
    """Sorted scores (top-k CE feeds its selected scores sorted) and a label position per row."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=generator, dtype=dtype).sort(-1).values
    return x, torch.randint(0, n, (rows,), generator=generator)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("network", ["splitter_selection", "bitonic", "odd_even"])
@pytest.mark.parametrize(("rows", "n", "k"), [(13, 16, 5), (3, 7, 3), (3, 40, 10), (2, 64, 20), (4, 2, 1), (3, 1, 1)])
def test_the_kernel_equals_the_torch_path(dtype, network, rows, n, k):
    x, position = _rows(rows, n, dtype, seed=n + k)
    _close(x, position, k, network)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("steepness", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_scales_and_steepness(dtype, steepness, scale):
    x, position = _rows(6, 16, dtype, seed=3)
    _close(x * scale, position, 5, steepness=steepness)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(dtype):
    """Tied scores and ``±inf`` (the stand-ins ``±F``: every comparison with them saturates and
    their gradient is 0); the largest finite scores times the steepness overflow to the same."""
    x = torch.tensor(sweep_rows(torch.finfo(dtype).max), dtype=dtype)
    _, grad = _close(x, torch.tensor([3, 0, 1, 6]), 3)
    assert bool(grad.isfinite().all()) and bool((grad[x.isinf()] == 0).all())


def test_nan_stays_in_its_row():
    x, position = _rows(3, 16, torch.float64)
    x[1, 4] = float("nan")
    _, grad = _close(x, position, 5)
    assert bool(grad[1].isnan().any()) and bool(grad[[0, 2]].isfinite().all())


def test_a_second_derivative_raises():
    x, position = _rows(2, 16, torch.float64)
    x.requires_grad_()
    ranks = sorting_networks.network_label_ranks(x, position, 5, network="bitonic", steepness=1.0, **CAUCHY)
    (grad,) = torch.autograd.grad((ranks**2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_topk_cross_entropy_equals_the_torch_path():
    """The loss with both CPU kernels (this one and the selection's) and its gradient."""
    x = torch.randn(64, 1000, generator=torch.Generator().manual_seed(2))
    target = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(3))
    results = topk_ce_paths(x, target)
    (l1, g1), (l0, g0) = results
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=1e-5 * float(g0.abs().max()))  # float32 sums


def test_where_the_kernel_runs(monkeypatch):
    wires = torch.randn(16, 2, 4)
    assert networks_numba.usable(wires, {**CAUCHY, "steepness": 1.0}, "stand-in")
    assert networks_numba.usable(wires.double(), {**CAUCHY, "steepness": 1.0}, "stand-in")
    assert not networks_numba.usable(wires, {**CAUCHY, "distribution": "logistic", "steepness": 1.0}, "stand-in")
    assert not networks_numba.usable(wires, {**CAUCHY, "steepness": torch.ones(1, 4)}, "stand-in")  # per row
    assert not networks_numba.usable(wires, {**CAUCHY, "steepness": 1.0}, "exact")
    assert not networks_numba.usable(wires.to("meta"), {**CAUCHY, "steepness": 1.0}, "stand-in")
    with triton_gate.torch_path():
        assert not networks_numba.usable(wires, {**CAUCHY, "steepness": 1.0}, "stand-in")
    with accelerator_steps():  # the launch counts of the tests and count_launches.py: an accelerator's path
        assert not networks_numba.usable(wires, {**CAUCHY, "steepness": 1.0}, "stand-in")
    monkeypatch.setattr(isotonic_numba, "available", lambda: False)  # no numba, or SOFTTOPK_NUMBA=0
    assert not networks_numba.usable(wires, {**CAUCHY, "steepness": 1.0}, "stand-in")


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_torch_func_transforms(transform):
    """``torch.func.grad`` and ``vmap`` of the loss agree with the eager kernels."""
    x = torch.randn(4, 40, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    target = torch.randint(0, 40, (4,), generator=torch.Generator().manual_seed(5))

    def loss(v, y):
        return softtopk.topk_cross_entropy(v, y, [0.5, 0.5], m=16, reduction="sum")

    if transform == "grad":
        got = torch.func.grad(loss)(x, target)
    else:
        got = torch.func.vmap(torch.func.grad(lambda v, y: loss(v[None], y[None])))(x, target)
    leaf = x.clone().requires_grad_()
    loss(leaf, target).backward()  # the kernels
    torch.testing.assert_close(got, leaf.grad, rtol=1e-12, atol=1e-12)
