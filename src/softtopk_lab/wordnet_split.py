"""Which synsets a built-in WordNet dataset keeps and how each class is split (no RNG involved).

A class keeps its first members in the order of the sha256 of their synset offsets, and each kept
class gives 20 % of them to validation, 20 % to test and the rest to training (:func:`split_sizes`).
The thresholds of each dataset and :func:`~.wordnet.build_wordnet` are in :mod:`.wordnet`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

#: Split codes stored in the ``split`` array.
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class DatasetPlan:
    """A dataset before embedding: which synsets, their labels and splits (all in sample order)."""

    name: str
    offsets: np.ndarray  # int32 [N]
    labels: np.ndarray  # int16 [N]
    split: np.ndarray  # int8 [N], index into SPLITS
    class_offsets: np.ndarray  # int32 [C]
    class_sizes: np.ndarray  # int64 [C], members before the cap


def _offset_key(offset: int) -> bytes:
    """Deterministic pseudo-random order of synsets: sha256 of the 8-digit offset."""
    return hashlib.sha256(f"{offset:08d}".encode()).digest()


def split_sizes(n: int) -> tuple[int, int, int]:
    """Train/val/test sizes of a class with ``n`` kept members: 20 % val, 20 % test, rest train.

    Val and test get ``floor(0.2 n + 0.5)`` members each (at least one), train the rest.

    >>> split_sizes(60), split_sizes(10), split_sizes(13), split_sizes(400)
    ((36, 12, 12), (6, 2, 2), (7, 3, 3), (240, 80, 80))
    """
    held_out = max(1, (2 * n + 5) // 10)
    return n - 2 * held_out, held_out, held_out


def select_and_split(name: str, labels: Mapping[int, int], *, min_size: int, cap: int) -> DatasetPlan:
    """Keep the classes with ``min_size`` members or more, cap them, and split each class.

    Classes are ordered by ancestor offset. Inside a class the members are ordered by
    :func:`_offset_key` (sha256 of the offset); the first ``cap`` are kept and split in that order
    by :func:`split_sizes`. Samples are stored class by class in that order. No RNG is involved.

    Args:
        name: the dataset's name.
        labels: ``{synset offset: class (ancestor) offset}``.
        min_size: the smallest class kept (members counted before the cap).
        cap: the most members kept per class.

    Returns:
        The :class:`DatasetPlan`.
    """
    members: dict[int, list[int]] = {}
    for offset, ancestor in labels.items():
        members.setdefault(ancestor, []).append(offset)
    classes = sorted(ancestor for ancestor, group in members.items() if len(group) >= min_size)
    if not classes:
        raise ValueError(f"{name}: no class has {min_size} or more members")
    offsets, sample_labels, split = [], [], []
    for index, ancestor in enumerate(classes):
        kept = sorted(members[ancestor], key=_offset_key)[:cap]
        n_train, n_val, n_test = split_sizes(len(kept))
        offsets += kept
        sample_labels += [index] * len(kept)
        split += [0] * n_train + [1] * n_val + [2] * n_test
    return DatasetPlan(
        name=name,
        offsets=np.asarray(offsets, dtype=np.int32),
        labels=np.asarray(sample_labels, dtype=np.int16),
        split=np.asarray(split, dtype=np.int8),
        class_offsets=np.asarray(classes, dtype=np.int32),
        class_sizes=np.asarray([len(members[ancestor]) for ancestor in classes], dtype=np.int64),
    )
