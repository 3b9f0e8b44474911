"""The built-in WordNet datasets: the committed files, and the builder on a synthetic WordNet."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
import pytest
import torch

from softtopk_lab import wordnet, wordnet_db
from softtopk_lab.wordnet import (
    BUILTIN_DATASETS,
    build_wordnet,
    builtin_metadata,
    load_builtin,
    load_builtin_arrays,
    select_and_split,
)
from softtopk_lab.wordnet_db import balanced_labels, parse_data_noun, plant_family_labels, plant_lexfile

KEYS = (
    "train_embeddings",
    "train_labels",
    "val_embeddings",
    "val_labels",
    "test_embeddings",
    "test_labels",
)


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_committed_dataset_loads(name):
    data = load_builtin(name)
    meta = builtin_metadata(name)
    n_classes = meta["num_classes"]
    assert set(data) == {*KEYS, "class_names", "train_class_counts"}
    for split in ("train", "val", "test"):
        x, y = data[f"{split}_embeddings"], data[f"{split}_labels"]
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert x.shape == (meta["split_counts"][split], 384) and y.shape == (x.shape[0],)
        assert int(y.min()) >= 0 and int(y.max()) < n_classes
        torch.testing.assert_close(x.norm(dim=1), torch.ones(x.shape[0]), atol=1e-5, rtol=0)
    assert torch.equal(torch.unique(data["train_labels"]), torch.arange(n_classes))
    assert len(data["class_names"]) == n_classes == len(set(data["class_names"]))
    counts = data["train_class_counts"]
    assert counts.dtype == torch.int64 and counts.tolist() == meta["train_class_counts"]
    assert torch.equal(counts, torch.bincount(data["train_labels"], minlength=n_classes))


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_committed_dataset_matches_metadata(name):
    arrays = load_builtin_arrays(name)
    meta = builtin_metadata(name)
    assert {key: wordnet._array_sha256(value) for key, value in arrays.items()} == meta["sha256"]
    offsets, split = arrays["offsets"], arrays["split"]
    assert len(np.unique(offsets)) == len(offsets)  # so the splits are disjoint
    assert set(np.unique(split).tolist()) == {0, 1, 2}
    kept = np.bincount(arrays["labels"], minlength=meta["num_classes"])
    before_cap = np.asarray(meta["class_sizes_before_cap"])
    if name == "wordnet148":
        assert before_cap.min() >= wordnet.BALANCED_MIN_SIZE
        assert kept.max() <= wordnet.BALANCED_CAP
        assert np.array_equal(kept, np.minimum(before_cap, wordnet.BALANCED_CAP))
    else:
        assert kept.min() >= wordnet.PLANTS_MIN_SIZE and kept.max() <= wordnet.PLANTS_CAP
        assert np.array_equal(kept, np.minimum(before_cap, wordnet.PLANTS_CAP))
    assert meta["quantisation_cosine_error"]["max"] < 1e-3
    assert meta["rule"] == wordnet._RULES[name] and meta["split"] == wordnet._SPLIT_RULE


def test_unknown_builtin_name_lists_valid_names():
    with pytest.raises(ValueError, match="wordnet148, wordnet-plants150"):
        load_builtin("nope")


# --- the builder on a synthetic WordNet -----------------------------------------------------------


def _line(offset, lex, words, pointers, gloss):
    ptrs = " ".join(f"{symbol} {target:08d} n 0000" for symbol, target in pointers)
    words_field = " ".join(f"{word} 0" for word in words)
    head = f"{offset:08d} {lex:02d} n {len(words):02x} {words_field} {len(pointers):03d} {ptrs}"
    return f"{head} | {gloss}  \n"


def _write_wordnet(directory, *, plant_lex=20, lexnames=True):
    """A tiny WordNet: entity -> a1 -> ... -> a4 -> {big (60 below), small (10 below)}, plus plants.

    Plants: family_Big (genus G1 with 12 species) and family_Small (genus G2 with 3 species).
    """
    lines = ["  licence header line\n", _line(1, 3, ["entity"], [], "root")]
    chain = [1]
    for depth in range(1, 5):
        lines.append(_line(10 + depth, 3, [f"a{depth}"], [("@", chain[-1])], f"level {depth}"))
        chain.append(10 + depth)
    lines.append(_line(100, 3, ["big"], [("@", 14)], "big class"))
    lines.append(_line(200, 3, ["small"], [("@", 14)], "small class"))
    for i in range(60):
        lines.append(_line(1000 + i, 3, [f"big_{i}"], [("@", 100)], f'member {i}; "an example"'))
    for i in range(10):
        lines.append(_line(2000 + i, 3, [f"small_{i}"], [("@i", 200)], f"instance {i}"))
    lines.append(_line(300, plant_lex, ["plant_family"], [("@", 100)], "a family of plants"))
    lines.append(_line(301, plant_lex, ["Bigaceae", "family_Bigaceae"], [("@", 300)], "big family"))
    lines.append(_line(302, plant_lex, ["Smallaceae", "family_Smallaceae"], [("@", 300)], "small family"))
    lines.append(_line(303, plant_lex, ["subfamily_Bigoideae"], [("@", 300), ("#m", 301)], "subfamily"))
    lines.append(_line(310, plant_lex, ["genus_G1"], [("@", 100), ("#m", 303)], "genus one"))
    lines.append(_line(320, plant_lex, ["genus_G2"], [("@", 100), ("#m", 302)], "genus two"))
    for i in range(12):
        lines.append(_line(3000 + i, plant_lex, [f"g1_{i}"], [("@", 100), ("#m", 310)], f"species {i}"))
    for i in range(3):
        lines.append(_line(4000 + i, plant_lex, [f"g2_{i}"], [("@", 100), ("#m", 320)], f"species {i}"))
    lines.append(_line(5000, plant_lex, ["orphan_plant"], [("@", 100)], "no family"))
    (directory / "data.noun").write_text("".join(lines), encoding="utf-8")
    if lexnames:
        (directory / "lexnames").write_text(f"03\tnoun.Tops\t1\n{plant_lex:02d}\tnoun.plant\t1\n", encoding="utf-8")


def test_parse_and_label(tmp_path):
    _write_wordnet(tmp_path, plant_lex=17)
    synsets = parse_data_noun(tmp_path / "data.noun")
    assert synsets[1000].gloss == 'member 0; "an example"' and synsets[310].pointers == (
        ("@", 100),
        ("#m", 303),
    )
    assert wordnet_db.synset_text(synsets[1000]) == "big 0: member 0"
    assert plant_lexfile(tmp_path) == 17
    labels = balanced_labels(synsets, depth=5)
    assert {offset: labels[offset] for offset in (1000, 2000)} == {1000: 100, 2000: 200}
    assert 100 not in labels and 14 not in labels  # the ancestor itself and shallower synsets
    families = plant_family_labels(synsets, 17)
    assert families[3000] == families[310] == families[303] == 301  # #m walks through the subfamily
    assert families[4000] == 302
    assert 301 not in families and 5000 not in families and 1000 not in families


def test_plant_lexfile_default_without_lexnames(tmp_path):
    assert plant_lexfile(tmp_path) == wordnet_db.NOUN_PLANT_LEXFILE


def test_select_and_split_is_deterministic_and_stratified():
    labels = {offset: 7 for offset in range(100, 160)} | {offset: 3 for offset in range(500, 510)}
    labels |= {offset: 9 for offset in range(900, 905)}
    plan = select_and_split("x", labels, min_size=10, cap=50)
    assert plan.class_offsets.tolist() == [3, 7] and plan.class_sizes.tolist() == [10, 60]
    assert np.bincount(plan.labels).tolist() == [10, 50]
    assert [np.bincount(plan.split[plan.labels == c]).tolist() for c in (0, 1)] == [
        [6, 2, 2],
        [30, 10, 10],
    ]
    again = select_and_split("x", dict(reversed(labels.items())), min_size=10, cap=50)
    assert np.array_equal(plan.offsets, again.offsets) and np.array_equal(plan.split, again.split)
    with pytest.raises(ValueError, match="no class"):
        select_and_split("x", labels, min_size=100, cap=50)


def _fake_embed(texts):
    rows = [np.frombuffer(hashlib.sha256(text.encode()).digest() * 12, dtype=np.uint8) for text in texts]
    x = np.asarray(rows, dtype=np.float32) - 127.5
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_build_wordnet_with_fake_embedding(tmp_path):
    source = tmp_path / "wn"
    source.mkdir()
    _write_wordnet(source)
    summaries = [
        build_wordnet(tmp_path / out, wordnet_dir=source, progress=False, embed=_fake_embed) for out in ("a", "b")
    ]
    assert summaries[0]["wordnet148"]["num_classes"] == 1  # "small" (10 members) is dropped, "big" capped
    assert summaries[0]["wordnet148"]["split_counts"] == {"train": 36, "val": 12, "test": 12}
    assert summaries[0]["wordnet-plants150"]["num_classes"] == 1  # family_Smallaceae has 4 members
    meta = [json.loads((tmp_path / out / "wordnet-plants150.json").read_text()) for out in ("a", "b")]
    assert meta[0]["sha256"] == meta[1]["sha256"]
    assert meta[0]["class_names"] == ["Bigaceae:00000301"]
    assert meta[0]["train_class_counts"] == [8]  # 12 species, genus G1 and the subfamily: 14 -> 8/3/3
    with np.load(tmp_path / "a" / "wordnet148.npz") as stored:
        assert stored["embeddings_q"].dtype == np.int8 and stored["embeddings_q"].shape == (60, 384)


def test_missing_wordnet_names_apt_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        build_wordnet(tmp_path / "out", wordnet_dir=tmp_path / "missing", embed=_fake_embed)


def test_missing_model_names_pip_command(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(RuntimeError, match=r'pip install "softtopk\[data\]"'):
        wordnet.minilm_embedder()


def test_bad_batch_size(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        build_wordnet(tmp_path, batch_size=0, embed=_fake_embed)
