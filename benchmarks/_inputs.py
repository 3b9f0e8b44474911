"""Timed calls take their inputs in turn from a pool of distinct random inputs, never one fixed input.

A CPU's branch predictor learns the branches that a sort or a top-k takes on the very numbers it
is given: timed again and again on one fixed input, ``torch.topk`` and every operator built on a
sort or a selection run on branches predicted from memory, which training (new scores at every
step) never sees. The effect is largest on small inputs (a whole ``randn(64, 100)`` is learnt) and
it does not treat a baseline and a candidate alike, so it changes ratios as well as times
(``python benchmarks/bench_input_pool.py``, ``results/input_pool.md``). A pool holds at least
:data:`MIN_INPUTS` inputs and :data:`MIN_ELEMENTS` elements in all (more than a predictor can
learn), and at most :data:`MAX_ELEMENTS` (memory), but never fewer than two inputs. Every
candidate timed on a shape gets the same pool (the same seed), so they see the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

MIN_INPUTS = 16
MIN_ELEMENTS = 2**20
MAX_ELEMENTS = 2**26

T = TypeVar("T")


def pool_size(numel: int) -> int:
    """How many distinct inputs of ``numel`` elements a pool holds."""
    wanted = max(MIN_INPUTS, math.ceil(MIN_ELEMENTS / max(numel, 1)))
    return max(2, min(wanted, MAX_ELEMENTS // max(numel, 1)))


class Pool(Generic[T]):
    """Inputs made by ``make(generator)`` from one seeded generator, handed out in turn by
    :meth:`next`; :attr:`first` is the first of them (for a forward captured once)."""

    def __init__(self, make: Callable[[torch.Generator], T], numel: int, seed: int = 0, device="cpu") -> None:
        generator = torch.Generator(device).manual_seed(seed)
        self.items = [make(generator) for _ in range(pool_size(numel))]
        self.first = self.items[0]
        self._turn = 0

    def next(self) -> T:
        item = self.items[self._turn]
        self._turn = (self._turn + 1) % len(self.items)
        return item
