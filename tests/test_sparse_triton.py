"""The Triton kernel of the sparse mask against the torch path, values and gradients (in Triton's
interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import sparse, sparse_triton, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from dispatch_counter import count_call  # noqa: E402
from triton_kernels import DEVICE, count_kernels, needs_triton  # noqa: E402

pytestmark = needs_triton

INF = float("inf")


def _both(x: torch.Tensor, k: int, lam: float, p: float, hard: bool = False):
    """(mask, grad) of the torch path and of the kernel for one upstream gradient."""
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype).to(x.device)
    out = []
    for fn in (
        lambda v: sparse.sparse_mask_rows(v, k, l=lam, p=p, solver="pav", n_iter=1, hard=hard),
        lambda v: sparse_triton.triton_mask(v, k, lam, sparse.exponent(p), hard=hard),
    ):
        leaf = x.detach().clone().requires_grad_()
        with triton_gate.torch_path():  # on a GPU the kernel is the default
            mask = fn(leaf)
        (mask * g).sum().backward()
        out.append((mask.detach(), leaf.grad))
    return out


def _close(x, k, lam, p, hard=False, rows=None):
    """The kernel's mask and gradient equal the torch path's (on ``rows``, default all)."""
    (m0, g0), (m1, g1) = _both(x, k, lam, p, hard)
    rows = slice(None) if rows is None else rows
    tol = 1e-12 if x.dtype == torch.float64 else 2e-6
    torch.testing.assert_close(m1[rows], m0[rows], rtol=0, atol=tol)
    # the gradient grows as 1 / λ: its rounding is relative to its largest entry, not to 1
    scale = max(1.0, float(g0[rows].abs().amax())) if g0[rows].numel() else 1.0
    torch.testing.assert_close(g1[rows], g0[rows], rtol=5 * tol, atol=50 * tol * scale)
    return m1, g1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("p", [4 / 3, 2.0])
@pytest.mark.parametrize(
    ("n", "k", "lam"),
    # 3000: candidates packed over three steps of 1024, few (l = 0.5) or all (l = 50) of the row
    [
        (50, 5, 1.0),
        (50, 25, 0.3),
        (7, 2, 1e-3),
        (3000, 10, 0.5),
        (3000, 10, 50.0),
        (9, 8, 2.0),
        (2, 1, 1.0),
        (100, 10, 100.0),
    ],
)
def test_the_kernel_equals_the_torch_path(dtype, p, n, k, lam):
    x = torch.randn(4, n, generator=torch.Generator().manual_seed(n + k), dtype=dtype).to(DEVICE)
    mask, _ = _close(x, k, lam, p)
    torch.testing.assert_close(mask.sum(-1), torch.full_like(mask[:, 0], float(k)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("scale", [1e-6, 1e6])
@pytest.mark.parametrize("p", [4 / 3, 2.0])
def test_extreme_scales(scale, p):
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(3)).to(DEVICE) * scale
    _close(x, 4, 1.0, p)
    _close(x, 4, scale, p)


def test_ties_and_constant_rows():
    x = torch.tensor([[1.0] * 8, [0, 0, 0, 5, 5, 5, -3, -3], [2, 2, 1, 1, 0, 0, 0, 0]], dtype=torch.float64)
    for k in (1, 3, 6):
        for lam in (0.1, 1.0, 10.0):
            _close(x.to(DEVICE), k, lam, 4 / 3)


@pytest.mark.parametrize("k", [2, 3, 6])
@pytest.mark.parametrize("hard", [False, True])
# the interpreter's numpy warns at inf - inf in the degenerate rows, whose values the rule replaces
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_infinite_rows_follow_the_extended_reals(k, hard):
    x = torch.tensor(
        [
            [1.0, INF, -INF, 2, 0, -1, 3, INF],
            [INF, INF, INF, 0, 1, 2, 3, 4],
            [-INF, -INF, -INF, -INF, -INF, 1, 2, -INF],
            [0.0] * 8,
            [3.4e38, -3.4e38, 1, 2, 0, 0, 0, 0],
        ],
        device=DEVICE,
    )
    mask, grad = _close(x, k, 0.5, 4 / 3, hard)
    assert torch.isfinite(mask).all() and torch.isfinite(grad).all()


def test_nan_stays_in_its_row():
    x = torch.tensor([[1.0, float("nan"), 0.0, 2.0, 5.0], [1.0, 3.0, 0.0, 2.0, 5.0]], device=DEVICE)
    (_, _), (mask, grad) = _both(x, 2, 1.0, 4 / 3)
    assert mask[0].isnan().all() and (grad[0] == 0).all()
    _close(x, 2, 1.0, 4 / 3, rows=slice(1, None))


def test_hard_forward_with_the_soft_gradient():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    mask, _ = _close(x, 5, 1.0, 4 / 3, hard=True)
    assert set(mask.unique().tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_round_the_float64_solution(dtype):
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    leaf = x.to(dtype).requires_grad_()
    mask = sparse_triton.triton_mask(leaf, 10, 1e-3, 3, hard=False)
    mask.sum().backward()
    with triton_gate.torch_path():
        want = sparse.sparse_mask_rows(leaf.detach().double(), 10, l=1e-3, p=4 / 3, solver="pav", n_iter=1)
    torch.testing.assert_close(mask.double(), want, rtol=0, atol=1e-2)
    assert torch.isfinite(leaf.grad).all()  # d = 3 z²/λ is held in float32: 3e3 would overflow float16


def test_an_empty_batch():
    x = torch.empty(0, 10, device=DEVICE, requires_grad=True)
    mask = sparse_triton.triton_mask(x, 3, 1.0, 3, hard=False)
    mask.sum().backward()
    assert mask.shape == (0, 10) and x.grad.shape == (0, 10)


@pytest.fixture
def kernel_launches(monkeypatch):
    """Routes the public operators' CPU rows to the kernels and counts kernel launches (grids)."""
    from softtopk.ops import lapsum_kernels, sparse_kernels

    launched = count_kernels(monkeypatch, sparse_kernels, "mask_forward")
    count_kernels(monkeypatch, lapsum_kernels, "mask_backward", launched=launched)  # the backward's kernel
    monkeypatch.setattr(triton_gate, "usable", lambda x, k, scale: isinstance(k, int) and isinstance(scale, float))
    return launched


def test_the_public_mask_runs_the_kernels_within_the_launch_budget(kernel_launches):
    x = torch.randn(64, 1000, device=DEVICE)
    counts = count_call(lambda v: softtopk.sparse_topk_mask(v, 10, l=1.0), x)
    kernels = len(kernel_launches) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0 and counts.ops["topk"] == 1
    assert counts.launches + kernels <= 32, counts.ops  # issue 21's budget for the sparse mask


def test_the_torch_path_stays_for_a_tensor_lambda_and_dykstra(kernel_launches):
    x = torch.randn(4, 30, device=DEVICE)
    softtopk.sparse_topk_mask(x, 3, l=torch.full((4,), 0.5, device=DEVICE))
    softtopk.sparse_topk_mask(x, 3, l=0.5, p=2.0, solver="dykstra")
    assert kernel_launches == []
    softtopk.sparse_topk_mask(x, 3, l=0.5, p=2.0, solver="dykstra", hard=True)  # hard: the exact mask's gradient
    assert len(kernel_launches) == 1
