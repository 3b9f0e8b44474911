"""Second derivatives are exact or refused, never silently wrong.

A backward that uses tensors saved without their graph (the masks' slopes, NeuralSort's and
SoftSort's ranks, the networks' swap probabilities, top-k CE's head) would give a wrong second
derivative if its recorded graph were differentiated; those backwards are ``once_differentiable``,
so differentiating through them raises. The others record their exact derivative: the sparse mask
and magnitude at ``p = 2`` (piecewise linear), Dykstra's unrolled iteration, the soft sort and rank,
the smooth top-1 SVM and the noised losses; float64 ``gradgradcheck`` holds for them.
"""

from __future__ import annotations

import pytest
import torch

import softtopk

X = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
LABEL = torch.tensor([0, 3, 5])
NOISE = torch.randn(3, 7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

EXACT = {
    "sparse p=2": lambda v: softtopk.sparse_topk_mask(v, 3, l=0.7, p=2),
    "sparse dykstra": lambda v: softtopk.sparse_topk_mask(v, 3, l=0.7, p=2, solver="dykstra"),
    "magnitude p=2": lambda v: softtopk.sparse_topk_mag(v, 3, l=0.7, p=2),
    "soft_rank": lambda v: softtopk.soft_rank(v, strength=0.5),
    "soft_sort kl": lambda v: softtopk.soft_sort(v, regularization="kl", strength=0.5),
    "smooth top-1 svm": lambda v: softtopk.smooth_top1_svm(v, LABEL, reduction="none"),
    "balanced noised": lambda v: softtopk.bal_noised_topk(v, LABEL, k=2, epsilon=0.5, noise=NOISE, reduction="none"),
}

REFUSED = {
    "lapsum": lambda v: softtopk.soft_topk(v, 3, tau=0.7),
    "lapsum k > n/2": lambda v: softtopk.soft_topk(v, 5, tau=0.7),
    "lapsum hard": lambda v: softtopk.soft_topk(v, 3, tau=0.7, hard=True),
    "topk weights": lambda v: softtopk.topk(v, 3).weights,
    "sparse p=4/3": lambda v: softtopk.sparse_topk_mask(v, 3, l=0.7),
    "magnitude p=4/3": lambda v: softtopk.sparse_topk_mag(v, 3, l=0.7),
    "neuralsort": lambda v: softtopk.soft_topk(v, 3, method="neuralsort"),
    "softsort": lambda v: softtopk.soft_topk(v, 3, method="softsort"),
    "splitter network": lambda v: softtopk.soft_topk(v, 3, method="splitter_selection"),
    "bitonic network": lambda v: softtopk.soft_topk(v, 3, method="bitonic"),
    "top-k CE splitter": lambda v: softtopk.topk_cross_entropy(v, LABEL, [0.5, 0.5], m=None, reduction="none"),
    "top-k CE neuralsort": lambda v: softtopk.topk_cross_entropy(
        v, LABEL, [0.5, 0.5], method="neuralsort", m=None, reduction="none"
    ),
    "smooth top-k svm": lambda v: softtopk.smooth_topk_svm(v, LABEL, k=2, reduction="none"),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_second_derivatives(name):
    assert torch.autograd.gradgradcheck(EXACT[name], (X.clone().requires_grad_(),))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_second_derivative_raises(name):
    """The gradient of ``<f(x), w>`` taken with ``create_graph=True`` is the first derivative taken
    without, and backpropagating through it (a gradient penalty's ``backward``) raises."""
    fn = REFUSED[name]
    x = X.clone().requires_grad_()
    out = fn(x)
    w = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2)).requires_grad_()
    (grad,) = torch.autograd.grad((out * w).sum(), x, create_graph=True)
    (want,) = torch.autograd.grad((fn(x) * w.detach()).sum(), x)
    torch.testing.assert_close(grad.detach(), want, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad.square().sum().backward()
