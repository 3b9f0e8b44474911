"""CIFAR-100 for the reproduction experiments: the python archive, label noise, augmentation.

* :func:`load_cifar100` reads the standard CIFAR-100 python archive (``cifar-100-python.tar.gz`` or its
  extracted directory). CIFAR cannot be downloaded on the offline machines this project targets; the
  loader is tested on small generated files of the same format. Its pickles are read with
  :func:`~.data_files.unpickle` (numpy-array globals only).
* :func:`noisy_labels` is the block-of-5 label noise of Berrada et al. (2018); :func:`augment_cifar` and
  :func:`normalize_cifar` are the training/evaluation transforms of difftopk's ``train_cifar100.py``
  (Petersen et al., 2022), vectorised in torch.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data_files import unpickle
from .errors import DataError

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "augment_cifar", "load_cifar100", "noisy_labels", "normalize_cifar"]

# difftopk's train_cifar100.py normalises CIFAR-100 with these CIFAR-10 per-channel statistics
# (transforms.Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))), applied to pixels / 255.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
CIFAR100_CLASSES = 100
_CIFAR_PAD = 4


# ------------------------------------------------------------------------------------------------ CIFAR-100

_CIFAR_MEMBERS = ("train", "test", "meta")


def _read_cifar_members(path: Path) -> dict[str, tuple[bytes, str]]:
    """Raw bytes and a display name of the ``train``, ``test`` and ``meta`` members of a CIFAR-100 source."""
    if not path.exists():
        raise DataError(
            f"{path}: no such file or directory (expected cifar-100-python.tar.gz or its extracted directory)"
        )
    if path.is_dir():
        base = path / "cifar-100-python" if (path / "cifar-100-python").is_dir() else path
        out = {}
        for name in _CIFAR_MEMBERS:
            file = base / name
            if not file.is_file():
                raise DataError(f"{base}: missing file '{name}' (a CIFAR-100 directory holds train, test and meta)")
            out[name] = (file.read_bytes(), str(file))
        return out
    try:
        with tarfile.open(path, "r:*") as archive:
            return _read_tar_members(archive, path)
    except (tarfile.TarError, OSError, EOFError) as error:
        reason = " ".join(str(error).split())  # tarfile lists one line per tried compression
        raise DataError(f"{path}: not a readable tar / tar.gz archive or a directory ({reason})") from error


_MAX_MEMBER_BYTES = 256 << 20  # CIFAR-100's largest member, train, is 148 MiB
_MAX_MEMBERS = 64


def _read_tar_members(archive: tarfile.TarFile, path: Path) -> dict[str, tuple[bytes, str]]:
    """The CIFAR-100 members of ``archive``, reading at most ``_MAX_MEMBERS`` headers and refusing a
    member that declares more than ``_MAX_MEMBER_BYTES`` (a decompression bomb is not expanded)."""
    out, seen = {}, []
    for count, member in enumerate(archive):
        if count >= _MAX_MEMBERS:
            raise DataError(
                f"{path}: more than {_MAX_MEMBERS} archive members before train, test and meta; not a CIFAR-100 archive"
            )
        if member.size > _MAX_MEMBER_BYTES:
            raise DataError(
                f"{path}: member {member.name!r} declares {member.size:,} bytes, more than any "
                f"CIFAR-100 file ({_MAX_MEMBER_BYTES:,} at most); not read"
            )
        name = Path(member.name).name
        if not member.isfile() or len(Path(member.name).parts) > 2:
            continue
        seen.append(name)
        if name in _CIFAR_MEMBERS and name not in out:
            out[name] = (archive.extractfile(member).read(_MAX_MEMBER_BYTES), f"{path}:{member.name}")
        if len(out) == len(_CIFAR_MEMBERS):
            break
    for name in _CIFAR_MEMBERS:
        if name not in out:
            raise DataError(f"{path}: archive has no member 'cifar-100-python/{name}' (found {sorted(seen)})")
    return out


def _field(record: Any, key: str, where: str) -> Any:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a pickled dict, got {type(record).__name__}")
    for candidate in (key.encode(), key):
        if candidate in record:
            return record[candidate]
    found = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in record)
    raise DataError(f"{where}: missing key {key!r} (found keys {found})")


def _cifar_split(record: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = _field(record, "data", where)
    labels = _field(record, "fine_labels", where)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{where}: 'data' must be a uint8 array of shape (N, 3072), got {got}")
    try:
        labels = np.asarray(labels)
    except (ValueError, TypeError) as error:
        raise DataError(f"{where}: 'fine_labels' is not a list of ints ({error})") from error
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(data):
        raise DataError(
            f"{where}: 'fine_labels' must be {len(data)} ints (one per image), "
            f"got {labels.dtype} array of shape {labels.shape}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= CIFAR100_CLASSES):
        raise DataError(
            f"{where}: 'fine_labels' must lie in [0, {CIFAR100_CLASSES}), got range [{labels.min()}, {labels.max()}]"
        )
    images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return images, torch.from_numpy(labels.astype(np.int64))


def load_cifar100(path: str | Path) -> dict[str, Any]:
    """Read CIFAR-100 from the standard python archive or its extracted directory.

    Args:
        path: ``cifar-100-python.tar.gz`` (any tar, optionally gzip/bz2/xz compressed), the extracted
            ``cifar-100-python`` directory, or a directory containing it. The ``train`` and ``test``
            pickles hold ``b'data'`` (N × 3072 uint8, channel-major rows of 32 × 32 pixels) and
            ``b'fine_labels'``; ``meta`` holds ``b'fine_label_names'``.

    Returns:
        ``{"train_images", "train_labels", "test_images", "test_labels", "class_names"}``: uint8 images
        ``(N, 3, 32, 32)``, int64 fine labels ``(N,)`` in ``[0, 100)`` and the 100 class names (str).
        The standard files give 50,000 train and 10,000 test images.

    Raises:
        DataError: the path is missing, is not an archive or directory, lacks a member, or a pickle is
            malformed (wrong keys, shapes, dtypes, labels out of range); the message names the file.
    """
    path = Path(path)
    members = _read_cifar_members(path)
    records = {name: unpickle(raw, where, "bytes") for name, (raw, where) in members.items()}
    train_images, train_labels = _cifar_split(records["train"], members["train"][1])
    test_images, test_labels = _cifar_split(records["test"], members["test"][1])
    meta_where = members["meta"][1]
    names = _field(records["meta"], "fine_label_names", meta_where)
    if not isinstance(names, (list, tuple)) or len(names) != CIFAR100_CLASSES:
        size = len(names) if isinstance(names, (list, tuple)) else type(names).__name__
        raise DataError(f"{meta_where}: 'fine_label_names' must be a list of {CIFAR100_CLASSES} names, got {size}")
    if not all(isinstance(name, (bytes, str)) for name in names):
        raise DataError(f"{meta_where}: 'fine_label_names' must hold bytes or str names")
    class_names = [name.decode() if isinstance(name, bytes) else name for name in names]
    return {
        "train_images": train_images,
        "train_labels": train_labels,
        "test_images": test_images,
        "test_labels": test_labels,
        "class_names": class_names,
    }


# ------------------------------------------------------------------------------------------------ label noise


def noisy_labels(
    labels: torch.Tensor,
    p: float,
    generator: torch.Generator | None = None,
    *,
    num_classes: int = CIFAR100_CLASSES,
) -> torch.Tensor:
    """Berrada et al.'s CIFAR-100 label noise: with probability ``p`` a label is redrawn within its block of 5.

    .. math::
        \\tilde y = \\begin{cases} y - (y \\bmod 5) + u, & u \\sim U\\{0, …, 4\\}, \\text{ with probability } p \\\\
        y & \\text{otherwise} \\end{cases}

    The redraw may return the original label, so the fraction of labels that actually change is
    ``p · 4/5`` in expectation. Blocks are 5 consecutive ids (with the alphabetical CIFAR-100 ids these
    are not the super-classes).

    Args:
        labels: integer class indices, any shape, in ``[0, num_classes)``.
        p: noise probability in ``[0, 1]``.
        generator: source of randomness (two draws per label: a Bernoulli and the in-block id); the same
            seed gives the same noisy labels. Its device is used for the draws.
        num_classes: number of classes, a multiple of 5 (100 for CIFAR-100).

    Returns:
        Noisy labels, same shape, dtype and device as ``labels``.

    References:
        L. Berrada, A. Zisserman, M. P. Kumar. Smooth loss functions for deep top-k classification. ICLR 2018.
    """
    if (
        not isinstance(labels, torch.Tensor)
        or labels.dtype.is_floating_point
        or labels.dtype.is_complex
        or labels.dtype == torch.bool
    ):
        got = labels.dtype if isinstance(labels, torch.Tensor) else type(labels).__name__
        raise TypeError(f"noisy_labels: labels must be an integer tensor, got {got}")
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"noisy_labels: p must be a probability in [0, 1], got {p!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 5 or num_classes % 5:
        raise ValueError(f"noisy_labels: num_classes must be a positive multiple of 5, got {num_classes!r}")
    if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"noisy_labels: labels must lie in [0, {num_classes}), got range [{int(labels.min())}, {int(labels.max())}]"
        )
    device = generator.device if generator is not None else labels.device
    flip = torch.rand(labels.shape, generator=generator, device=device) < p
    offset = torch.randint(0, 5, labels.shape, generator=generator, device=device)
    redrawn = labels - labels % 5 + offset.to(labels.device, labels.dtype)
    return torch.where(flip.to(labels.device), redrawn, labels)


# ------------------------------------------------------------------------------------------------ transforms


def _check_uint8_images(batch: torch.Tensor, name: str) -> None:
    if not isinstance(batch, torch.Tensor) or batch.dtype != torch.uint8 or batch.ndim != 4 or batch.shape[1] != 3:
        got = (
            f"{batch.dtype} tensor of shape {tuple(batch.shape)}"
            if isinstance(batch, torch.Tensor)
            else type(batch).__name__
        )
        raise ValueError(f"{name}: expected a uint8 tensor of shape (N, 3, H, W), got {got}")


def normalize_cifar(batch: torch.Tensor) -> torch.Tensor:
    """Evaluation transform: ``(pixels / 255 − mean) / std`` with difftopk's CIFAR-10 statistics.

    ``mean = (0.4914, 0.4822, 0.4465)``, ``std = (0.2023, 0.1994, 0.2010)`` (:data:`CIFAR10_MEAN`,
    :data:`CIFAR10_STD`), used by difftopk for CIFAR-100 too.

    Args:
        batch: uint8 images.

    Returns:
        float32 images on the same device.

    Shape:
        - Input: ``(N, 3, H, W)`` uint8.
        - Output: ``(N, 3, H, W)`` float32.
    """
    _check_uint8_images(batch, "normalize_cifar")
    mean = torch.tensor(CIFAR10_MEAN, device=batch.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, device=batch.device).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


def augment_cifar(batch: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Training transform: random crop with 4-pixel zero padding, random horizontal flip, normalisation.

    Equivalent to torchvision's ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()`` +
    ``ToTensor()`` + ``Normalize(CIFAR10_MEAN, CIFAR10_STD)``, vectorised over the batch: each image is
    zero-padded by 4 pixels on every side, a window of the original size is cut at a uniform offset in
    ``{0, …, 8}²`` and mirrored left-right with probability 1/2. Padding is applied to the raw pixels
    (value 0), so padded pixels become ``−mean / std`` after normalisation, as in torchvision.

    Args:
        batch: uint8 images.
        generator: source of randomness (draw order: vertical offsets, horizontal offsets, flips; one
            of each per image); same seed → same output. Its device is used for the draws.

    Returns:
        float32 augmented, normalised images on the input's device.

    Shape:
        - Input: ``(N, 3, H, W)`` uint8 (32 × 32 for CIFAR).
        - Output: ``(N, 3, H, W)`` float32.
    """
    _check_uint8_images(batch, "augment_cifar")
    n, c, h, w = batch.shape
    device = generator.device if generator is not None else batch.device
    top = torch.randint(0, 2 * _CIFAR_PAD + 1, (n,), generator=generator, device=device).to(batch.device)
    left = torch.randint(0, 2 * _CIFAR_PAD + 1, (n,), generator=generator, device=device).to(batch.device)
    flip = (torch.rand(n, generator=generator, device=device) < 0.5).to(batch.device)
    padded = torch.nn.functional.pad(batch, (_CIFAR_PAD,) * 4)
    rows = top[:, None] + torch.arange(h, device=batch.device)
    columns = torch.arange(w, device=batch.device).expand(n, w)
    columns = left[:, None] + torch.where(flip[:, None], w - 1 - columns, columns)
    cropped = padded[
        torch.arange(n, device=batch.device)[:, None, None, None],
        torch.arange(c, device=batch.device)[None, :, None, None],
        rows[:, None, :, None],
        columns[:, None, None, :],
    ]
    return normalize_cifar(cropped)
