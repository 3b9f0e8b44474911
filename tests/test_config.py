"""The lab's typed configs: flags checked once, the equivalent command line parses back, and the
``--method`` choices listed without importing torch match the library's registry."""

from __future__ import annotations

from pathlib import Path

import pytest

import softtopk
from softtopk_lab import demo
from softtopk_lab.config import Cifar100Config, DemoConfig, EmbeddingConfig, KnnConfig, LossConfig, SweepConfig
from softtopk_lab.errors import UsageError
from softtopk_lab.flags import DIFFTOPK_RANKS, KNN_METHODS, OTHER_RANKS, build_parser

CONFIGS = {
    "train-embeddings": EmbeddingConfig,
    "train-cifar100": Cifar100Config,
    "knn": KnnConfig,
    "sweep": SweepConfig,
    "demo": DemoConfig,
}


def _parse(argv: list[str]):
    args = build_parser().parse_args(argv)
    return CONFIGS[args.command].from_args(args)


def test_method_choices_match_the_registry():
    registry = softtopk.methods()
    assert set(KNN_METHODS) == {name for name, info in registry.items() if "mask" in info.outputs}
    ranks = {name for name, info in registry.items() if "ranks" in info.outputs}
    assert set(OTHER_RANKS) == ranks - set(DIFFTOPK_RANKS)


@pytest.mark.parametrize("name", sorted(demo.RUNS))
def test_demo_run_configs_parse_back_from_their_command_line(name):
    config = demo.run_config(demo.RUNS[name], Path("runs/x"), seed=3, n_epochs=None)
    assert config.command_line().startswith("softtopk train-embeddings -d wordnet148 ")
    assert _parse([config.command, *config.to_argv()]) == config


@pytest.mark.parametrize(
    "argv",
    [
        ["train-cifar100", "-d", "c.tar.gz", "--method", "bitonic", "--p_k", ".5", ".5", "--label_noise", ".2"],
        ["knn", "--method", "lapsum", "--eval_neighbors", "100", "--data_root", "m.pkl.gz", "--no-progress"],
        ["sweep", "wordnet148", "--seeds", "4", "5", "--only", "svm_tau1", "--dry-run"],
        ["demo", "--n_epochs", "2", "--out", "d"],
    ],
)
def test_parsed_configs_are_typed_frozen_and_parse_back(argv):
    config = _parse(argv)
    assert _parse([*config.command.split(), *config.to_argv()]) == config
    assert all(not isinstance(value, list) for value in config.flags().values())
    with pytest.raises(AttributeError):
        config.seed = 1


@pytest.mark.parametrize(
    "p_k,message",
    [
        ((), "--p_k: p_k must be a non-empty sequence of floats"),
        ((0.5, -0.1, 0.6), "--p_k: p_k entries must be finite and >= 0, got [0.5, -0.1, 0.6]"),
        ((0.5, float("nan"), 0.5), "--p_k: p_k entries must be finite and >= 0"),
        ((0.5, 0.4), "--p_k: p_k must sum to 1, got [0.5, 0.4] summing to 0.9"),
    ],
)
def test_p_k_is_checked_by_the_loss_config(p_k, message):
    with pytest.raises(UsageError) as error:
        LossConfig("bitonic", p_k)
    assert str(error.value).startswith(message)
    assert LossConfig("bitonic", (1, 0)).p_k == (1.0, 0.0)  # floats, within 1e-4 of 1 accepted
    assert LossConfig("bitonic", (0.5, 0.50005)).p_k == (0.5, 0.50005)
