"""softtopk.ops.isotonic_small, the base case of the fixed-shape isotonic solver: every segment
against the NumPy PAV oracle (values, ties, integer data, wide ranges), bitwise equal values within
a block, the segment size it picks, and no value read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import permutahedron_reference as R
from dispatch_counter import count_call
from softtopk.ops import isotonic
from softtopk.ops import isotonic_small as S


def _segments(seed: int, m: int, kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "ties":  # small integers: many equal values and exactly equal block means
        return rng.integers(-3, 4, size=(5, m)).astype(np.float64)
    if kind == "wide":
        return rng.normal(size=(5, m)) * 10.0 ** rng.integers(-6, 7, size=(5, 1))
    return np.sort(rng.normal(size=(5, m)), -1)[:, ::-1] + rng.normal(size=(5, m)) * 0.3  # nearly decreasing


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), log_m=st.integers(1, 7), kind=st.sampled_from(["ties", "wide", "near"]))
def test_segments_match_pav(seed, log_m, kind):
    m = 2**log_m
    y = _segments(seed, m, kind)
    lw = np.random.default_rng(seed + 1).normal(size=y.shape)
    got = S.small_l2(torch.tensor(y.reshape(1, -1)), m).reshape(y.shape).numpy()
    want = np.stack([R.isotonic_l2(row) for row in y])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(y).max())
    # points of one block are bitwise equal: as many distinct values as the oracle's blocks
    assert [len(set(row)) for row in got] == [len(np.unique(np.round(row, 9))) for row in want]
    y = y / max(1.0, np.abs(y).max() / 50)  # kl values are log-sum-exps: keep exp within range
    got = S.small_kl(torch.tensor((y - lw).reshape(1, -1)), torch.tensor(lw.reshape(1, -1)), m).reshape(y.shape)
    want = np.stack([R.isotonic_kl(a, b) for a, b in zip(y, lw, strict=True)])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize(
    "shape,size", [((64, 128), 128), ((64, 1024), 64), ((64, 16384), 4), ((64, 131072), 1), ((3, 2), 2), ((0, 8), 8)]
)
def test_segment_size_within_the_memory_budget(shape, size, monkeypatch):
    assert S.small_size(torch.Size(shape), torch.device("cpu")) == min(size, 4)
    monkeypatch.setattr(S, "_cap", lambda device: 128)  # an accelerator's
    assert S.small_size(torch.Size(shape), torch.device("cpu")) == size


def test_no_value_read_and_few_launches():
    y = torch.randn(4, 64, dtype=torch.float64)
    assert count_call(lambda t: S.small_l2(t, 64), y, backward=False).reads == 0
    counts = count_call(lambda t: S.small_kl(t, t * 0.5, 64), y, backward=False)
    assert counts.reads == 0 and counts.launches <= 30, counts.ops


@pytest.mark.parametrize("n", [100, 300, 1000])
def test_levels_on_top_of_the_accelerator_base_case(n, monkeypatch):
    """With an accelerator's segments (up to 128 points at once), the fixed-shape solver still
    agrees with the CPU rounds, plain and under vmap."""
    monkeypatch.setattr(S, "_cap", lambda device: 128)
    gen = torch.Generator().manual_seed(n)
    s = torch.randn(6, n, dtype=torch.float64, generator=gen).sort(-1, descending=True).values * 3
    w = torch.arange(n, 0, -1, dtype=torch.float64)
    lw = torch.randn(6, n, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(isotonic.levels_l2(s - w), isotonic.isotonic_l2(s - w), rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(isotonic.levels_kl(s, lw), isotonic.isotonic_kl(s, lw), rtol=1e-12, atol=1e-10)
    vmapped = torch.vmap(lambda a, b: isotonic.levels_kl(a[None], b[None])[0])(s, lw)
    torch.testing.assert_close(vmapped, isotonic.isotonic_kl(s, lw), rtol=1e-12, atol=1e-10)
