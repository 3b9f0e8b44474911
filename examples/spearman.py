"""Learning to rank by Spearman correlation: a soft-rank loss against mean squared error.

A small regressor of diabetes progression (scikit-learn's bundled diabetes data: 442 patients, 10
baseline variables, a disease-progression score one year later; Efron et al. 2004; no download)
trained to *order* patients, as a triage list would, with ``softtopk.spearman_loss`` (one minus
the Spearman correlation of the batch's soft ranks and the targets' ranks: torchsort's README
example, here exact and compile-free) against plain regression.

Data: a fixed split by ``DATA_SEED`` = 0 into 265 train, 88 validation and 89 test patients;
features standardised with the train split's mean and deviation; targets standardised the same way
for ``mse``. Model: ``Linear(10, 32) - ReLU - Linear(32, 1)``. Adam, batches of ``--batch_size``
patients (each batch is one list for the rank losses), ``--epochs`` epochs, evaluated once at the
end. Settings:

* ``mse``: mean squared error on the standardised target;
* ``spearman``: ``spearman_loss(pred, target, strength=--strength)`` (l2 soft ranks);
* ``spearman_kl``: the same with ``regularization="kl"``;
* ``mse+spearman``: the sum of the two.

The validation split served only to pick ``--lr``, ``--epochs`` and ``--strength`` on seed 0.

Command::

    python examples/spearman.py                   # 3 seeds x 4 settings, a few seconds on 1 thread
    python examples/spearman.py --seeds 0 --epochs 2 --settings mse spearman

Measures on the test patients (mean ± std over seeds): ``spearman``, Spearman's rank correlation of
predictions and targets (``scipy.stats.spearmanr``); ``pearson``, the linear correlation; and
``ms_step``, the median wall-clock time of a training step in milliseconds. Needs scikit-learn
(``pip install scikit-learn``; it is in the ``test`` extra).

References:
    M. Blondel, O. Teboul, Q. Berthet, J. Djolonga. Fast Differentiable Sorting and Ranking. ICML 2020.
    B. Efron, T. Hastie, I. Johnstone, R. Tibshirani. Least Angle Regression. Annals of Statistics
    32(2), 2004 (the diabetes data).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import compare, parser, seeded

import softtopk

DATA_SEED = 0
SETTINGS = ("mse", "spearman", "spearman_kl", "mse+spearman")


def load() -> dict[str, torch.Tensor]:
    """The diabetes data split 60/20/20 by ``DATA_SEED``, standardised with the train split's statistics."""
    try:
        from sklearn.datasets import load_diabetes
    except ImportError:
        raise SystemExit("examples/spearman.py needs scikit-learn: pip install scikit-learn") from None
    x, y = (torch.tensor(a, dtype=torch.float32) for a in load_diabetes(return_X_y=True))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(DATA_SEED))
    parts = dict(zip(("train", "val", "test"), order.split([265, 88, 89]), strict=False))
    mean, std = x[parts["train"]].mean(0), x[parts["train"]].std(0)
    y_mean, y_std = y[parts["train"]].mean(), y[parts["train"]].std()
    data = {}
    for name, index in parts.items():
        data[f"x_{name}"] = (x[index] - mean) / std
        data[f"y_{name}"] = (y[index] - y_mean) / y_std
    return data


def loss_of(setting: str, args: argparse.Namespace):
    """The training loss of a setting: ``(pred (B,), target (B,)) -> scalar``."""
    mse = torch.nn.functional.mse_loss

    def rank(pred: torch.Tensor, target: torch.Tensor, regularization: str = "l2") -> torch.Tensor:
        return softtopk.spearman_loss(pred, target, regularization=regularization, strength=args.strength)

    return {
        "mse": mse,
        "spearman": rank,
        "spearman_kl": lambda p, t: rank(p, t, "kl"),
        "mse+spearman": lambda p, t: mse(p, t) + rank(p, t),
    }[setting]


def correlations(pred: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Spearman's and Pearson's correlation of two 1-D tensors."""
    from scipy.stats import pearsonr, spearmanr

    a, b = pred.double().numpy(), target.double().numpy()
    return {"spearman": float(spearmanr(a, b).statistic), "pearson": float(pearsonr(a, b).statistic)}


def run(setting: str, seed: int, data: dict[str, torch.Tensor], args: argparse.Namespace) -> dict[str, float]:
    """Train one setting with one seed; its correlations on the evaluation split."""
    g = seeded(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimiser, loss_fn, steps_ms = torch.optim.Adam(model.parameters(), lr=args.lr), loss_of(setting, args), []
    x, y = data["x_train"], data["y_train"]
    for _ in range(args.epochs):
        for batch in torch.randperm(len(y), generator=g).split(args.batch_size):
            if len(batch) < 2:  # a rank correlation needs two patients
                continue
            start = time.perf_counter()
            optimiser.zero_grad()
            loss_fn(model(x[batch]).squeeze(-1), y[batch]).backward()
            optimiser.step()
            steps_ms.append(1000 * (time.perf_counter() - start))
    split = "val" if args.validation else "test"
    with torch.no_grad():
        pred = model(data[f"x_{split}"]).squeeze(-1)
    return {**correlations(pred, data[f"y_{split}"]), "ms_step": statistics.median(steps_ms)}


def main() -> None:
    p = parser(__doc__.split("\n")[0], out="spearman.json")
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--strength", type=float, default=0.1, help="the soft ranks' regularisation strength")
    p.add_argument("--validation", action="store_true", help="evaluate on the validation split (tuning)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    data = load()
    columns = [
        ("spearman", "Spearman ρ (test)", ".3f"),
        ("pearson", "Pearson r (test)", ".3f"),
        ("ms_step", "ms/step", ".2f"),
    ]
    compare(args, lambda setting, seed: run(setting, seed, data, args), columns)


if __name__ == "__main__":
    main()
