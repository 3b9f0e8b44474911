"""The distribution: a torch-only library, the lab as an extra, and a ``softtopk`` command whose
``--help`` and ``--version`` import no heavy module."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "matplotlib", "tqdm")


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """The ``modules`` present in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {list(modules)!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_library_leaves_the_lab_and_its_dependencies_out():
    lab = ("softtopk_lab", "matplotlib", "tqdm")
    by_torch = _loaded_after("import torch", lab)  # torch.hub imports tqdm where it is installed
    assert set(by_torch) <= {"tqdm"}
    assert _loaded_after("import softtopk, softtopk.compat.difftopk", lab) == by_torch


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["train-embeddings", "--help"],
        ["knn", "--help"],
        ["sweep", "--help"],
        ["data", "build-wordnet", "--help"],
        ["--version"],
    ],
)
def test_help_and_version_import_no_heavy_module(argv):
    code = (
        f"from softtopk_lab.cli import main\ntry:\n    main({argv!r})\n"
        "except SystemExit as exit:\n    assert exit.code == 0"
    )
    assert _loaded_after(code, HEAVY) == []


def test_version_prints_the_installed_version():
    done = subprocess.run(
        [sys.executable, "-m", "softtopk_lab.cli", "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == f"softtopk {importlib.metadata.version('softtopk')}\n"


def test_library_depends_on_torch_only_and_the_lab_extra_brings_the_tools():
    """torch is the "torch" extra (softtopk.jax needs none); the lab and the tests bring it, the tests
    numba too."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert project["dependencies"] == [] and len(extras["torch"]) == 1 and extras["torch"][0].startswith("torch")
    assert {"softtopk[torch]", "numpy", "tqdm", "matplotlib"} <= set(extras["lab"])
    assert "softtopk[torch,numba]" in extras["test"] and not any("torch" in need for need in extras["jax"])
    assert [need.split(">")[0] for need in extras["numba"]] == ["numba"]  # the CPU PAV kernels, optional
    assert project["scripts"] == {"softtopk": "softtopk_lab.cli:main"}
    assert "[project.urls]" not in (ROOT / "pyproject.toml").read_text()


def test_both_packages_are_typed():
    for package in ("softtopk", "softtopk_lab"):
        assert (ROOT / "src" / package / "py.typed").is_file()


def _imports(package: str):
    """``(file, module, names)`` of every ``import`` / ``from ... import`` in ``src/<package>``."""
    for path in sorted((ROOT / "src" / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                yield path.name, module, [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    yield path.name, alias.name, []


def test_the_lab_imports_public_library_names_only_and_the_library_never_imports_the_lab():
    for file, module, names in _imports("softtopk_lab"):
        if module.split(".")[0] == "softtopk":
            assert module in ("softtopk", "softtopk.compat.difftopk"), (file, module)
            assert not any(name.startswith("_") for name in names), (file, module, names)
        if "build_parser" in names:
            assert file == "cli.py", f"{file} builds the parser: only cli.main may"
    for file, module, _ in _imports("softtopk"):
        assert not module.startswith("softtopk_lab"), (file, module)
