"""The numba kernel of the noised losses' Monte-Carlo (k+1)-th largest score on CPU rows against
the torch path, bit for bit, and where it runs (``softtopk.ops.noised_numba``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import softtopk
from softtopk.ops import isotonic_numba, noised_numba, triton_gate

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import by_value, recorded  # noqa: E402
from dispatch_counter import accelerator_steps  # noqa: E402

pytestmark = pytest.mark.skipif(
    not isotonic_numba.available(), reason="numba is not installed, so there is no kernel to test (pip install numba)"
)

INF, NAN = float("inf"), float("nan")


def _loss_and_grad(x, target, kernel, n_samples=5, **kwargs):
    """``BalNoisedTopK``'s per-row loss and the gradient of its weighted sum, for seeded noise
    given to the loss (its own draws on CPU rows are another kernel's: ``test_noised_draws.py``)."""
    leaf = x.detach().clone().requires_grad_()
    noise = torch.randn(*x.shape, n_samples, generator=torch.Generator().manual_seed(7), dtype=x.dtype)
    with pytest.MonkeyPatch.context() as patch, torch.enable_grad() if kernel else triton_gate.torch_path():
        seen = recorded(patch, noised_numba)
        loss = softtopk.bal_noised_topk(leaf, target, noise=noise, reduction="none", **kwargs)
        (loss * torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype)).sum().backward()
    assert seen == [kernel]
    return loss.detach(), leaf.grad


def _same(x, target, ties=False, **kwargs):
    got, want = (_loss_and_grad(x, target, kernel, **kwargs) for kernel in (True, False))
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)  # the same float sums
    if ties:  # tied draws may put the (k+1)-th on either class: per score, the same gradient
        for a, b in zip(by_value(x, got[1]), by_value(x, want[1]), strict=True):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6, nan_ok=True)
    else:
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("rows", "classes", "k", "samples"), [(64, 1000, 5, 5), (8, 10, 9, 3), (5, 2, 1, 1), (3, 50, 1, 8)]
)
def test_the_kernel_equals_the_torch_path(dtype, rows, classes, k, samples):
    gen = torch.Generator().manual_seed(classes + k)
    x = torch.randn(rows, classes, generator=gen, dtype=dtype)
    target = torch.randint(0, classes, (rows,), generator=gen)
    _same(x, target, k=k, epsilon=0.5, n_samples=samples)


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_extreme_scales(scale):
    x = torch.randn(16, 100, generator=torch.Generator().manual_seed(3)) * scale
    _same(x, torch.arange(16), k=5, epsilon=scale)


def test_ties_infinities_and_nan():
    x = torch.tensor(
        [
            [1.0, INF, -INF, 2, 0, -1, 3, INF] * 3,
            [0.5] * 24,  # every draw tied at epsilon = 0
            [-INF] * 20 + [1.0, 2.0, 3.0, 4.0],
            [1.0, NAN, 0.0, 2.0] * 6,  # NaN ranks first, as in topk
        ]
    )
    target = torch.tensor([2, 0, 21, 0])
    for epsilon in (0.0, 1.0):
        _same(x, target, ties=True, k=3, epsilon=epsilon, n_samples=4)


def test_the_noise_given_by_the_caller_is_not_written():
    x = torch.randn(4, 30, generator=torch.Generator().manual_seed(5), requires_grad=True)
    noise = torch.randn(4, 30, 5, generator=torch.Generator().manual_seed(6))
    kept = noise.clone()
    assert noised_numba.usable(x, noise)
    softtopk.bal_noised_topk(x, torch.arange(4), k=2, epsilon=1.0, noise=noise).backward()
    assert torch.equal(noise, kept) and x.grad is not None


def test_where_the_kernel_runs(monkeypatch):
    x, noise = torch.randn(4, 30), torch.randn(4, 30, 5)
    assert noised_numba.usable(x, noise) and noised_numba.usable(x.double(), noise.double())
    assert not noised_numba.usable(x, noise.double())  # the noise in the scores' dtype only
    assert not noised_numba.usable(x.bfloat16(), noise.bfloat16())  # NumPy has no bfloat16
    assert not noised_numba.usable(x.to("meta"), noise.to("meta"))
    with triton_gate.torch_path():
        assert not noised_numba.usable(x, noise)
    with accelerator_steps():  # the launch counts of the tests and count_launches.py: an accelerator's path
        assert not noised_numba.usable(x, noise)
    seen = []
    torch.func.vmap(lambda row, z: seen.append(noised_numba.usable(row[None], z[None])) or row)(x, noise)
    assert seen == [False]
    monkeypatch.setattr(isotonic_numba, "available", lambda: False)  # no numba, or SOFTTOPK_NUMBA=0
    assert not noised_numba.usable(x, noise)
