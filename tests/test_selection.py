"""The loss's top-m pre-selection (strided block maxima) selects exactly what torch.topk selects."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from softtopk.losses.topk_ce import _top_indices


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 2100),
    m=st.integers(1, 40),
    levels=st.sampled_from([0, 2, 5]),  # 0: continuous scores; otherwise heavy ties
    seed=st.integers(0, 2**31 - 1),
)
def test_top_indices_match_torch_topk_values(n, m, levels, seed):
    m = min(m, n)
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(7, n, generator=generator)
    if levels:
        scores = torch.randint(0, levels, (7, n), generator=generator).float()
    index = _top_indices(scores, m)
    assert index.shape == (7, m)
    assert ((index >= 0) & (index < n)).all()
    assert all(len(set(row.tolist())) == m for row in index)  # distinct items
    assert torch.equal(scores.gather(-1, index), scores.topk(m, dim=-1).values)
