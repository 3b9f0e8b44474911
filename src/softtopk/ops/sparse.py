"""Sparse soft top-k (Sander et al., ICML 2023): exact p-norm regularised top-k mask and magnitude.

The mask solves ``y* = argmax_{y ∈ [0,1]^n, Σy = k} <x, y> - (λ/p) ||y||_p^p``. Its KKT conditions
give a threshold form, ``y_i = clip(((x_i - t)_+ / λ)^r, 0, 1)`` with ``r = 1/(p-1)`` and ``t`` set by
``Σ y = k``: the same minimiser that the paper's PAV isotonic regression returns (its pooled block is
the set ``0 < y < 1``, at value ``t``). The magnitude variant (top-k of ``|x|``, signs kept) is
``o_i = sign(x_i) (θ u_i + (|x_i| - θ)_+)`` with ``u_i = clip(((|x_i| - θ)_+ / (λ θ^{1/r}))^r, 0, 1)``
and ``Σ u = k``, again PAV's solution written through its block value ``θ``.

**Solver.** ``t`` lies in ``[s_k - λ, s_k]`` (``s_k`` the k-th largest), so only entries above
``s_k - λ`` matter, but any number of them may lie above ``t`` (all ``n`` when λ is large against
the row's spread): no fixed number of ``topk`` candidates is enough for every row, and choosing the
number from the values reads them on the host. On accelerators (and under ``torch.compile`` or
``vmap``) each row is therefore sorted once, with no data-dependent shape or branch; on a CPU
tensor, where a read is no synchronisation, :func:`threshold` tries a few more than ``k``
candidates first and reads one boolean to confirm them. On the sorted candidates, clamped to the
bracket so every power sum stays of size ``λ``, the sum is evaluated at every breakpoint with
float64 prefix moments and ``searchsorted`` (saturation counts among the ``k + 1`` largest only: at
most ``k`` entries saturate); inside the right segment ``t`` is closed form (p = 2) or the single
real root of a monotone cubic (p = 4/3, Cardano plus two Newton steps). O(n) memory; never an
``n × n`` matrix.

**±inf** (``softtopk._extended``): in the usual rows an infinite entry is exactly saturated or
zero; the two degenerate cases (``p >= k`` entries at ``+inf``; at most ``k`` entries above
``-inf``) are recognised from per-row counts and written through the kernel's own formula. The
magnitude is ``x ⊙ m`` with ``m`` that rule on ``|x|``: with ``P`` entries at ``±inf``, ``P < k``
keeps them (output ``x``, gradient 1) and the finite entries get the kernel's answer for ``k - P``;
``P >= k`` gives the finite entries 0 and the infinite ones ``±inf`` with gradient ``k/P``
(:func:`_extended_mag`).

**Backward** (implicit function theorem; the Jacobian is PAV's block structure). Mask:
``∂L/∂x = d ⊙ (g - Σ d g / Σ d)``, ``d_i = r z_i^{r-1} / λ`` on ``0 < z_i < 1`` (0 elsewhere); a
per-row tensor ``λ`` (B, 1) gets ``∂L/∂λ = Σ d g (x̄ - x) / λ``, ``x̄ = Σ d x / Σ d`` (from
``∂t/∂λ = -Σ d z / Σ d``; the mask is solved in units of λ, so no power of λ can overflow).
Magnitude: identity on saturated entries, 0 below ``θ``, and on the interior ``I``
``∂L/∂s_j = g_j (1 + θ e_j) + e_j Σ_I g (u - 1 - θ e β) / Σ_I e β`` with ``e = r z^{r-1} / (λ θ^{1/r})``,
``β = 1 + (s - θ)/(r θ)``. Finite everywhere, including at ``x = 0``.
"""

from __future__ import annotations

from typing import cast

import torch

from .._window import window_power, window_root
from . import sparse_triton, triton_gate
from ._function import Function, once_differentiable_unless
from .compute import can_inspect, scan_rows, sort_rows, topk_rows
from .cubic import cubic_root
from .dykstra import dykstra_mag_rows, dykstra_mask_rows


def exponent(p: float) -> int:
    """``r = 1/(p-1)``: 1 for p = 2, 3 for p = 4/3."""
    return 1 if abs(p - 2.0) < 1e-9 else 3


def _nonnegative(v: torch.Tensor) -> torch.Tensor:
    return v.clamp_min(0)


def _saturation_knot(s: torch.Tensor, lam: float, r: int) -> torch.Tensor:
    """Magnitude: the θ at which an entry of size ``s`` saturates, ``θ + λ θ^{1/r} = s``."""
    if r == 1:
        return s / (1.0 + lam)
    return cubic_root(torch.full_like(s, lam), -s).pow(3)


def _power_sums(u: torch.Tensor, r: int) -> torch.Tensor:
    """Prefix sums ``(r, B, K+1)`` of ``u^m`` for m = 1..r (float64), stacked, so that one scan and
    one gather per bound serve every power (``u·u·u`` is how ATen's ``pow(u, 3)`` rounds)."""
    powers = u.unsqueeze(0) if r == 1 else torch.stack([u, u * u, u * u * u])
    return torch.nn.functional.pad(scan_rows(powers), (1, 0))


def _window_sums(prefix: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> list[torch.Tensor]:
    """``Σ_{lo < i <= hi} u_i^m`` for m = 1..r (each (B, M)) from the stacked prefix sums."""
    size = (prefix.shape[0], *hi.shape)
    return list((prefix.gather(-1, hi.expand(size)) - prefix.gather(-1, lo.expand(size))).unbind(0))


def _window_power(prefix: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, at: torch.Tensor, r: int):
    """``Σ_{lo < i <= hi} (u_i - at)^r`` from the stacked prefix sums (bounds and ``at`` (B, M))."""
    return window_power(_window_sums(prefix, lo, hi), (hi - lo).to(at.dtype), at, r)


def _solve_sorted(s: torch.Tensor, k: int, lam: float | torch.Tensor, r: int, magnitude: bool):
    """The threshold from the sorted (descending, float64) candidates ``s`` (B, K), K > k or K = n:
    ``θ`` (B, 1) for the magnitude; ``(s_k, a)`` for the mask, ``a = (t - s_k)/λ``, solved in units
    of λ (the mask is ``clip((x - s_k)/λ - a, 0, 1)^r``: exact where ``t`` would round to ``s_k``)."""
    big = s.shape[-1]
    sk = s[:, k - 1 : k]
    if magnitude:
        lower, upper = _saturation_knot(sk, cast(float, lam), r), sk + lam * sk.pow(1.0 / r)
        u, lam_u = s.clamp(lower, upper) - sk, lam  # statuses unchanged for every threshold in the bracket
    else:  # scaled before clamping, so that the bracket cannot round away
        u, lam_u = ((s - sk) / lam).clamp(-1.0, 1.0), 1.0
    neg = (-u).contiguous()
    # at every threshold in the bracket at most k entries saturate, all among the k + 1 largest; a
    # count capped there overstates a sum that exceeds k anyway (the capped entries enter the
    # window at power >= 1), so every comparison with k below is unchanged
    top = neg[:, : k + 1].clone()  # not .contiguous(): inside vmap that keeps the slice's strides
    prefix = _power_sums(u, r)

    def total(at: torch.Tensor, above: torch.Tensor | None) -> torch.Tensor:  # Σ_i h(.) at ``at`` (B, M)
        theta = at + sk
        reach = -(lam * theta.clamp_min(0).pow(1.0 / r)) - at if magnitude else -at - 1.0
        sat = torch.searchsorted(top, reach.contiguous(), right=True)
        if above is None:
            above = torch.searchsorted(neg, (-at).contiguous(), right=False).clamp_min(sat)
        window = _window_power(prefix, sat, above, at, r)
        if magnitude:
            scale = lam**r * theta
            window = window / scale.where(scale > 0, torch.ones_like(scale))
        return window.add_(sat)

    # a breakpoint within rounding of the root counts as reached: its entry is at 0 (or 1) either way
    slack = 1e-9 * k
    # at the i-th entry's own value the i entries before it are above (ties add 0: their window
    # terms vanish; the saturated ones come first, sat <= i); at its saturation knot the i + 1
    # largest saturate, so only i <= k can be <= k
    position = torch.arange(big, device=s.device).expand(s.shape[0], big)
    n_above = (total(u, position) < k - slack).sum(-1, keepdim=True)
    knots = u[:, : k + 1]
    sat_knots = (_saturation_knot(knots + sk, cast(float, lam), r) - sk) if magnitude else knots - 1.0
    n_sat = (total(sat_knots, None) <= k + slack).sum(-1, keepdim=True).clamp_max(n_above)
    deficit = k - n_sat.to(s.dtype)
    window_prefix = _window_sums(prefix, n_sat, n_above)
    count = (n_above - n_sat).to(s.dtype)
    safe = count.clamp_min(1)
    at = window_root(
        window_prefix, count, safe, deficit, sk, lam_u, r, magnitude, nonnegative=_nonnegative, cubic_root=cubic_root
    )
    solved = (count > 0) & (deficit > 0)
    # otherwise nothing is strictly inside (or only entries at the zero edge, deficit 0): the sum is
    # flat at k there and any threshold between the groups is exact (their middle; solving the
    # degenerate cubic is not); and when the k largest saturate before the (k+1)-th starts, the exact
    # answer is the hard k-hot mask (decided from the gap, not from sums that rounding blurs)
    if magnitude:
        nxt, last = s.gather(-1, n_sat.clamp_max(big - 1)), s.gather(-1, (n_sat - 1).clamp(0, big - 1))
        flat = torch.where(
            n_sat < big, 0.5 * (nxt + torch.maximum(_saturation_knot(last, cast(float, lam), r), nxt)), s[:, -1:]
        )
        following = s[:, k : k + 1]
        return torch.where(lower >= following, 0.5 * (lower + following), torch.where(solved, at + sk, flat))
    limit = torch.finfo(s.dtype).max ** 0.5
    v = ((s - sk) / lam).clamp(-limit, limit)
    nxt, last = v.gather(-1, n_sat.clamp_max(big - 1)), v.gather(-1, (n_sat - 1).clamp(0, big - 1))
    flat = torch.where(n_sat < big, 0.5 * (nxt + torch.maximum(last - 1.0, nxt)), v[:, -1:] - 1.0)
    following = v[:, k : k + 1]
    # hard k-hot rows: any a in [following, -1] is exact; the midpoint, at most 2 away from -1 (a
    # gap of 1e39 λ would overflow x's dtype)
    hard = (0.5 * (following - 1.0)).clamp_min(-2.0)
    return sk, torch.where(following <= -1.0, hard, torch.where(solved, at, flat))


def threshold(x: torch.Tensor, k: int, lam: float | torch.Tensor, r: int, magnitude: bool):
    """Exact threshold per row of ``x`` (B, n), float64, as :func:`_solve_sorted` returns it.

    On an accelerator, under ``torch.compile`` and inside ``vmap`` every row is sorted: any number of
    entries may lie above the threshold, and no fixed number of candidates is enough for every row
    without reading values. On a CPU tensor, where reading a value costs no synchronisation, the
    ``2k + 8`` largest are tried first and the count grows only while some row's threshold lies
    below its last candidate (one boolean read per try); both give the same exact threshold."""
    scores = x.detach().abs() if magnitude else x.detach()
    n = scores.shape[-1]
    size = min(n, 2 * k + 8) if can_inspect(x) else n
    while True:
        vals = (topk_rows(scores, size) if size < n else sort_rows(scores, descending=True))[0]
        vals = vals.to(torch.float64)
        found = _solve_sorted(vals, k, lam, r, magnitude)
        if size == n:
            return found
        t = found if magnitude else found[0] + found[1] * lam
        if bool((vals[:, -1:] <= t).all()):  # every non-candidate at or below the threshold: exact
            return found
        size = min(n, 4 * size)


class _MaskFn(Function):
    """``y = clip((x - s_k)/λ - a, 0, 1)^r`` with the threshold ``t = s_k + a λ`` (solved outside)
    differentiated implicitly through ``Σ y = k``: with ``u = (x - t)/λ`` and ``d = ∂y/∂x = r u^{r-1}/λ``
    on the interior (0 elsewhere), ``∂t/∂x = d/Σd``, ``∂t/∂λ = -ū`` with ``ū = Σ d u / Σ d``, so
    ``∂L/∂x = d (g - Σ d g / Σ d)`` and, for a tensor ``λ``, ``∂L/∂λ = Σ g d (ū - u)`` (per row),
    evaluated as ``Σ g d (x̄ - x) / λ`` with ``x̄ = Σ d x / Σ d`` (interior ``x`` only: no ``0 · inf``).

    The forward also returns ``w = u^{r-1}`` on the interior (0 elsewhere; ``d = r w / λ``), the one
    tensor the backward needs. Rows of the degenerate ``±inf`` cases come with ``(s_k, a)`` that put
    every finite entry at 0 or 1, times ``scale`` (``k/p`` for the ``+inf`` entries of a row with
    ``p >= k`` of them); ``-inf`` entries get ``share`` (0 but in rows with at most ``k`` entries above
    ``-inf``). ``hard`` forwards the k-hot mask of ``x``'s top ``k`` (``torch.topk``'s choice)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        x: torch.Tensor,
        sk: torch.Tensor,
        a: torch.Tensor,
        scale: torch.Tensor,
        share: torch.Tensor,
        lam: float | torch.Tensor,
        r: int,
        k: int,
        hard: bool,
    ):
        z = ((x - sk) / lam - a).clamp(0, 1)
        w = ((z > 0) & (z < 1)).to(z.dtype) if r == 1 else torch.where(z < 1, z.square(), 0.0)
        if hard:
            return torch.zeros_like(x).scatter_(-1, x.topk(k, -1).indices, 1.0), w
        return torch.where(x == -torch.inf, share, z.pow(r).mul_(scale)), w

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, _, _, _, _, lam, r, _, _ = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.tensor_lam = isinstance(lam, torch.Tensor)
        # ū - u = (x̄ - x)/λ from x itself: u's differences cancel when λ is large against x's spread
        lam_x = ((lam, x) if ctx.needs_input_grad[5] else (lam,)) if ctx.tensor_lam else ()
        ctx.save_for_backward(output[1], *lam_x)
        ctx.lam_value, ctx.r = (None if ctx.tensor_lam else lam), r

    @staticmethod
    @once_differentiable_unless(lambda ctx: ctx.r == 1)  # p = 2: w is piecewise constant in x
    def backward(ctx, grad: torch.Tensor, _w: torch.Tensor):
        w, *lam_x = ctx.saved_tensors
        lam = lam_x[0] if lam_x else ctx.lam_value
        rate = ctx.r / lam  # d = rate * w
        total = w.sum(-1, keepdim=True).clamp_min_(torch.finfo(w.dtype).tiny)
        gbar = torch.linalg.vecdot(w, grad).unsqueeze_(-1).div_(total)
        grad_x = (grad - gbar).mul_(w).mul_(rate)
        grad_lam = None
        if len(lam_x) == 2:  # Σ g d (x̄ - x)/λ, x̄ = Σ d x / Σ d (interior x: no ±inf)
            x = lam_x[1].where(w > 0, 0)
            xbar = torch.linalg.vecdot(w, x).unsqueeze(-1) / total
            grad_lam = (torch.linalg.vecdot(grad * w, xbar - x).unsqueeze(-1) * rate / lam).sum_to_size(lam.shape)
        return grad_x, None, None, None, None, grad_lam, None, None, None


class _MagFn(Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, theta: torch.Tensor, lam: float, r: int):
        s = x.abs()
        positive = theta > 0
        scale = lam * theta.clamp_min(0).pow(1.0 / r)
        # z = (|x| - θ) / (λ θ^{1/r}); a row with θ = 0 keeps every entry (z = +inf)
        z = torch.where(positive, (s - theta) / scale.where(positive, torch.ones_like(scale)), torch.inf)
        kept = theta * z.clamp(0, 1).pow(r) + (s - theta).clamp_min(0)
        return x.sign() * torch.where(z >= 1, s, kept), z

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, theta, lam, r = inputs
        ctx.save_for_backward(x, theta, output[1])
        ctx.mark_non_differentiable(output[1])
        ctx.lam, ctx.r = lam, r

    @staticmethod
    @once_differentiable_unless(lambda ctx: ctx.r == 1)  # p = 2: e = 1/(λθ) inside, recorded through θ
    def backward(ctx, grad: torch.Tensor, _z: torch.Tensor):
        # on the interior I (0 < z < 1), with e = r z^{r-1} / (λ θ^{1/r}) and g~ = g sign(x):
        #   ∂L/∂s = g~ (1 + θ e) + e c / Σ_I e β,  c = -Σ_I g~ (1 + θ e),  β = 1 + z λ θ^{1/r} / (r θ)
        # (u - 1 - θ e β collapses to -(1 + θ e)); saturated entries pass g~ through, zeros get 0
        x, theta, z = ctx.saved_tensors
        lam, r = ctx.lam, ctx.r
        sign = x.sign()
        g = grad * sign
        inside = (z > 0) & (z < 1)
        safe_theta = theta.where(theta > 0, torch.ones_like(theta))
        scale = lam * safe_theta.pow(1.0 / r)
        zc = z.where(inside, torch.zeros_like(z))
        e = inside / scale if r == 1 else zc.square().mul_(r / scale)
        e = e.to(g.dtype)
        eb = e.sum(-1, keepdim=True) + (scale / (r * safe_theta)) * torch.linalg.vecdot(e, zc).unsqueeze(-1)
        theta_e = theta * e
        c = -torch.linalg.vecdot(inside.to(g.dtype), g).unsqueeze(-1) - torch.linalg.vecdot(theta_e, g).unsqueeze(-1)
        weight = (z > 0).to(g.dtype).add_(theta_e)
        grad_s = torch.addcmul(g * weight, e, c / eb.where(eb > 0, torch.ones_like(eb)))  # vmap: not in place
        return grad_s.mul_(sign), None, None, None


def _ones(x: torch.Tensor) -> torch.Tensor:
    """The mask for ``k >= n``: 1 everywhere (``±inf`` and NaN entries too), gradient 0."""
    return x.nan_to_num(0.0, 0.0, 0.0).mul(0).add_(1)


def _exact_mask(x: torch.Tensor, k: int, lam: float | torch.Tensor, r: int, hard: bool):
    """The exact mask of rows ``x`` (B, n), ``k < n``, on the extended reals (``softtopk._extended``:
    with ``p`` entries at ``+inf`` and ``q`` at ``-inf``, a row with ``p >= k`` shares ``k`` among
    its ``+inf`` entries, a row with at most ``k`` entries above ``-inf`` selects them and shares the
    rest among its ``-inf`` entries; other rows are the kernel's), and those degenerate rows (B, 1)."""
    n = x.shape[-1]
    p = (x == torch.inf).sum(-1, keepdim=True)
    q = (x == -torch.inf).sum(-1, keepdim=True)
    full = p >= k
    short = (n - q <= k) & ~full
    degenerate = full | short
    # a tensor λ: the threshold from its float64 values, taken before rounding to x's dtype (as a float l is)
    wide = lam.detach().to(torch.float64) if isinstance(lam, torch.Tensor) else lam
    sk, a = threshold(torch.where(degenerate, 0.0, x), k, wide, r, False)
    # degenerate rows: every finite entry at 0 (full) or 1 (short); +inf at 1, -inf at 0 before scale/share
    big = torch.finfo(x.dtype).max
    sk = torch.where(full, big, torch.where(short, -big, sk)).to(x.dtype)
    a = torch.where(full, 1.0, torch.where(short, -1.0, a)).to(x.dtype)
    p, q = p.to(x.dtype), q.to(x.dtype)
    scale = torch.where(full, k / p.clamp_min(1), 1.0)
    share = torch.where(short, (k - n + q) / q.clamp_min(1), 0.0)
    lam_x = lam.to(x.dtype) if isinstance(lam, torch.Tensor) else lam
    return _MaskFn.apply(x, sk, a, scale, share, lam_x, r, k, hard)[0], degenerate


def _exact_mag(x: torch.Tensor, k: int, lam: float, r: int) -> torch.Tensor:
    return _MagFn.apply(x, threshold(x, k, lam, r, True).to(x.dtype), lam, r)[0]


def _extended_mag(x: torch.Tensor, k: int, kernel) -> torch.Tensor:
    """``kernel(rows)`` (B, n) on the extended reals: with ``P`` infinite magnitudes (``x = ±inf``)
    in a row, ``P < k`` rows are the kernel's (an infinite entry saturates: output ``x``, gradient
    1; the finite entries get the kernel's answer for ``k - P``), and ``P >= k`` rows are
    ``x ⊙ m`` with ``m`` the extended mask of ``|x|`` held fixed: ``k/P`` on the infinite entries
    (output ``±inf``, gradient ``k/P``), 0 on the finite ones (output 0, gradient 0). The kernel
    sees zeros in those rows; no value is read on the host."""
    infinite = x.isinf()
    count = infinite.sum(-1, keepdim=True, dtype=x.dtype)
    full = count >= k
    body = kernel(torch.where(full, 0.0, x))
    return torch.where(full, x * torch.where(infinite, k / count.clamp_min(1), 0.0), body)


def sparse_mask_rows(
    x: torch.Tensor,
    k: int,
    *,
    l: float | torch.Tensor,
    p: float,
    solver: str,  # noqa: E741
    n_iter: int,
    hard: bool = False,
) -> torch.Tensor:
    """Sparse soft top-k mask of rows ``x`` (B, n): exact (``'pav'``) or Dykstra (``'dykstra'``), on
    the extended reals (``±inf`` as in ``softtopk._extended``); ``hard`` forwards the k-hot mask of
    the ``k`` largest and backpropagates the exact mask's gradient. ``l`` is a positive float or a
    per-row tensor (B, 1) of any floating dtype, with a gradient. No value is read on the host."""
    if k >= x.shape[-1]:
        return _ones(x)
    r = exponent(p)
    exact_only = solver != "dykstra" or hard  # the exact mask is the answer (hard: its gradient)
    if exact_only and triton_gate.usable(x, k, l):
        return sparse_triton.triton_mask(x, k, cast(float, l), r, hard=hard)
    exact, degenerate = _exact_mask(x, k, l, r, hard)
    if exact_only:
        return exact
    # not clamped: every iterate sums to k, and before convergence it may leave [0, 1] (the
    # original's README prints 1.0000229 after 100 projections); no graph through its iterations
    approx = dykstra_mask_rows(x.detach(), k, l.detach().to(x.dtype) if isinstance(l, torch.Tensor) else l, n_iter)
    approx = torch.where(degenerate, exact.detach(), approx)
    wanted = x.requires_grad or (isinstance(l, torch.Tensor) and l.requires_grad)
    if not (torch.is_grad_enabled() and wanted):
        return approx
    # Dykstra's value, the exact problem's Jacobian: the truncation error stays out of the gradient
    return exact + (approx - exact).detach()


def sparse_mag_rows(x: torch.Tensor, k: int, *, l: float, p: float, solver: str, n_iter: int) -> torch.Tensor:  # noqa: E741
    """Sparse soft top-k in magnitude of rows ``x`` (B, n), ``l`` a positive float, on the extended
    reals (:func:`_extended_mag`: ``|x| = inf`` are the largest magnitudes)."""
    if k >= x.shape[-1]:
        return x * 1
    r = exponent(p)
    return _extended_mag(x, k, lambda rows: _mag_kernel(rows, k, l, r, solver, n_iter))


def _mag_kernel(x: torch.Tensor, k: int, lam: float, r: int, solver: str, n_iter: int) -> torch.Tensor:
    if solver != "dykstra":
        return _exact_mag(x, k, lam, r)
    approx = dykstra_mag_rows(x.detach(), k, lam, n_iter)
    if not (torch.is_grad_enabled() and x.requires_grad):
        return approx
    exact = _exact_mag(x, k, lam, r)
    # Dykstra's value, the exact Jacobian; both are x itself at the infinite entries (no inf - inf)
    return exact + torch.where(x.isinf(), 0.0, approx - exact).detach()


def hard_mask_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """k-hot mask of the ``k`` largest entries per row (zero gradient; 0, not NaN, at unselected
    ``±inf`` entries)."""
    return torch.where(x.isinf(), 0.0, x * 0).abs().scatter(-1, x.topk(k, -1).indices, 1.0)
