"""The adversarial probe grid of issue 22, re-run on every public operator, method, output and loss.

Each family below runs over one grid of inputs: random rows at scales 1e-6, 1 and 1e6; values near
the float32 maximum; ties (all equal, and groups); ``-inf`` padding, one ``+inf``, more infinite
entries than ``k``; a NaN row beside finite ones; k = 1 and k = n; an empty batch; float16 and
bfloat16; and, where the method has one, a tensor temperature with ``requires_grad``. What must
hold everywhere:

* finite input: no NaN or infinity in the output or in any gradient (the input's and the
  temperature's);
* ``±inf`` input: no NaN in the output or the gradients (``softtopk._extended``'s limits);
* a NaN row stays in its row: the other rows are untouched;
* masks of normalised methods lie in [0, 1] and sum to ``k`` (NeuralSort and SoftSort: sum only);
* nothing raises but ``ValueError``/``TypeError`` with a message.

A failure lists every case that broke the rules (family, input, what). Deterministic (fixed seeds).
"""

# ruff: noqa: B023  (every lambda below is called at once, inside its loop iteration)
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import softtopk

INF = float("inf")
N = 6
NETWORKS = ("bitonic", "odd_even", "splitter_selection")
MASK_METHODS = ("lapsum", "sparse", "neuralsort", "softsort", "perturbed", "gumbel", *NETWORKS)
BOUNDED = {"lapsum", "sparse", "perturbed", "gumbel", *NETWORKS}  # masks in [0, 1]
TEMPERATURE = {"lapsum": "tau", "neuralsort": "tau", "softsort": "tau", "sparse": "l", "bitonic": "steepness"}


def _params(method: str) -> dict:
    if method == "perturbed":
        return {"n_samples": 16, "generator": torch.Generator().manual_seed(0)}
    if method == "gumbel":
        return {"generator": torch.Generator().manual_seed(0)}
    return {}


def _grid() -> dict[str, torch.Tensor]:
    """Rows (3, N) in float32 unless named otherwise."""
    g = torch.Generator().manual_seed(0)
    random = torch.randn(3, N, generator=g)
    rows = {f"scale{s:g}": random * s for s in (1e-6, 1.0, 1e6)}
    rows["near_max"] = torch.tensor([[3e38, -3e38, 1.0, 2.0, 0.0, -1.0]] * 3) * torch.tensor([[1.0], [0.5], [-1.0]])
    rows["ties"] = torch.tensor([[0.0] * N, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [2.0, 2.0, -1.0, -1.0, 3.0, 3.0]])
    rows["neg_inf"] = random.clone().index_fill_(-1, torch.tensor([1, 4]), -INF)
    rows["pos_inf"] = random.clone().index_fill_(-1, torch.tensor([2]), INF)
    rows["many_inf"] = torch.tensor(
        [[INF, INF, INF, INF, 1.0, 2.0], [-INF] * 5 + [0.5], [INF, -INF, INF, -INF, 0.0, 1.0]]
    )
    rows["nan_row"] = (
        random.clone()
        .index_fill_(0, torch.tensor([1]), 0.0)
        .index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(float("nan")))
    )
    rows["float16"] = random.half()
    rows["bfloat16"] = random.bfloat16()
    rows["empty"] = torch.zeros(0, N)
    return rows


GRID = _grid()
FINITE = {name for name, x in GRID.items() if x.numel() and bool(x.float().isfinite().all())}


class Probe:
    """Collects the broken rules of one family over the grid."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.cases = 0

    def run(
        self,
        label: str,
        fn: Callable[[torch.Tensor], torch.Tensor],
        x: torch.Tensor,
        *,
        extra=(),
        check: Callable[[torch.Tensor, torch.Tensor], str | None] | None = None,
        finite: bool = False,
    ) -> None:
        """``fn(leaf)`` and the gradient of a weighted sum of its finite entries; ``extra`` are more
        leaves (temperatures) whose gradients are checked too; ``check(out, x)`` adds a rule."""
        self.cases += 1
        leaf = x.detach().clone().requires_grad_(x.is_floating_point())
        try:
            out = fn(leaf)
        except (ValueError, TypeError) as error:
            if not str(error):
                self.problems.append(f"{label}: {type(error).__name__} without a message")
            return
        except Exception as error:  # noqa: BLE001 - the probe's point: list every raw exception
            self.problems.append(f"{label}: raw {type(error).__name__}: {str(error)[:120]}")
            return
        rows = _clean_rows(x)
        per_row = out.dim() > 0 and out.shape[0] == x.shape[0]
        if (out[rows] if per_row else out).isnan().any() and (per_row or bool(rows.all())):
            self.problems.append(f"{label}: NaN in the output")
        if finite and not out.isfinite().all():
            self.problems.append(f"{label}: non-finite output for finite input")
        if check is not None:
            broken = check(out, x)
            if broken:
                self.problems.append(f"{label}: {broken}")
        leaves = [leaf, *extra]
        wanted = [t for t in leaves if t.requires_grad]
        if not out.requires_grad or not wanted:
            return
        weights = torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape).to(out.dtype)
        target = torch.where(out.isfinite(), out * weights, 0.0).sum()
        try:
            grads = torch.autograd.grad(target, wanted, allow_unused=True)
        except Exception as error:  # noqa: BLE001
            self.problems.append(f"{label}: backward raised {type(error).__name__}: {str(error)[:120]}")
            return
        for name, grad in zip(("x", "temperature"), grads, strict=False):
            if grad is None:
                continue
            if name != "x" and not bool(rows.all()):  # a shared temperature also sees the NaN row
                continue
            clean = grad[rows] if name == "x" else grad
            if clean.isnan().any():
                self.problems.append(f"{label}: NaN gradient in {name}")
            elif finite and not clean.isfinite().all():
                self.problems.append(f"{label}: infinite gradient in {name}")

    def assert_clean(self) -> None:
        """No problem in any case."""
        assert not self.problems, f"{len(self.problems)} of {self.cases} cases:\n" + "\n".join(self.problems)


def _clean_rows(x: torch.Tensor) -> torch.Tensor:
    """The rows (first dim) with no NaN: the ones whose output must be NaN-free."""
    if x.dim() < 2 or not x.is_floating_point():
        return torch.ones(x.shape[:1], dtype=torch.bool)
    return ~x.isnan().flatten(1).any(-1)


def _mask_rule(k: int, method: str, *, converged: bool = True):
    def check(out: torch.Tensor, x: torch.Tensor) -> str | None:
        rows = _clean_rows(x)
        mask = out[rows].float()
        if not mask.numel():
            return None
        tol = 2e-2 if out.dtype in (torch.float16, torch.bfloat16) else 1e-3
        if not converged:  # Dykstra's truncated iteration: finite, but bounds and sum only at convergence
            return None
        if method in BOUNDED and ((mask < -tol).any() or (mask > 1 + tol).any()):
            return f"mask outside [0, 1]: {mask.min().item():.4g}..{mask.max().item():.4g}"
        if ((mask.sum(-1) - k).abs() > tol * max(k, 1)).any():
            return f"mask sums {mask.sum(-1).tolist()} != {k}"
        return None

    return check


def _operator_probe(method: str) -> Probe:
    probe = Probe()
    info = softtopk.methods()[method]
    for (name, x), k in ((item, k) for item in GRID.items() for k in (1, 3, N)):
        label, finite = f"{method} {name} k={k}", name in FINITE
        if "mask" in info.outputs:
            probe.run(
                f"mask {label}",
                lambda t: softtopk.soft_topk(t, k, method=method, **_params(method)),
                x,
                check=_mask_rule(k, method),
                finite=finite,
            )
        if "ranks" in info.outputs and method != "gumbel":
            probe.run(
                f"ranks {label}",
                lambda t: softtopk.soft_topk_ranks(t, k, method=method, **_params(method)),
                x,
                finite=finite,
            )
    if "permutation" in info.outputs:
        for name, x in GRID.items():
            probe.run(
                f"permutation {method} {name}",
                lambda t: softtopk.soft_permutation(t, method=method),
                x,
                finite=name in FINITE,
            )
    if method in TEMPERATURE:
        for name, x in GRID.items():
            temperature = torch.tensor(0.5, requires_grad=True)
            if method == "sparse":  # a per-row tensor l
                temperature = torch.full((x.shape[0],), 0.5, requires_grad=True)
            probe.run(
                f"tensor {TEMPERATURE[method]} {method} {name}",
                lambda t, s=temperature: softtopk.soft_topk(t, 3, method=method, **{TEMPERATURE[method]: s}),
                x,
                extra=(temperature,),
                check=_mask_rule(3, method),
                finite=name in FINITE,
            )
    return probe


@pytest.mark.parametrize("method", MASK_METHODS)
def test_probe_operators(method):
    _operator_probe(method).assert_clean()


def _sparse_probe() -> Probe:
    probe = Probe()
    for (name, x), k in ((item, k) for item in GRID.items() for k in (1, 3, N)):
        finite = name in FINITE
        for solver, p in (("pav", 4 / 3), ("pav", 2.0), ("dykstra", 2.0)):
            probe.run(
                f"sparse_topk_mask {solver} p={p:.3g} {name} k={k}",
                lambda t: softtopk.sparse_topk_mask(t, k, p=p, solver=solver, n_iter=50),
                x,
                check=_mask_rule(k, "sparse", converged=solver != "dykstra"),
                finite=finite,
            )
            probe.run(
                f"sparse_topk_mag {solver} p={p:.3g} {name} k={k}",
                lambda t: softtopk.sparse_topk_mag(t, k, p=p, solver=solver, n_iter=50),
                x,
                finite=finite,
            )
        probe.run(f"hard_topk_mask {name} k={k}", lambda t: softtopk.hard_topk_mask(t, k), x)
        probe.run(f"hard_topk_mag {name} k={k}", lambda t: softtopk.hard_topk_mag(t, k), x)
        probe.run(f"topk {name} k={k}", lambda t: softtopk.topk(t, k).weights, x, finite=finite)
        probe.run(
            f"noised_kth_value {name} k={k}",
            lambda t: softtopk.noised_kth_value(t, k, epsilon=0.5, generator=torch.Generator().manual_seed(0)),
            x,
            finite=finite,
        )
    return probe


def test_probe_sparse_hard_and_stochastic_operators():
    _sparse_probe().assert_clean()


def _logit_grid() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Logits (4, 10) and targets (4,)."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4, 10, generator=g)
    target = torch.tensor([0, 3, 5, 9])
    grid = {f"scale{s:g}": (base * s, target) for s in (1e-6, 1.0, 1e6)}
    grid["near_max"] = (1e38 * (2.0 + 0.5 * base.tanh()), target)  # differences within float32
    grid["near_max_signed"] = (3e38 * base.sign(), target)  # a loss may overflow here: no NaN only
    grid["ties"] = (torch.zeros(4, 10), target)
    grid["neg_inf_other"] = (base.clone().index_fill_(-1, torch.tensor([1, 2]), -INF), target)
    grid["pos_inf_other"] = (base.clone().index_fill_(-1, torch.tensor([4]), INF), target)
    grid["pos_inf_label"] = (base.clone().index_fill_(-1, torch.tensor([0, 4]), INF), target)
    grid["neg_inf_label"] = (base.clone().index_fill_(-1, torch.tensor([0]), -INF), target)
    grid["nan_row"] = (
        base.clone().index_put_((torch.tensor([1]), torch.tensor([2])), torch.tensor(float("nan"))),
        target,
    )
    grid["float16"] = (base.half(), target)
    grid["bfloat16"] = (base.bfloat16(), target)
    grid["empty"] = (torch.zeros(0, 10), target[:0])
    return grid


def _losses() -> dict[str, Callable]:
    counts = [50.0, 20, 10, 5, 5, 3, 2, 1, 1, 1]
    return {
        "topk_ce splitter": softtopk.TopKCrossEntropyLoss([0.5, 0.5], reduction="none"),
        "topk_ce bitonic smce m=None": softtopk.TopKCrossEntropyLoss(
            [0.5, 0.5], method="bitonic", top1_mode="smce", m=None, reduction="none"
        ),
        "topk_ce neuralsort sort": softtopk.TopKCrossEntropyLoss(
            [0.5, 0.5], method="neuralsort", top1_mode="sort", reduction="none"
        ),
        "topk_ce softsort": softtopk.TopKCrossEntropyLoss([0.5, 0.5], method="softsort", reduction="none"),
        "topk_ce logistic_phi": softtopk.TopKCrossEntropyLoss(
            [0.5, 0.5], distribution="logistic_phi", reduction="none"
        ),
        "smooth_topk_svm k=2": softtopk.SmoothTopKSVM(k=2, reduction="none"),
        "smooth_topk_svm k=5": softtopk.SmoothTopKSVM(k=5, reduction="none"),
        "smooth_top1_svm": softtopk.SmoothTop1SVM(reduction="none"),
        "topk_svm k=5": softtopk.TopKSVM(k=5, reduction="none"),
        "top1_svm": softtopk.Top1SVM(reduction="none"),
        "bal_noised": softtopk.BalNoisedTopK(
            5, epsilon=0.5, generator=torch.Generator().manual_seed(0), reduction="none"
        ),
        # scale 1: with the default 50 the loss at logits near 2e38 is beyond float32 (inf is its rounding)
        "imbal_noised": softtopk.ImbalNoisedTopK(
            5,
            epsilon=0.5,
            max_m=0.5,
            cls_num_list=counts,
            scale=1.0,
            generator=torch.Generator().manual_seed(0),
            reduction="none",
        ),
    }


@pytest.mark.parametrize("name", sorted(_losses()))
def test_probe_class_losses(name):
    loss = _losses()[name]
    probe = Probe()
    for case, (logits, target) in _logit_grid().items():
        probe.run(f"{name} {case}", lambda t: loss(t, target), logits, finite=case in FINITE_LOGITS)
        probe.run(
            f"{name} {case} mean",
            lambda t: loss(t, target).mean() if t.numel() else loss(t, target).sum(),
            logits,
            finite=case in FINITE_LOGITS,
        )
    probe.assert_clean()


FINITE_LOGITS = {
    name
    for name, (x, _) in _logit_grid().items()
    if x.numel() and bool(x.float().isfinite().all()) and name != "near_max_signed"
}


def test_probe_ranking_routing_and_knn():
    probe = Probe()
    g = torch.Generator().manual_seed(2)
    relevance = torch.rand(3, N, generator=g)
    for name, x in GRID.items():
        rel = relevance[: x.shape[0]]
        if name not in FINITE or name == "near_max":  # features, not scores: ±inf has no meaning
            continue
        finite = name in FINITE
        probe.run(
            f"ndcg_loss {name}", lambda t: softtopk.ndcg_loss(t.float(), rel, 3, reduction="none"), x, finite=finite
        )
        router = softtopk.TopKRouter(N, 4, 2)
        probe.run(f"router {name}", lambda t: router(t.float()).weights.sum() + router.aux_loss, x, finite=finite)
        knn = softtopk.DifferentiableKNN(2)
        labels = torch.arange(x.shape[0]) % 2
        probe.run(f"knn {name}", lambda t: knn(t.float(), t.float().flip(0), labels, labels).loss, x, finite=finite)
    probe.assert_clean()
