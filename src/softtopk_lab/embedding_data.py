"""Loading precomputed embeddings in difftopk's format, or a built-in dataset, with clear errors.

A difftopk embedding file is a ``torch.save``-d dict of tensors with one of the key sets in
``KEY_SETS``: ``train_*``/``test_*`` (ImageNet-1K ResNeXt), ``train_*``/``val_*`` (EfficientNet-L2;
the official val split is the test set) or ``imagenet21k_train_*``/``imagenet21k_val_*``
(ImageNet-21K-P). Embeddings are ``(N, D)`` float16/float32, labels ``(N,)`` integers. As in
difftopk, the validation set is carved from the training set by a seeded ``randperm``: its first
``val_size`` indices.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .runner import UsageError

KEY_SETS = {
    "train/test": ("train_embeddings", "train_labels", "test_embeddings", "test_labels"),
    "train/val": ("train_embeddings", "train_labels", "val_embeddings", "val_labels"),
    "imagenet21k": ("imagenet21k_train_embeddings", "imagenet21k_train_labels",
                    "imagenet21k_val_embeddings", "imagenet21k_val_labels"),
}
DIFFTOPK_VAL_SIZE = {"train/test": 50_000, "train/val": 50_000, "imagenet21k": 100_000}
SMALL_DATA_VAL_FRACTION = 5  # default val_size is at most 1/5 of the training set


def default_val_size(key_set: str, n_train: int) -> int:
    """difftopk's validation size (50,000; 100,000 for 21K-P), capped at a fifth of the training set."""
    return max(1, min(DIFFTOPK_VAL_SIZE[key_set], n_train // SMALL_DATA_VAL_FRACTION))


def _check_split(embeddings: Any, labels: Any, name: str, source: str) -> None:
    if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2 or not embeddings.is_floating_point():
        raise UsageError(f"{source}: {name}_embeddings must be a 2-D floating tensor (N, D), got "
                         f"{type(embeddings).__name__} {getattr(embeddings, 'dtype', '')} "
                         f"{tuple(getattr(embeddings, 'shape', ()))}")
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.is_floating_point() \
            or labels.is_complex() or labels.dtype == torch.bool:
        raise UsageError(f"{source}: {name}_labels must be a 1-D integer tensor, got "
                         f"{type(labels).__name__} {getattr(labels, 'dtype', '')} {tuple(getattr(labels, 'shape', ()))}")
    if len(embeddings) != len(labels):
        raise UsageError(f"{source}: {name}_embeddings has {len(embeddings)} rows but {name}_labels has "
                         f"{len(labels)} entries")
    if len(labels) == 0:
        raise UsageError(f"{source}: the {name} split is empty")
    if int(labels.min()) < 0:
        raise UsageError(f"{source}: {name}_labels must be >= 0, got min {int(labels.min())}")


def load_embedding_file(path: str, seed: int, val_size: int | None) -> dict[str, Any]:
    """Load a difftopk embedding file and split off the validation set.

    Args:
        path: the ``-d/--data_path`` value.
        seed: ``--seed``; the validation split is ``randperm(N_train)`` of a generator seeded with it.
        val_size: ``--val_size``, or ``None`` for :func:`default_val_size`.

    Returns:
        ``{'train': (x, y), 'valid': (x, y), 'test': (x, y), 'n_classes': C, 'train_class_counts': ...,
        'source': str}``; embeddings keep the file's dtype, labels are int64. C = max train label + 1.

    Raises:
        UsageError: missing/unreadable file, wrong keys or shapes, labels out of range, bad ``val_size``.
    """
    source = f"-d/--data_path {path}"
    if not os.path.isfile(path):
        raise UsageError(f"{source}: no such file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 -- any failure of the (weights-only) unpickler means a malformed file
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UsageError(f"{source}: not a readable torch pickle of tensors ({first})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{source}: expected a dict of tensors, got {type(data).__name__}")
    key_set = next((name for name, keys in KEY_SETS.items() if set(keys) <= set(data)), None)
    if key_set is None:
        accepted = "; ".join(f"{{{', '.join(keys)}}}" for keys in KEY_SETS.values())
        raise UsageError(f"{source}: wrong keys {sorted(map(str, data))}; accepted key sets: {accepted}")
    train_x, train_y, test_x, test_y = (data[key] for key in KEY_SETS[key_set])
    _check_split(train_x, train_y, "train", source)
    _check_split(test_x, test_y, "test" if key_set == "train/test" else "val", source)
    if train_x.shape[1] != test_x.shape[1]:
        raise UsageError(f"{source}: train embeddings have D = {train_x.shape[1]} but the test/val ones "
                         f"D = {test_x.shape[1]}")
    train_y, test_y = train_y.long(), test_y.long()
    n_classes = int(train_y.max()) + 1
    if int(test_y.max()) >= n_classes:
        raise UsageError(f"{source}: test/val labels must be < {n_classes} (max training label + 1), "
                         f"got max {int(test_y.max())}")
    if n_classes < 2:
        raise UsageError(f"{source}: need at least 2 classes, the training labels have {n_classes}")
    size = default_val_size(key_set, len(train_y)) if val_size is None else val_size
    if not 1 <= size < len(train_y):
        raise UsageError(f"--val_size must be in [1, {len(train_y) - 1}] for {len(train_y)} training rows, got {size}")
    order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(seed))
    valid, train = order[:size], order[size:]
    return {"train": (train_x[train], train_y[train]), "valid": (train_x[valid], train_y[valid]),
            "test": (test_x, test_y), "n_classes": n_classes,
            "train_class_counts": torch.bincount(train_y[train], minlength=n_classes), "source": key_set}


def load_data(path: str, seed: int, val_size: int | None) -> dict[str, Any]:
    """``-d/--data_path``: a built-in dataset name (``softtopk_lab.wordnet``) or an embedding file.

    Built-in datasets come with their own validation split (``val_size`` is then ignored).
    Returns the dict of :func:`load_embedding_file`.
    """
    if os.path.exists(path) or os.sep in path or Path(path).suffix:
        return load_embedding_file(path, seed, val_size)
    try:
        from . import wordnet
    except ImportError as error:
        raise UsageError(f"-d/--data_path {path}: no such file, and the built-in datasets are unavailable "
                         f"({error})") from None
    if path not in wordnet.BUILTIN_DATASETS:
        raise UsageError(f"-d/--data_path {path}: no such file, and not a built-in dataset "
                         f"{tuple(wordnet.BUILTIN_DATASETS)}")
    data = wordnet.load_builtin(path)
    return {"train": (data["train_embeddings"], data["train_labels"].long()),
            "valid": (data["val_embeddings"], data["val_labels"].long()),
            "test": (data["test_embeddings"], data["test_labels"].long()),
            "n_classes": len(data["class_names"]), "train_class_counts": data["train_class_counts"],
            "source": path}
