"""The analytic swap slopes used by the hand-written network backward equal autograd's derivative."""

import pytest
import torch

from conftest import DISTRIBUTIONS
from softtopk.ops.swaps import swap_probability, swap_slope


@pytest.mark.parametrize("steepness", [0.3, 1.0, 25.0])
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_swap_slope_is_the_derivative_of_the_swap_probability(distribution, steepness):
    d = torch.cat([torch.linspace(-4, 4, 801, dtype=torch.float64), torch.tensor([0.0, 1e-9, -1e-9], dtype=torch.float64)])
    d.requires_grad_()
    alpha = swap_probability(d, distribution, steepness, 0.4)
    (expected,) = torch.autograd.grad(alpha.sum(), d)
    slope = swap_slope(d.detach(), alpha.detach(), distribution, steepness, 0.4)
    torch.testing.assert_close(slope, expected, rtol=1e-10, atol=1e-12)
    # symmetry f(-d) = 1 - f(d), which lets both wires of a comparator share one alpha
    torch.testing.assert_close(swap_probability(-d.detach(), distribution, steepness, 0.4), 1 - alpha.detach())
