"""``softtopk train-cifar100``: a CIFAR ResNet-18 trained from scratch on CIFAR-100 with a top-k loss.

The flags of difftopk's ``experiments/train_cifar100.py`` keep their names, defaults and meaning
(``--n_epochs 200``, ``--nloglr 3``, ``--batch_size 128``, ``--seed 0``, ``--device cuda``, ``-m``
None = all 100 classes, ``--top1_mode smce``, ...), so its README commands run unchanged apart from
the program name and the data path (``-d``, the ``cifar-100-python.tar.gz`` archive or its extracted
directory; CIFAR is never downloaded).

Protocol (as difftopk): :func:`~.models.resnet18_cifar`; ``--val_size`` (2,500) training images held
out by a random split seeded from ``--seed``; random crop (pad 4) + horizontal flip, normalised with
the CIFAR-10 statistics (:func:`~.cifar_data.augment_cifar`, drawn on the CPU from a generator whose
state is checkpointed); ``drop_last`` on the training and validation batches (the validation metrics
use the first ``floor(val_size / batch_size) * batch_size`` held-out images, the test metrics all
10,000); Adam with the constant learning rate ``10 ** -nloglr``, no weight decay. After every epoch
the validation and test sets are evaluated (top-1/5/10/20, micro and macro), a line is appended to
``metrics.jsonl`` and ``checkpoint.pt`` is written; each reported metric is the test value at the
best validation value of that metric.

``--label_noise P`` (Berrada et al., 2018): with probability ``P`` a label is redrawn uniformly within
its block of 5 consecutive class ids (:func:`~.cifar_data.noisy_labels`). The noise is drawn once,
from a generator seeded by ``--seed``, over all 50,000 training labels *before* the validation split,
so the validation labels are noisy too, as in Berrada et al.'s protocol where the validation set is
carved from the (noisy) training set: model selection sees the same corrupted labels a practitioner
would have. Test labels stay clean.

Run files, resume and torchrun: :mod:`.runner`; the training loop: :mod:`.loop`. Under torchrun every
rank draws the augmentation of the whole global batch from the same generator and trains on its own
part of it, so the data seen is independent of the number of processes (BatchNorm statistics are per
rank).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from .cifar_data import CIFAR100_CLASSES, augment_cifar, load_cifar100, noisy_labels, normalize_cifar
from .config import Cifar100Config
from .errors import UsageError
from .loop import Batch, Step, Task, train
from .metrics import topk_metrics
from .models import resnet18_cifar
from .runner import Run
from .runtime import epoch_permutation, resolve_device
from .train_losses import build_loss


def load_splits(path: str, seed: int, val_size: int, label_noise: float, batch_size: int) -> dict[str, Any]:
    """CIFAR-100 as uint8 train/valid/test splits, with label noise and the seeded validation split.

    Args:
        path: the archive or extracted directory (see :func:`~.cifar_data.load_cifar100`).
        seed: seeds the label noise and the split (two separate generators).
        val_size: held-out training images.
        label_noise: Berrada's block-of-5 noise probability, applied before the split.
        batch_size: the validation split is cut to a multiple of it (difftopk's ``drop_last``).

    Raises:
        DataError: unreadable or malformed data.
        UsageError: a split too small for ``batch_size``.
    """
    data = load_cifar100(path)
    images, clean = data["train_images"], data["train_labels"]
    labels = clean
    if label_noise > 0:
        labels = noisy_labels(
            clean, label_noise, torch.Generator().manual_seed(seed * 7 + 5), num_classes=CIFAR100_CLASSES
        )
    if len(labels) - val_size < batch_size:
        raise UsageError(
            f"--val_size {val_size}: leaves {len(labels) - val_size} of {len(labels)} training images, "
            f"fewer than one batch of --batch_size {batch_size}"
        )
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    valid_idx, train_idx = order[:val_size], order[val_size:]
    valid_idx = valid_idx[: val_size // batch_size * batch_size]
    return {
        "train": (images[train_idx], labels[train_idx]),
        "valid": (images[valid_idx], labels[valid_idx]),
        "test": (data["test_images"], data["test_labels"]),
        "changed_label_fraction": (labels != clean).double().mean().item(),
    }


@torch.no_grad()
def evaluate_images(
    model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Top-k metrics of ``model`` (eval mode) on uint8 images, normalised on ``device`` batch by batch."""
    was_training = model.training
    model.eval()
    outputs = [
        model(normalize_cifar(images[i : i + batch_size].to(device, non_blocking=True))).float().cpu()
        for i in range(0, len(labels), batch_size)
    ]
    model.train(was_training)
    return topk_metrics(torch.cat(outputs), labels.cpu())


def build_model(n_classes: int) -> torch.nn.Module:
    """The CIFAR-100 network: difftopk's ResNet-18 for 32 x 32 images with ``n_classes`` outputs."""
    return resnet18_cifar(n_classes)


def _result_fields(config: Cifar100Config, data: dict[str, Any]) -> dict[str, Any]:
    """The tool's own ``results.json`` fields."""
    return {
        "n_classes": CIFAR100_CLASSES,
        "n_train": len(data["train"][1]),
        "n_valid": config.val_size,
        "n_valid_evaluated": len(data["valid"][1]),
        "n_test": len(data["test"][1]),
        "label_noise": config.label_noise,
        "changed_label_fraction": data["changed_label_fraction"],
        "data": str(config.data_path),
    }


def train_cifar100(config: Cifar100Config) -> dict[str, Any]:
    """Run ``softtopk train-cifar100``; returns the content of ``results.json``.

    Raises:
        UsageError: a flag value refused here (device, run directory, loss, a split too small).
        DataError: the CIFAR-100 data is missing or malformed.
    """
    distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if distributed else None
    resolve_device(config.device, local_rank)  # fail before loading
    data = load_splits(config.data_path, config.seed, config.val_size, config.label_noise, config.batch_size)
    run = Run(config)
    if config.batch_size < run.world_size:
        raise UsageError(f"--batch_size {config.batch_size} is smaller than the {run.world_size} torchrun processes")
    torch.manual_seed(config.seed)
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = data["train"], data["valid"], data["test"]
    if run.device.type == "cuda":
        train_x, valid_x, test_x = train_x.pin_memory(), valid_x.pin_memory(), test_x.pin_memory()
    model_args = {"n_classes": CIFAR100_CLASSES}
    model = build_model(**model_args)
    noise = torch.Generator(device=run.device).manual_seed(config.seed * 7919 + run.rank)
    augment = torch.Generator().manual_seed(config.seed * 104729 + 1)  # same on every rank: global batch augmented
    class_counts = torch.bincount(train_y, minlength=CIFAR100_CLASSES)
    loss_fn = build_loss(config.loss, CIFAR100_CLASSES, class_counts, noise).to(run.device)
    steps_per_epoch = len(train_y) // config.batch_size  # drop_last

    def step(net: torch.nn.Module, batch: Batch) -> Step:
        images = augment_cifar(train_x[batch.indices], augment)  # whole global batch, same draws on every rank
        x = images[batch.part].to(run.device, non_blocking=True)
        y = train_y[batch.local].to(run.device, non_blocking=True)
        logits = net(x)
        return Step(loss_fn(logits, y) * batch.weight, (logits.detach().argmax(1) == y).sum(), len(y))

    def evaluation() -> tuple[dict[str, float], dict[str, float]]:
        valid = evaluate_images(model, valid_x, valid_y, batch_size=config.batch_size, device=run.device)
        return valid, evaluate_images(model, test_x, test_y, batch_size=config.batch_size, device=run.device)

    def batches(epoch: int) -> Iterable[tuple[torch.Tensor, None]]:
        order = epoch_permutation(len(train_y), config.seed, epoch)[: steps_per_epoch * config.batch_size]
        return ((batch, None) for batch in order.view(steps_per_epoch, config.batch_size))

    fields = _result_fields(config, data)
    # as difftopk's train_cifar100.py: evaluated after every epoch only; results.json keeps its 0.2.0 fields
    # (no step time)
    task = Task(
        model,
        model_args,
        lambda parameters: torch.optim.Adam(parameters, lr=10**-config.nloglr),
        {"loss_noise": noise, "augment": augment},
        config.n_epochs,
        steps_per_epoch,
        batches,
        step,
        evaluation,
        steps_per_epoch,
        fields,
        evaluate_first=False,
        step_time_in_results=False,
    )
    return train(run, task)
