"""Why NeuralSort/SoftSort top-k CE loses top-1 on wordnet148 (docs/results.md, "NeuralSort and SoftSort").

1. Trains the linear head of the wordnet148 sweep (Adam lr 1e-2, batch 256, 30 epochs, seed 0) with
   difftopk's loss as softtopk computes it (``softtopk.compat.difftopk``) and, when the original
   ``difftopk`` package is installed, with the original, in the same loop; prints test top-1/top-5,
   the share of test rows whose argmax is the single most predicted class ("hub"), and where the
   label ranks.
2. On the logits of a cross-entropy-trained head (trained here, same protocol), adds a constant c to
   one class for every row whose label is another class, and prints each loss as c grows: a loss that
   stays flat does not resist one wrong class taking rank 1 everywhere.
3. Repeats (1) for NeuralSort at higher inverse temperatures.

Run: ``python scripts/hub_collapse.py`` (about 2 minutes on 2 CPU cores; needs the ``lab`` extra).
"""

from __future__ import annotations

import torch

from softtopk.compat.difftopk import TopKCrossEntropyLoss
from softtopk_lab.embedding_data import load_data

P_TOP5 = [0.25, 0, 0, 0, 0.75]


def train(loss_fn, data, seed: int = 0, epochs: int = 30) -> torch.nn.Linear:
    x, y = data["train"]
    torch.manual_seed(seed)
    model = torch.nn.Linear(x.shape[1], data["n_classes"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for batch in torch.randperm(len(y)).split(256):
            loss = loss_fn(model(x[batch].float()), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


@torch.no_grad()
def report(name: str, model: torch.nn.Linear, data) -> None:
    x, y = data["test"]
    scores = model(x.float())
    rank = (scores > scores.gather(1, y[:, None])).sum(1)
    hub_share = torch.bincount(scores.argmax(1)).max().item() / len(y)
    ranks = ", ".join(f"{100 * (rank == r).float().mean():.0f}%" for r in range(5))
    print(
        f"  {name:<50} top-1 {100 * (rank == 0).float().mean():5.1f}%  top-5 {100 * (rank < 5).float().mean():5.1f}%"
        f"  hub share {100 * hub_share:4.1f}%  label at rank 1..5: {ranks}"
    )


def ours(method: str, beta: float, p_k, **kw) -> TopKCrossEntropyLoss:
    return TopKCrossEntropyLoss(method, beta, p_k, 148, m=16, **kw)


def main() -> None:
    torch.set_num_threads(1)
    data = load_data("wordnet148")
    print("1. Test metrics after training (seed 0):")
    report("cross-entropy", ce_model := train(torch.nn.CrossEntropyLoss(), data), data)
    report("neuralsort beta .5 P_K [.25,0,0,0,.75] (softtopk)", train(ours("neuralsort", 0.5, P_TOP5), data), data)
    try:
        import difftopk
    except ImportError:
        print("  (difftopk is not installed: the original's row is skipped)")
    else:
        original = difftopk.TopKCrossEntropyLoss(
            diffsort_method="neuralsort", inverse_temperature=0.5, p_k=P_TOP5, n=148, m=16
        )
        report("neuralsort beta .5 P_K [.25,0,0,0,.75] (difftopk)", train(original, data), data)
    report("softsort beta .5 P_K [.2]*5 (softtopk)", train(ours("softsort", 0.5, [0.2] * 5), data), data)

    print("2. Loss on the cross-entropy head's training logits with class 0 raised by c (rows with another label):")
    x, y = data["train"]
    with torch.no_grad():
        scores = ce_model(x[:1000].float())
    keep = y[:1000] != 0
    offsets = (0, 2, 4, 6, 8, 12, 20)
    print("  " + " " * 50 + "".join(f"{f'c={c}':>8}" for c in offsets))
    losses = {
        "neuralsort beta .5 P_K [.25,0,0,0,.75]": ours("neuralsort", 0.5, P_TOP5),
        "neuralsort beta .5 P_K [.2]*5": ours("neuralsort", 0.5, [0.2] * 5),
        "softsort beta .5 P_K [.2]*5": ours("softsort", 0.5, [0.2] * 5),
        "splitter logistic_phi beta 1 P_K [.2]*5": ours(
            "splitter_selection", 1.0, [0.2] * 5, distribution="logistic_phi", art_lambda=0.5
        ),
    }
    for name, loss_fn in losses.items():
        values = []
        for c in offsets:
            raised = scores.clone()
            raised[:, 0] += c
            values.append(loss_fn(raised[keep], y[:1000][keep]).item())
        print(f"  {name:<50}" + "".join(f"{v:8.3f}" for v in values))

    print("3. NeuralSort P_K [.25,0,0,0,.75] at higher inverse temperatures:")
    for beta in (2.0, 8.0):
        report(f"neuralsort beta {beta:g}", train(ours("neuralsort", beta, P_TOP5), data), data)


if __name__ == "__main__":
    main()
