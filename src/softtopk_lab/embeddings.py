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

Test-only hook: with the environment variable ``SOFTTOPK_TEST_KILL_AT_STEP=N`` the process sends
itself SIGKILL right after optimizer step ``N`` (used by the kill-and-resume test).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any

import torch

from .embedding_data import load_data
from .metrics import BestTracker, evaluate, summary_table
from .runner import Run, UsageError, add_run_arguments, epoch_permutation
from .train_losses import add_loss_arguments, build_loss, check_p_k_flag, method_choices


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``train-embeddings`` flags (difftopk's first, then ours) to ``parser``."""
    p = parser.add_argument
    p("-eid", "--experiment_id", type=int, default=None, help="free experiment id stored in config.json (difftopk)")
    p("-d", "--data_path", type=str, required=True,
      help="embedding file in difftopk's format (torch-pickled dict with train_*/test_*, train_*/val_* or "
           "imagenet21k_train_*/imagenet21k_val_* embeddings and labels), or a built-in dataset name "
           "(wordnet148, wordnet-plants150)")
    p("--n_epochs", type=int, default=20, help="training epochs (default 20)")
    p("--nloglr", type=float, default=4.5, help="Adam learning rate is 10**-nloglr (default 4.5)")
    p("--batch_size", type=int, default=500, help="global batch size, split across torchrun ranks (default 500)")
    p("--seed", type=int, default=0, help="seed of initialisation, validation split and data order (default 0)")
    p("--device", type=str, default="cpu", help="cpu, cuda or cuda:N (default cpu, as difftopk)")
    p("--method", type=str, required=True, choices=method_choices(), metavar="METHOD",
      help="loss: " + ", ".join(method_choices()))
    p("--p_k", type=float, nargs="+", required=True,
      help="P_K, weights of ranks 1..k (non-negative, sum 1); the SVM/noised losses use k = last nonzero index + 1")
    p("--inverse_temperature", type=float, default=1.0,
      help="steepness of sorting networks; 1/tau for neuralsort/softsort/other ranks methods; tau of "
           "smooth_topk/smooth_hard_topk (default 1)")
    p("-m", "--m", type=int, default=16,
      help="pre-select the m largest scores before sorting (default 16; m >= classes: no pre-selection)")
    p("--distribution", type=str, default=None,
      help="sorting-network comparator distribution (cauchy, logistic, logistic_phi, ...; default None = cauchy)")
    p("--art_lambda", type=float, default=0.5, help="lambda of the logistic_phi (ART) distribution (default 0.5)")
    p("--top1_mode", type=str, default="sm", help="top-1 term of the top-k CE loss: sm, smce or sort (default sm)")
    p("--hidden_dims", type=int, nargs="*", default=[], help="hidden layer widths of a ReLU MLP head (default: linear)")
    p("--eval_freq", type=int, default=100, help="evaluate every this many steps (default 100)")
    p("--apply_relu", action="store_true", help="apply a ReLU to the input embeddings")
    p("--apply_dropout", action="store_true", help="apply Dropout(0.5) to the input embeddings during training")
    p("--normalize_ll", action="store_true",
      help="normalised last layer: scores are cosines of the features and the class weights, in [-1, 1], no bias "
           "(pytopk's setting for imbal_noised_topk, whose --scale multiplies them)")
    add_run_arguments(parser, "train-embeddings")
    p("--val_size", type=int, default=None,
      help="validation rows carved from the training set of a file (default difftopk's 50,000, 100,000 for "
           "21K-P, capped at a fifth of the training set; built-in datasets have their own split)")
    add_loss_arguments(parser)


def _check_flags(args: Any) -> None:
    for name in ("n_epochs", "batch_size", "eval_freq"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.m is not None and args.m < 1:
        raise UsageError(f"-m/--m must be >= 1, got {args.m}")
    if any(width < 1 for width in args.hidden_dims):
        raise UsageError(f"--hidden_dims must be positive widths, got {args.hidden_dims}")
    if args.val_size is not None and args.val_size < 1:
        raise UsageError(f"--val_size must be >= 1, got {args.val_size}")
    if not args.inverse_temperature > 0:
        raise UsageError(f"--inverse_temperature must be > 0, got {args.inverse_temperature}")
    if args.out is not None and args.resume is not None:
        raise UsageError("--out and --resume are exclusive (a resumed run continues in its own directory)")
    check_p_k_flag(args.p_k)


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


def build_model(dim: int, n_classes: int, hidden_dims: list[int], apply_relu: bool, apply_dropout: bool,
                normalize_ll: bool = False) -> torch.nn.Module:
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


def train_embeddings(args: Any) -> dict[str, Any]:
    """Run ``softtopk train-embeddings`` with parsed flags; returns the content of ``results.json``.

    Raises:
        UsageError: bad flags or data (printed as one line by the CLI).
    """
    _check_flags(args)
    data = load_data(args.data_path, args.seed, args.val_size)
    run = Run("train-embeddings", args)
    torch.manual_seed(args.seed)
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = data["train"], data["valid"], data["test"]
    model = build_model(train_x.shape[1], data["n_classes"], args.hidden_dims, args.apply_relu, args.apply_dropout,
                        args.normalize_ll)
    net = run.wrap_model(model)
    optimizer = torch.optim.Adam(net.parameters(), lr=10 ** -args.nloglr)
    noise = torch.Generator(device=run.device).manual_seed(args.seed * 7919 + run.rank)
    loss_fn = build_loss(args, data["n_classes"], data["train_class_counts"], noise).to(run.device)
    generators, best = {"loss_noise": noise}, BestTracker()
    start_epoch, step, losses, train_seconds = 0, 0, [], 0.0
    state = run.restore(generators, model, optimizer, best)
    if state is not None:
        start_epoch, step = state["epoch"] + 1, state["step"]
        valid, test = state["last_evaluation"]
        losses = list(state["losses_since_evaluation"])
        train_seconds = state["train_seconds"]
    kill_at = int(os.environ.get("SOFTTOPK_TEST_KILL_AT_STEP", "0"))
    steps_per_epoch = -(-len(train_y) // args.batch_size)
    total_steps = args.n_epochs * steps_per_epoch

    def evaluation() -> tuple[dict, dict]:
        valid = evaluate(model, valid_x, valid_y, batch_size=args.batch_size, device=run.device)
        test = evaluate(model, test_x, test_y, batch_size=args.batch_size, device=run.device)
        best.update(valid, test, step)
        train_loss = run.mean_loss(losses)
        run.log({"step": step, "epoch": step / steps_per_epoch, "train_loss": train_loss, "valid": valid, "test": test,
                 "elapsed": run.elapsed()})
        losses.clear()
        return valid, test

    if state is None:
        valid, test = evaluation()
    for epoch in range(start_epoch, args.n_epochs):
        net.train()
        order = epoch_permutation(len(train_y), args.seed, epoch)
        batches = run.progress(order.split(args.batch_size), steps_per_epoch, f"epoch {epoch + 1}/{args.n_epochs}")
        for batch in batches:
            tick = time.perf_counter()
            local = run.shard(batch)
            x = train_x[local].to(run.device).float()
            y = train_y[local].to(run.device)
            logits = net(x)
            if len(local):
                loss = loss_fn(logits, y) * run.shard_weight(len(local), len(batch))
            else:
                loss = logits.sum() * 0.0
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            train_seconds += time.perf_counter() - tick
            step += 1
            losses.append(loss.detach())
            if run.show_progress:
                accuracy = (logits.argmax(1) == y).float().mean().item() if len(local) else 0.0
                batches.set_postfix(loss=f"{losses[-1].item():.4f}", acc=f"{accuracy:.3f}")
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % args.eval_freq == 0 or step == total_steps:
                valid, test = evaluation()
        run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                             "step": step, "best": best.state_dict(), "last_evaluation": (valid, test),
                              "losses_since_evaluation": list(losses), "train_seconds": train_seconds},
                            generators)
    results = {"reported_test_at_best_valid": best.reported(), "final_valid": valid, "final_test": test,
               "best": best.state_dict(), "steps": step, "epochs": args.n_epochs, "n_classes": data["n_classes"],
               "n_train": len(train_y), "n_valid": len(valid_y), "n_test": len(test_y), "data": data["source"],
               "elapsed": run.elapsed(), "train_seconds": train_seconds,
               "ms_per_step": 1e3 * train_seconds / max(step, 1)}
    run.finish(results, summary_table(valid, test, best))
    return results
