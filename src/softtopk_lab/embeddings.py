"""``softtopk train-embeddings``: a linear (or MLP) head on precomputed embeddings.

The flags of difftopk's ``experiments/train_imagenet.py`` keep their names, defaults and meaning,
so its README commands run unchanged apart from the program name and the data path. Training is
Adam with the constant learning rate ``10 ** -nloglr``, no weight decay; the model is
``nn.Linear(D, C)`` or, with ``--hidden_dims``, a ReLU MLP; ``--apply_relu`` applies a ReLU and
``--apply_dropout`` a ``Dropout(0.5)`` to the input embeddings (difftopk's exact placement of the
two is unverified); ``--normalize_ll`` makes the last layer a :class:`CosineLinear` (pytopk's
normalised last layer, used there with ``imbal_noised_topk``). Top-1/5/10/20 (micro and macro) are
evaluated on the validation and test sets at step 0, every ``--eval_freq`` steps and at the end;
each metric is reported as the test value at the best validation value of that metric. Run files,
resume and torchrun: :mod:`.runner`.

The training loop (counters, checkpoints, resume, the test-only kill hook): :mod:`.loop`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .config import EmbeddingConfig
from .embedding_data import default_val_size, load_data, split_validation
from .errors import UsageError
from .loop import Batch, Step, Task, train
from .metrics import evaluate
from .runner import Run
from .runtime import epoch_permutation
from .train_losses import build_loss


class CosineLinear(torch.nn.Module):
    """Normalised last layer: ``s_c = <x, w_c> / (||x|| ||w_c||)``, cosines in ``[-1, 1]``, no bias.

    The "normalised last layer" of LDAM (Cao et al., NeurIPS 2019) that pytopk's Pl@ntNet experiment
    uses with ``ImbalNoisedTopK`` (Garcin et al., ICML 2022), whose ``scale`` then acts as the inverse
    temperature. Weights start as ``nn.Linear``'s (Kaiming-uniform); zero vectors give zero scores.

    Shape: ``(N, in_features)`` → ``(N, out_features)``.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.nn.Linear(in_features, out_features, bias=False).weight.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normalize = torch.nn.functional.normalize
        return torch.nn.functional.linear(normalize(x, dim=-1), normalize(self.weight, dim=-1))


def build_model(
    dim: int,
    n_classes: int,
    hidden_dims: Sequence[int],
    apply_relu: bool,
    apply_dropout: bool,
    normalize_ll: bool = False,
) -> torch.nn.Module:
    """``[ReLU] [Dropout(0.5)] (Linear ReLU)* Linear`` from ``dim`` inputs to ``n_classes`` scores, the last
    layer a :class:`CosineLinear` with ``normalize_ll``."""
    layers: list[torch.nn.Module] = []
    if apply_relu:
        layers.append(torch.nn.ReLU())
    if apply_dropout:
        layers.append(torch.nn.Dropout(0.5))
    for width in hidden_dims:
        layers += [torch.nn.Linear(dim, width), torch.nn.ReLU()]
        dim = width
    layers.append(CosineLinear(dim, n_classes) if normalize_ll else torch.nn.Linear(dim, n_classes))
    return torch.nn.Sequential(*layers)


def _val_size(val_size: int | None, data: dict[str, Any]) -> int:
    """``--val_size``, or difftopk's default for the file's key set; at least one row on either side."""
    n_train = len(data["train"][1])
    size = default_val_size(data["source"], n_train) if val_size is None else val_size
    if not 1 <= size < n_train:
        raise UsageError(f"--val_size must be in [1, {n_train - 1}] for {n_train} training rows, got {size}")
    return size


def _model_args(config: EmbeddingConfig, dim: int, n_classes: int) -> dict[str, Any]:
    """The head's constructor arguments (``best.pt`` keeps them for :func:`build_model`)."""
    return {
        "dim": dim,
        "n_classes": n_classes,
        "hidden_dims": list(config.hidden_dims),
        "apply_relu": config.apply_relu,
        "apply_dropout": config.apply_dropout,
        "normalize_ll": config.normalize_ll,
    }


def train_embeddings(config: EmbeddingConfig, parent: str | None = None) -> dict[str, Any]:
    """Run ``softtopk train-embeddings``; returns the content of ``results.json`` (``parent``: the run
    id of the command that started it, recorded in the run's marker).

    Raises:
        UsageError: a flag value refused here (device, run directory, loss, ``--val_size``).
        DataError: the data file or built-in dataset is missing or malformed.
    """
    data = load_data(config.data_path)
    if "valid" not in data:  # a file: the validation rows are carved from its training set
        data = split_validation(data, config.seed, _val_size(config.val_size, data))
    run = Run(config, parent=parent)
    torch.manual_seed(config.seed)
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = data["train"], data["valid"], data["test"]
    model_args = _model_args(config, train_x.shape[1], data["n_classes"])
    model = build_model(**model_args)
    noise = torch.Generator(device=run.device).manual_seed(config.seed * 7919 + run.rank)
    loss_fn = build_loss(config.loss, data["n_classes"], data["train_class_counts"], noise).to(run.device)

    def step(net: torch.nn.Module, batch: Batch) -> Step:
        local = batch.local
        x, y = train_x[local].to(run.device).float(), train_y[local].to(run.device)
        logits = net(x)
        if not len(local):  # a torchrun process without rows: its forward pass still joins DDP's reduction
            return Step(logits.sum() * 0.0)
        return Step(loss_fn(logits, y) * batch.weight, (logits.detach().argmax(1) == y).sum(), len(y))

    def evaluation() -> tuple[dict[str, float], dict[str, float]]:
        valid = evaluate(model, valid_x, valid_y, batch_size=config.batch_size, device=run.device)
        return valid, evaluate(model, test_x, test_y, batch_size=config.batch_size, device=run.device)

    def batches(epoch: int) -> Iterable[tuple[torch.Tensor, None]]:
        return ((batch, None) for batch in epoch_permutation(len(train_y), config.seed, epoch).split(config.batch_size))

    task = Task(
        model,
        model_args,
        lambda parameters: torch.optim.Adam(parameters, lr=10**-config.nloglr),
        {"loss_noise": noise},
        config.n_epochs,
        -(-len(train_y) // config.batch_size),
        batches,
        step,
        evaluation,
        config.eval_freq,
        {
            "n_classes": data["n_classes"],
            "n_train": len(train_y),
            "n_valid": len(valid_y),
            "n_test": len(test_y),
            "data": data["source"],
        },
    )
    return train(run, task)
