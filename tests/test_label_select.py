"""The numba kernel of top-k cross-entropy's pre-selection against its torch path: the selected
scores, classes, label positions and gradients, and where it runs (``softtopk.ops.label_select``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softtopk.ops import isotonic_numba, label_select, networks_numba, triton_gate
from softtopk.ops.label_select import LabelSelect

sys.path.insert(0, str(Path(__file__).parent))
from cpu_kernels import by_value, topk_ce_paths  # noqa: E402
from dispatch_counter import accelerator_steps  # noqa: E402
from extended_rows import SELECTION_LABELS, SELECTION_ROWS  # noqa: E402

pytestmark = pytest.mark.skipif(
    not isotonic_numba.available(), reason="numba is not installed, so there is no kernel to test (pip install numba)"
)

INF = float("inf")


@pytest.fixture(autouse=True)
def any_size(monkeypatch):
    """The kernel at every size, not only where it is faster (``test_the_kernel_runs_where_it_pays``)."""
    monkeypatch.setattr(label_select, "pays", lambda classes, m: True)


def _select(x: torch.Tensor, label: torch.Tensor, m: int, kernel: bool):
    """The selection and the gradient of ``x`` for a fixed weighting of the selected scores."""
    leaf = x.detach().clone().requires_grad_()
    assert label_select.usable(leaf, m) == kernel or not kernel
    with torch.enable_grad() if kernel else triton_gate.torch_path():
        assert label_select.usable(leaf, m) == kernel
        scores, index, position, masked = LabelSelect.apply(leaf, label, m)
    weights = torch.linspace(-1.0, 2.0, m, dtype=x.dtype)
    (scores.nan_to_num(0.0) * weights).sum().backward()
    return scores.detach(), index, position, masked, leaf.grad


def _same(x: torch.Tensor, label: torch.Tensor, m: int, ties: bool = False) -> None:
    got = _select(x, label, m, kernel=True)
    want = _select(x, label, m, kernel=False)
    for name, a, b in zip(("scores", "index", "position", "masked"), got[:4], want[:4], strict=True):
        if name == "index" and ties:  # tied classes may be kept in either order: their scores agree
            continue
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=name)
    if ties:  # sums of the same weights, perhaps in another order
        for a, b in zip(by_value(x, got[4]), by_value(x, want[4]), strict=True):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-6)
    else:
        torch.testing.assert_close(got[4], want[4], rtol=0, atol=0)


def _rows(rows: int, classes: int, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, classes, generator=gen, dtype=dtype), torch.randint(0, classes, (rows,), generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("classes", "m"), [(1000, 16), (100, 16), (64, 16), (40, 16), (17, 16), (200, 6), (500, 64)])
def test_the_kernel_equals_the_torch_path(dtype, classes, m):
    x, label = _rows(32, classes, classes + m, dtype)
    _same(x, label, m)


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_extreme_scales(scale):
    x, label = _rows(16, 300, 3)
    _same(x * scale, label, 16)


def test_labels_at_every_place_and_rank():
    x, _ = _rows(1, 200, 4)
    x = x.expand(200, -1)
    _same(x, torch.arange(200), 16)  # the label among the top 15, at the boundary, and far below


def test_infinities_nan_and_ties():
    x = torch.tensor(SELECTION_ROWS)
    for label in SELECTION_LABELS:
        _same(x, torch.tensor(label), 16, ties=True)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([-INF, -2.0, -1.0, 0.0, 0.5, 1.0, 3.0, INF]), min_size=40, max_size=40),
    st.integers(0, 39),
    st.integers(2, 10),
)
def test_any_row_of_few_values(row, label, m):
    """Rows of heavy ties and infinities: the same scores, positions and per-value gradients."""
    _same(torch.tensor([row]), torch.tensor([label]), m, ties=True)


def test_the_loss_and_its_gradient_equal_the_torch_path(monkeypatch):
    """The selection alone differs (the network's backward kernel, ``test_networks_numba.py``, off)."""
    monkeypatch.setattr(networks_numba, "usable", lambda *args: False)
    x, label = _rows(64, 1000, 5)
    results = topk_ce_paths(x, label)
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_the_kernel_runs_where_it_pays(monkeypatch):
    monkeypatch.undo()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert label_select.pays(1000, 16) and label_select.pays(17, 16) and label_select.pays(10**5, 16)
    assert label_select.pays(1000, 17) and label_select.pays(256, label_select.MAX_M)
    assert not label_select.pays(1000, label_select.MAX_M + 1)  # its insertions grow with m: topk
    assert not label_select.pays(255, label_select.MAX_M)  # too short for its bound: every entry inserted
    assert label_select.usable(torch.randn(4, 64), 16) and label_select.usable(torch.randn(4, 68), 17)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # torch's threads against one kernel thread
    assert label_select.pays(4096, 16) and not label_select.pays(4097, 16) and not label_select.pays(1000, 17)
    assert label_select.usable(torch.randn(4, 64), 16) and not label_select.usable(torch.randn(4, 68), 17)


def test_where_the_kernel_runs(monkeypatch):
    x = torch.randn(4, 50)
    assert label_select.usable(x, 16) and label_select.usable(x.double(), 40)
    assert not label_select.usable(x.bfloat16(), 16)  # NumPy has no bfloat16 (losses compute in float32)
    assert not label_select.usable(x.to("meta"), 16)
    with triton_gate.torch_path():
        assert not label_select.usable(x, 16)
    with accelerator_steps():  # the launch counts of the tests and count_launches.py: an accelerator's path
        assert not label_select.usable(x, 16)
    seen = []
    torch.func.vmap(lambda row: seen.append(label_select.usable(row[None], 16)) or row)(x)
    assert seen == [False]
    monkeypatch.setattr(isotonic_numba, "available", lambda: False)  # no numba, or SOFTTOPK_NUMBA=0
    assert not label_select.usable(x, 16)


def test_vmap_and_an_empty_batch_take_their_paths():
    x, label = _rows(6, 50, 6, torch.float64)
    got = torch.func.vmap(lambda r, y: LabelSelect.apply(r[None], y[None], 8)[0][0])(x, label)
    torch.testing.assert_close(got, LabelSelect.apply(x, label, 8)[0], rtol=0, atol=0)
    empty = LabelSelect.apply(torch.empty(0, 50), torch.empty(0, dtype=torch.int64), 8)
    assert [t.shape for t in empty] == [(0, 8), (0, 8), (0,), (0,)]
