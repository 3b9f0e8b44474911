"""The Triton kernel of top-k cross-entropy's pre-selection against the torch path and the numba
kernel: the selected scores, classes, label positions and gradients, and where it runs (in Triton's
interpreter without a GPU: ``triton_kernels.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import softtopk
from softtopk import _validation
from softtopk.ops import ce_head_triton, isotonic_numba, label_select, select_kernels, triton_gate
from softtopk.ops.label_select import LabelSelect

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import by_value  # noqa: E402
from dispatch_counter import accelerator_steps, count_call  # noqa: E402
from extended_rows import SELECTION_LABELS, SELECTION_ROWS  # noqa: E402
from triton_kernels import DEVICE, count_kernels, needs_triton, seeded_rows, usable_on_any_device  # noqa: E402

pytestmark = needs_triton

INF, NAN = float("inf"), float("nan")


def _select(x: torch.Tensor, label: torch.Tensor, m: int, path: str):
    """The selection and the gradient of ``x`` for a fixed weighting of the selected scores, by
    ``path``: ``'triton'``, ``'torch'`` or ``'numba'`` (the CPU kernel)."""
    leaf = x.detach().clone().requires_grad_()
    with pytest.MonkeyPatch.context() as patch:
        launched = count_kernels(patch, select_kernels, "label_select")
        patch.setattr(triton_gate, "usable", usable_on_any_device if path == "triton" else lambda *args: False)
        patch.setattr(triton_gate, "KERNELS", path != "torch")
        patch.setattr(label_select, "pays", lambda classes, m: path == "numba")
        scores, index, position, masked = LabelSelect.apply(leaf, label, m)
    assert len(launched) == (path == "triton")
    weights = torch.linspace(-1.0, 2.0, m, dtype=x.dtype).to(x.device)
    (scores.nan_to_num(0.0) * weights).sum().backward()
    return scores.detach(), index, position, masked, leaf.grad


def _same(x: torch.Tensor, label: torch.Tensor, m: int, ties: bool = False, path: str = "torch") -> None:
    """The kernel's selection is ``path``'s: exactly, except that with ``ties`` tied classes may
    be kept in another order (their scores, and the gradients summed by value, agree)."""
    got = _select(x, label, m, "triton")
    want = _select(x, label, m, path)
    for name, a, b in zip(("scores", "index", "position", "masked"), got[:4], want[:4], strict=True):
        if name == "index" and ties:
            continue
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=name)
    if ties:
        for a, b in zip(by_value(x.cpu(), got[4].cpu()), by_value(x.cpu(), want[4].cpu()), strict=True):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6)
    else:
        torch.testing.assert_close(got[4], want[4], rtol=0, atol=0)


def _rows(rows: int, classes: int, seed: int, dtype=torch.float32):
    label = torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
    return seeded_rows(rows, classes, dtype, seed), label


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("classes", "m"), [(1000, 16), (100, 16), (17, 16), (200, 6), (500, 64), (3, 2)])
def test_the_kernel_equals_the_torch_path(dtype, classes, m):
    x, label = _rows(4, classes, classes + m, dtype)
    _same(x, label, m)


def test_extreme_scales_and_labels_at_every_place_and_rank():
    x, label = _rows(4, 300, 3)
    for scale in (1e-6, 1e6):
        _same(x * scale, label, 16)
    row, _ = _rows(1, 40, 4)
    _same(row.expand(40, -1), torch.arange(40, device=DEVICE), 16)  # among the top 15, at the boundary, below


def test_infinities_nan_and_ties():
    x = torch.tensor(SELECTION_ROWS).to(DEVICE)
    for label in SELECTION_LABELS:
        _same(x, torch.tensor(label, device=DEVICE), 16, ties=True)


@pytest.mark.skipif(not isotonic_numba.available() or DEVICE != "cpu", reason="numba's kernel runs on CPU rows only")
def test_the_kernel_keeps_the_numba_kernels_order_among_ties():
    """Both kernels keep ``topk``'s order with ties by place, so even tied classes agree."""
    x = torch.tensor(SELECTION_ROWS)
    for label in SELECTION_LABELS:
        _same(x, torch.tensor(label), 16, path="numba")


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.sampled_from([-INF, -2.0, -1.0, 0.0, 0.5, 1.0, 3.0, INF, NAN]), min_size=24, max_size=24),
    st.integers(0, 23),
    st.integers(2, 10),
)
def test_any_row_of_few_values(row, label, m):
    """Rows of heavy ties, infinities and NaN: the same scores, positions and per-value gradients."""
    _same(torch.tensor([row]).to(DEVICE), torch.tensor([label], device=DEVICE), m, ties=True)


def test_the_loss_runs_the_kernel_and_equals_the_torch_path(monkeypatch):
    """Top-k CE by SoftSort on the torch path's head: one launch forward, and fewer ops than the
    torch path's selection; the same loss and gradient, with no value read."""
    monkeypatch.setattr(_validation, "values_checked", lambda value: False)
    logits, target = _rows(8, 100, 7)

    def loss(s):
        return softtopk.topk_cross_entropy(s, target, [0.5, 0.5], method="softsort", reduction="none")

    results = []
    for path in ("torch", "triton"):
        with pytest.MonkeyPatch.context() as patch:
            launched = count_kernels(patch, select_kernels, "label_select")
            patch.setattr(ce_head_triton, "usable", lambda scores: False)  # the selection alone differs
            patch.setattr(triton_gate, "usable", usable_on_any_device if path == "triton" else lambda *args: False)
            patch.setattr(triton_gate, "KERNELS", path == "triton")
            counts = count_call(loss, logits)
            leaf = logits.clone().requires_grad_()
            with accelerator_steps():  # a GPU's path: CPU rows would take numba's kernel here
                value = loss(leaf)
            value.sum().backward()
        assert len(launched) == 3 * (path == "triton") and counts.reads == 0  # count_call's two forwards, ours
        results.append((counts.launches, value.detach(), leaf.grad))
    (ops_torch, v0, g0), (ops_kernel, v1, g1) = results
    assert ops_kernel + 10 <= ops_torch
    torch.testing.assert_close(v1, v0, rtol=0, atol=0)
    torch.testing.assert_close(g1, g0, rtol=0, atol=0)


def test_where_the_kernel_runs(monkeypatch):
    """Rows of at most MAX_CLASSES classes and selections of at most MAX_M; vmap and compile keep
    the torch path (``triton_gate.usable``), and an empty batch launches nothing."""
    monkeypatch.setattr(label_select, "pays", lambda classes, m: False)
    monkeypatch.setattr(triton_gate, "usable", usable_on_any_device)
    launched = count_kernels(monkeypatch, select_kernels, "label_select")
    for classes, m, runs in ((label_select.MAX_CLASSES, 16, True), (label_select.MAX_CLASSES + 1, 16, False)):
        x, label = _rows(1, classes, 5)
        before = len(launched)
        LabelSelect.apply(x, label, m)
        assert (len(launched) > before) == runs
    x, label = _rows(2, 200, 6)
    before = len(launched)
    LabelSelect.apply(x, label, label_select.MAX_M + 1)
    torch.func.vmap(lambda r, y: LabelSelect.apply(r[None], y[None], 8)[0][0])(x, label)
    empty = LabelSelect.apply(x[:0], label[:0], 8)
    assert len(launched) == before and empty[0].shape == (0, 8)
