"""A library call does not warn about itself: no warning (Dynamo's ``lru_cache`` notice, graph-break
or recompile messages, ``torch.searchsorted`` on non-contiguous input, ...) from compiling one
call of each family with ``torch.compile(fullgraph=True, backend="aot_eager")`` and running its
forward and backward, nor from the eager calls on non-contiguous input and along ``dim=0``.

Dynamo prints each of its own warnings once per process (``torch._dynamo.utils.warn_once``): its
cache is emptied here so that an earlier test cannot hide one.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import pytest
import torch

import softtopk

TARGET = torch.tensor([0, 1, 2, 3])
CE = softtopk.TopKCrossEntropyLoss([0.5, 0.5], method="splitter_selection")
ROUTER = softtopk.TopKRouter(10, 6, 2)

FAMILIES = {
    "bitonic mask": lambda x: softtopk.soft_topk(x, 3, method="bitonic"),
    "splitter_selection ranks": lambda x: softtopk.soft_topk_ranks(x, 3, method="splitter_selection"),
    "odd_even permutation": lambda x: softtopk.soft_permutation(x[:, :6], method="odd_even"),
    "neuralsort mask": lambda x: softtopk.soft_topk(x, 3, method="neuralsort"),
    "softsort ranks": lambda x: softtopk.soft_topk_ranks(x, 3, method="softsort"),
    "lapsum mask": lambda x: softtopk.soft_topk(x, 3),
    "sparse mask and magnitude": lambda x: softtopk.sparse_topk_mask(x, 3) + softtopk.sparse_topk_mag(x, 3),
    "smooth top-k SVM (subsets and ESF)": lambda x: (
        softtopk.smooth_topk_svm(x, TARGET, k=2) + softtopk.smooth_topk_svm(x, TARGET, k=9)
    ),
    "top-k cross-entropy": lambda x: CE(x, TARGET),
    "imbalanced noised loss, functional": lambda x: softtopk.imbal_noised_topk(
        x, TARGET, k=2, epsilon=0.5, max_m=0.3, cls_num_list=[float(c) for c in range(1, x.shape[1] + 1)]
    ),
    "router": lambda x: ROUTER(x).weights.sum() + ROUTER.aux_loss,
}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def no_warnings(monkeypatch):
    """Every warning and every torch log record at WARNING or above, during the test."""
    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())
    handler = _Records()
    logger = logging.getLogger("torch")
    logger.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    logger.removeHandler(handler)
    messages = [str(w.message) for w in caught] + handler.messages
    assert not messages, "\n".join(messages)


@pytest.mark.usefixtures("fresh_dynamo", "no_warnings")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_compiled_families_do_not_warn(family):
    x = torch.randn(4, 10, generator=torch.Generator().manual_seed(0), requires_grad=True)
    out = torch.compile(FAMILIES[family], fullgraph=True, backend="aot_eager")(x)
    out.sum().backward()
    assert x.grad.isfinite().all()


@pytest.mark.usefixtures("no_warnings")
@pytest.mark.parametrize("method", ["neuralsort", "softsort", "lapsum", "sparse", "bitonic"])
def test_non_contiguous_input_and_dim_0_do_not_warn(method):
    """``torch.searchsorted`` warned on non-contiguous rows from ``ops/neuralsort.py``."""
    base = torch.randn(10, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    for x, dim in ((base.t(), -1), (base, 0), (base[::2], 0)):
        mask = softtopk.soft_topk(x, 3, method=method, dim=dim)
        ranks = softtopk.soft_topk_ranks(x, 3, method=method, dim=dim) if method in ("neuralsort", "softsort") else mask
        (mask.sum() + ranks.sum()).backward()


@pytest.mark.usefixtures("no_warnings")
@pytest.mark.parametrize("p", [2.0, 4 / 3])
def test_sparse_under_vmap_does_not_warn(p):
    """``searchsorted`` on a sliced boundary (``.contiguous()`` keeps a batched slice's strides) and
    an in-place ``addcmul_`` in the magnitude's backward (no batching rule) warned under vmap.
    ``searchsorted``'s warning is printed once per process: run alone, this test sees it."""
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w = torch.randn(12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for op in (softtopk.sparse_topk_mask, softtopk.sparse_topk_mag):
        torch.vmap(lambda row, op=op: op(row, 4, l=0.5, p=p))(x)
        torch.vmap(torch.func.grad(lambda row, op=op: (op(row, 4, l=0.5, p=p) * w).sum()))(x)


@pytest.mark.usefixtures("no_warnings")
@pytest.mark.parametrize("numba_kernels", [True, False])
def test_network_topk_cross_entropy_under_vmap_of_grad_does_not_warn(numba_kernels):
    """Per-example gradients of top-k CE with a network: the sweep's backward added a product with
    an in-place ``addcmul_``, which has no batching rule (functorch ran it example by example)."""
    from softtopk.ops import triton_gate

    x = torch.randn(4, 24, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = torch.tensor([3, 0, 23, 7])

    def loss(row, label):
        return softtopk.topk_cross_entropy(row.unsqueeze(0), label.unsqueeze(0), [0.5, 0.5], m=16)

    with contextlib.nullcontext() if numba_kernels else triton_gate.torch_path():
        grads = torch.vmap(torch.func.grad(loss))(x, y)
    leaf = x[2].clone().requires_grad_()
    loss(leaf, y[2]).backward()
    torch.testing.assert_close(grads[2], leaf.grad)
