"""Mixture-of-experts routing with soft top-k gates: a small MoE classifier on the built-in WordNet embeddings.

What it shows: :class:`softtopk.TopKRouter` as the router of a mixture of experts (8 experts, each token sent
to k = 2 of them), with four gates ("settings"), everything else equal:

* ``hard``: ``torch.topk`` dispatch, softmax over the two chosen logits (Shazeer et al. 2017; Mixtral);
* ``lapsum``: the same dispatch, weights = the closed-form Laplace soft top-k mask at the chosen experts
  (LapSum), in [0, 1];
* ``sparse``: weights = the sparse soft top-k mask (Sander et al. 2023, p = 4/3), whose exact zeros leave the
  experts far below the threshold without gradient;
* ``straight_through``: LapSum with ``hard=True``: weights exactly 1 forward, LapSum's gradient backward.

Model: ``head(x + moe(x))``, a linear head to the 148 classes of ``wordnet148`` (all-MiniLM-L6-v2 embeddings of
WordNet noun glosses, shipped with the package: no download), the unit-norm embeddings scaled by sqrt(384) so
that a feature has unit mean square and the router's logits are of order 1 from the start. An expert is a
384 -> ``--hidden`` -> 384 GELU MLP and only sees its own tokens (sparse dispatch: one ``index_select`` /
``index_add_`` per expert, not a dense evaluation of all experts). Loss: cross-entropy +
``alpha * router.aux_loss`` (the Switch Transformer load-balancing loss, 1 when dispatch is uniform); Adam,
batch 256, a fixed number of epochs; evaluated once on the test split at the end (no model selection).

Command::

    python examples/moe_routing.py                     # 3 seeds x 4 settings, about a minute on 1 CPU thread
    python examples/moe_routing.py --seeds 0 --epochs 1 --settings hard lapsum

Measures, per setting (mean ± std over seeds, one run per seed):

* ``top1`` / ``top5``: test accuracy (%);
* ``load_cv``: the coefficient of variation (population std / mean) of the per-expert dispatch counts on the
  test set (each token counted once at each of its k experts); 0 is perfectly balanced;
* ``max_load``: the largest per-expert count over the mean count (1 is balanced; at most E / k = 4, reached
  when one expert is among the k of every token);
* ``aux``: the load-balancing loss averaged over the training steps of the last epoch;
* ``gate_sum``: the mean over test tokens of the sum of its k weights (1 for ``hard``, 2 for
  ``straight_through``, in (0, 2] for the masks);
* ``ms_step``: the median wall-clock time of a training step (forward, backward, Adam), in milliseconds.

References:
    Noam Shazeer et al. Outrageously large neural networks: the sparsely-gated mixture-of-experts layer.
    ICLR 2017.
    William Fedus, Barret Zoph and Noam Shazeer. Switch Transformers: scaling to trillion parameter models with
    simple and efficient sparsity. JMLR 2022.
    Albert Q. Jiang et al. Mixtral of experts. arXiv:2401.04088, 2024.
    Michael E. Sander, Joan Puigcerver, Josip Djolonga, Gabriel Peyré and Mathieu Blondel. Fast, differentiable
    and sparse top-k: a convex analysis perspective. ICML 2023.
    Łukasz Struski, Michał B. Bednarczyk, Igor T. Podolak and Jacek Tabor. LapSum – one method to differentiate
    them all: ranking, sorting and top-k selection. ICML 2025.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from _common import compare, parser, seeded

import softtopk
from softtopk_lab.wordnet import load_builtin

N_EXPERTS, K, BATCH = 8, 2, 256
SETTINGS = ("hard", "lapsum", "sparse", "straight_through")
COLUMNS = [
    ("top1", "top-1 (%)", ".2f"),
    ("top5", "top-5 (%)", ".2f"),
    ("load_cv", "load CV", ".3f"),
    ("max_load", "max/mean load", ".2f"),
    ("aux", "aux loss", ".4f"),
    ("gate_sum", "gate sum", ".3f"),
    ("ms_step", "ms / step", ".2f"),
]


def router_params(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`softtopk.TopKRouter` keyword arguments of a setting."""
    return {
        "hard": {"method": "hard"},
        "lapsum": {"method": "lapsum", "tau": args.tau},
        "sparse": {"method": "sparse", "l": args.l, "p": 4 / 3},
        "straight_through": {"method": "lapsum", "tau": args.tau, "hard": True},
    }[setting]


class MoE(torch.nn.Module):
    """A mixture of GELU-MLP experts behind a top-k router; each expert runs on its own tokens only."""

    def __init__(self, d_model: int, hidden: int, router: softtopk.TopKRouter) -> None:
        super().__init__()
        self.router = router
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d_model, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d_model))
            for _ in range(router.n_experts)
        )
        self.last: softtopk.Routing | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``sum_j weights_j * expert_{indices_j}(x)`` per token; the routing is kept in ``self.last``."""
        self.last = weights, indices = self.router(x)
        tokens = torch.arange(x.shape[0]).repeat_interleave(indices.shape[-1])
        indices, weights = indices.reshape(-1), weights.reshape(-1, 1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            slots = (indices == e).nonzero().squeeze(1)
            if slots.numel():
                rows = tokens[slots]
                out.index_add_(0, rows, weights[slots] * expert(x.index_select(0, rows)))
        return out


class Classifier(torch.nn.Module):
    """``head(x + moe(x))``: a residual MoE layer and a linear head."""

    def __init__(self, moe: MoE, n_classes: int) -> None:
        super().__init__()
        self.moe = moe
        self.head = torch.nn.Linear(moe.router.d_model, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x + self.moe(x))


def train(
    model: Classifier, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, g: torch.Generator
) -> tuple[float, float]:
    """Train in place; return the last epoch's mean aux loss and the median step time (ms)."""
    optimiser = torch.optim.Adam(model.parameters(), lr=args.lr)
    steps_ms, aux = [], []
    for _ in range(args.epochs):
        aux.clear()
        for batch in torch.randperm(len(y), generator=g).split(BATCH):
            start = time.perf_counter()
            logits = model(x[batch])
            router_loss = model.moe.router.aux_loss
            loss = torch.nn.functional.cross_entropy(logits, y[batch]) + args.alpha * router_loss
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            steps_ms.append(1e3 * (time.perf_counter() - start))
            aux.append(router_loss.detach())
    return torch.stack(aux).double().mean().item(), statistics.median(steps_ms)


@torch.no_grad()
def evaluate(model: Classifier, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Top-1 / top-5 accuracy (%), load balance and gate statistics on ``(x, y)``."""
    top5 = model(x).topk(5, dim=-1).indices
    weights, indices = model.moe.last
    counts = torch.bincount(indices.reshape(-1), minlength=N_EXPERTS).double()
    return {
        "top1": 100 * (top5[:, 0] == y).double().mean().item(),
        "top5": 100 * (top5 == y[:, None]).any(-1).double().mean().item(),
        "load_cv": (counts.std(correction=0) / counts.mean()).item(),
        "max_load": (counts.max() / counts.mean()).item(),
        "gate_sum": weights.sum(-1).double().mean().item(),
    }


def load() -> dict[str, torch.Tensor]:
    """``wordnet148``'s train and test splits, ``x`` scaled to unit mean square per feature."""
    data = load_builtin("wordnet148")
    scale = data["train_embeddings"].shape[1] ** 0.5
    return {
        "x_train": data["train_embeddings"] * scale,
        "y_train": data["train_labels"],
        "x_test": data["test_embeddings"] * scale,
        "y_test": data["test_labels"],
    }


def run(setting: str, seed: int, data: dict[str, torch.Tensor], args: argparse.Namespace) -> dict[str, float]:
    """One training run of one setting; its metrics."""
    g = seeded(seed)
    d_model, n_classes = data["x_train"].shape[1], int(data["y_train"].max()) + 1
    router = softtopk.TopKRouter(d_model, N_EXPERTS, K, **router_params(setting, args))
    model = Classifier(MoE(d_model, args.hidden, router), n_classes)
    aux, ms_step = train(model, data["x_train"], data["y_train"], args, g)
    return {**evaluate(model, data["x_test"], data["y_test"]), "aux": aux, "ms_step": ms_step}


def main() -> None:
    p = parser(__doc__.split("\n")[0], out="moe_routing.json")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (21 steps each)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--alpha", type=float, default=1e-2, help="weight of the load-balancing loss")
    p.add_argument("--hidden", type=int, default=64, help="hidden width of an expert")
    p.add_argument(
        "--tau",
        type=float,
        default=0.5,
        help="LapSum temperature (lapsum, straight_through): the router's logits have a spread (std "
        "over experts) of about 0.55 at initialisation and 1.3 after training the hard router, "
        "whose median gap between the 2nd and 3rd logit is 0.43; tau = 0.5 is of that scale, so "
        "the gate is neither saturated nor flat (the two chosen weights of LapSum sum to 1.5 on "
        "average on the trained hard router's logits, 1.14 at initialisation)",
    )
    p.add_argument(
        "--l",
        type=float,
        default=3.0,
        help="sparse regularisation strength (p = 4/3): on the same logits, l = 3 gives the mean "
        "gate sum of LapSum at tau = 0.5 (1.48 vs 1.50 trained, 1.05 vs 1.14 at init)",
    )
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS), help="routers to compare")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = load()
    compare(args, lambda setting, seed: run(setting, seed, data, args), COLUMNS)


if __name__ == "__main__":
    main()
