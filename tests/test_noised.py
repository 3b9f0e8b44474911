"""Noised top-k hinge losses (:mod:`softtopk.losses.noised`): formula, limits, reductions, gradients
and argument errors. Random draws are seeded, so every check is deterministic."""

from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_counter import accelerator_steps
from softtopk.losses import BalNoisedTopK, ImbalNoisedTopK, bal_noised_topk, imbal_noised_topk, ldam_margins
from softtopk.ops import triton_gate

FEW = settings(max_examples=20, deadline=None)
COUNTS = [50, 7, 200, 1, 13]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _match(*parts: str) -> str:
    return ".*".join(re.escape(part) for part in parts)


def _problem(batch=6, classes=5, seed=0, dtype=torch.float64):
    gen = _gen(seed)
    return (torch.randn(batch, classes, generator=gen, dtype=dtype), torch.randint(0, classes, (batch,), generator=gen))


def _reference(s, y, k, epsilon, z, margins=None, scale=None):
    """Per-sample loss straight from the formula: sort each noisy row, take the (k+1)-th largest."""
    noisy = s.unsqueeze(-1) + epsilon * z  # (N, C, S)
    top = noisy.sort(dim=1, descending=True).values[:, k].mean(-1)
    margin = 1.0 if margins is None else margins.to(s.dtype)[y]
    hinge = margin + top - s.gather(1, y[:, None]).squeeze(1)
    return torch.relu(hinge if scale is None else scale * hinge)


def _loss(kind, s, y, **kw):
    if kind == "bal":
        return bal_noised_topk(s, y, **kw)
    kw.setdefault("max_m", 0.4)
    kw.setdefault("cls_num_list", COUNTS[: s.shape[1]])
    kw.setdefault("scale", 3.0)
    return imbal_noised_topk(s, y, **kw)


# ------------------------------------------------------------------------------- values


@FEW
@given(st.integers(0, 2**16), st.integers(1, 4), st.sampled_from([0.1, 1.0, 3.0]), st.integers(1, 6))
def test_matches_direct_monte_carlo_formula(seed, k, epsilon, samples):
    s, y = _problem(seed=seed)
    z = torch.randn(*s.shape, samples, generator=_gen(seed + 1), dtype=torch.float64)
    got = bal_noised_topk(s, y, k=k, epsilon=epsilon, noise=z, reduction="none")
    torch.testing.assert_close(got, _reference(s, y, k, epsilon, z))
    margins = ldam_margins(COUNTS, 0.4)
    got = imbal_noised_topk(
        s, y, k=k, epsilon=epsilon, noise=z, max_m=0.4, cls_num_list=COUNTS, scale=3.0, reduction="none"
    )
    torch.testing.assert_close(got, _reference(s, y, k, epsilon, z, margins, 3.0))


def test_ldam_margins():
    margins = ldam_margins(COUNTS, 0.4)
    expected = torch.tensor([n**-0.25 for n in COUNTS], dtype=torch.float64)
    torch.testing.assert_close(margins, 0.4 * expected / expected.max())
    assert margins[3] == 0.4  # the rarest class gets max_m
    assert torch.equal(ldam_margins(COUNTS, 0.0), torch.zeros(5, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["bal", "imbal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_accelerator_selection_gives_the_same_loss(kind, dtype):
    """Off the CPU the ``(k+1)``-th draw is taken by ``kthvalue`` (``compute.kth_largest``): the
    same noise gives the CPU's loss and gradient bit for bit."""
    s, y = _problem(batch=64, classes=300, seed=3, dtype=dtype)
    z = torch.randn(64, 300, 4, generator=_gen(9))
    results = []
    for steps in (contextlib.nullcontext(), accelerator_steps()):
        leaf = s.clone().requires_grad_()
        with steps:
            counts = {} if kind == "bal" else {"cls_num_list": list(range(1, 301))}
            loss = _loss(kind, leaf, y, k=5, epsilon=0.7, noise=z, **counts)
            loss.backward()
        results.append((loss.detach(), leaf.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("kind", ["bal", "imbal"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_epsilon_zero_is_exact_hard_hinge(kind, k):
    s, y = _problem(batch=20, seed=k)
    s.requires_grad_()
    loss = _loss(kind, s, y, k=k, epsilon=0.0, reduction="none")
    kth = s.detach().sort(dim=1, descending=True).values[:, k]
    margin = 1.0 if kind == "bal" else ldam_margins(COUNTS, 0.4)[y]
    scale = 1.0 if kind == "bal" else 3.0
    expected = torch.relu(scale * (margin + kth - s.detach().gather(1, y[:, None]).squeeze(1)))
    torch.testing.assert_close(loss.detach(), expected, rtol=0, atol=1e-15)
    loss.sum().backward()
    index = s.detach().sort(dim=1, descending=True).indices[:, k]
    grad = torch.zeros_like(s)
    active = (expected > 0).to(s.dtype) * scale
    grad.scatter_add_(1, index[:, None], active[:, None]).scatter_add_(1, y[:, None], -active[:, None])
    torch.testing.assert_close(s.grad, grad, rtol=0, atol=0)


def test_hinge_is_zero_when_label_wins_by_margin():
    s = torch.tensor([[10.0, 0.0, 0.1, -1.0]])
    assert bal_noised_topk(s, torch.tensor([0]), k=1, epsilon=0.0) == 0
    assert bal_noised_topk(s, torch.tensor([1]), k=2, epsilon=0.0) == 1.0  # 1 + s_[3] - s_1 = 1 + 0 - 0


def test_generator_reproducibility_and_global_rng():
    s, y = _problem(batch=8, classes=30, dtype=torch.float32)
    a = bal_noised_topk(s, y, k=3, epsilon=1.0, generator=_gen(7))
    b = bal_noised_topk(s, y, k=3, epsilon=1.0, generator=_gen(7))
    c = bal_noised_topk(s, y, k=3, epsilon=1.0, generator=_gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    torch.manual_seed(1)
    d = bal_noised_topk(s, y, k=3, epsilon=1.0)
    torch.manual_seed(1)
    assert torch.equal(d, bal_noised_topk(s, y, k=3, epsilon=1.0))
    module = BalNoisedTopK(3, epsilon=1.0, generator=_gen(7))
    assert torch.equal(module(s, y), a)
    assert not torch.equal(module(s, y), a)  # the generator advanced


def test_the_torch_path_draws_randn_of_the_input_shape():
    """Where no kernel draws the noise (accelerators; CPU with the kernels off, as here), it is
    ``randn(input.shape + (S,), generator)`` in float32: pytopk's draw."""
    s, y = _problem(batch=8, classes=30, dtype=torch.float32)
    z = torch.randn(*s.shape, 5, generator=_gen(7))
    kept = z.clone()
    with triton_gate.torch_path():
        a = bal_noised_topk(s, y, k=3, epsilon=1.0, generator=_gen(7))
        half = bal_noised_topk(s, y, k=3, epsilon=0.3, generator=_gen(7), reduction="none")
    assert torch.equal(a, bal_noised_topk(s, y, k=3, epsilon=1.0, noise=z))
    # the loss scales and adds into its own draw in place, never into the caller's noise
    assert torch.equal(half, bal_noised_topk(s, y, k=3, epsilon=0.3, noise=z, reduction="none"))
    assert torch.equal(z, kept)


def test_modules_equal_functions():
    s, y = _problem(batch=8, classes=5, dtype=torch.float32)
    weight = torch.rand(5, generator=_gen(3)) + 0.5
    y[0] = -1
    kw = {"weight": weight, "ignore_index": -1, "reduction": "sum"}
    bal = BalNoisedTopK(2, epsilon=0.5, n_samples=3, generator=_gen(4), **kw)
    assert torch.equal(bal(s, y), bal_noised_topk(s, y, k=2, epsilon=0.5, n_samples=3, generator=_gen(4), **kw))
    imbal = ImbalNoisedTopK(
        2, epsilon=0.5, max_m=0.3, cls_num_list=COUNTS, scale=7.0, n_samples=3, generator=_gen(4), **kw
    )
    expected = imbal_noised_topk(
        s, y, k=2, epsilon=0.5, max_m=0.3, cls_num_list=COUNTS, scale=7.0, n_samples=3, generator=_gen(4), **kw
    )
    assert torch.equal(imbal(s, y), expected)
    assert "margins" in dict(imbal.named_buffers()) and imbal.margins.dtype == torch.float64
    assert "weight" in dict(imbal.named_buffers())
    assert repr(imbal) == (
        "ImbalNoisedTopK(k=2, epsilon=0.5, max_m=0.3, scale=7.0, classes=5, n_samples=3, "
        "reduction='sum', ignore_index=-1, weight=True)"
    )


# ------------------------------------------------------------------------ reduction conventions


@pytest.mark.parametrize("kind", ["bal", "imbal"])
def test_reduction_weight_ignore_index_like_cross_entropy(kind):
    s, y = _problem(batch=12, classes=5, seed=3)
    z = torch.randn(*s.shape, 4, generator=_gen(0), dtype=torch.float64)
    weight = torch.tensor([0.5, 2.0, 1.0, 3.0, 0.25], dtype=torch.float64)
    y[[1, 4]] = 7
    per = _loss(kind, s, y, k=2, epsilon=0.5, noise=z, reduction="none", ignore_index=7)
    assert per.shape == (12,) and per[1] == 0 and per[4] == 0
    keep = y != 7
    safe = torch.where(keep, y, 0)
    unweighted = _loss(kind, s, safe, k=2, epsilon=0.5, noise=z, reduction="none")
    torch.testing.assert_close(per, unweighted * keep)
    w = weight[safe] * keep
    kw = {"k": 2, "epsilon": 0.5, "noise": z, "ignore_index": 7, "weight": weight}
    torch.testing.assert_close(_loss(kind, s, y, reduction="sum", **kw), (unweighted * w).sum())
    torch.testing.assert_close(_loss(kind, s, y, reduction="mean", **kw), (unweighted * w).sum() / w.sum())
    torch.testing.assert_close(_loss(kind, s, y, k=2, epsilon=0.5, noise=z, ignore_index=7), unweighted[keep].mean())
    # the weighted mean is CrossEntropyLoss's convention: check the denominators agree
    ce = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=7)
    ce_sum = torch.nn.CrossEntropyLoss(weight=weight, ignore_index=7, reduction="sum")
    torch.testing.assert_close(ce(s, y), ce_sum(s, y) / w.sum())
    # all targets ignored: 0, not NaN
    assert _loss(kind, s, torch.full_like(y, 7), k=2, epsilon=0.5, noise=z, ignore_index=7) == 0


@pytest.mark.parametrize("kind", ["bal", "imbal"])
def test_spatial_inputs_match_flattened_rows(kind):
    gen = _gen(5)
    s = torch.randn(3, 5, 4, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 5, (3, 4, 2), generator=gen)
    z = torch.randn(3, 5, 4, 2, 6, generator=gen, dtype=torch.float64)
    per = _loss(kind, s, y, k=2, epsilon=0.7, noise=z, reduction="none")
    assert per.shape == (3, 4, 2)
    rows = s.movedim(1, -1).reshape(-1, 5)
    rows_z = z.movedim(1, -2).reshape(-1, 5, 6)
    flat = _loss(kind, rows, y.reshape(-1), k=2, epsilon=0.7, noise=rows_z, reduction="none")
    torch.testing.assert_close(per.reshape(-1), flat, rtol=0, atol=0)
    torch.testing.assert_close(_loss(kind, s, y, k=2, epsilon=0.7, noise=z), flat.mean())
    # drawn noise: on the torch path, the draw of the input's shape; a kernel's own draws go by
    # rows, so a (N, C, d1) loss equals the (N*d1, C) loss from the same seed
    with triton_gate.torch_path():
        drawn = _loss(kind, s, y, k=2, epsilon=0.7, generator=_gen(9), reduction="none")
    z9 = torch.randn(3, 5, 4, 2, 5, generator=_gen(9)).to(torch.float64)
    torch.testing.assert_close(drawn, _loss(kind, s, y, k=2, epsilon=0.7, noise=z9, reduction="none"))
    drawn = _loss(kind, s, y, k=2, epsilon=0.7, generator=_gen(9), reduction="none")
    flat = _loss(kind, rows, y.reshape(-1), k=2, epsilon=0.7, generator=_gen(9), reduction="none")
    torch.testing.assert_close(drawn.reshape(-1), flat, rtol=0, atol=0)


# -------------------------------------------------------------------------------- gradients


@FEW
@given(
    st.integers(0, 2**16),
    st.integers(1, 3),
    st.sampled_from([0.0, 0.3, 2.0]),
    st.integers(1, 4),
    st.sampled_from(["bal", "imbal"]),
    st.sampled_from(["mean", "sum", "none"]),
)
def test_gradcheck_float64(seed, k, epsilon, samples, kind, reduction):
    s, y = _problem(batch=4, classes=5, seed=seed)
    s = s * 3  # spread apart: no ties, hinge away from its kink
    z = torch.randn(*s.shape, samples, generator=_gen(seed + 1), dtype=torch.float64)
    weight = torch.rand(5, generator=_gen(seed), dtype=torch.float64) + 0.5
    s.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda s: _loss(kind, s, y, k=k, epsilon=epsilon, noise=z, weight=weight, reduction=reduction), (s,)
    )


_SCALE_CASES = [
    (dtype, magnitude)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    for magnitude in (1e-6, 1e-3, 1.0, 1e3, 1e6)
    if not (dtype == torch.float16 and magnitude > 1e4)  # 1e6 is beyond float16's range
]


@pytest.mark.parametrize("kind", ["bal", "imbal"])
@pytest.mark.parametrize(("dtype", "magnitude"), _SCALE_CASES)
def test_finite_at_all_scales(kind, dtype, magnitude):
    s, y = _problem(batch=16, classes=20, seed=2, dtype=torch.float32)
    s = (s * magnitude).to(dtype).requires_grad_()
    extra = {} if kind == "bal" else {"cls_num_list": list(range(1, 21))}
    loss = _loss(kind, s, y, k=5, epsilon=1.0, generator=_gen(0), **extra)
    loss.backward()
    assert loss.dtype == dtype and torch.isfinite(loss)
    assert torch.isfinite(s.grad).all()


def test_gradient_is_sparse():
    s, y = _problem(batch=32, classes=1000, seed=0, dtype=torch.float32)
    s.requires_grad_()
    bal_noised_topk(s, y, k=5, epsilon=1.0, generator=_gen(0), reduction="sum").backward()
    assert int((s.grad != 0).sum(1).max()) <= 5 + 1


# ----------------------------------------------------------------------------------- errors


def test_error_messages():
    s, y = _problem(batch=2, classes=4, dtype=torch.float32)
    bal = {"k": 1, "epsilon": 1.0}
    imb = {"k": 1, "epsilon": 1.0, "max_m": 0.3, "cls_num_list": [1, 2, 3, 4]}
    cases = [
        (
            ValueError,
            "k must satisfy 1 <= k <= 3 (k < C, the number of classes",
            lambda: bal_noised_topk(s, y, k=4, epsilon=1.0),
        ),
        (
            ValueError,
            "k must satisfy 1 <= k <= 3 (k < C, the number of classes",
            lambda: bal_noised_topk(s, y, k=0, epsilon=1.0),
        ),
        (ValueError, "k must be >= 1, got 0", lambda: BalNoisedTopK(0, epsilon=1.0)),
        (TypeError, "k must be an int", lambda: bal_noised_topk(s, y, k=1.5, epsilon=1.0)),
        (
            ValueError,
            "k must satisfy 1 <= k <= 3 (k < C, the number of classes",
            lambda: BalNoisedTopK(5, epsilon=1.0)(s, y),
        ),
        (
            ValueError,
            "epsilon must be a finite number >= 0, got -0.5",
            lambda: bal_noised_topk(s, y, k=1, epsilon=-0.5),
        ),
        (
            ValueError,
            "epsilon must be a finite number >= 0, got nan",
            lambda: bal_noised_topk(s, y, k=1, epsilon=math.nan),
        ),
        (ValueError, "epsilon must be a finite number >= 0", lambda: BalNoisedTopK(1, epsilon=-1.0)),
        (ValueError, "n_samples must be >= 1, got 0", lambda: bal_noised_topk(s, y, n_samples=0, **bal)),
        (ValueError, "n_samples must be >= 1, got 0", lambda: BalNoisedTopK(1, epsilon=1.0, n_samples=0)),
        (
            ValueError,
            "cls_num_list must have one count per class, C = 4, got length 3",
            lambda: imbal_noised_topk(s, y, **{**imb, "cls_num_list": [1, 2, 3]}),
        ),
        (
            ValueError,
            "cls_num_list must have one count per class, C = 4, got length 3",
            lambda: ImbalNoisedTopK(1, epsilon=1.0, max_m=0.3, cls_num_list=[1, 2, 3])(s, y),
        ),
        (ValueError, "got 0.0 for class 2", lambda: imbal_noised_topk(s, y, **{**imb, "cls_num_list": [1, 2, 0, 4]})),
        (
            ValueError,
            "got -1.0 for class 0",
            lambda: ImbalNoisedTopK(1, epsilon=1.0, max_m=0.3, cls_num_list=[-1, 2, 3, 4]),
        ),
        (
            TypeError,
            "cls_num_list must be a non-empty sequence",
            lambda: imbal_noised_topk(s, y, **{**imb, "cls_num_list": []}),
        ),
        (
            TypeError,
            "cls_num_list must hold real numbers",
            lambda: imbal_noised_topk(s, y, **{**imb, "cls_num_list": [1, 2, "3", 4]}),
        ),
        (
            ValueError,
            "max_m must be a finite number >= 0, got -0.1",
            lambda: imbal_noised_topk(s, y, **{**imb, "max_m": -0.1}),
        ),
        (
            ValueError,
            "max_m must be a finite number >= 0",
            lambda: ImbalNoisedTopK(1, epsilon=1.0, max_m=-0.1, cls_num_list=[1, 2, 3, 4]),
        ),
        (ValueError, "scale must be a positive finite number, got 0", lambda: imbal_noised_topk(s, y, scale=0, **imb)),
        (
            ValueError,
            "target values must be in [0, 3] (or ignore_index=-100), got 4",
            lambda: bal_noised_topk(s, torch.tensor([0, 4]), **bal),
        ),
        (ValueError, "target values must be in [0, 3]", lambda: bal_noised_topk(s, torch.tensor([-1, 0]), **bal)),
        (
            TypeError,
            "target must hold integer class indices, got dtype torch.float32",
            lambda: bal_noised_topk(s, torch.tensor([0.0, 1.0]), **bal),
        ),
        (ValueError, "target must have shape (2,)", lambda: bal_noised_topk(s, torch.tensor([0, 1, 2]), **bal)),
        (
            ValueError,
            "weight must have shape (4,), got (3,)",
            lambda: bal_noised_topk(s, y, weight=torch.ones(3), **bal),
        ),
        (
            ValueError,
            "weight must have shape (4,), got (3,)",
            lambda: BalNoisedTopK(1, epsilon=1.0, weight=torch.ones(3))(s, y),
        ),
        (ValueError, "reduction must be one of", lambda: bal_noised_topk(s, y, reduction="avg", **bal)),
        (ValueError, "input must have shape (N, C)", lambda: bal_noised_topk(s[0], y, **bal)),
        (TypeError, "input must have a floating dtype", lambda: bal_noised_topk(y[None], y[:1], **bal)),
        (
            ValueError,
            "noise must have shape (2, 4, S): one noise draw per entry and sample, S >= 1, got (2, 4)",
            lambda: bal_noised_topk(s, y, noise=torch.randn(2, 4), **bal),
        ),
        (TypeError, "noise must be a floating torch.Tensor", lambda: bal_noised_topk(s, y, noise=[1.0], **bal)),
        (TypeError, "generator must be a torch.Generator", lambda: bal_noised_topk(s, y, generator=0, **bal)),
        (TypeError, "generator must be a torch.Generator", lambda: BalNoisedTopK(1, epsilon=1.0, generator=0)),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=_match(message)):
            call()
