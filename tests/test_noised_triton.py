"""The Triton kernels of the noised top-k hinge losses against the torch path on the same draws,
values and gradients (in Triton's interpreter without a GPU: ``triton_kernels.py``), on the path a
CUDA tensor takes (``kthvalue``, no numba)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk import _validation
from softtopk.ops import noised_kernels, noised_triton

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import by_value  # noqa: E402
from dispatch_counter import accelerator_steps, count_call  # noqa: E402
from triton_kernels import DEVICE, both_paths, needs_triton, route_kernels, seeded_rows  # noqa: E402

pytestmark = needs_triton

INF, NAN = float("inf"), float("nan")
KERNELS = ("hinge_forward", "hinge_backward")


def _generator() -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(7)


def _close(x, target, tol: float, imbalanced: bool = False, ties: bool = False, **kwargs) -> None:
    """The loss (reduction 'none') and its gradient on the kernels equal the torch path's on the
    same draws, NaN where it has NaN; with ``ties`` the gradient summed over the classes of equal
    score (of tied scores, ``kthvalue`` may pick any one)."""

    def loss(s):
        if imbalanced:
            counts = list(range(3, 3 + x.shape[1]))
            fn = softtopk.ImbalNoisedTopK(generator=_generator(), cls_num_list=counts, reduction="none", **kwargs)
        else:
            fn = softtopk.BalNoisedTopK(generator=_generator(), reduction="none", **kwargs)
        return fn(s, target)

    with accelerator_steps():
        (v0, g0), (v1, g1) = both_paths(noised_kernels, KERNELS, loss, x)
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol, equal_nan=True)
    if not ties:
        torch.testing.assert_close(g1, g0, rtol=tol, atol=tol, equal_nan=True)
        return
    rows = x.movedim(1, -1).reshape(-1, x.shape[1]).cpu()
    for a, b in zip(by_value(rows, _rows(g1)), by_value(rows, _rows(g0)), strict=True):
        assert a == pytest.approx(b, rel=tol, abs=tol, nan_ok=True)


def _rows(grad: torch.Tensor) -> torch.Tensor:
    return grad.movedim(1, -1).reshape(-1, grad.shape[1]).cpu()


def _target(rows: int, classes: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("k", "epsilon"), [(1, 1.0), (3, 0.5), (5, 0.0), (2, 3.0)])
def test_the_balanced_loss_equals_the_torch_path(dtype, k, epsilon):
    x = seeded_rows(6, 40, dtype, seed=1)
    target = _target(6, 40)
    target[4] = -100  # an ignored row: loss and gradient 0
    _close(x, target, 1e-12 if dtype == torch.float64 else 1e-6, k=k, epsilon=epsilon)


@pytest.mark.parametrize("scale", [1.0, 50.0])
def test_the_imbalanced_loss_equals_the_torch_path(scale):
    x = seeded_rows(5, 30, torch.float64, seed=2)
    _close(x, _target(5, 30, 1), 1e-12, imbalanced=True, k=2, epsilon=0.5, max_m=0.4, scale=scale)


def test_infinities_and_nan():
    x = torch.tensor(
        [
            [INF, 1.0, 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],  # a +inf score: every draw's top
            [INF, INF, INF, 0.0, -1.0, 3.0, 0.5, 0.25],  # (k+1)-th largest at +inf: inf - s_y
            [-INF, -INF, -INF, -INF, -INF, -INF, 1.0, 2.0],  # -inf draws
            [1.0, NAN, 2.0, 0.0, -1.0, 3.0, 0.5, 0.25],  # NaN
            [0.0] * 8,  # all tied
        ],
        dtype=torch.float64,
    ).to(DEVICE)
    for epsilon in (1.0, 0.0):
        _close(x, torch.tensor([1, 4, 6, 2, 3]).to(DEVICE), 1e-12, ties=True, k=2, epsilon=epsilon)


def test_more_dimensions():
    x = seeded_rows(12, 16, torch.float32, seed=3).reshape(3, 4, 16).transpose(1, 2)  # (N, C, d)
    _close(x, _target(12, 16, 2).reshape(3, 4), 1e-6, k=2, epsilon=1.0)


def test_a_given_noise_and_large_blocks_keep_the_torch_path(monkeypatch):
    launched = route_kernels(monkeypatch, noised_kernels, *KERNELS)
    x = seeded_rows(2, 20, torch.float32, seed=4).requires_grad_()
    noise = torch.randn(2, 20, 5, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with accelerator_steps():
        softtopk.bal_noised_topk(x, _target(2, 20), k=2, epsilon=1.0, noise=noise).backward()  # pytopk's order
        monkeypatch.setattr(noised_triton, "MAX_BLOCK", 32 * 8 - 1)
        softtopk.bal_noised_topk(x, _target(2, 20), k=2, epsilon=1.0).backward()
    assert launched == []


def test_a_second_derivative_raises(monkeypatch):
    route_kernels(monkeypatch, noised_kernels, *KERNELS)
    x = seeded_rows(2, 20, torch.float64, seed=5).requires_grad_()
    with accelerator_steps():
        loss = softtopk.bal_noised_topk(x, _target(2, 20), k=2, epsilon=1.0, reduction="none")
    w = torch.ones_like(loss).requires_grad_()  # an upstream gradient with a graph of its own
    (grad,) = torch.autograd.grad((loss * w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.sum().backward()


def test_the_loss_runs_the_kernels_within_the_launch_budget(monkeypatch):
    """One fwd+bwd of ``BalNoisedTopK(5, epsilon=1)`` at 64 rows x 1000 classes: the draw, the two
    kernels and the class-loss reduction (issue 21's budget: 24); no value read."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    launched = route_kernels(monkeypatch, noised_kernels, *KERNELS)
    logits = seeded_rows(64, 1000, torch.float32, seed=6)
    target = _target(64, 1000, 3)
    loss = softtopk.BalNoisedTopK(5, epsilon=1.0)
    counts = count_call(lambda s: loss(s, target), logits)
    kernels = len(launched) - 1  # count_call runs a warm-up forward first
    assert kernels == 2 and counts.reads == 0
    assert counts.launches + kernels <= 16, counts.ops
