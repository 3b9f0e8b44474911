"""The CPU's own steps of ``softtopk.ops.compute`` (``topk_rows``, ``sort_rows``, ``row_dot``):
other ATen calls, faster on a CPU, that give the values of the one call an accelerator makes."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from dispatch_counter import accelerator_steps
from softtopk.ops import compute

INF, NAN = float("inf"), float("nan")


def _rows(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Rows with ties, ±inf, ±0, rows short of finite entries, an all -inf row and NaN of both signs."""
    x = torch.randn(8, n, generator=torch.Generator().manual_seed(seed), dtype=dtype).round(decimals=1)
    x[1, : n // 30] = INF
    x[2, : n - 7] = -INF
    x[3, 20:] = INF
    x[4] = -INF
    x[5, : n // 2] = 0.0
    x[5, n // 2 :] = -0.0
    x[6, :3] = NAN
    x[7, :3] = -NAN
    return x


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(("n", "k"), [(1000, 20), (1000, 5), (4000, 5), (64, 2), (65536, 10), (1001, 20)])
def test_candidates_from_blocks_are_topk(n, k, largest):
    """``topk_rows`` gives ``torch.topk``'s values, sorted, at distinct indices holding them, with
    NaN ranked as ``topk`` ranks it (more shapes and ties: tests/test_selection.py)."""
    x = _rows(n, n + k)
    x[7, :3] = NAN  # rows 6 and 7: NaN of either sign, one NaN in a row of -inf
    x[4, 5] = NAN
    values, index = compute.topk_rows(x, k, largest)
    want = x.topk(k, -1, largest=largest).values
    assert torch.equal(values.isnan(), want.isnan())
    assert torch.equal(values.nan_to_num(0.5), want.nan_to_num(0.5))
    assert torch.equal(x.gather(-1, index).nan_to_num(0.5), values.nan_to_num(0.5))
    assert (index.sort(-1).values.diff(dim=-1) > 0).all()


@pytest.mark.parametrize("k", [1, 6, 500, 1000])
def test_kth_largest_on_either_path(k):
    """``kth_largest`` along a strided dim (the noised losses' ``(R, C, S)`` draws): ``topk``'s
    ``k``-th on the CPU and ``kthvalue`` off it give the same values, NaN where ``topk`` puts it, at
    indices holding them."""
    x = _rows(1000, k)
    draws = torch.stack([x, x.flip(-1), -x], -1)  # (8, 1000, 3): the selection runs along dim 1
    want = draws.topk(k, dim=1).values[:, k - 1]
    for steps in (contextlib.nullcontext(), accelerator_steps()):
        with steps:
            values, index = compute.kth_largest(draws, k, dim=1)
        assert values.shape == index.shape == (8, 3)
        assert torch.equal(values.isnan(), want.isnan())
        assert torch.equal(values.nan_to_num(0.5), want.nan_to_num(0.5))
        assert torch.equal(draws.gather(1, index.unsqueeze(1)).squeeze(1).nan_to_num(0.5), values.nan_to_num(0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("stable", [False, True])
@pytest.mark.parametrize("n", [32, 100, 1000])  # torch.sort itself, integer keys
def test_sort_by_integer_keys_is_torch_sort(dtype, descending, stable, n):
    """``sort_rows`` equals ``torch.sort``: values (NaN of either sign where it puts NaN) and, among
    ties (``-0`` tied with ``+0`` too), the same order."""
    x = _rows(n, 0, dtype)
    values, index = compute.sort_rows(x, descending, stable)
    want, want_index = x.sort(dim=-1, descending=descending, stable=stable)
    assert torch.equal(values.isnan(), want.isnan())
    assert torch.equal(values.nan_to_num(0.5), want.nan_to_num(0.5))
    assert torch.equal(index, want_index)
    finite = x.nan_to_num(0.0)  # the caller's promise: no NaN, no mask
    assert torch.equal(
        compute.sort_rows(finite, descending, stable, finite=True)[1],
        finite.sort(dim=-1, descending=descending, stable=stable)[1],
    )


@pytest.mark.parametrize("value", [1.0, -1.0])
def test_muladd_on_either_path(value):
    """``muladd_rows`` is ``addcmul`` to a rounding, on the CPU (a product and a sum) and off it."""
    terms, scale, shift = (
        torch.rand(4, 300, dtype=torch.float64),
        torch.rand(4, 1, dtype=torch.float64),
        torch.rand(4, 1, dtype=torch.float64),
    )
    want = torch.addcmul(shift, terms, scale, value=value)
    torch.testing.assert_close(compute.muladd_rows(terms, scale, shift, value), want, rtol=1e-15, atol=1e-15)
    with accelerator_steps():
        assert torch.equal(compute.muladd_rows(terms, scale, shift, value), want)


def test_row_dot_on_either_path():
    a, b = torch.randn(2, 5, 300, dtype=torch.float64)
    want = (a * b).sum(-1, keepdim=True)
    torch.testing.assert_close(compute.row_dot(a, b), want, rtol=1e-14, atol=1e-14)
    with accelerator_steps():
        torch.testing.assert_close(compute.row_dot(a, b), want, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize(("rows", "n"), [(3, 7), (200, 1000), (5, 70000)])  # one block, 65 rows a block, a row a block
@pytest.mark.parametrize("degree", [1, 5])
def test_power_sums_on_either_path(rows, n, degree):
    """``power_sums`` (by blocks of rows on the CPU, in place) gives float64 ``Σ y^m`` exactly as the
    whole-batch products an accelerator makes, and leaves its argument unchanged."""
    y = torch.rand(rows, n, generator=torch.Generator().manual_seed(n))
    kept = y.clone()
    want = torch.stack([(y.double() ** m).sum(-1) for m in range(1, degree + 1)], -1)
    got = compute.power_sums(y, degree)
    assert got.dtype == torch.float64 and got.shape == (rows, degree)
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0.0)
    with accelerator_steps():
        assert torch.equal(compute.power_sums(y, degree), got)  # the same products, summed per row
    assert torch.equal(y, kept)


def test_horner_step_on_either_path():
    """``horner_step`` is ``addcmul`` to a rounding; on the CPU a ``(R, n)`` accumulator is written in
    place, a per-row one is not."""
    y, acc, shift = torch.rand(4, 300, dtype=torch.float64), torch.rand(4, 1, dtype=torch.float64), torch.rand(4, 1)
    shift = shift.double()
    first = compute.horner_step(shift, acc, y)
    torch.testing.assert_close(first, torch.addcmul(shift, acc, y), rtol=1e-15, atol=1e-15)
    want = torch.addcmul(shift, first, y)
    second = compute.horner_step(shift, first, y)
    assert second.data_ptr() == first.data_ptr()
    torch.testing.assert_close(second, want, rtol=1e-15, atol=1e-15)
    with accelerator_steps():
        fresh = compute.horner_step(shift, acc.expand(4, 300).clone(), y)
        assert torch.equal(fresh, torch.addcmul(shift, acc, y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("samples", [1, 3, 5, 8, 100])
def test_overflow_free_mean_is_the_mean_bit_for_bit(dtype, samples):
    """``overflow_free_mean`` gives ``plus + values.mean(-1)`` exactly (the roundings commute with its
    powers of 2), and stays finite near the dtype's largest value, where the mean's sum overflows."""
    values = torch.randn(50, samples, generator=torch.Generator().manual_seed(samples), dtype=dtype) * 1e3
    plus = torch.randn(50, dtype=dtype)
    assert torch.equal(compute.overflow_free_mean(values), values.mean(-1))
    assert torch.equal(compute.overflow_free_mean(values, plus=plus), plus + values.mean(-1))
    assert torch.equal(compute.overflow_free_mean(values, plus=1.0), 1.0 + values.mean(-1))
    big = torch.full((2, samples), torch.finfo(dtype).max, dtype=dtype)
    big[1] *= -1
    want = torch.tensor([1.0, -1.0], dtype=dtype) * torch.finfo(dtype).max
    got = compute.overflow_free_mean(big)  # the mean's own rounding of a division by S: an ulp
    assert bool(got.isfinite().all())
    torch.testing.assert_close(got, want, rtol=2 * torch.finfo(dtype).eps, atol=0)


def test_off_the_cpu_each_step_is_one_call():
    """On ``meta`` (as on an accelerator) the steps are ``topk``, ``sort`` and ``bmm`` themselves."""
    x = torch.empty(4, 1000, device="meta")
    assert compute.topk_rows(x, 20)[0].shape == (4, 20)
    assert compute.sort_rows(x)[1].shape == (4, 1000)
    assert compute.row_dot(x, x).shape == (4, 1)


def test_put_rows_writes_in_place_and_copies_under_vmap_and_compile():
    index = torch.tensor([[2, 0], [1, 3]])
    values = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    fresh = torch.zeros(2, 4)
    out = compute.put_rows(fresh, index, values)
    assert out.data_ptr() == fresh.data_ptr()  # no copy of the row
    torch.testing.assert_close(out, torch.zeros(2, 4).scatter(-1, index, values))
    torch.testing.assert_close(
        compute.put_rows(torch.zeros(3, 2), index[:1], 1.0, dim=0)[:, 0], torch.tensor([0, 0, 1.0])
    )

    def per_row(row: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return compute.put_rows(torch.zeros_like(row), i, v)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scatter_ under vmap would warn and fall back to a loop
        batched = torch.vmap(per_row)(torch.ones(2, 4), index, values)
    torch.testing.assert_close(batched, out)
    compiled = torch.compile(lambda r: compute.put_rows(r * 1, index, values), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(torch.zeros(2, 4)), out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_filled_is_masked_fill(dtype):
    """``filled`` (one ``where`` with the value on the device) gives ``masked_fill``'s values, with a
    broadcast mask, NaN and ``±inf`` kept where unmasked, and its gradient (0 under the mask)."""
    x = _rows(50, 1, dtype)
    mask = torch.rand(50, generator=torch.Generator().manual_seed(2)) < 0.4  # broadcast over the rows
    got, want = compute.filled(x, mask, -1.5), x.masked_fill(mask, -1.5)
    assert got.dtype == dtype and got.shape == x.shape
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(0.5), want.nan_to_num(0.5))
    leaf = x.nan_to_num(0.0).requires_grad_()
    compute.filled(leaf, mask, 3.0).sum().backward()
    assert torch.equal(leaf.grad, (~mask).to(dtype).expand_as(leaf))


def test_filled_keeps_integer_and_meta_tensors():
    labels = torch.arange(-3, 7)
    assert torch.equal(compute.filled(labels, labels < 0, 0), labels.clamp_min(0))
    meta = compute.filled(torch.empty(3, 4, device="meta"), torch.ones(4, dtype=torch.bool, device="meta"), 1.0)
    assert meta.shape == (3, 4) and meta.device.type == "meta"
