"""Top-k accuracy metrics for the training tools, and the paper's "test at best validation" rule.

Every evaluation reports ``top{k}`` (fraction of samples whose label is among the k largest
scores) and ``macro_top{k}`` (mean over the classes present in the split of the per-class top-k
accuracy; the right number for imbalanced data) for k in ``TOPKS`` that are <= the number of
classes. :class:`BestTracker` keeps, for each metric, the test value at the best validation value
of the same metric, as difftopk's ``train_imagenet.py`` reports its results.
"""

from __future__ import annotations

import torch

TOPKS = (1, 5, 10, 20)


def topk_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Micro and macro top-k accuracies of one split.

    Args:
        logits: ``(N, C)`` scores.
        labels: ``(N,)`` integer class indices in ``[0, C)``.

    Returns:
        ``{'top1': ..., 'macro_top1': ..., 'top5': ..., ...}`` for each k in ``TOPKS`` with
        ``k <= C``; values in [0, 1].
    """
    n_classes = logits.shape[1]
    ks = [k for k in TOPKS if k <= n_classes]
    ranked = logits.topk(max(ks), dim=1).indices
    hit_rank = (ranked == labels.unsqueeze(1)).float()
    present = torch.bincount(labels, minlength=n_classes) > 0
    counts = torch.bincount(labels, minlength=n_classes).clamp(min=1).double()
    result: dict[str, float] = {}
    for k in ks:
        hits = hit_rank[:, :k].sum(1).double()
        result[f"top{k}"] = hits.mean().item()
        per_class = torch.zeros(n_classes, dtype=torch.float64).index_add_(0, labels, hits) / counts
        result[f"macro_top{k}"] = per_class[present].mean().item()
    return result


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, embeddings: torch.Tensor, labels: torch.Tensor, *, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Top-k metrics of ``model`` on a split, in eval mode, batch by batch (inputs cast to float32).

    Args:
        model: maps ``(B, D)`` float32 inputs to ``(B, C)`` scores.
        embeddings: ``(N, D)`` inputs in any floating dtype, on any device.
        labels: ``(N,)`` integer labels.
        batch_size: evaluation batch size.
        device: where the model runs.

    Returns:
        :func:`topk_metrics` of the whole split.
    """
    was_training = model.training
    model.eval()
    outputs = [
        model(embeddings[i : i + batch_size].to(device).float()).float().cpu()
        for i in range(0, len(labels), batch_size)
    ]
    model.train(was_training)
    return topk_metrics(torch.cat(outputs), labels.cpu())


class BestTracker:
    """For each metric, the best validation value so far and the test value at that evaluation.

    Ties keep the earlier evaluation (difftopk compares with ``>``).
    """

    def __init__(self) -> None:
        self.best: dict[str, dict[str, float]] = {}

    def update(self, valid: dict[str, float], test: dict[str, float], step: int) -> set[str]:
        """Record one evaluation (validation and test metrics with the same keys) at ``step``;
        returns the metrics it improved."""
        improved = set()
        for name, value in valid.items():
            if name not in self.best or value > self.best[name]["valid"]:
                self.best[name] = {"valid": value, "test": test[name], "step": step}
                improved.add(name)
        return improved

    def state_dict(self) -> dict:
        """A JSON- and checkpoint-friendly copy of the tracked values."""
        return {name: dict(entry) for name, entry in self.best.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the values of :meth:`state_dict`.

        Raises:
            ValueError: an entry is not ``{"valid": number, "test": number, "step": int}``.
        """
        for name, entry in state.items():
            if not (
                isinstance(entry, dict)
                and all(isinstance(entry.get(key), (int, float)) for key in ("valid", "test"))
                and isinstance(entry.get("step"), int)
            ):
                raise ValueError(f"best[{name!r}] is not a best-validation entry")
        self.best = {name: dict(entry) for name, entry in state.items()}

    def reported(self) -> dict[str, float]:
        """The paper's numbers: ``{metric: test value at the best validation value}``."""
        return {name: entry["test"] for name, entry in self.best.items()}


def summary_table(final_valid: dict[str, float], final_test: dict[str, float], best: BestTracker) -> str:
    """A fixed-width table: one row per metric, final valid/test and test at best validation (%)."""
    lines = [f"{'metric':<14}{'valid(final)':>14}{'test(final)':>13}{'test@best-valid':>17}{'best step':>11}", "-" * 69]
    for name, value in final_valid.items():
        entry = best.best[name]
        lines.append(
            f"{name:<14}{100 * value:>13.2f}%{100 * final_test[name]:>12.2f}%"
            f"{100 * entry['test']:>16.2f}%{entry['step']:>11d}"
        )
    return "\n".join(lines)
