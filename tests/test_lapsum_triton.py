"""The Triton kernels of the Laplace mask against the torch path, values and gradients (in Triton's
interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import lapsum, lapsum_triton, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from extended_rows import EXTENDED_ROWS  # noqa: E402
from triton_kernels import DEVICE, count_kernels, needs_triton  # noqa: E402

pytestmark = needs_triton

CONSTANTS = {"clamp": lapsum._C, "floor": lapsum._FLOOR}


def _on_the_torch_path(fn, *args, **kwargs):
    with triton_gate.torch_path():  # on a GPU the kernels are the default
        return fn(*args, **kwargs)


def _both(x: torch.Tensor, k: int, tau: float, hard: bool = False):
    """(mask, grad) of the torch path and of the kernels for one upstream gradient."""
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype).to(x.device)
    out = []
    for fn in (
        lambda v: _on_the_torch_path(lapsum.lapsum_mask, v, k, tau, hard=hard),
        lambda v: lapsum_triton.kernel_mask(v, k, tau, hard=hard, **CONSTANTS),
    ):
        leaf = x.detach().clone().requires_grad_()
        mask = fn(leaf)
        (mask * g).sum().backward()
        out.append((mask, leaf.grad))
    return out


def _close(x, k, tau, hard=False):
    (m0, g0), (m1, g1) = _both(x, k, tau, hard)
    tol = 1e-12 if x.dtype == torch.float64 else 2e-6
    torch.testing.assert_close(m1, m0, rtol=0, atol=tol, equal_nan=True)
    # the gradient grows as 1 / tau: its rounding is relative to its largest entry, not to 1
    scale = max(1.0, float(g0.abs().nan_to_num(posinf=0.0).amax()))
    torch.testing.assert_close(g1, g0, rtol=5 * tol, atol=50 * tol * scale, equal_nan=True)
    return m1, g1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("n", "k", "tau"),
    [(50, 5, 1.0), (50, 25, 0.3), (50, 30, 0.3), (7, 2, 1e-3), (3000, 10, 0.5), (9, 8, 2.0), (2, 1, 1.0)],
)
def test_kernels_equal_the_torch_path(dtype, n, k, tau):
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n + k), dtype=dtype).to(DEVICE)
    mask, _ = _close(x, k, tau)
    torch.testing.assert_close(mask.sum(-1), torch.full_like(mask[:, 0], float(k)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_extreme_scales(scale):
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(3)).to(DEVICE) * scale
    _close(x, 4, 1.0)
    _close(x, 4, scale)


@pytest.mark.parametrize("k", [2, 3, 6])
def test_infinite_and_tied_rows_follow_the_extended_reals(k):
    mask, grad = _close(torch.tensor(EXTENDED_ROWS, device=DEVICE), k, 0.7)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()


def test_nan_stays_in_its_row():
    x = torch.tensor([[1.0, float("nan"), 0.0, 2.0], [1.0, 3.0, 0.0, 2.0]], device=DEVICE)
    mask, _ = _close(x, 2, 1.0)
    assert mask[0].isnan().all() and not mask[1].isnan().any()


def test_hard_forward_with_the_soft_gradient():
    _close(torch.randn(4, 50, generator=torch.Generator().manual_seed(5)).to(DEVICE), 5, 1.0, hard=True)


def test_an_empty_batch():
    x = torch.empty(0, 10, device=DEVICE, requires_grad=True)
    mask = lapsum_triton.kernel_mask(x, 3, 1.0, hard=False, **CONSTANTS)
    mask.sum().backward()
    assert mask.shape == (0, 10) and x.grad.shape == (0, 10)


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes the public operators' CPU rows to the kernels and counts kernel launches (grids)."""
    from softtopk.ops import lapsum_kernels

    launched = count_kernels(monkeypatch, lapsum_kernels, "mask_forward", "mask_backward")
    monkeypatch.setattr(triton_gate, "usable", lambda x, k, tau: isinstance(k, int) and isinstance(tau, float))
    return launched


def test_topk_weights_through_the_kernels_equal_the_torch_path(kernel_launches, monkeypatch):
    route = [True]
    monkeypatch.setattr(triton_gate, "usable", lambda x, k, tau: route[0] and isinstance(tau, float))
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    g = torch.randn(8, 4, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    for hard in (False, True):
        results = []
        for route[0] in (True, False):
            leaf = x.clone().requires_grad_()
            values, indices, weights = softtopk.topk(leaf, 4, hard=hard, tau=0.5)
            (weights * g).sum().backward()
            results.append((values.detach(), indices, weights.detach(), leaf.grad))
        for got, want in zip(*results, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    assert len(kernel_launches) == 4  # forward and backward, soft and hard


BUDGETS = {  # issue 21's budgets for one forward + backward at 64 x 1000, k = 10
    "lapsum": (lambda v: softtopk.soft_topk(v, 10, tau=1.0), 16),
    "lapsum hard": (lambda v: softtopk.soft_topk(v, 10, tau=1.0, hard=True), 20),
    "gumbel": (
        lambda v: softtopk.soft_topk(v, 10, method="gumbel", generator=torch.Generator(v.device).manual_seed(0)),
        24,
    ),
}


@pytest.mark.parametrize("name", list(BUDGETS))
def test_the_kernels_meet_the_launch_budgets(kernel_launches, name):
    fn, budget = BUDGETS[name]
    counts = count_call(fn, torch.randn(64, 1000, device=DEVICE))
    kernels = len(kernel_launches) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0 and counts.ops["topk"] == 1 + (name == "lapsum hard")
    assert counts.launches + kernels <= budget, counts.ops


def test_the_kernels_are_on_unless_switched_off():
    assert triton_gate.switched_on(None) and triton_gate.switched_on("1")
    assert not triton_gate.switched_on("0")


def test_the_torch_path_runs_off_cuda_and_for_tensor_arguments(monkeypatch):
    x = torch.randn(2, 8)
    monkeypatch.setattr(triton_gate, "ENABLED", True)
    assert not triton_gate.usable(x, 2, 1.0)  # a CPU tensor
    cuda_like = x.to("meta")
    assert not triton_gate.usable(cuda_like, 2, 1.0)
    assert not triton_gate.usable(x, torch.tensor([[2.0]]), 1.0)  # a tensor k
    assert not triton_gate.usable(x, 2, torch.tensor(1.0))  # a tensor tau


def test_the_kernels_need_an_nvidia_gpu_of_capability_8(monkeypatch):
    check = triton_gate._supported.__wrapped__  # the cached check, uncached
    monkeypatch.setattr(torch.version, "hip", None)
    for capability, expected in (((7, 5), False), ((8, 0), True), ((9, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert check(torch.device("cuda")) is expected
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert check(torch.device("cuda")) is False


@pytest.mark.parametrize("mask", ["sparse", "lapsum"])
def test_a_second_derivative_raises_instead_of_being_zero(mask):
    """The kernels' backward (``ImplicitMask``, both masks') is not differentiable: double backward
    raises, as PyTorch's once-differentiable kernels do, where a silent zero would be wrong."""
    from softtopk.ops import sparse_triton

    x = torch.randn(3, 20, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(DEVICE)
    x.requires_grad_()
    if mask == "sparse":
        out = sparse_triton.triton_mask(x, 4, 0.5, 3, hard=False)
    else:
        out = lapsum_triton.kernel_mask(x, 4, 0.5, hard=False, clamp=lapsum._C, floor=lapsum._FLOOR)
    (grad,) = torch.autograd.grad((out * out).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()
