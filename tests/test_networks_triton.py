"""The Triton kernels of the networks' label sweep (top-k cross-entropy's relaxation) against the
torch path, values and gradients (in Triton's interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation
from softtopk.ops import networks_triton, sorting_networks, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from triton_kernels import DEVICE, count_kernels, needs_triton  # noqa: E402

pytestmark = needs_triton

INF = float("inf")
NETWORKS = ("splitter_selection", "bitonic", "odd_even")


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts their launches."""
    from softtopk.ops import networks_kernels

    launched = count_kernels(monkeypatch, networks_kernels, "label_forward", "label_backward")
    monkeypatch.setattr(triton_gate, "usable", _usable_on_any_device)
    return launched


def _usable_on_any_device(x, k, scale):
    """``triton_gate.usable`` without its device test: the same scope, compile and vmap excluded."""
    if torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(x):
        return False
    return isinstance(k, int) and isinstance(scale, float)


def _both(x, position, k, network, steepness=10.0, distribution="cauchy"):
    """(ranks, grad) of the torch path and of the kernels for one upstream gradient."""
    g = torch.randn((x.shape[0], k), generator=torch.Generator().manual_seed(1), dtype=x.dtype).to(x.device)
    out = []
    for kernels in (False, True):
        leaf = x.detach().clone().requires_grad_()
        params = {"distribution": distribution, "steepness": steepness, "art_lambda": 0.25}
        if kernels:
            plan = sorting_networks._plan(network, x.shape[-1], k, str(x.device), str(x.dtype))
            far = torch.finfo(x.dtype).max / 8
            ranks = networks_triton.label_sweep(leaf, position, plan, steepness, far)
        else:
            with triton_gate.torch_path():
                ranks = sorting_networks.network_label_ranks(leaf, position, k, network=network, **params)
        (ranks * g).sum().backward()
        out.append((ranks.detach(), leaf.grad))
    return out


def _close(x, position, k, network, steepness=10.0):
    """The kernels' ranks and gradient equal the torch path's: to float64 rounding, and in float32
    as close to the float64 torch path as the float32 torch path is (each layer rounds its swap
    differently: the kernels take atan in float64), up to a few ulps of the largest entry."""
    (r0, g0), (r1, g1) = _both(x, position, k, network, steepness)
    scale = max(1.0, float(g0.abs().amax())) if g0.numel() else 1.0
    if x.dtype == torch.float64:
        torch.testing.assert_close(r1, r0, rtol=0, atol=1e-13)
        torch.testing.assert_close(g1, g0, rtol=0, atol=1e-13 * scale)
        return r1, g1
    (r64, g64), _ = _both(x.double(), position, k, network, steepness)
    for mine, theirs, truth, unit in ((r1, r0, r64, 1.0), (g1, g0, g64, scale)):
        torch_error = float((theirs.double() - truth).abs().max())
        assert float((mine.double() - truth).abs().max()) <= 4 * torch_error + 1e-6 * unit
    return r1, g1


def _rows(rows, n, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=generator, dtype=dtype).sort(-1).values
    return x.to(DEVICE), torch.randint(0, n, (rows,), generator=generator).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize(("rows", "n", "k"), [(13, 16, 5), (3, 7, 3), (3, 40, 10), (2, 64, 20), (4, 2, 1), (3, 1, 1)])
def test_the_kernels_equal_the_torch_path(dtype, network, rows, n, k):
    """Rows of n wires (W a power of 2, spare wires idle), a last program with fewer rows than
    the others (13 rows of 16: eight per program)."""
    x, position = _rows(rows, n, dtype, seed=n + k)
    ranks, _ = _close(x, position, k, network)
    assert bool((ranks.sum(-1) <= 1 + 1e-5).all()) and bool((ranks >= -1e-7).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("steepness", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_scales_and_steepness(dtype, steepness, scale):
    x, position = _rows(6, 16, dtype, seed=3)
    _close(x * scale, position, 5, "splitter_selection", steepness)


# the interpreter computes with numpy, which warns where the largest scores times the steepness
# overflow to inf (then clamped to F, as in the torch path)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(dtype):
    """Tied scores, and ±inf (±F in both paths: every comparison with them saturates, and their
    gradient is 0); the largest finite float32 scores times the steepness overflow to the same."""
    big = torch.finfo(dtype).max
    x = torch.tensor(
        [
            [-INF, -1.0, 0.0, 0.0, 0.0, 2.0, INF, INF],
            [0.0] * 8,
            [-INF, -INF, 1.0, 1.0, 2.0, 3.0, 3.0, 4.0],
            [-big, -1.0, 0.0, 1.0, 2.0, 3.0, big / 2, big],
        ],
        dtype=dtype,
    ).to(DEVICE)
    position = torch.tensor([3, 0, 1, 6]).to(DEVICE)
    ranks, grad = _close(x, position, 3, "splitter_selection")
    assert bool(ranks.isfinite().all()) and bool(grad.isfinite().all())
    assert bool((grad[x.isinf()] == 0).all())


def test_nan_stays_in_its_row():
    """A NaN score spreads through the comparators it meets, as in the torch path, and nowhere else."""
    x, position = _rows(3, 16, torch.float32)
    x[1, 4] = float("nan")
    (r0, g0), (r1, g1) = _both(x, position, 5, "splitter_selection")
    torch.testing.assert_close(r1, r0, rtol=0, atol=2e-6, equal_nan=True)
    assert bool(g1[1].isnan().any()) and bool(g1[[0, 2]].isfinite().all())
    torch.testing.assert_close(g1[[0, 2]], g0[[0, 2]], rtol=0, atol=2e-5)


def test_a_second_derivative_raises():
    """As the torch path's: the first derivative taken with ``create_graph`` is the plain one, and
    backpropagating through it raises."""
    x, position = _rows(2, 16, torch.float64)
    x.requires_grad_()
    plan = sorting_networks._plan("splitter_selection", 16, 5, str(x.device), str(x.dtype))
    ranks = networks_triton.label_sweep(x, position, plan, 10.0, torch.finfo(x.dtype).max / 8)
    w = torch.randn(ranks.shape, dtype=ranks.dtype).to(DEVICE).requires_grad_()
    (grad,) = torch.autograd.grad((ranks * w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_topk_cross_entropy_runs_the_kernels_within_the_launch_budget(kernel_launches, monkeypatch):
    """One fwd+bwd at 64 rows x 1000 classes, m = 16: the kernels' two launches beside the
    selection, head and reduction (issue 21's budget: 96), the same loss and gradient."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    target = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    def loss(s):
        return softtopk.topk_cross_entropy(s, target, [0.2] * 5)

    counts = count_call(loss, logits)
    kernels = len(kernel_launches) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0
    assert counts.launches + kernels <= 96, counts.ops
    values = []
    for kernels_on in (False, True):
        leaf = logits.clone().requires_grad_()
        with triton_gate.torch_path() if not kernels_on else _nothing():
            value = loss(leaf)
        value.backward()
        values.append((value.detach(), leaf.grad))
    torch.testing.assert_close(values[1][0], values[0][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(values[1][1], values[0][1], rtol=0, atol=1e-7)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize(
    "params",
    [
        {"distribution": "logistic"},
        {"steepness": torch.full((4, 1), 5.0)},
        {"m": 100},
    ],
    ids=["logistic", "tensor steepness", "100 wires"],
)
def test_the_torch_path_stays_outside_the_kernels_scope(kernel_launches, params):
    logits, target = torch.randn(4, 200).to(DEVICE), torch.tensor([0, 5, 9, 100]).to(DEVICE)
    params = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    softtopk.topk_cross_entropy(logits, target, [0.5, 0.5], **params)
    assert kernel_launches == []


def test_vmap_keeps_the_torch_path(kernel_launches):
    x, position = _rows(4, 16, torch.float32)
    params = {"distribution": "cauchy", "steepness": 10.0, "art_lambda": 0.25}

    def one(row, pos):
        return sorting_networks.network_label_ranks(row[None], pos[None], 5, network="bitonic", **params)[0]

    torch.func.vmap(one)(x, position)
    assert kernel_launches == []
