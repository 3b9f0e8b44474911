"""On a CUDA device (issue 21): every operator, loss, router and kNN call runs forward and backward
with ``torch.cuda.set_sync_debug_mode("error")`` (no host synchronisation), and its forward is
captured in a CUDA graph whose replay equals eager (stochastic calls: same shape, finite).

Each case is called once before the checks, as ``tests/dispatch_counter.py`` does: caches built on
a first call (e.g. a sorting network's layout, copied to the device once) are filled outside them.
Skipped without CUDA."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch

import softtopk
from softtopk.ops import triton_gate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROWS, N, K = 64, 1000, 10
CLASSES_ROWS = 64
P_K = [0.2] * 5


def _scores(shape=(ROWS, N)) -> torch.Tensor:
    gen = torch.Generator("cuda").manual_seed(0)
    return torch.randn(shape, generator=gen, device="cuda").requires_grad_()


def _mask(fn: Callable, shape=(ROWS, N), stochastic: bool = False):
    def build():
        x = _scores(shape)
        return [x], (lambda: fn(x)), stochastic

    return build


def _torch_lapsum(x: torch.Tensor) -> torch.Tensor:
    """The Laplace mask by the torch path (where triton is installed, the default is its kernels)."""
    with triton_gate.torch_path():
        return softtopk.soft_topk(x, K, tau=1.0)


def _loss(make: Callable, stochastic: bool = False):
    def build():
        x = _scores((CLASSES_ROWS, N))
        target = torch.randint(0, N, (CLASSES_ROWS,), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        loss = make()
        return [x], (lambda: loss(x, target)), stochastic

    return build


def _router(method: str, **params):
    def build():
        torch.manual_seed(0)
        router = softtopk.TopKRouter(64, 16, 2, method=method, **params).cuda()
        x = _scores((256, 64))
        mask = torch.ones(16, dtype=torch.bool, device="cuda")

        def forward():
            weights = router(x, mask)[0]
            return weights.sum(-1) + router.aux_loss

        return [x, *router.parameters()], forward, False

    return build


def _knn(method: str, stochastic: bool = False, **params):
    def build():
        knn = softtopk.DifferentiableKNN(3, method=method, **params)
        query, neighbors = _scores((16, 8)), _scores((100, 8))
        labels = torch.arange(100, device="cuda") % 5
        query_labels = torch.arange(16, device="cuda") % 5
        return [query, neighbors], (lambda: knn(query, neighbors, labels, query_labels).loss), stochastic

    return build


def _soft_topk(method: str, **params):
    return lambda x: softtopk.soft_topk(x, K, method=method, **params)


CASES = {
    "lapsum": _mask(_soft_topk("lapsum")),
    "lapsum hard": _mask(_soft_topk("lapsum", hard=True)),
    "lapsum largest=False": _mask(_soft_topk("lapsum", largest=False)),
    "lapsum torch path": _mask(_torch_lapsum),
    "sparse p=4/3": _mask(_soft_topk("sparse")),
    "sparse p=2": _mask(_soft_topk("sparse", p=2.0)),
    "sparse dykstra": _mask(_soft_topk("sparse", p=2.0, solver="dykstra", n_iter=50)),
    "neuralsort": _mask(_soft_topk("neuralsort")),
    "softsort": _mask(_soft_topk("softsort")),
    "gumbel no noise": _mask(_soft_topk("gumbel", noise=False)),
    "gumbel": _mask(_soft_topk("gumbel"), stochastic=True),
    "gumbel subsets": _mask(_soft_topk("gumbel", relaxation="subsets"), stochastic=True),
    "perturbed": _mask(_soft_topk("perturbed", n_samples=8), stochastic=True),
    "bitonic": _mask(_soft_topk("bitonic"), shape=(ROWS, 100)),
    "splitter_selection": _mask(_soft_topk("splitter_selection"), shape=(ROWS, 100)),
    "odd_even": _mask(_soft_topk("odd_even"), shape=(8, 32)),
    "sparse_topk_mag": _mask(lambda x: softtopk.sparse_topk_mag(x, K)),
    "topk weights": _mask(lambda x: softtopk.topk(x, K, method="lapsum").weights),
    "soft_topk_ranks softsort": _mask(lambda x: softtopk.soft_topk_ranks(x, K, method="softsort")),
    "soft_topk_ranks neuralsort": _mask(lambda x: softtopk.soft_topk_ranks(x, K, method="neuralsort")),
    "soft_permutation softsort": _mask(lambda x: softtopk.soft_permutation(x, method="softsort"), shape=(8, 64)),
    "soft_rank l2": _mask(lambda x: softtopk.soft_rank(x)),
    "soft_rank kl": _mask(lambda x: softtopk.soft_rank(x, regularization="kl")),
    "soft_sort l2 descending": _mask(lambda x: softtopk.soft_sort(x, descending=True)),
    "soft_sort kl, strength per row": _mask(
        lambda x: softtopk.soft_sort(x, regularization="kl", strength=torch.linspace(0.1, 10.0, ROWS, device="cuda"))
    ),
    "TopKCE splitter m=16": _loss(lambda: softtopk.TopKCrossEntropyLoss(P_K, method="splitter_selection", m=16)),
    "TopKCE neuralsort m=16": _loss(lambda: softtopk.TopKCrossEntropyLoss(P_K, method="neuralsort", m=16)),
    "SmoothTopKSVM": _loss(lambda: softtopk.SmoothTopKSVM(k=5)),
    "SmoothTop1SVM": _loss(lambda: softtopk.SmoothTop1SVM()),
    "TopKSVM": _loss(lambda: softtopk.TopKSVM(k=5)),
    "BalNoisedTopK": _loss(lambda: softtopk.BalNoisedTopK(5, epsilon=1.0, n_samples=5), stochastic=True),
    "ImbalNoisedTopK": _loss(
        lambda: softtopk.ImbalNoisedTopK(5, epsilon=0.01, max_m=0.2, cls_num_list=[10.0] * N).cuda(), stochastic=True
    ),
    "router hard": _router("hard"),
    "router lapsum hard": _router("lapsum", hard=True),
    "router sparse": _router("sparse"),
    "kNN neuralsort": _knn("neuralsort"),
    "kNN lapsum": _knn("lapsum"),
    "kNN gumbel": _knn("gumbel", stochastic=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_backward_never_syncs(name):
    leaves, forward, _ = CASES[name]()
    forward().sum().backward()  # the first call: caches filled here
    for leaf in leaves:
        leaf.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = forward()
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(leaf.grad is not None for leaf in leaves[:1])


@pytest.mark.parametrize("name", list(CASES))
def test_forward_captured_in_a_cuda_graph_replays_eager(name):
    _, forward, stochastic = CASES[name]()
    with torch.no_grad():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graphs asks
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = forward()
        graph.replay()
        eager = forward()
        torch.cuda.synchronize()
    assert captured.shape == eager.shape and torch.isfinite(captured).all()
    if not stochastic:
        torch.testing.assert_close(captured, eager)


SOLVED = {
    "sparse p=4/3": lambda x: softtopk.soft_topk(x, K, method="sparse"),
    "sparse p=2": lambda x: softtopk.soft_topk(x, K, method="sparse", p=2.0),
    "sparse_topk_mag": lambda x: softtopk.sparse_topk_mag(x, K),
    "soft_rank l2": softtopk.soft_rank,
    "soft_rank kl": lambda x: softtopk.soft_rank(x, regularization="kl"),
    "soft_sort l2": softtopk.soft_sort,
    "soft_sort kl": lambda x: softtopk.soft_sort(x, regularization="kl", strength=0.1),
}


@pytest.mark.parametrize("n", [100, 5000, 12000])
@pytest.mark.parametrize("name", list(SOLVED))
def test_the_device_solver_equals_the_cpu_solver(name, n):
    """The isotonic solvers differ by device (Triton kernels on the GPU: PAV's, and for the l2 sort
    and rank their own, whose programs take 1 to 16 warps by n; numba's PAV on the CPU); both are
    exact, so in float64 they agree: values with ties too (inputs rounded to a tenth), gradients
    without (at a tie the map is not differentiable, and each solver returns a valid but
    different one-sided derivative)."""
    x = 3 * torch.randn(ROWS, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    g = torch.randn_like(x)
    fn = SOLVED[name]
    tied = x.round(decimals=1)
    torch.testing.assert_close(fn(tied.cuda()).cpu(), fn(tied), rtol=1e-9, atol=1e-9)
    results = []
    for device in ("cuda", "cpu"):
        leaf = x.to(device).requires_grad_()
        out = fn(leaf)
        (grad,) = torch.autograd.grad((out * g.to(device)).sum(), leaf)
        results.append((out.cpu(), grad.cpu()))
    (out_d, grad_d), (out_c, grad_c) = results
    torch.testing.assert_close(out_d, out_c, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(grad_d, grad_c, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n", [700, 3000, 9000, 16000])
@pytest.mark.parametrize("strength", [0.01, 100.0])
@pytest.mark.parametrize("regularization", ["l2", "kl"])
@pytest.mark.parametrize("fn", [softtopk.soft_rank, softtopk.soft_sort], ids=["rank", "sort"])
def test_the_fused_kernels_agree_with_the_cpu_at_every_warp_count(fn, regularization, strength, n):
    """The fused kernels' programs take 1 to 16 warps by n, which run PAV's l2 walk apart between
    barriers (run 18 of ``benchmarks/results/gpu_runs.md`` found two races there that one-warp
    rows never show): rows with and without ties, strengths where the fit pools almost every
    point and where it pools almost none."""
    x = 3 * torch.randn(16, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    for rows in (x, x.round(decimals=1)):
        on_gpu = fn(rows.cuda(), regularization=regularization, strength=strength).cpu()
        torch.testing.assert_close(
            on_gpu, fn(rows, regularization=regularization, strength=strength), rtol=1e-9, atol=1e-9
        )


COMPILED = {
    "lapsum": lambda x: softtopk.soft_topk(x, K, tau=1.0),
    "sparse p=4/3": lambda x: softtopk.soft_topk(x, K, method="sparse"),
    "soft_rank l2": softtopk.soft_rank,
}


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("name", list(COMPILED))
def test_inductor_fullgraph_equals_eager_on_the_device(name):
    """The default backend on the GPU at 64 x 1e5, the size where Inductor once failed (issue 21)."""
    fn, x = COMPILED[name], _scores((ROWS, 100_000))
    g = torch.randn_like(x)
    results = []
    for f in (torch.compile(fn, fullgraph=True), fn):
        out = f(x)
        (grad,) = torch.autograd.grad((out * g).sum(), x)
        results.append((out, grad))
    (out_c, grad_c), (out_e, grad_e) = results
    torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grad_c, grad_e, rtol=1e-4, atol=1e-4)


def test_the_triton_kernels_equal_the_torch_path_on_the_device():
    pytest.importorskip("triton", reason="the Triton kernels need triton")
    assert triton_gate.usable(_scores(), K, 1.0)  # the default on a GPU
    x = _scores()
    g = torch.randn_like(x)
    torch_mask = _torch_lapsum(x)
    (torch_grad,) = torch.autograd.grad((torch_mask * g).sum(), x)
    triton_mask = softtopk.soft_topk(x, K, tau=1.0)
    (triton_grad,) = torch.autograd.grad((triton_mask * g).sum(), x)
    torch.testing.assert_close(triton_mask, torch_mask, rtol=0, atol=2e-6)
    torch.testing.assert_close(triton_grad, torch_grad, rtol=1e-5, atol=1e-4)


def test_the_sparse_kernel_equals_the_torch_path_on_the_device():
    pytest.importorskip("triton", reason="the Triton kernels need triton")
    x = _scores()
    assert triton_gate.usable(x, K, 1.0)  # the default on a GPU
    g = torch.randn_like(x)
    results = []
    for kernels in (True, False):
        with contextlib.nullcontext() if kernels else triton_gate.torch_path():
            mask = softtopk.soft_topk(x, K, method="sparse")
        (grad,) = torch.autograd.grad((mask * g).sum(), x)
        results.append((mask, grad))
    (mask_k, grad_k), (mask_t, grad_t) = results
    torch.testing.assert_close(mask_k, mask_t, rtol=0, atol=2e-6)
    torch.testing.assert_close(grad_k, grad_t, rtol=1e-5, atol=1e-4)


def test_the_svm_kernels_equal_the_torch_path_on_the_device():
    """``SmoothTopKSVM(k=5)`` at 64 rows x 1000 classes: the Triton kernels (the default on a GPU,
    float64 inside) against the torch path (float32 with float64 power sums)."""
    pytest.importorskip("triton", reason="the Triton kernels need triton")
    from softtopk.ops import svm_triton

    x = _scores()
    target = torch.randint(0, N, (ROWS,), generator=torch.Generator("cuda").manual_seed(1), device="cuda")
    assert svm_triton.usable(x, 5, 1.0, 1.0)  # the default on a GPU
    results = []
    for kernels in (True, False):
        with contextlib.nullcontext() if kernels else triton_gate.torch_path():
            loss = softtopk.smooth_topk_svm(x, target, k=5, reduction="none")
        (grad,) = torch.autograd.grad(loss.sum(), x)
        results.append((loss, grad))
    (loss_k, grad_k), (loss_t, grad_t) = results
    torch.testing.assert_close(loss_k, loss_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_k, grad_t, rtol=1e-5, atol=1e-6)
