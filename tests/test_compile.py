"""``torch.compile(fullgraph=True)`` of the public path: one graph, no graph breaks, same values and
gradients as eager, and no recompilation when only the values change.

Backend: ``aot_eager`` for the matrix below. Inductor compiles everything here too, but on this
2-core CPU it takes ~10-30 s per case (bitonic ~30 s, splitter_selection ~20 s), which does not fit
the test-time budget; ``fullgraph=True`` failures (graph breaks) come from Dynamo tracing, which is
the same for every backend, and ``aot_eager`` also runs AOTAutograd (functionalisation and the
traced backward). Three inductor cases (NeuralSort soft_topk, a 4-class bitonic
TopKCrossEntropyLoss through the sweeps' autograd.Function, and the smooth top-k SVM's subset
kernel) check the default backend end to end.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import softtopk

TOL = {"rtol": 1e-5, "atol": 1e-5}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _values_and_grads(fn, *inputs):
    leaves = [x.clone().requires_grad_() if x.is_floating_point() else x for x in inputs]
    out = fn(*leaves)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), leaves[0].grad


def _check_compiled_matches_eager(fn, make_inputs, backend="aot_eager"):
    """Two calls with different values: both equal eager (values and gradients), one compilation."""
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    for seed in (0, 1):
        inputs = make_inputs(torch.Generator().manual_seed(seed))
        out_c, grad_c = _values_and_grads(compiled, *inputs)
        out_e, grad_e = _values_and_grads(fn, *inputs)
        torch.testing.assert_close(out_c, out_e, **TOL)
        torch.testing.assert_close(grad_c, grad_e, **TOL)
        assert grad_e.abs().sum() > 0
    assert counter.frame_count == 1, "recompiled for new values (a data-dependent guard)"


@pytest.mark.parametrize(
    "method,params,n",
    [("bitonic", {"steepness": 2.0, "distribution": "cauchy"}, 8), ("neuralsort", {"tau": 1.0}, 8)],
)
def test_soft_topk_fullgraph(method, params, n):
    def fn(x):
        return softtopk.soft_topk(x, 3, method=method, **params)

    _check_compiled_matches_eager(fn, lambda g: (torch.randn(4, n, generator=g),))


@pytest.mark.parametrize(
    "method,params",
    [("splitter_selection", {"steepness": 2.0, "distribution": "logistic_phi"}), ("softsort", {"tau": 1.0})],
)
def test_topk_cross_entropy_module_fullgraph(method, params):
    loss = softtopk.TopKCrossEntropyLoss([0.5, 0.3, 0.2], method=method, m=None, **params)

    def make_inputs(g):
        return torch.randn(6, 10, generator=g), torch.randint(0, 10, (6,), generator=g)

    _check_compiled_matches_eager(loss, make_inputs)


@pytest.mark.parametrize(("m", "classes"), [(16, 100), (32, 200)])
def test_default_topk_cross_entropy_fullgraph(m, classes):
    """The default loss (splitter network, Cauchy swap, the m largest scores): compiled, it takes
    the torch path of the selection and the sweep (eager on the CPU, their numba kernels), and its
    gate reads nothing Dynamo cannot trace (``m > 16`` asks for torch's thread count in eager)."""
    loss = softtopk.TopKCrossEntropyLoss([0.2] * 5, m=m)

    def make_inputs(g):
        return torch.randn(6, classes, generator=g), torch.randint(0, classes, (6,), generator=g)

    _check_compiled_matches_eager(loss, make_inputs)


def test_soft_topk_fullgraph_inductor():
    """The default backend end to end on the cheapest case."""

    def fn(x):
        return softtopk.soft_topk(x, 3, method="neuralsort", tau=1.0)

    _check_compiled_matches_eager(fn, lambda g: (torch.randn(4, 8, generator=g),), backend="inductor")


def test_network_loss_fullgraph_inductor():
    """The default backend on the network path: TopKCrossEntropyLoss through the hand-written
    autograd.Function of the sweeps (a small network keeps the compile time to seconds)."""
    loss = softtopk.TopKCrossEntropyLoss(
        [0.5, 0.5], method="bitonic", m=None, distribution="logistic_phi", steepness=2.0, art_lambda=0.5
    )

    def make_inputs(g):
        return torch.randn(5, 4, generator=g), torch.randint(0, 4, (5,), generator=g)

    _check_compiled_matches_eager(loss, make_inputs, backend="inductor")


def test_smooth_svm_fullgraph_inductor():
    """The default backend on the smooth top-k SVM's subset kernel (``k <= 8``), whose Toeplitz
    expansion once failed in Inductor's code generation on the CPU."""

    def make_inputs(g):
        return torch.randn(6, 12, generator=g), torch.randint(0, 12, (6,), generator=g)

    _check_compiled_matches_eager(softtopk.SmoothTopKSVM(k=3, tau=0.5), make_inputs, backend="inductor")


@pytest.mark.parametrize("loss", [softtopk.SmoothTopKSVM(k=3, tau=0.5), softtopk.TopKSVM(k=3)])
def test_topk_svm_fullgraph(loss):
    """The smooth loss runs through the ESF's hand-written tail Function (module ``ops.esf``)."""

    def make_inputs(g):
        return torch.randn(6, 12, generator=g), torch.randint(0, 12, (6,), generator=g)

    _check_compiled_matches_eager(loss, make_inputs)


@pytest.mark.parametrize("n", [1000, 3000])
def test_long_rows_compile_to_tiled_scans_and_running_block_sums(n):
    """Past 1024 points, 64-bit scans run as tiles and block sums as differences of running sums
    under compile (Inductor cannot generate CUDA code for the one-line forms): the same values."""
    from softtopk.ops.compute import scan_rows
    from softtopk.ops.isotonic import block_ids, block_sum

    def fn(x, ids, counts):
        return scan_rows(x), scan_rows(x, "logsumexp"), scan_rows(counts), block_sum(x, ids)

    g = torch.Generator().manual_seed(n)
    x = torch.randn(3, n, generator=g, dtype=torch.float64)
    ids = block_ids((3 * torch.randn(3, n, generator=g)).round().sort(-1, descending=True).values)
    counts = torch.randint(0, 5, (3, n), generator=g)
    eager = fn(x, ids, counts)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(x, ids, counts)
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)


def test_constant_result_marks_as_the_compiler_decorator_does():
    """``ops.compute.constant_result`` (which spares an operator's first call the import of
    ``torch._dynamo``) sets exactly what ``torch.compiler.assume_constant_result`` sets; the
    network tests above compile through it (the networks' plans are constants of the graph)."""
    from softtopk.ops.compute import constant_result

    def ours():
        return 1

    def theirs():
        return 1

    assert constant_result(ours) is ours and torch.compiler.assume_constant_result(theirs) is theirs
    assert ours.__dict__ == theirs.__dict__ == {"_dynamo_marked_constant": True}


def test_a_first_call_does_not_import_the_compiler():
    import subprocess
    import sys

    code = (
        "import sys, torch, softtopk; x = torch.randn(4, 20, requires_grad=True);"
        "softtopk.soft_topk(x, 3).sum().backward(); softtopk.soft_topk(x, 3, method='bitonic').sum().backward();"
        "print('torch._dynamo' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False"]
