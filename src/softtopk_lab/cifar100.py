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

Run files, resume and torchrun: :mod:`.runner`. Under torchrun every rank draws the augmentation of
the whole global batch from the same generator and trains on its own part of it, so the data seen is
independent of the number of processes (BatchNorm statistics are per rank).

Test-only hook: with the environment variable ``SOFTTOPK_TEST_KILL_AT_STEP=N`` the process sends
itself SIGKILL right after optimizer step ``N`` (used by the kill-and-resume test).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
from typing import Any

import torch

from .metrics import BestTracker, summary_table, topk_metrics
from .models import resnet18_cifar
from .runner import Run, UsageError, add_run_arguments, epoch_permutation, resolve_device
from .train_losses import add_loss_arguments, build_loss, check_p_k_flag, method_choices
from .cifar_data import CIFAR100_CLASSES, augment_cifar, load_cifar100, noisy_labels, normalize_cifar
from .data_files import DataError

DEFAULT_VAL_SIZE = 2500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``train-cifar100`` flags (difftopk's first, then ours) to ``parser``."""
    p = parser.add_argument
    p("-eid", "--experiment_id", type=int, default=None, help="free experiment id stored in config.json (difftopk)")
    p("-d", "--data_path", type=str, required=True,
      help="CIFAR-100 python archive (cifar-100-python.tar.gz) or its extracted directory; never downloaded")
    p("--n_epochs", type=int, default=200, help="training epochs (default 200)")
    p("--nloglr", type=float, default=3.0, help="Adam learning rate is 10**-nloglr (default 3)")
    p("--batch_size", type=int, default=128,
      help="global batch size, split across torchrun ranks; incomplete last batches of the training and "
           "validation sets are dropped (default 128)")
    p("--seed", type=int, default=0,
      help="seed of initialisation, validation split, label noise, data order and augmentation (default 0)")
    p("--device", type=str, default="cuda", help="cpu, cuda or cuda:N (default cuda, as difftopk)")
    p("--method", type=str, required=True, choices=method_choices(), metavar="METHOD",
      help="loss: " + ", ".join(method_choices()))
    p("--p_k", type=float, nargs="+", required=True,
      help="P_K, weights of ranks 1..k (non-negative, sum 1); the SVM/noised losses use k = last nonzero index + 1")
    p("--inverse_temperature", type=float, default=1.0,
      help="steepness of sorting networks; 1/tau for neuralsort/softsort/other ranks methods; tau of "
           "smooth_topk/smooth_hard_topk (default 1)")
    p("-m", "--m", type=int, default=None,
      help="pre-select the m largest scores before sorting (default None: all 100 classes are sorted)")
    p("--distribution", type=str, default=None,
      help="sorting-network comparator distribution (cauchy, logistic, logistic_phi, ...; default None = cauchy)")
    p("--art_lambda", type=float, default=0.5, help="lambda of the logistic_phi (ART) distribution (default 0.5)")
    p("--top1_mode", type=str, default="smce", help="top-1 term of the top-k CE loss: sm, smce or sort (default smce)")
    p("--label_noise", type=float, default=0.0,
      help="probability P in [0, 1] that a training label is redrawn uniformly within its block of 5 class ids "
           "(Berrada et al. 2018); applied once, before the validation split (validation labels are noisy "
           "too), seeded by --seed; test labels stay clean (default 0)")
    p("--val_size", type=int, default=DEFAULT_VAL_SIZE,
      help=f"training images held out for validation by a seeded random split (default {DEFAULT_VAL_SIZE:,})")
    add_run_arguments(parser, "train-cifar100")
    add_loss_arguments(parser)


def _check_flags(args: Any) -> None:
    for name in ("n_epochs", "batch_size", "val_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.m is not None and args.m < 1:
        raise UsageError(f"-m/--m must be >= 1, got {args.m}")
    if not args.inverse_temperature > 0:
        raise UsageError(f"--inverse_temperature must be > 0, got {args.inverse_temperature}")
    if not (math.isfinite(args.label_noise) and 0.0 <= args.label_noise <= 1.0):
        raise UsageError(f"--label_noise must be a probability in [0, 1], got {args.label_noise}")
    if args.val_size < args.batch_size:
        raise UsageError(f"--val_size {args.val_size} must be >= --batch_size {args.batch_size} "
                         "(the incomplete last validation batch is dropped, as in difftopk)")
    if args.out is not None and args.resume is not None:
        raise UsageError("--out and --resume are exclusive (a resumed run continues in its own directory)")
    check_p_k_flag(args.p_k)


def load_splits(path: str, seed: int, val_size: int, label_noise: float, batch_size: int) -> dict[str, Any]:
    """CIFAR-100 as uint8 train/valid/test splits, with label noise and the seeded validation split.

    Args:
        path: the archive or extracted directory (see :func:`~.cifar_data.load_cifar100`).
        seed: seeds the label noise and the split (two separate generators).
        val_size: held-out training images.
        label_noise: Berrada's block-of-5 noise probability, applied before the split.
        batch_size: the validation split is cut to a multiple of it (difftopk's ``drop_last``).

    Raises:
        UsageError: unreadable/malformed data, or a split too small for ``batch_size``.
    """
    try:
        data = load_cifar100(path)
    except DataError as error:
        raise UsageError(str(error)) from None
    images, clean = data["train_images"], data["train_labels"]
    labels = clean
    if label_noise > 0:
        labels = noisy_labels(clean, label_noise, torch.Generator().manual_seed(seed * 7 + 5),
                              num_classes=CIFAR100_CLASSES)
    if len(labels) - val_size < batch_size:
        raise UsageError(f"--val_size {val_size}: leaves {len(labels) - val_size} of {len(labels)} training images, "
                         f"fewer than one batch of --batch_size {batch_size}")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    valid_idx, train_idx = order[:val_size], order[val_size:]
    valid_idx = valid_idx[:val_size // batch_size * batch_size]
    return {"train": (images[train_idx], labels[train_idx]), "valid": (images[valid_idx], labels[valid_idx]),
            "test": (data["test_images"], data["test_labels"]),
            "changed_label_fraction": (labels != clean).double().mean().item()}


@torch.no_grad()
def evaluate_images(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, *, batch_size: int,
                    device: torch.device) -> dict[str, float]:
    """Top-k metrics of ``model`` (eval mode) on uint8 images, normalised on ``device`` batch by batch."""
    was_training = model.training
    model.eval()
    outputs = [model(normalize_cifar(images[i:i + batch_size].to(device, non_blocking=True))).float().cpu()
               for i in range(0, len(labels), batch_size)]
    model.train(was_training)
    return topk_metrics(torch.cat(outputs), labels.cpu())


def train_cifar100(args: Any) -> dict[str, Any]:
    """Run ``softtopk train-cifar100`` with parsed flags; returns the content of ``results.json``.

    Raises:
        UsageError: bad flags, device or data (printed as one line by the CLI).
    """
    _check_flags(args)
    distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    resolve_device(args.device, int(os.environ.get("LOCAL_RANK", "0")) if distributed else None)  # fail before loading
    data = load_splits(args.data_path, args.seed, args.val_size, args.label_noise, args.batch_size)
    run = Run("train-cifar100", args)
    if args.batch_size < run.world_size:
        raise UsageError(f"--batch_size {args.batch_size} is smaller than the {run.world_size} torchrun processes")
    torch.manual_seed(args.seed)
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = data["train"], data["valid"], data["test"]
    if run.device.type == "cuda":
        train_x, valid_x, test_x = train_x.pin_memory(), valid_x.pin_memory(), test_x.pin_memory()
    model = resnet18_cifar(CIFAR100_CLASSES)
    net = run.wrap_model(model)
    optimizer = torch.optim.Adam(net.parameters(), lr=10 ** -args.nloglr)
    noise = torch.Generator(device=run.device).manual_seed(args.seed * 7919 + run.rank)
    augment = torch.Generator().manual_seed(args.seed * 104729 + 1)  # same on every rank: global batch augmented
    class_counts = torch.bincount(train_y, minlength=CIFAR100_CLASSES)
    loss_fn = build_loss(args, CIFAR100_CLASSES, class_counts, noise).to(run.device)
    generators, best = {"loss_noise": noise, "augment": augment}, BestTracker()
    start_epoch, step, valid, test = 0, 0, None, None
    state = run.restore(generators, model, optimizer, best)
    if state is not None:
        start_epoch, step = state["epoch"] + 1, state["step"]
        valid, test = state["last_evaluation"]
    kill_at = int(os.environ.get("SOFTTOPK_TEST_KILL_AT_STEP", "0"))
    steps_per_epoch = len(train_y) // args.batch_size  # drop_last

    for epoch in range(start_epoch, args.n_epochs):
        net.train()
        order = epoch_permutation(len(train_y), args.seed, epoch)[:steps_per_epoch * args.batch_size]
        batches = run.progress(order.view(steps_per_epoch, args.batch_size), steps_per_epoch,
                               f"epoch {epoch + 1}/{args.n_epochs}")
        losses, correct, seen = [], torch.zeros((), dtype=torch.long, device=run.device), 0
        for batch in batches:
            images = augment_cifar(train_x[batch], augment)  # whole global batch, same draws on every rank
            parts = torch.arange(len(batch)).tensor_split(run.world_size)[run.rank]
            x = images[parts].to(run.device, non_blocking=True)
            y = train_y[batch][parts].to(run.device, non_blocking=True)
            logits = net(x)
            loss = loss_fn(logits, y) * run.shard_weight(len(parts), len(batch))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.detach())
            correct += (logits.detach().argmax(1) == y).sum()
            seen += len(y)
            if run.show_progress:
                batches.set_postfix(loss=f"{losses[-1].item():.4f}", acc=f"{correct.item() / max(seen, 1):.3f}")
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        valid = evaluate_images(model, valid_x, valid_y, batch_size=args.batch_size, device=run.device)
        test = evaluate_images(model, test_x, test_y, batch_size=args.batch_size, device=run.device)
        best.update(valid, test, step)
        train_loss = run.mean_loss(losses)
        if not math.isfinite(train_loss):
            raise FloatingPointError(f"training loss is {train_loss} in epoch {epoch + 1}")
        run.log({"step": step, "epoch": epoch + 1, "train_loss": train_loss,
                 "train_top1_rank0": correct.item() / max(seen, 1), "valid": valid, "test": test, "elapsed": run.elapsed()})
        run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                             "step": step, "best": best.state_dict(), "last_evaluation": (valid, test)},
                            generators)
    results = {"reported_test_at_best_valid": best.reported(), "final_valid": valid, "final_test": test,
               "best": best.state_dict(), "steps": step, "epochs": args.n_epochs, "n_classes": CIFAR100_CLASSES,
               "n_train": len(train_y), "n_valid": args.val_size, "n_valid_evaluated": len(valid_y),
               "n_test": len(test_y), "label_noise": args.label_noise,
               "changed_label_fraction": data["changed_label_fraction"], "data": str(args.data_path),
               "elapsed": run.elapsed()}
    run.finish(results, summary_table(valid, test, best))
    return results
