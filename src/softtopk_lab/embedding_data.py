"""Loading precomputed embeddings in difftopk's format, or a built-in dataset, with clear errors.

A difftopk embedding file is a ``torch.save``-d dict of tensors with one of the key sets in
``KEY_SETS``: ``train_*``/``test_*`` (ImageNet-1K ResNeXt), ``train_*``/``val_*`` (EfficientNet-L2;
the official val split is the test set) or ``imagenet21k_train_*``/``imagenet21k_val_*``
(ImageNet-21K-P). Embeddings are ``(N, D)`` float16/float32, labels ``(N,)`` integers. As in
difftopk, the validation set is carved from the training set by a seeded ``randperm``: its first
``val_size`` indices (:func:`split_validation`). Problems with a file raise
:class:`~softtopk_lab.errors.DataError` naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .errors import DataError

KEY_SETS = {
    "train/test": ("train_embeddings", "train_labels", "test_embeddings", "test_labels"),
    "train/val": ("train_embeddings", "train_labels", "val_embeddings", "val_labels"),
    "imagenet21k": (
        "imagenet21k_train_embeddings",
        "imagenet21k_train_labels",
        "imagenet21k_val_embeddings",
        "imagenet21k_val_labels",
    ),
}
DIFFTOPK_VAL_SIZE = {"train/test": 50_000, "train/val": 50_000, "imagenet21k": 100_000}
SMALL_DATA_VAL_FRACTION = 5  # default val_size is at most 1/5 of the training set


def default_val_size(key_set: str, n_train: int) -> int:
    """difftopk's validation size (50,000; 100,000 for 21K-P), capped at a fifth of the training set."""
    return max(1, min(DIFFTOPK_VAL_SIZE[key_set], n_train // SMALL_DATA_VAL_FRACTION))


def _check_split(embeddings: Any, labels: Any, name: str, source: str) -> None:
    if not isinstance(embeddings, torch.Tensor) or embeddings.dim() != 2 or not embeddings.is_floating_point():
        raise DataError(
            f"{source}: {name}_embeddings must be a 2-D floating tensor (N, D), got "
            f"{type(embeddings).__name__} {getattr(embeddings, 'dtype', '')} "
            f"{tuple(getattr(embeddings, 'shape', ()))}"
        )
    if (
        not isinstance(labels, torch.Tensor)
        or labels.dim() != 1
        or labels.is_floating_point()
        or labels.is_complex()
        or labels.dtype == torch.bool
    ):
        raise DataError(
            f"{source}: {name}_labels must be a 1-D integer tensor, got "
            f"{type(labels).__name__} {getattr(labels, 'dtype', '')} {tuple(getattr(labels, 'shape', ()))}"
        )
    if len(embeddings) != len(labels):
        raise DataError(
            f"{source}: {name}_embeddings has {len(embeddings)} rows but {name}_labels has {len(labels)} entries"
        )
    if len(labels) == 0:
        raise DataError(f"{source}: the {name} split is empty")
    if int(labels.min()) < 0:
        raise DataError(f"{source}: {name}_labels must be >= 0, got min {int(labels.min())}")
    finite = torch.isfinite(embeddings).all(1)
    if not bool(finite.all()):
        rows = (~finite).nonzero().squeeze(1)
        raise DataError(
            f"{source}: {len(rows)} of the {len(labels)} {name} embedding rows hold NaN or inf (first: "
            f"row {int(rows[0])}); remove or repair them (no accuracy is reported on such rows)"
        )


def load_embedding_file(path: str) -> dict[str, Any]:
    """Load a difftopk embedding file.

    Args:
        path: the file.

    Returns:
        ``{'train': (x, y), 'test': (x, y), 'n_classes': C, 'source': key set}``; embeddings keep the
        file's dtype, labels are int64. C = max train label + 1.

    Raises:
        DataError: missing/unreadable file, wrong keys or shapes, labels out of range.
    """
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as error:  # noqa: BLE001 -- any failure of the (weights-only) unpickler means a malformed file
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DataError(f"{path}: not a readable torch pickle of tensors ({first})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a dict of tensors, got {type(data).__name__}")
    key_set = next((name for name, keys in KEY_SETS.items() if set(keys) <= set(data)), None)
    if key_set is None:
        accepted = "; ".join(f"{{{', '.join(keys)}}}" for keys in KEY_SETS.values())
        raise DataError(f"{path}: wrong keys {sorted(map(str, data))}; accepted key sets: {accepted}")
    train_x, train_y, test_x, test_y = (data[key] for key in KEY_SETS[key_set])
    _check_split(train_x, train_y, "train", path)
    _check_split(test_x, test_y, "test" if key_set == "train/test" else "val", path)
    if train_x.shape[1] != test_x.shape[1]:
        raise DataError(
            f"{path}: train embeddings have D = {train_x.shape[1]} but the test/val ones D = {test_x.shape[1]}"
        )
    train_y, test_y = train_y.long(), test_y.long()
    n_classes = int(train_y.max()) + 1
    if n_classes > len(train_y):  # checked before any (n_classes)-sized allocation
        raise DataError(
            f"{path}: the training labels imply {n_classes} classes (max label + 1) for only "
            f"{len(train_y)} training rows; labels must be class indices 0..C-1 with C <= the "
            "number of training rows"
        )
    if int(test_y.max()) >= n_classes:
        raise DataError(
            f"{path}: test/val labels must be < {n_classes} (max training label + 1), got max {int(test_y.max())}"
        )
    if n_classes < 2:
        raise DataError(f"{path}: need at least 2 classes, the training labels have {n_classes}")
    return {"train": (train_x, train_y), "test": (test_x, test_y), "n_classes": n_classes, "source": key_set}


def split_validation(data: dict[str, Any], seed: int, size: int) -> dict[str, Any]:
    """``data`` of :func:`load_embedding_file` with its first ``size`` training rows of a ``randperm``
    seeded with ``seed`` as ``'valid'``, and the ``'train_class_counts'`` of the rest.

    Args:
        data: an embedding file's splits.
        seed: seeds the permutation.
        size: validation rows, ``1 <= size < N_train``.
    """
    train_x, train_y = data["train"]
    order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(seed))
    valid, train = order[:size], order[size:]
    return {
        **data,
        "train": (train_x[train], train_y[train]),
        "valid": (train_x[valid], train_y[valid]),
        "train_class_counts": torch.bincount(train_y[train], minlength=data["n_classes"]),
    }


def load_data(path: str) -> dict[str, Any]:
    """A built-in dataset by name (:mod:`softtopk_lab.wordnet`) or an embedding file.

    Returns:
        The dict of :func:`load_embedding_file`; a built-in dataset's has its own validation split
        (``'valid'``) and ``'train_class_counts'`` too, a file's gets them from :func:`split_validation`.
    """
    if os.path.exists(path) or os.sep in path or Path(path).suffix:
        return load_embedding_file(path)
    try:
        from . import wordnet
    except ImportError as error:
        raise DataError(f"{path}: no such file, and the built-in datasets are unavailable ({error})") from None
    if path not in wordnet.BUILTIN_DATASETS:
        raise DataError(f"{path}: no such file, and not a built-in dataset {tuple(wordnet.BUILTIN_DATASETS)}")
    data = wordnet.load_builtin(path)
    return {
        "train": (data["train_embeddings"], data["train_labels"].long()),
        "valid": (data["val_embeddings"], data["val_labels"].long()),
        "test": (data["test_embeddings"], data["test_labels"].long()),
        "n_classes": len(data["class_names"]),
        "train_class_counts": data["train_class_counts"],
        "source": path,
    }
