"""The Triton kernels of the networks' label sweep (top-k cross-entropy's relaxation) and mask
(``soft_topk`` with a network) against the torch path, values and gradients (in Triton's
interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation
from softtopk.ops import networks_kernels, sorting_networks, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from extended_rows import sweep_rows  # noqa: E402
from triton_kernels import DEVICE, both_paths, count_loss_kernels, needs_triton, route_kernels  # noqa: E402

pytestmark = needs_triton

INF = float("inf")
NETWORKS = ("splitter_selection", "bitonic", "odd_even")
KERNELS = ("label_forward", "label_backward", "mask_forward", "mask_backward")
SWEEPS = ("label", "mask")  # the label's ranks (top-k CE) and the mask (soft_topk)


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes CPU rows to the kernels (as a CUDA tensor goes) and counts their launches."""
    return route_kernels(monkeypatch, networks_kernels, *KERNELS)


def _both(x, position, k, network, steepness=10.0):
    """(output, grad) of the torch path and of the kernels for one upstream gradient: the label's
    ranks ``P[b, position[b], :k]`` (B, k) for a ``position``, else the mask (B, n)."""
    params = {"distribution": "cauchy", "steepness": steepness, "art_lambda": 0.25}

    def call(leaf):
        if position is None:
            return sorting_networks.network_mask(leaf, k, network=network, **params)
        return sorting_networks.network_label_ranks(leaf, position, k, network=network, **params)

    return both_paths(networks_kernels, KERNELS, call, x)


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


def _rows(rows, n, dtype, sweep, seed=0):
    """Scores (top-k CE feeds its selected scores sorted; the mask takes them as they come) and,
    for the label sweep, a label position per row (None for the mask)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=generator, dtype=dtype)
    if sweep == "mask":
        return x.to(DEVICE), None
    return x.sort(-1).values.to(DEVICE), torch.randint(0, n, (rows,), generator=generator).to(DEVICE)


# (rows, n, k): W a power of 2 with spare wires idle, a last program with fewer rows than the others
# (13 rows of 16: eight per program); the mask up to the 1024 wires of a program
SIZES = {
    "label": [(13, 16, 5), (3, 7, 3), (3, 40, 10), (2, 64, 20), (4, 2, 1), (3, 1, 1)],
    "mask": [(13, 16, 5), (3, 7, 3), (2, 20, 18), (2, 300, 10), (1, 1000, 10)],
}
CASES = [
    (sweep, network, *size)
    for sweep in SWEEPS
    for network in NETWORKS
    for size in SIZES[sweep]
    if network != "odd_even" or size[1] <= 64  # odd_even has n layers
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("sweep", "network", "rows", "n", "k"), CASES)
def test_the_kernels_equal_the_torch_path(dtype, sweep, network, rows, n, k):
    x, position = _rows(rows, n, dtype, sweep, seed=n + k)
    out, _ = _close(x, position, k, network)
    if sweep == "label":
        assert bool((out.sum(-1) <= 1 + 1e-5).all()) and bool((out >= -1e-7).all())
    else:
        torch.testing.assert_close(out.sum(-1), torch.full_like(out[:, 0], float(k)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("steepness", [1e-3, 1.0, 1e3])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
def test_scales_and_steepness(sweep, dtype, steepness, scale):
    x, position = _rows(6, 16, dtype, sweep, seed=3)
    _close(x * scale, position, 5, "splitter_selection", steepness)


# the interpreter computes with numpy, which warns where the largest scores times the steepness
# overflow to inf (then clamped to F, as in the torch path)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("sweep", SWEEPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ties_and_infinities(sweep, dtype):
    """Tied scores, and ±inf (±F in both paths: every comparison with them saturates, and their
    gradient is 0); the largest finite float32 scores times the steepness overflow to the same."""
    x = torch.tensor(sweep_rows(torch.finfo(dtype).max), dtype=dtype).to(DEVICE)
    position = torch.tensor([3, 0, 1, 6]).to(DEVICE) if sweep == "label" else None
    ranks, grad = _close(x, position, 3, "splitter_selection")
    assert bool(ranks.isfinite().all()) and bool(grad.isfinite().all())
    assert bool((grad[x.isinf()] == 0).all())


@pytest.mark.parametrize("sweep", SWEEPS)
def test_nan_stays_in_its_row(sweep):
    """A NaN score spreads through the comparators it meets, as in the torch path, and nowhere else."""
    x, position = _rows(3, 16, torch.float32, sweep)
    x[1, 4] = float("nan")
    (r0, g0), (r1, g1) = _both(x, position, 5, "splitter_selection")
    torch.testing.assert_close(r1, r0, rtol=0, atol=2e-6, equal_nan=True)
    assert bool(g1[1].isnan().any()) and bool(g1[[0, 2]].isfinite().all())
    torch.testing.assert_close(g1[[0, 2]], g0[[0, 2]], rtol=0, atol=2e-5)


@pytest.mark.parametrize("sweep", SWEEPS)
def test_a_second_derivative_raises(sweep, kernel_launches):
    """As the torch path's: the first derivative taken with ``create_graph`` is the plain one, and
    backpropagating through it raises."""
    x, position = _rows(2, 16, torch.float64, sweep)
    x.requires_grad_()
    params = {"network": "splitter_selection", "distribution": "cauchy", "steepness": 10.0, "art_lambda": 0.25}
    if sweep == "mask":
        out = sorting_networks.network_mask(x, 5, **params)
    else:
        out = sorting_networks.network_label_ranks(x, position, 5, **params)
    w = torch.randn(out.shape, dtype=out.dtype).to(DEVICE).requires_grad_()
    (grad,) = torch.autograd.grad((out * w).sum(), x, create_graph=True)
    assert len(kernel_launches) == 2
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

    own = count_loss_kernels(monkeypatch)  # the selection's, the head's and the mean's kernels
    counts = count_call(loss, logits)
    kernels = len(kernel_launches) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and len(own) - 3 == 4 and counts.reads == 0
    assert counts.launches + kernels + 4 <= 96, counts.ops
    _same_with_and_without_kernels(loss, logits, rtol=1e-6, atol=1e-7)


def test_the_network_mask_runs_the_kernels_within_the_launch_budget(kernel_launches):
    """``soft_topk(x, 10, method='splitter_selection')`` on rows of 1000: the two kernels and the
    rule for rows of infinities (issue 21's budget for the splitter network at 64 x 1000: 256).
    Two rows, not 64: this call launches the same ops at any row count (``launches.md`` counts 64),
    and the interpreter runs each row's program in turn (64 rows take minutes)."""
    x = torch.randn(2, 1000, generator=torch.Generator().manual_seed(2)).to(DEVICE)

    def mask(v):
        return softtopk.soft_topk(v, 10, method="splitter_selection")

    counts = count_call(mask, x)
    kernels = len(kernel_launches) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0
    assert counts.launches + kernels <= 256, counts.ops
    _same_with_and_without_kernels(mask, x, rtol=0, atol=2e-6)


def _same_with_and_without_kernels(fn, x, rtol, atol):
    """``fn(x)`` and its gradient for ``<fn(x), g>`` by the torch path and by the kernels."""
    results = []
    for route in (triton_gate.torch_path(), contextlib.nullcontext()):
        leaf = x.clone().requires_grad_()
        with route:
            value = fn(leaf)
        (value * torch.ones_like(value)).sum().backward()
        results.append((value.detach(), leaf.grad))
    (v0, g0), (v1, g1) = results
    torch.testing.assert_close(v1, v0, rtol=rtol, atol=atol)
    torch.testing.assert_close(g1, g0, rtol=0, atol=atol * max(1.0, float(g0.abs().max())))


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


@pytest.mark.parametrize(
    ("n", "params"),
    [(2000, {}), (100, {"distribution": "logistic"}), (100, {"steepness": torch.full((4,), 5.0)})],
    ids=["2000 wires", "logistic", "tensor steepness"],
)
def test_the_mask_keeps_the_torch_path_outside_the_kernels_scope(kernel_launches, n, params):
    params = {k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for k, v in params.items()}
    softtopk.soft_topk(torch.randn(4, n).to(DEVICE), 5, method="splitter_selection", **params)
    assert kernel_launches == []


@pytest.mark.parametrize("sweep", SWEEPS)
def test_vmap_keeps_the_torch_path(kernel_launches, sweep):
    x, position = _rows(4, 16, torch.float32, "label")
    params = {"network": "bitonic", "distribution": "cauchy", "steepness": 10.0, "art_lambda": 0.25}

    def one(row, pos):
        if sweep == "mask":
            return sorting_networks.network_mask(row[None], 5, **params)[0]
        return sorting_networks.network_label_ranks(row[None], pos[None], 5, **params)[0]

    torch.func.vmap(one)(x, position)
    assert kernel_launches == []
