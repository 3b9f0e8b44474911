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
from triton_kernels import DEVICE, both_paths, count_kernels, needs_triton, route_kernels, seeded_rows  # noqa: E402

pytestmark = needs_triton

INF, NAN = float("inf"), float("nan")
KERNELS = ("hinge_forward", "hinge_backward")


def _generator() -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(7)


def _close(x, target, tol: float, imbalanced: bool = False, ties: bool = False, launches: int = 2, **kwargs):
    """The loss (reduction 'none' unless given) and its gradient on the kernels (``launches`` of
    them) equal the torch path's on the same draws, NaN where it has NaN; with ``ties`` the
    gradient summed over the classes of equal score (of tied scores, ``kthvalue`` may pick any
    one). Returns the kernels' loss and gradient."""

    def loss(s):
        return _loss(imbalanced, **{"reduction": "none", **kwargs})(s, target)

    with accelerator_steps():
        (v0, g0), (v1, g1) = both_paths(noised_kernels, KERNELS, loss, x, launches)
    torch.testing.assert_close(v1, v0, rtol=tol, atol=tol, equal_nan=True)
    if not ties:
        torch.testing.assert_close(g1, g0, rtol=tol, atol=tol, equal_nan=True)
        return v1, g1
    rows = x.movedim(1, -1).reshape(-1, x.shape[1]).cpu()
    for a, b in zip(by_value(rows, _rows(g1)), by_value(rows, _rows(g0)), strict=True):
        assert a == pytest.approx(b, rel=tol, abs=tol, nan_ok=True)
    return v1, g1


def _loss(imbalanced: bool, **kwargs):
    """The balanced or imbalanced loss (classes counted 3, 4, ...: as many as the scores have),
    drawing from a fixed generator."""
    if not imbalanced:
        return softtopk.BalNoisedTopK(generator=_generator(), **kwargs)

    def imbalanced_loss(s, target):
        counts = list(range(3, 3 + s.shape[1]))
        return softtopk.ImbalNoisedTopK(generator=_generator(), cls_num_list=counts, **kwargs)(s, target)

    return imbalanced_loss


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
    kernels and the reduction's (issue 21's budget: 24), in one autograd node; no value read."""
    from softtopk.ops import reduce_kernels

    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    launched = route_kernels(monkeypatch, noised_kernels, *KERNELS)
    count_kernels(monkeypatch, reduce_kernels, "reduce_rows", launched=launched)
    logits = seeded_rows(64, 1000, torch.float32, seed=6)
    target = _target(64, 1000, 3)
    loss = softtopk.BalNoisedTopK(5, epsilon=1.0)
    counts = count_call(lambda s: loss(s, target), logits)
    kernels = len(launched) - 2  # count_call runs a warm-up forward first
    assert kernels == 3 and counts.reads == 0
    assert counts.launches + kernels <= 14, counts.ops
    with accelerator_steps():  # the path a CUDA tensor takes (no numba draws)
        assert type(loss(logits.requires_grad_(), target).grad_fn).__name__ == "TritonNoisedHingeBackward"


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("imbalanced", [False, True])
def test_the_reduction_in_the_kernels_equals_the_torch_path(reduction, imbalanced):
    """'mean' and 'sum' by the reduction's kernel: the torch path's within the last bits (a sum in
    another order), ignored rows left out; every row ignored, or none at all, gives 0."""
    x = seeded_rows(6, 12, torch.float64, seed=8)
    target = _target(6, 12, 4)
    target[1] = -100
    kwargs = {"k": 2, "epsilon": 0.5, "reduction": reduction}
    if imbalanced:
        kwargs |= {"max_m": 0.3, "scale": 2.0}
    for rows, labels in ((x, target), (x, torch.full_like(target, -100)), (x[:0], target[:0])):
        value, grad = _close(rows, labels, 1e-14, imbalanced=imbalanced, launches=2 if len(rows) else 0, **kwargs)
        assert value.dim() == 0 and (bool(value != 0) if labels.ne(-100).any() else value.item() == 0.0)
        assert bool(grad[1].eq(0).all()) if len(rows) else grad.numel() == 0
