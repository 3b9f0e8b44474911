"""The sparse mask kernel with a per-row tensor ``l`` (B, 1) (issue 12, item 4).

Checked here, on :func:`softtopk.ops.sparse.sparse_mask_rows` directly: the forward equals the float
call row by row (and the float64 PAV oracle), also for huge ``l`` (solved as ``(x/l, 1)``), tiny
``l`` (hard rows), ties, ``±inf`` entries and an ``l`` of another dtype; the analytic gradient in
``l`` (implicit in the threshold) by gradcheck and by the degree-0 homogeneity of the mask in
``(x, l)``; Dykstra with a tensor ``l`` (its value, the exact problem's gradient).
"""

from __future__ import annotations

import pytest
import torch

from pav_reference import pav_mask
from softtopk.ops.dykstra import dykstra_mask_rows
from softtopk.ops.sparse import sparse_mask_rows

F64 = torch.float64
P_VALUES = (2.0, 4.0 / 3.0)


def _mask(x, k, l, p=2.0, solver="pav", n_iter=500):
    return sparse_mask_rows(x, k, l=l, p=p, solver=solver, n_iter=n_iter)


def _rows(seed: int = 0) -> torch.Tensor:
    """Five rows of 9: random, two ties inside the support, random, a separated grid (hard for small l), random."""
    x = torch.randn(5, 9, generator=torch.Generator().manual_seed(seed), dtype=F64)
    x[1, 2] = x[1, 5]
    x[1, 7] = x[1, 0]
    x[3] = torch.tensor([4.0, -1.0, 7.0, 0.0, 2.0, 6.0, 1.0, 3.0, 5.0], dtype=F64)
    return x


LAM = [[0.3], [1.0], [5.0], [1e-3], [0.05]]


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("k", [1, 3, 8])
def test_forward_equals_the_float_call_row_by_row(p, k):
    x = _rows()
    lam = torch.tensor(LAM, dtype=F64)
    lam[2, 0] = 1e150  # solved as (x / l, 1)
    got = _mask(x, k, lam, p)
    for i in range(x.shape[0]):
        want = _mask(x[i : i + 1], k, float(lam[i]), p)
        torch.testing.assert_close(got[i : i + 1], want, atol=1e-12, rtol=0)
        row, scale = x[i : i + 1], max(float(lam[i]), 1.0)  # the oracle overflows at l = 1e150
        oracle = torch.from_numpy(pav_mask((row / scale).numpy(), k, float(lam[i]) / scale, p))
        torch.testing.assert_close(got[i : i + 1], oracle, atol=1e-9, rtol=0)
    torch.testing.assert_close(got.sum(-1), torch.full((5,), float(k), dtype=F64), atol=1e-12, rtol=0)
    assert torch.equal(got[3], (x[3] >= x[3].topk(k).values[-1]).to(F64))  # l = 1e-3: the hard mask


@pytest.mark.parametrize("p", P_VALUES)
def test_l_of_another_dtype_or_broadcast_is_converted(p):
    x = _rows(1)
    lam32 = torch.tensor(LAM, dtype=torch.float32)
    got = _mask(x, 3, lam32, p)
    assert got.dtype == F64
    torch.testing.assert_close(got, _mask(x, 3, lam32.to(F64), p), atol=0, rtol=0)
    # float32 rows with a float64 l: the same rounding as the float call (l rounded like a scalar)
    x32, lam64 = x.float(), torch.tensor(LAM, dtype=F64)
    got32 = _mask(x32, 3, lam64, p)
    assert got32.dtype == torch.float32
    for i in range(x.shape[0]):
        assert torch.equal(got32[i : i + 1], _mask(x32[i : i + 1], 3, float(lam64[i]), p))
    # one l for every row, as (1, 1)
    torch.testing.assert_close(
        _mask(x, 3, torch.tensor([[0.7]], dtype=F64), p), _mask(x, 3, 0.7, p), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("p", P_VALUES)
def test_gradcheck_in_x_and_l_with_ties_and_a_hard_row(p):
    x = _rows(2).requires_grad_()
    lam = torch.tensor(LAM, dtype=F64, requires_grad=True)
    for k in (2, 3):
        assert torch.autograd.gradcheck(lambda a, b, k=k: _mask(b, k, a, p), (lam, x))
    # l alone (x constant), and a weighted loss
    w = torch.randn(5, 9, generator=torch.Generator().manual_seed(3), dtype=F64)
    assert torch.autograd.gradcheck(lambda a: (_mask(x.detach(), 3, a, p) * w).sum(-1), (lam,))


@pytest.mark.parametrize("p", P_VALUES)
def test_hard_rows_have_zero_gradient(p):
    x = _rows(3).requires_grad_()
    lam = torch.tensor([[1e-8], [1e-9], [1e-12], [1e-8], [1e-10]], dtype=F64, requires_grad=True)
    mask = _mask(x, 4, lam, p)
    assert ((mask == 0) | (mask == 1)).all()
    (mask * torch.arange(9.0, dtype=F64)).sum().backward()
    assert torch.equal(lam.grad, torch.zeros_like(lam)) and torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("p", P_VALUES)
def test_the_l_gradient_satisfies_homogeneity(p):
    # mask(c x, c l) = mask(x, l): x . dL/dx + l dL/dl = 0 on every row, huge l included
    x = (_rows(4) * torch.tensor([[1.0], [1.0], [1e140], [1.0], [3.0]], dtype=F64)).requires_grad_()
    lam = torch.tensor([[0.3], [1.0], [2e140], [0.2], [1e120]], dtype=F64, requires_grad=True)
    mask = _mask(x, 3, lam, p)
    assert ((mask[2] > 0) & (mask[2] < 1)).sum() >= 2  # x / l of order one: a soft row
    (mask * torch.randn(5, 9, generator=torch.Generator().manual_seed(5), dtype=F64)).sum().backward()
    euler = (x * x.grad).sum(-1, keepdim=True)
    scale = (x.abs() * x.grad.abs()).sum(-1, keepdim=True).clamp_min(1e-300)  # 0 on hard rows
    assert (lam.grad[:3] != 0).all() and torch.isfinite(lam.grad).all()  # rows 3, 4: hard, and near uniform
    torch.testing.assert_close(lam * lam.grad / scale, -euler / scale, atol=1e-12, rtol=0)


@pytest.mark.parametrize("p", P_VALUES)
def test_huge_l_per_row_is_finite_and_tends_to_uniform(p):
    x = _rows(5).requires_grad_()
    lam = torch.tensor([[1e101], [1e200], [1.7e308], [0.5], [1e99]], dtype=F64, requires_grad=True)
    mask = _mask(x, 3, lam, p)
    torch.testing.assert_close(mask[:3], torch.full((3, 9), 3 / 9, dtype=F64), atol=1e-12, rtol=0)
    for i in (0, 1, 4):  # (the float call at p = 4/3 was NaN from l ~ 5e51 up to 1e100)
        torch.testing.assert_close(
            mask[i : i + 1], _mask(x.detach()[i : i + 1], 3, float(lam.detach()[i]), p), atol=1e-12, rtol=0
        )
    mask.pow(3).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(lam.grad).all()


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("big", [1.0, 1e150])
def test_infinite_entries(p, big):
    inf = float("inf")
    x = _rows(6)
    x[0, 0], x[0, 4] = -inf, inf
    x[1, :4] = -inf
    x[2, 1] = x[2, 6] = inf
    x[3, :5] = -inf
    x[3, 6] = inf
    x = x.requires_grad_()
    lam = torch.tensor([[0.3 * big], [1.0], [5.0 * big], [0.5], [1e-3]], dtype=F64, requires_grad=True)
    mask = _mask(x, 3, lam, p)
    assert torch.isfinite(mask).all()
    assert (mask[x.detach() == -inf] == 0).all() and (mask[x.detach() == inf] == 1).all()
    torch.testing.assert_close(mask.sum(-1), torch.full((5,), 3.0, dtype=F64), atol=1e-12, rtol=0)
    for i in range(5):
        torch.testing.assert_close(
            mask[i : i + 1], _mask(x.detach()[i : i + 1], 3, float(lam.detach()[i]), p), atol=1e-12, rtol=0
        )
    (mask * torch.arange(9.0, dtype=F64)).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(lam.grad).all()
    assert (x.grad[x.detach().isinf()] == 0).all()
    if big == 1.0:  # the finite entries' gradient, x and l
        finite = x.detach().isfinite()

        def on_finite(values, a):
            full = x.detach().masked_scatter(finite, values)
            return _mask(full, 3, a, p)

        assert torch.autograd.gradcheck(on_finite, (x.detach()[finite].requires_grad_(), lam))


def test_dykstra_value_with_the_exact_gradient():
    x = _rows(7).requires_grad_()
    lam = torch.tensor([[0.3], [1.0], [5.0], [0.2], [1e150]], dtype=F64, requires_grad=True)
    got = _mask(x, 3, lam, solver="dykstra", n_iter=40)
    # the value is Dykstra's, per row (a huge l is run on (x / l, 1), as the float call does)
    for i in range(5):
        want = _mask(x.detach()[i : i + 1], 3, float(lam.detach()[i]), solver="dykstra", n_iter=40)
        torch.testing.assert_close(got[i : i + 1], want, atol=1e-12, rtol=0)
    assert not torch.equal(got.detach(), _mask(x.detach(), 3, lam.detach()))  # 40 iterations: not converged
    # the gradient is the exact problem's, for x and l
    w = torch.randn(5, 9, generator=torch.Generator().manual_seed(8), dtype=F64)
    grads = torch.autograd.grad((got * w).sum(), (x, lam))
    wants = torch.autograd.grad((_mask(x, 3, lam) * w).sum(), (x, lam))
    for grad, want in zip(grads, wants, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-12, rtol=0)
    # l alone requiring a gradient: still the exact one (no graph through Dykstra's iterations)
    x0 = x.detach()
    (grad,) = torch.autograd.grad((_mask(x0, 3, lam, solver="dykstra", n_iter=40) * w).sum(), lam)
    (want,) = torch.autograd.grad((_mask(x0, 3, lam) * w).sum(), lam)
    torch.testing.assert_close(grad, want, atol=1e-12, rtol=0)
    # converged, the value is the exact mask
    torch.testing.assert_close(
        _mask(x0, 3, lam.detach(), solver="dykstra", n_iter=4000), _mask(x0, 3, lam.detach()), atol=1e-8, rtol=0
    )
    torch.testing.assert_close(
        dykstra_mask_rows(x0[:4], 3, lam.detach()[:4], 40),
        _mask(x0, 3, lam.detach(), solver="dykstra", n_iter=40)[:4],
        atol=1e-12,
        rtol=0,
    )


def test_float_l_gives_no_l_gradient_and_unchanged_values():
    x = _rows(9).requires_grad_()
    for p in P_VALUES:
        a = _mask(x, 3, 0.4, p)
        b = _mask(x, 3, torch.full((5, 1), 0.4, dtype=F64), p)
        assert torch.equal(a, b)
        ga = torch.autograd.grad(a.pow(2).sum(), x)[0]
        gb = torch.autograd.grad(b.pow(2).sum(), x)[0]
        torch.testing.assert_close(ga, gb, atol=1e-15, rtol=0)
