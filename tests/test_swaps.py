"""The analytic swap slopes used by the hand-written network backward equal autograd's derivative."""

import pytest
import torch

import softtopk
from conftest import DISTRIBUTIONS
from softtopk.ops.swaps import swap_probability, swap_slope


@pytest.mark.parametrize("steepness", [0.3, 1.0, 25.0])
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_swap_slope_is_the_derivative_of_the_swap_probability(distribution, steepness):
    d = torch.cat(
        [torch.linspace(-4, 4, 801, dtype=torch.float64), torch.tensor([0.0, 1e-9, -1e-9], dtype=torch.float64)]
    )
    d.requires_grad_()
    alpha = swap_probability(d, distribution, steepness, 0.4)
    (expected,) = torch.autograd.grad(alpha.sum(), d)
    slope = swap_slope(d.detach(), alpha.detach(), distribution, steepness, 0.4)
    torch.testing.assert_close(slope, expected, rtol=1e-10, atol=1e-12)
    # symmetry f(-d) = 1 - f(d), which lets both wires of a comparator share one alpha
    torch.testing.assert_close(swap_probability(-d.detach(), distribution, steepness, 0.4), 1 - alpha.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logistic_phi_is_finite_for_huge_differences(dtype):
    # d² overflowed float32 from |d| ~ 2e19 on: the swap probability fell to 1/2 and its slope to NaN
    d = torch.tensor([-1e38, -1e30, -1e20, 1e20, 1e30, 1e38], dtype=dtype)
    alpha = swap_probability(d, "logistic_phi", 1.0, 0.5)
    torch.testing.assert_close(alpha, (d > 0).to(dtype))
    slope = swap_slope(d, alpha, "logistic_phi", 1.0, 0.5)
    assert slope.isfinite().all() and (slope >= 0).all()


def test_top_k_ce_with_logistic_phi_at_huge_logits_has_finite_gradients():
    logits = (1e30 * torch.randn(4, 20, generator=torch.Generator().manual_seed(0))).requires_grad_()
    loss_fn = softtopk.TopKCrossEntropyLoss(
        [0.5, 0.5], method="splitter_selection", distribution="logistic_phi", steepness=1.0
    )
    loss_fn(logits, torch.tensor([0, 5, 10, 15])).backward()
    assert logits.grad.isfinite().all()
