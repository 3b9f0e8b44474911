"""Module twins of the operators: parity with the functional API, construction-time checks, repr."""

import pytest
import torch

import softtopk
from conftest import RANK_METHODS, method_params


@pytest.mark.parametrize("method", RANK_METHODS)
def test_modules_match_functional(method):
    x = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(0))
    params = method_params(method)
    torch.testing.assert_close(
        softtopk.SoftTopK(4, method=method, dim=1, **params)(x.transpose(1, 2)),
        softtopk.soft_topk(x.transpose(1, 2), 4, method=method, dim=1, **params),
    )
    torch.testing.assert_close(
        softtopk.SoftTopKRanks(4, method=method, **params)(x), softtopk.soft_topk_ranks(x, 4, method=method, **params)
    )


def test_modules_check_parameters_at_construction():
    with pytest.raises(ValueError, match="method must be one of"):
        softtopk.SoftTopK(2, method="bogus")
    with pytest.raises(ValueError, match="tau must be a positive finite number, got -1"):
        softtopk.SoftTopKRanks(2, method="softsort", tau=-1.0)


def test_module_repr_names_method_and_parameters():
    text = repr(softtopk.SoftTopKRanks(3, method="bitonic", steepness=2.0))
    assert "k=3" in text and "method='bitonic'" in text and "steepness=2.0" in text


@pytest.mark.parametrize("method", RANK_METHODS)
def test_vmap_and_func_grad_match_batched_calls(method):
    """torch.func transforms: vmap of the operators equals the batched call, and vmap(grad) equals
    per-row autograd (the network sweeps have a vmap rule that folds the vmapped axis into the batch)."""
    x = torch.randn(4, 3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    params = method_params(method)
    torch.testing.assert_close(
        torch.vmap(lambda t: softtopk.soft_topk_ranks(t, 3, method=method, **params))(x),
        softtopk.soft_topk_ranks(x, 3, method=method, **params),
    )
    weights = torch.arange(1.0, 9.0, dtype=torch.float64)

    def objective(t):
        return (softtopk.soft_topk(t, 3, method=method, **params) * weights).sum()

    expected = torch.stack([torch.autograd.grad(objective(row.requires_grad_()), row)[0] for row in x.clone()])
    torch.testing.assert_close(torch.vmap(torch.func.grad(objective))(x), expected)
