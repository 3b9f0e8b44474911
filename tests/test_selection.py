"""``ops.compute.topk_rows`` (strided block maxima on the CPU) selects exactly what torch.topk selects."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softtopk.ops.compute import topk_rows


@settings(max_examples=80, deadline=None)
@given(
    n=st.sampled_from([2, 7, 64, 100, 256, 640, 1000, 1024, 2100, 8192, 10000]),
    m=st.integers(1, 40),
    levels=st.sampled_from([0, 2, 5]),  # 0: continuous scores; otherwise heavy ties
    infinities=st.booleans(),
    largest=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_rows_match_torch_topk_values(n, m, levels, infinities, largest, seed):
    m = min(m, n)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(7, n, generator=generator)
    if levels:
        scores = torch.randint(0, levels, (7, n), generator=generator).float()
    if infinities:  # ±inf, rows short of finite entries, an all -inf row
        scores[0, : n // 3] = float("inf")
        scores[1, : n - m // 2] = -float("inf")
        scores[2] = -float("inf")
    values, index = topk_rows(scores, m, largest)
    assert index.shape == (7, m)
    assert ((index >= 0) & (index < n)).all()
    assert all(len(set(row.tolist())) == m for row in index)  # distinct items
    assert torch.equal(values, scores.topk(m, dim=-1, largest=largest).values)
    assert torch.equal(scores.gather(-1, index), values)
