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


@pytest.mark.parametrize("name", ["SoftRank", "SoftSort"])
@pytest.mark.parametrize("reg", ["l2", "kl"])
def test_sorting_modules_match_functional_and_learn_their_strength(name, reg):
    module, function = getattr(softtopk, name), getattr(softtopk, name.replace("Soft", "soft_").lower())
    x = torch.randn(2, 5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    layer = module(regularization=reg, strength=0.5, dim=1, descending=True)
    torch.testing.assert_close(layer(x), function(x, regularization=reg, strength=0.5, dim=1, descending=True))
    # a Parameter strength (one per row) is learnable and saved; a plain tensor is a buffer
    strength = torch.nn.Parameter(torch.full((2, 7), 0.5, dtype=torch.float64))
    layer = module(regularization=reg, strength=strength, dim=1)
    layer(x).pow(2).sum().backward()
    assert [n for n, _ in layer.named_parameters()] == ["strength"] and strength.grad.abs().sum() > 0
    buffered = module(strength=torch.full((2, 7), 0.5)).double()
    assert "strength" in buffered.state_dict() and not list(buffered.parameters())
    assert buffered.strength.dtype == torch.float64
    torch.testing.assert_close(buffered(x.transpose(1, 2)), function(x.transpose(1, 2), strength=0.5))
    assert repr(layer) == f"{name}(regularization={reg!r}, strength=<tensor>, dim=1)"
    assert repr(module(strength=2.0, descending=True)).endswith("strength=2.0, dim=-1, descending=True)")


def test_sorting_modules_check_parameters_at_construction():
    with pytest.raises(ValueError, match=r"regularization must be one of \('l2', 'kl'\), got 'l1'"):
        softtopk.SoftRank(regularization="l1")
    with pytest.raises(ValueError, match="strength must be a positive finite number, got 0"):
        softtopk.SoftSort(strength=0.0)
    with pytest.raises(TypeError, match="strength must be a floating tensor"):
        softtopk.SoftSort(strength=torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="descending must be a bool, got str 'yes'"):
        softtopk.SoftRank(descending="yes")
    with pytest.raises(TypeError, match="dim must be an int, got float 1.0"):
        softtopk.SoftRank(dim=1.0)
