"""Numerical robustness: no NaN/inf in values or gradients at extreme scales, ties and temperatures,
and the tamed logistic_phi (ART) gradient at ties compared with difftopk's formula."""

from __future__ import annotations

import pytest
import torch

import softtopk
from conftest import DISTRIBUTIONS, NETWORK_TYPES, RANK_METHODS, method_params
from softtopk.ops.networks import build_network

METHOD_CASES = [(m, d) for m in NETWORK_TYPES for d in DISTRIBUTIONS] + [
    (m, None) for m in RANK_METHODS if m not in NETWORK_TYPES
]
CASE_IDS = [m if d is None else f"{m}-{d}" for m, d in METHOD_CASES]

# steepness (networks) / tau (NeuralSort, SoftSort) at the extremes; None = the smooth default.
TEMPERATURES = {
    "default": None,
    "tiny": {"steepness": 1e-6, "tau": 1e6},  # nearly flat relaxations
    "huge": {"steepness": 1e8, "tau": 1e-8},  # nearly hard relaxations
}


def extreme_inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 9, generator=g, dtype=torch.float64)
    cases = {
        "scale_1e-6": base * 1e-6,
        "scale_1": base,
        "scale_1e6": base * 1e6,
        "all_zero": torch.zeros(3, 9, dtype=torch.float64),
        "all_equal_1e6": torch.full((3, 9), 1e6, dtype=torch.float64),
        "two_level_ties": torch.randint(0, 2, (3, 9), generator=g).to(torch.float64),
        "mixed_rows": base * torch.tensor([[1e-6], [1.0], [1e6]], dtype=torch.float64),
    }
    return {name: x.to(dtype) for name, x in cases.items()}


def params_at(method: str, distribution: str | None, temperature: str) -> dict:
    params = method_params(method, distribution=distribution or "cauchy")
    extreme = TEMPERATURES[temperature]
    if extreme is not None:
        key = "steepness" if method in NETWORK_TYPES else "tau"
        params[key] = extreme[key]
    return params


def _finite_problems(method, params, x, k=4) -> list[str]:
    """Values and gradients of a random linear functional for mask, ranks and permutation."""
    problems = []
    g = torch.Generator().manual_seed(1)
    for name, fn, args in [
        ("mask", softtopk.soft_topk, (k,)),
        ("ranks", softtopk.soft_topk_ranks, (k,)),
        ("permutation", softtopk.soft_permutation, ()),
    ]:
        leaf = x.clone().requires_grad_()
        out = fn(leaf, *args, method=method, **params)
        weights = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
        (grad,) = torch.autograd.grad((out * weights).sum(), leaf)
        if not torch.isfinite(out).all():
            problems.append(f"{name} values")
        if not torch.isfinite(grad).all():
            problems.append(f"{name} gradient")
        if name != "mask" and torch.isfinite(out).all():
            # the rank columns must still sum to one at every extreme
            # (in float16/bfloat16 each of the n entries is rounded: allow n ulps)
            tol = 1e-3 if x.dtype in (torch.float32, torch.float64) else x.shape[-1] * torch.finfo(x.dtype).eps
            err = (out.double().sum(-2) - 1).abs().max().item()
            if err > tol:
                problems.append(f"{name} columns sum off by {err:.2e}")
    return problems


@pytest.mark.parametrize("temperature", list(TEMPERATURES))
@pytest.mark.parametrize("method, distribution", METHOD_CASES, ids=CASE_IDS)
def test_values_and_gradients_are_finite(method, distribution, temperature):
    """float32 and float64; inputs scaled 1e-6 / 1 / 1e6, all-equal (zeros and 1e6), two-level ties
    and rows of different scales in one batch; the default, tiny and huge temperature."""
    params = params_at(method, distribution, temperature)
    failures = []
    for dtype in (torch.float32, torch.float64):
        for name, x in extreme_inputs(dtype).items():
            failures += [f"{dtype} {name}: {p}" for p in _finite_problems(method, params, x)]
    assert not failures, f"{method} {params}: " + "; ".join(failures)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method, distribution", METHOD_CASES, ids=CASE_IDS)
def test_low_precision_values_and_gradients_are_finite(method, distribution, dtype):
    """float16/bfloat16 inputs of unit scale and all-equal inputs at the default temperature.
    (Scale 1e6 overflows float16 itself, and steepness 1e8 has true gradients beyond its range.)"""
    params = params_at(method, distribution, "default")
    failures = []
    for name in ("scale_1", "all_zero", "two_level_ties"):
        failures += [f"{name}: {p}" for p in _finite_problems(method, params, extreme_inputs(dtype)[name])]
    assert not failures, "; ".join(failures)


def test_finite_check_can_fail():
    """The helper reports a non-finite value (guards against a vacuous check)."""
    x = torch.tensor([[0.0, float("nan"), 1.0, 2.0, 3.0]])
    assert _finite_problems("bitonic", method_params("bitonic"), x, k=2)


# --------------------------------------------------------------------------------------------
# logistic_phi (ART) at ties
# --------------------------------------------------------------------------------------------


def _tie_setup(dtype=torch.float32):
    """All-zero logits of n = 100 classes; the m = 16 pre-selection keeps 16 of them (the label on
    wire 0, as difftopk does). Returns the logits leaf and the 16 wires."""
    logits = torch.zeros(100, dtype=dtype, requires_grad=True)
    return logits, logits[:16]


def tie_gradient(distribution: str) -> float:
    """max |∂ (top-5 mass of wire 0) / ∂ logits| for a 16-wire odd_even network, steepness 1,
    art_lambda 0.5."""
    logits, wires = _tie_setup()
    ranks = softtopk.soft_topk_ranks(
        wires, 5, method="odd_even", distribution=distribution, steepness=1.0, art_lambda=0.5
    )
    ranks[0].sum().backward()
    assert torch.isfinite(logits.grad).all()
    return logits.grad.abs().max().item()


def hand_network_ranks(x: torch.Tensor, k: int, alpha) -> torch.Tensor:
    """Relaxed odd_even network written out comparator by comparator (rows = inputs, cols = ranks)."""
    n = x.shape[-1]
    net = build_network("odd_even", n, n)
    values = list(x.unbind(-1))
    columns = list(torch.eye(n, dtype=x.dtype).unbind(-1))
    for layer in net.layers:
        for hi, lo in layer:
            a, b, ca, cb = values[hi], values[lo], columns[hi], columns[lo]
            p = alpha(a - b)
            values[hi], values[lo] = p * a + (1 - p) * b, (1 - p) * a + p * b
            columns[hi], columns[lo] = p * ca + (1 - p) * cb, (1 - p) * ca + p * cb
    return torch.stack([columns[w] for w in net.out_wires[:k]], -1)


def hand_tie_gradient(alpha) -> float:
    logits, wires = _tie_setup()
    hand_network_ranks(wires, 5, alpha)[0].sum().backward()
    return logits.grad.abs().max().item()


def difftopk_logistic_phi(d: torch.Tensor, steepness: float = 1.0, art_lambda: float = 0.5) -> torch.Tensor:
    """difftopk/diffsort's ART swap: σ(β d / (|d| + 1e-10)^λ)."""
    return torch.sigmoid(steepness * d / (d.abs() + 1e-10) ** art_lambda)


def test_logistic_phi_tie_gradient_is_tamed():
    """All-zero logits, n = 100 → 16 wires, odd_even, steepness 1, art_lambda 0.5, backward of the
    top-5 mass of wire 0. Measured (float32, torch 2.13 CPU) max |grad|:

    =============  ==========  =====================
    distribution   max |grad|  ÷ logistic
    =============  ==========  =====================
    logistic       2.744e-3    1
    reciprocal     2.744e-3    1
    cauchy         3.494e-3    1.27
    gaussian       4.379e-3    1.60
    optimal        1.098e-2    4.0
    logistic_phi   8.677e-2    31.6 (= 1e-3 ** -0.5)
    difftopk ART   274.4       1.0e5 (= 1e-10 ** -0.5)
    =============  ==========  =====================

    At a tie every wire stays 0 and α = ½, so the gradient is linear in the swap slope f'(0): for
    ART that is β·δ^{-λ} with δ = 1e-3 here and δ = 1e-10 in difftopk.
    """
    measured = {d: tie_gradient(d) for d in DISTRIBUTIONS}
    logistic = measured["logistic"]
    assert logistic > 1e-4  # the functional is not trivially flat at a tie
    for distribution, value in measured.items():
        assert value <= 100 * logistic, f"{distribution}: {value:.3e} vs logistic {logistic:.3e}"
    assert measured["logistic_phi"] == pytest.approx(logistic * 1e-3**-0.5, rel=1e-3)

    # Our library equals the hand-written network with both swaps (so the hand route is valid) ...
    assert hand_tie_gradient(lambda d: torch.sigmoid(d)) == pytest.approx(logistic, rel=1e-5)
    ours_by_hand = hand_tie_gradient(lambda d: torch.sigmoid(d / (d * d + 1e-6) ** 0.25))
    assert ours_by_hand == pytest.approx(measured["logistic_phi"], rel=1e-5)
    # ... and difftopk's formula spikes: 1e5 x logistic, 3000 x ours.
    original = hand_tie_gradient(difftopk_logistic_phi)
    assert original == pytest.approx(logistic * 1e5, rel=1e-3)
    assert original > 1000 * measured["logistic_phi"]


@pytest.mark.parametrize("art_lambda", [0.25, 0.5, 0.9])
def test_logistic_phi_matches_art_away_from_ties(art_lambda):
    """Away from ties (|d| >= 0.1) softtopk's smoothed ART equals difftopk's to 1e-4 relative, so
    the taming changes only the neighbourhood of a tie."""
    from softtopk.ops.swaps import swap_probability

    d = torch.cat([torch.linspace(-50, -0.1, 200), torch.linspace(0.1, 50, 200)]).double()
    ours = swap_probability(d, "logistic_phi", 3.0, art_lambda)
    theirs = difftopk_logistic_phi(d, 3.0, art_lambda)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=0)
    near = torch.tensor([0.0, 1e-6], dtype=torch.float64, requires_grad=True)
    swap_probability(near, "logistic_phi", 1.0, art_lambda).sum().backward()
    assert near.grad.max() <= 1e-3**-art_lambda / 4 * 1.001
