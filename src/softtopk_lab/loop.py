"""The one training loop of ``softtopk train-embeddings``, ``train-cifar100`` and ``knn``.

A tool describes its run as a :class:`Task`: the model and the arguments that rebuild it, its
optimizer, its random generators, the global batches of each epoch, one step's loss on this
process's part of a batch, and its evaluation. :func:`train` does the rest, the same way for every
tool:

* **counters**: the epoch, the optimizer step, and ``train_seconds``, the time spent in steps (data,
  forward, backward, update; evaluations and checkpoints left out);
* **shards**: under torchrun each global batch is split across the processes (:meth:`.Run.shard`)
  and each process's mean loss is weighted so that DDP's gradient average is the global-batch mean
  (:class:`Batch`);
* **losses**: the detached per-step losses, and the top-1 hits of the tools that count them, since
  the last evaluation; reduced once per evaluation (:meth:`.Run.mean_loss`), never per step;
* **evaluation**: before the first step (unless ``Task.evaluate_first`` is false), after every
  ``Task.eval_every`` steps and after the last step; each one writes ``best.pt`` when top-1
  improved and one record of ``metrics.jsonl``; a non-finite mean training loss stops the run
  (a one-line :class:`.UsageError`);
* **checkpoint** at the end of every epoch, the same entries for every tool
  (:data:`.checkpoint.ENTRIES`), and **resume** from it (:meth:`.Run.restore`): the counters, the
  losses and hits since the last evaluation, and every random state come back, so a run killed and
  resumed with ``--resume`` ends with the results of an uninterrupted one;
* **results**: the fields every ``results.json`` shares, then the tool's own (:func:`train`).

Test-only hook: with the environment variable ``SOFTTOPK_TEST_KILL_AT_STEP=N`` the process sends
itself SIGKILL right after optimizer step ``N`` (read once per run; the kill-and-resume tests use it).
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .errors import UsageError
from .metrics import BestTracker, summary_table
from .runner import Run

#: the test-only kill hook's environment variable (see the module docstring)
KILL_AT_STEP = "SOFTTOPK_TEST_KILL_AT_STEP"

Metrics = dict[str, float]


class Step(NamedTuple):
    """One training step's outcome: this process's loss (already multiplied by :attr:`Batch.weight`)
    and, for a classifier, its top-1 hits (a 0-dim tensor) among the ``seen`` rows it trained on."""

    loss: torch.Tensor
    correct: torch.Tensor | None = None
    seen: int = 0


@dataclass(frozen=True)
class Batch:
    """One global batch as one process sees it.

    Attributes:
        indices: the training rows of the global batch (every process's).
        part: this process's positions in ``indices`` (all of them without torchrun).
        weight: the factor of this process's mean loss (:meth:`.Run.shard_weight`).
        shared: what every process uses whole (kNN's candidate rows; ``None`` for the classifiers).
    """

    indices: torch.Tensor
    part: torch.Tensor
    weight: float
    shared: Any = None

    @property
    def local(self) -> torch.Tensor:
        """This process's training rows: ``indices[part]``."""
        return self.indices[self.part]


def train_top1(train_loss: float | None, top1: float | None) -> dict[str, Any]:
    """The classifiers' extra field of an evaluation record: rank 0's training top-1 since the last one."""
    return {"train_top1_rank0": top1}


@dataclass(frozen=True)
class Task:
    """What a training tool gives :func:`train`.

    Attributes:
        model: the model (unwrapped: checkpoints and ``best.pt`` hold its weights).
        model_args: ``build_model(**model_args)`` of the tool's module rebuilds it (stored in ``best.pt``).
        optimizer: builds the optimizer from the parameters of the model as trained.
        generators: the tool's own random generators by name (checkpointed with torch's, python's,
            numpy's and CUDA's global states).
        n_epochs: epochs of the run.
        steps_per_epoch: optimizer steps per epoch (the length of ``batches(epoch)``).
        batches: ``epoch -> (indices, shared)`` per step: the global batch's training rows, split across
            processes, and what every process uses whole (see :class:`Batch`); a function of the seed
            and ``epoch`` only, so that a resumed run replays the same batches.
        step: ``(model as trained, batch) -> Step``: the forward pass and the loss (the loop runs
            backward and the update).
        evaluate: ``() -> (valid, test)`` metrics of the current weights; ``valid["top1"]`` selects
            ``best.pt``.
        eval_every: evaluate after every this many steps (and after the last step).
        result_fields: the tool's own fields of ``results.json`` (data sizes, sources, method).
        evaluate_first: evaluate the initial weights before the first step as well. When false,
            ``eval_every`` must divide ``steps_per_epoch`` (every checkpoint follows an evaluation).
        record_fields: ``(train_loss, train_top1) -> fields`` the tool adds to each evaluation record.
        step_time_in_results: write ``train_seconds`` and ``ms_per_step`` to ``results.json``
            (the checkpoint holds ``train_seconds`` in every case).
    """

    model: torch.nn.Module
    model_args: dict[str, Any]
    optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    generators: dict[str, torch.Generator]
    n_epochs: int
    steps_per_epoch: int
    batches: Callable[[int], Iterable[tuple[torch.Tensor, Any]]]
    step: Callable[[torch.nn.Module, Batch], Step]
    evaluate: Callable[[], tuple[Metrics, Metrics]]
    eval_every: int
    result_fields: dict[str, Any]
    evaluate_first: bool = True
    record_fields: Callable[[float | None, float | None], dict[str, Any]] = train_top1
    step_time_in_results: bool = True


class _Loop:
    """The state of one run of :func:`train`: counters, accumulators, best values, last evaluation."""

    def __init__(self, run: Run, task: Task) -> None:
        self.run, self.task = run, task
        self.net = run.wrap_model(task.model)
        self.optimizer = task.optimizer(self.net.parameters())
        self.best = BestTracker()
        self.total_steps = run.total_steps = task.n_epochs * task.steps_per_epoch
        self.kill_at = int(os.environ.get(KILL_AT_STEP, "0"))
        self.epoch, self.step, self.train_seconds = 0, 0, 0.0
        self.losses: list[torch.Tensor] = []
        self.correct, self.seen = torch.zeros((), dtype=torch.long, device=run.device), 0
        self.last: tuple[Metrics, Metrics] | None = None

    def restore(self) -> bool:
        """Continue from the checkpoint on ``--resume`` (``False`` for a new run)."""
        task = self.task
        state = self.run.restore(
            task.generators,
            task.model,
            self.optimizer,
            self.best,
            n_epochs=task.n_epochs,
            steps_per_epoch=task.steps_per_epoch,
        )
        if state is None:
            return False
        self.epoch, self.step, self.train_seconds = state["epoch"] + 1, state["step"], state["train_seconds"]
        valid, test = state["last_evaluation"]
        self.last = valid, test
        self.losses = [loss.to(self.run.device) for loss in state["losses_since_evaluation"]]  # loaded on the CPU
        correct, self.seen = state["correct_since_evaluation"]
        self.correct = torch.tensor(correct, dtype=torch.long, device=self.run.device)
        return True

    def train_step(self, indices: torch.Tensor, shared: Any) -> None:
        """One optimizer step on this process's part of a global batch."""
        tick = time.perf_counter()
        part = self.run.shard(torch.arange(len(indices)))
        out = self.task.step(self.net, Batch(indices, part, self.run.shard_weight(len(part), len(indices)), shared))
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        self.optimizer.step()
        self.train_seconds += time.perf_counter() - tick
        self.step += 1
        self.losses.append(out.loss.detach())
        if out.correct is not None:
            self.correct += out.correct
            self.seen += out.seen

    def postfix(self) -> dict[str, str]:
        """The progress bar's figures: the last step's loss and the training top-1 since the last evaluation."""
        shown = {"loss": f"{self.losses[-1].item():.4f}"}
        if self.seen:
            shown["acc"] = f"{self.correct.item() / self.seen:.3f}"
        return shown

    def evaluate(self) -> None:
        """Evaluate, write ``best.pt`` on a better top-1 and log one record; reset the accumulators."""
        valid, test = self.last = self.task.evaluate()
        self.run.save_best(self.task.model, self.task.model_args, self.best.update(valid, test, self.step), self.best)
        train_loss = self.run.mean_loss(self.losses)
        if train_loss is not None and not math.isfinite(train_loss):
            raise UsageError(
                f"training diverged: the mean training loss is {train_loss} at step {self.step} "
                "(a smaller learning rate may help)"
            )
        top1 = self.correct.item() / self.seen if self.seen else None
        self.run.log(
            {
                "step": self.step,
                "epoch": self.step / self.task.steps_per_epoch,
                "train_loss": train_loss,
                **self.task.record_fields(train_loss, top1),
                "valid": valid,
                "test": test,
                "elapsed": self.run.elapsed(),
            }
        )
        self.losses = []
        self.correct, self.seen = torch.zeros_like(self.correct), 0

    def run_epoch(self, epoch: int) -> None:
        """Train one epoch, evaluating when due, then write the checkpoint."""
        task = self.task
        self.net.train()
        batches = self.run.progress(task.batches(epoch), task.steps_per_epoch, f"epoch {epoch + 1}/{task.n_epochs}")
        for indices, shared in batches:
            self.train_step(indices, shared)
            if self.run.show_progress:
                batches.set_postfix(**self.postfix())
            if self.step == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.step % task.eval_every == 0 or self.step == self.total_steps:
                self.evaluate()
        self.checkpoint(epoch)

    def checkpoint(self, epoch: int) -> None:
        """``checkpoint.pt`` after ``epoch``: the entries of :data:`.checkpoint.ENTRIES` (less the RNG
        states and the elapsed time, which :meth:`.Run.save_checkpoint` adds)."""
        self.run.save_checkpoint(
            {
                "model": self.task.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "epoch": epoch,
                "step": self.step,
                "best": self.best.state_dict(),
                "last_evaluation": self.last,
                "losses_since_evaluation": list(self.losses),
                "correct_since_evaluation": [self.correct.item(), self.seen],
                "train_seconds": self.train_seconds,
            },
            self.task.generators,
        )

    def results(self) -> dict[str, Any]:
        """``results.json``: the shared fields, the tool's own, then the timings."""
        assert self.last is not None, "the last step is always evaluated"
        valid, test = self.last
        head = {
            "reported_test_at_best_valid": self.best.reported(),
            "final_valid": valid,
            "final_test": test,
            "best": self.best.state_dict(),
            "steps": self.step,
            "epochs": self.task.n_epochs,
        }
        timing: dict[str, Any] = {"elapsed": self.run.elapsed()}
        if self.task.step_time_in_results:
            timing.update(train_seconds=self.train_seconds, ms_per_step=1e3 * self.train_seconds / max(self.step, 1))
        return {**head, **self.task.result_fields, **timing}


def train(run: Run, task: Task) -> dict[str, Any]:
    """Train ``task`` in ``run`` (new or resumed), write ``results.json`` and return its content.

    Raises:
        UsageError: on ``--resume``, a checkpoint that does not fit this run (:meth:`.Run.restore`);
            a run file that cannot be written; a mean training loss at an evaluation that is not finite.
    """
    loop = _Loop(run, task)
    if not loop.restore() and task.evaluate_first:
        loop.evaluate()
    for epoch in range(loop.epoch, task.n_epochs):
        loop.run_epoch(epoch)
    results = loop.results()
    run.finish(results, summary_table(results["final_valid"], results["final_test"], loop.best))
    return results
