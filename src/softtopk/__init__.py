"""softtopk: differentiable top-k operators and top-k losses for PyTorch.

The face of the library: every public name, re-exported from :mod:`softtopk.functional`,
:mod:`softtopk.nn` and :mod:`softtopk.losses` (where they are documented); ``softtopk.compat`` holds
the original packages' signatures.

The names load on first use (a module ``__getattr__``, PEP 562), so that ``import softtopk.jax``,
which runs this file first, needs no torch; without torch a torch name raises an ``ImportError``
naming the install command.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what __getattr__ loads, spelled out for type checkers and the API docs
    from . import functional, losses, nn
    from ._registry import MethodInfo
    from .functional import (
        bal_noised_topk,
        gumbel_topk,
        hard_topk_mag,
        hard_topk_mask,
        imbal_noised_topk,
        load_balancing_loss,
        methods,
        ndcg_loss,
        noised_kth_value,
        perturbed_topk,
        smooth_top1_svm,
        smooth_topk_svm,
        soft_permutation,
        soft_rank,
        soft_sort,
        soft_topk,
        soft_topk_ranks,
        sparse_topk_mag,
        sparse_topk_mask,
        spearman_loss,
        top1_svm,
        topk,
        topk_cross_entropy,
        topk_svm,
    )
    from .nn import (
        BalNoisedTopK,
        DifferentiableKNN,
        ImbalNoisedTopK,
        NDCGLoss,
        Routing,
        SmoothTop1SVM,
        SmoothTopKSVM,
        SmoothTopkSVM,
        SoftRank,
        SoftSort,
        SoftTopK,
        SoftTopKRanks,
        SpearmanLoss,
        Top1SVM,
        TopKCrossEntropyLoss,
        TopKRouter,
        TopKSVM,
        TopkSVM,
    )
    from .operators import TopK

try:
    __version__ = version("softtopk")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = [
    "BalNoisedTopK",
    "DifferentiableKNN",
    "ImbalNoisedTopK",
    "MethodInfo",
    "NDCGLoss",
    "Routing",
    "SmoothTop1SVM",
    "SmoothTopKSVM",
    "SmoothTopkSVM",
    "SoftRank",
    "SoftSort",
    "SoftTopK",
    "SoftTopKRanks",
    "SpearmanLoss",
    "Top1SVM",
    "TopKCrossEntropyLoss",
    "TopKRouter",
    "TopK",
    "TopKSVM",
    "TopkSVM",
    "bal_noised_topk",
    "functional",
    "gumbel_topk",
    "hard_topk_mag",
    "hard_topk_mask",
    "imbal_noised_topk",
    "load_balancing_loss",
    "losses",
    "methods",
    "ndcg_loss",
    "nn",
    "noised_kth_value",
    "perturbed_topk",
    "smooth_top1_svm",
    "smooth_topk_svm",
    "soft_permutation",
    "soft_rank",
    "soft_sort",
    "soft_topk",
    "soft_topk_ranks",
    "sparse_topk_mag",
    "sparse_topk_mask",
    "spearman_loss",
    "top1_svm",
    "topk",
    "topk_cross_entropy",
    "topk_svm",
]


def __getattr__(name: str) -> Any:
    """A public name, imported (with torch) on first use and kept in the module; a submodule
    (``softtopk.routing``) is imported on first use too, as the eager imports of 0.2.0 made it an
    attribute of ``import softtopk``."""
    if name not in __all__:
        try:
            if not name.startswith("__"):
                return import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module 'softtopk' has no attribute {name!r}")
    try:
        import torch  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"softtopk.{name} is part of softtopk's PyTorch API, which needs torch: pip install 'softtopk[torch]' "
            "(softtopk.jax needs no torch)"
        ) from error
    # import_module, not ``from . import``: that would look the modules up here first, in this hook
    functional, nn = import_module(".functional", __name__), import_module(".nn", __name__)
    found = {
        "functional": functional,
        "nn": nn,
        "losses": import_module(".losses", __name__),
        "MethodInfo": import_module("._registry", __name__).MethodInfo,
        "TopK": import_module(".operators", __name__).TopK,
    }
    globals().update(
        {public: found.get(public) or getattr(functional, public, None) or getattr(nn, public) for public in __all__}
    )
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
