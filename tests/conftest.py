"""Shared test helpers: the method matrix and parameters that make each method sharp or smooth."""

from __future__ import annotations

import os

import pytest
import torch

import softtopk
from softtopk.ops.networks import NETWORK_TYPES
from softtopk.ops.swaps import DISTRIBUTIONS

# one thread per test process: the suite runs under pytest-xdist on 2 cores, and torch's default
# thread pool would oversubscribe them
torch.set_num_threads(1)

# XLA's CPU compiler options for the JAX tests: no LLVM optimisation of the generated code. The
# tests compile hundreds of small programs and run each a few times, so compiling is most of their
# time. The option changes the speed of the code and the last rounding of some float32 results (an
# ulp or two), nothing else: tests/test_jax.py::test_the_test_compiler_options_agree_with_the_defaults
# compares it with XLA's defaults.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def pytest_configure(config) -> None:
    """Set the test compiler options before any test module imports JAX (each xdist worker runs
    this too); a user's own ``XLA_FLAGS`` are kept."""
    os.environ.setdefault("XLA_FLAGS", TEST_XLA_FLAGS)


# deterministic ranks methods (the stochastic gumbel method has its own tests: tests/test_gumbel.py)
RANK_METHODS = tuple(
    name for name, info in softtopk.methods().items() if "ranks" in info.outputs and not info.stochastic
)
EQUIVARIANT_METHODS = ("neuralsort", "softsort")


def method_params(method: str, *, sharp: bool = False, distribution: str = "cauchy") -> dict:
    """Parameters for ``method``: smooth (temperature ~1) or sharp (close to the hard top-k)."""
    if method in NETWORK_TYPES:
        steepness = {"cauchy": 1e7, "reciprocal": 1e7, "optimal": 1e7}.get(distribution, 1e4)
        return {"distribution": distribution, "steepness": steepness if sharp else 2.0, "art_lambda": 0.25}
    return {"tau": 1e-4 if sharp else 1.0}


@pytest.fixture
def fresh_dynamo():
    """A clean Dynamo state before and after a compile test (no cached graphs or recompile counts)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_same_values_and_grads(fns, x: torch.Tensor, upstream: torch.Tensor, tau: float) -> None:
    """Each ``fn(x, tau)`` of ``fns`` (e.g. compiled and eager) gives the same output and the same
    gradients in ``x`` and a tensor ``tau`` for the upstream gradient ``upstream``."""
    results = []
    for f in fns:
        leaf, tau_t = x.clone().requires_grad_(), torch.tensor(tau, requires_grad=True)
        out = f(leaf, tau_t)
        (out * upstream).sum().backward()
        results.append((out.detach(), leaf.grad, tau_t.grad))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def hard_topk_ranks(x: torch.Tensor, k: int) -> torch.Tensor:
    """Exact one-hot top-k ranks ``x.shape + (k,)`` along the last dim."""
    index = x.topk(k, dim=-1).indices
    return torch.nn.functional.one_hot(index, x.shape[-1]).transpose(-1, -2).to(x.dtype)


__all__ = [
    "DISTRIBUTIONS",
    "EQUIVARIANT_METHODS",
    "NETWORK_TYPES",
    "RANK_METHODS",
    "assert_same_values_and_grads",
    "hard_topk_ranks",
    "method_params",
]
