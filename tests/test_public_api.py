"""The public surface: every name of softtopk 0.1.0 still resolves (old spellings through aliases that
warn), functions and their Module twins take the same parameters, and the version is exposed."""

from __future__ import annotations

import importlib
import inspect
import warnings

import pytest
import torch

import softtopk

# every public name of 0.1.0, by module (their __all__ before the library/lab redesign)
NAMES_0_1_0 = {
    "softtopk": [
        "BalNoisedTopK",
        "DifferentiableKNN",
        "ImbalNoisedTopK",
        "MethodInfo",
        "SmoothTop1SVM",
        "SmoothTopkSVM",
        "SoftTopK",
        "SoftTopKRanks",
        "Top1SVM",
        "TopKCrossEntropyLoss",
        "TopkSVM",
        "bal_noised_topk",
        "functional",
        "gumbel_topk",
        "hard_topk_mag",
        "hard_topk_mask",
        "imbal_noised_topk",
        "methods",
        "noised_kth_value",
        "perturbed_topk",
        "smooth_top1_svm",
        "smooth_topk_svm",
        "soft_permutation",
        "soft_topk",
        "soft_topk_ranks",
        "sparse_topk_mag",
        "sparse_topk_mask",
        "top1_svm",
        "topk_cross_entropy",
        "topk_svm",
    ],
    "softtopk.functional": [
        "bal_noised_topk",
        "gumbel_topk",
        "hard_topk_mag",
        "hard_topk_mask",
        "imbal_noised_topk",
        "methods",
        "noised_kth_value",
        "perturbed_topk",
        "smooth_top1_svm",
        "smooth_topk_svm",
        "soft_permutation",
        "soft_topk",
        "soft_topk_ranks",
        "sparse_topk_mag",
        "sparse_topk_mask",
        "top1_svm",
        "topk_cross_entropy",
        "topk_svm",
    ],
    "softtopk.nn": [
        "BalNoisedTopK",
        "DifferentiableKNN",
        "ImbalNoisedTopK",
        "KNNOutput",
        "SmoothTop1SVM",
        "SmoothTopkSVM",
        "SoftTopK",
        "SoftTopKRanks",
        "Top1SVM",
        "TopKCrossEntropyLoss",
        "TopkSVM",
    ],
    "softtopk.compat.difftopk": [
        "DiffSortNet",
        "DiffTopkNet",
        "NeuralSort",
        "SmoothHardTopKLoss",
        "SmoothTopKLoss",
        "SoftSort",
        "TopKCrossEntropyLoss",
    ],
    "softtopk.compat.pytopk": ["BalNoisedTopK", "ImbalNoisedTopK", "NoisedTopK"],
    "softtopk.compat.smooth_topk": ["MaxTop1SVM", "MaxTopkSVM", "SmoothTop1SVM", "SmoothTopkSVM"],
    "softtopk.compat.sparse_soft_topk": [
        "hard_topk_mag",
        "hard_topk_mask",
        "sparse_soft_topk_mag_dykstra",
        "sparse_soft_topk_mag_pav",
        "sparse_soft_topk_mask_dykstra",
        "sparse_soft_topk_mask_pav",
    ],
    "softtopk.compat.subsets": ["SubsetOperator", "SubsetsDKNN"],
}
RENAMED = {"SmoothTopkSVM": "SmoothTopKSVM", "TopkSVM": "TopKSVM"}


@pytest.mark.parametrize("module", sorted(NAMES_0_1_0))
def test_every_0_1_0_name_still_resolves_and_is_exported(module):
    imported = importlib.import_module(module)
    for name in NAMES_0_1_0[module]:
        assert hasattr(imported, name), f"{module}.{name} is gone"
        assert name in imported.__all__, f"{module}.{name} is not in __all__"


@pytest.mark.parametrize("face", ["softtopk", "softtopk.functional", "softtopk.nn", "softtopk.losses"])
def test_faces_export_what_they_list(face):
    imported = importlib.import_module(face)
    assert sorted(imported.__all__) == sorted(set(imported.__all__))
    for name in imported.__all__:
        assert getattr(imported, name) is not None


def test_the_package_lists_exactly_the_faces_names():
    """``softtopk.__all__`` repeats the names the faces import (it must know them without importing
    torch): every function and Module, the kNN's result type left to ``softtopk.nn``."""
    faces = {*softtopk.functional.__all__, *softtopk.nn.__all__} - {"KNNOutput"}
    assert set(softtopk.__all__) == faces | {"MethodInfo", "TopK", "functional", "losses", "nn"}


@pytest.mark.parametrize("old,new", sorted(RENAMED.items()))
def test_old_spellings_warn_and_keep_their_signature(old, new):
    x, y = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3])
    with pytest.warns(FutureWarning, match=f"softtopk.{old} is deprecated .* use softtopk.{new}"):
        loss = getattr(softtopk, old)(6, k=2)
    assert isinstance(loss, getattr(softtopk, new)) and loss.n_classes == 6
    torch.testing.assert_close(loss(x, y), getattr(softtopk, new)(k=2)(x, y))
    with pytest.raises(ValueError, match="built with n_classes = 6"):
        loss(torch.randn(4, 7), y)
    with pytest.raises(ValueError, match="k must satisfy 1 <= k <= 5"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        getattr(softtopk.nn, old)(6, k=6)


TENSORS = {"x", "input", "target", "noise"}
TWINS = [
    (softtopk.soft_topk, softtopk.SoftTopK),
    (softtopk.soft_topk_ranks, softtopk.SoftTopKRanks),
    (softtopk.topk_cross_entropy, softtopk.TopKCrossEntropyLoss),
    (softtopk.smooth_topk_svm, softtopk.SmoothTopKSVM),
    (softtopk.smooth_top1_svm, softtopk.SmoothTop1SVM),
    (softtopk.topk_svm, softtopk.TopKSVM),
    (softtopk.top1_svm, softtopk.Top1SVM),
    (softtopk.bal_noised_topk, softtopk.BalNoisedTopK),
    (softtopk.imbal_noised_topk, softtopk.ImbalNoisedTopK),
    (softtopk.soft_rank, softtopk.SoftRank),
    (softtopk.soft_sort, softtopk.SoftSort),
    (softtopk.spearman_loss, softtopk.SpearmanLoss),
]


def _parameters(callable_, keep) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(callable_).parameters.values() if keep(p.name)]


@pytest.mark.parametrize("function,module", TWINS, ids=[module.__name__ for _, module in TWINS])
def test_module_twins_take_their_functions_parameters(function, module):
    """``__init__`` takes the function's non-tensor parameters (names, order, defaults); ``forward``
    takes the tensors."""
    assert _parameters(module.__init__, lambda name: name != "self") == _parameters(
        function, lambda name: name not in TENSORS
    )
    assert [name for name, _ in _parameters(module.forward, lambda name: name != "self")] == [
        name for name, _ in _parameters(function, lambda name: name in TENSORS)
    ]


def test_version_is_the_distributions():
    from importlib.metadata import version

    assert softtopk.__version__ == version("softtopk")
