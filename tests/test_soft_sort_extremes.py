"""softtopk.soft_rank and soft_sort at extreme scales and strengths, on both solvers (the CPU rounds,
in linear sums or log-sum-exps, and the fixed-shape merges with an accelerator's base case): finite
values and gradients, ranks summing to n(n+1)/2, sorts monotone and agreeing between the solvers."""

from __future__ import annotations

import pytest
import torch

import softtopk
from softtopk.ops import isotonic_small


def _both_paths(fn, x, monkeypatch):
    leaf = x.clone().requires_grad_()
    rounds = fn(leaf)
    rounds.sum().backward()
    with monkeypatch.context() as patch:  # what an accelerator runs
        patch.setattr("softtopk.ops.isotonic.can_inspect", lambda value: False)
        patch.setattr("softtopk.ops.permutahedron.can_inspect", lambda value: False)
        patch.setattr(isotonic_small, "_cap", lambda device: 128)
        fixed = fn(x)
    return rounds, leaf.grad, fixed


@pytest.mark.parametrize("reg", ["l2", "kl"])
@pytest.mark.parametrize("scale", [1e-6, 1.0, 1e6])
@pytest.mark.parametrize("strength", [1e-6, 1.0, 1e6])
def test_extreme_scales_and_strengths(reg, scale, strength, monkeypatch):
    x = torch.randn(3, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * scale
    x[0, ::7] = x[0, 3]  # ties
    n = x.shape[-1]
    ranks, grad, fixed = _both_paths(
        lambda t: softtopk.soft_rank(t, regularization=reg, strength=strength), x, monkeypatch
    )
    assert ranks.isfinite().all() and grad.isfinite().all()
    # a pooled rank rounds at float64's eps |x / ε| (l2), or that times the rank (kl: w e^δ)
    atol = 1e-9 + 1e-15 * (n * n if reg == "kl" else n) * float(x.abs().max()) / strength
    torch.testing.assert_close(ranks.sum(-1), torch.full((3,), n * (n + 1) / 2, dtype=torch.float64), rtol=0, atol=atol)
    torch.testing.assert_close(fixed, ranks, rtol=1e-9, atol=atol)
    values, grad, fixed = _both_paths(
        lambda t: softtopk.soft_sort(t, regularization=reg, strength=strength), x, monkeypatch
    )
    assert values.isfinite().all() and grad.isfinite().all()
    assert (values.diff(dim=-1) >= -1e-9 * scale).all()
    torch.testing.assert_close(fixed, values, rtol=1e-9, atol=1e-9 * scale)
