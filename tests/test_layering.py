"""The import rule (README, "Architecture"): shared -> ops -> conventions -> families -> faces -> compat
-> lab, where "shared" is the framework-free ``softtopk._checks`` (the Python-value checks and the
messages) and ``softtopk._window`` (the sparse kernels' closed forms, in Python arithmetic), the
standard library only; the JAX front-end ``softtopk.jax`` stands apart: jax and
numpy, and of the rest of softtopk the shared modules only (so ``import softtopk.jax`` loads no torch).
Inside, it mirrors the torch tree and its rule: ``softtopk.jax.X`` sits in the layer of ``softtopk.X``,
except ``softtopk.jax._extended``, which sits with the kernels (the JAX lapsum kernel reads its
``±inf`` rows off its own candidates with the closed form there).

Walks the ``ast`` of every module of ``src/softtopk`` and ``src/softtopk_lab`` and fails on an upward
import, a cycle, a private name imported from another module, a private module imported by compat or
the lab (compat may use the shared checks of ``softtopk._validation``), a face that defines
something, or a third-party import in the torch-only library.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from softtopk.ops import triton_gate

SRC = Path(__file__).resolve().parents[1] / "src"
SHARED = {"softtopk._checks", "softtopk._window"}
CONVENTIONS = {"softtopk._validation", "softtopk._layout", "softtopk._extended", "softtopk._registry"}
FACES = {"softtopk", "softtopk.functional", "softtopk.nn", "softtopk.losses"}
LAYERS = ("shared", "ops", "conventions", "families", "faces", "compat", "lab")


def layer(module: str) -> int:
    """The layer of a module of the repository (adding a module outside these places fails here)."""
    if module.startswith("softtopk_lab"):
        return LAYERS.index("lab")
    if module == "softtopk.jax._extended":
        return LAYERS.index("ops")
    if module.startswith("softtopk.jax"):
        return layer(mirror(module))
    if module in SHARED:
        return LAYERS.index("shared")
    if module.startswith("softtopk.ops"):
        return LAYERS.index("ops")
    if module in CONVENTIONS:
        return LAYERS.index("conventions")
    if module in FACES:
        return LAYERS.index("faces")
    if module.startswith("softtopk.compat"):
        return LAYERS.index("compat")
    families = {
        "softtopk.operators",
        "softtopk.sparse",
        "softtopk.sorting",
        "softtopk.stochastic",
        "softtopk.knn",
        "softtopk.routing",
        "softtopk._deprecated",
    }
    if module in families or module.startswith("softtopk.losses."):
        return LAYERS.index("families")
    raise AssertionError(f"{module} has no layer: place it in tests/test_layering.py and the README's Architecture")


def mirror(module: str) -> str:
    """The torch module that a module of ``softtopk.jax`` mirrors (others unchanged)."""
    return "softtopk" + module[len("softtopk.jax") :] if module.startswith("softtopk.jax") else module


def modules() -> dict[str, Path]:
    found = {}
    for package in ("softtopk", "softtopk_lab"):
        for path in sorted((SRC / package).rglob("*.py")):
            parts = list(path.relative_to(SRC).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(module: str, path: Path) -> list[tuple[str, str | None, int]]:
    """``(imported module, imported name or None, line)`` for every import of the project's packages
    and every third-party import (stdlib and ``__future__`` left out)."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                if submodule in MODULES:  # ``from . import functional``: a module, not a name
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((target, alias.name, node.lineno))
    return [item for item in found if item[0].split(".")[0] not in sys.stdlib_module_names | {"__future__"}]


MODULES = modules()
EDGES = {module: imports(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer_and_the_lab_is_separate():
    for module in MODULES:
        layer(module)
    assert "softtopk.experiments" not in MODULES and "softtopk.cli" not in MODULES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module):
    for target, name, line in EDGES[module]:
        root = target.split(".")[0]
        where = f"{MODULES[module].relative_to(SRC)}:{line}"
        front_end = module.startswith("softtopk.jax")
        if root not in ("softtopk", "softtopk_lab"):
            allowed = {"torch"} if module.startswith("softtopk.") or module == "softtopk" else None
            allowed = {"jax", "numpy"} if front_end else set() if module in SHARED else allowed
            # the optional Triton kernels, imported only where they run (softtopk.ops.*_triton)
            kernels = tuple(f"softtopk.ops.{name}" for name in triton_gate.KERNEL_MODULES + triton_gate.KERNEL_HELPERS)
            allowed = {"triton"} if module in kernels else allowed
            # the optional numba kernels, imported at their first use (ops.isotonic_numba, ops.lapsum_numba,
            # ops.label_select, ops.networks_numba, ops.noised_numba), and what they share
            numba_kernels = tuple(
                f"softtopk.ops.{name}"
                for name in (
                    "isotonic_kernels",
                    "lapsum_numba_kernels",
                    "label_select_kernels",
                    "networks_numba_kernels",
                    "noised_numba_kernels",
                    "order_kernels",
                    "random_kernels",
                )
            )
            allowed = {"numba", "numpy"} if module in numba_kernels else allowed
            assert allowed is None or root in allowed, f"{where}: {module} imports {root} ({sorted(allowed or ())})"
            continue
        if front_end and not target.startswith("softtopk.jax"):
            assert target in SHARED, f"{where}: softtopk.jax imports {target} (the torch library)"
            continue
        assert front_end or not target.startswith("softtopk.jax"), f"{where}: {module} imports the JAX front-end"
        assert layer(target) <= layer(module), f"{where}: upward import of {target} ({LAYERS[layer(target)]})"
        assert name is None or not name.startswith("_"), f"{where}: private name {name} imported from {target}"
        if layer(module) >= LAYERS.index("compat") and layer(target) < LAYERS.index("compat"):
            shared_checks = layer(module) == LAYERS.index("compat") and mirror(target) == "softtopk._validation"
            assert mirror(target) in FACES or shared_checks, f"{where}: {module} imports {target}, not a face"


def test_no_import_cycle():
    graph = {module: {target for target, _, _ in EDGES[module] if target in MODULES} for module in MODULES}
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in graph[module]:
            assert state.get(target) != 1, "import cycle: " + " -> ".join(path + [module, target])
            if target not in state:
                visit(target, path + [module])
        state[module] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("face", sorted(FACES - {"softtopk"}))
def test_faces_define_nothing(face):
    tree = ast.parse(MODULES[face].read_text())
    for node in tree.body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        exports = isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["__all__"]
        assert docstring or exports or isinstance(node, (ast.Import, ast.ImportFrom)), (
            f"{face} defines something at line {node.lineno}: faces only re-export"
        )


def test_library_files_stay_short():
    for module, path in MODULES.items():
        if not module.startswith("softtopk_lab"):
            lines = len(path.read_text().splitlines())
            assert lines <= 400, f"{path.relative_to(SRC)} has {lines} lines (at most 400)"


def test_the_rule_catches_an_upward_import(tmp_path):
    """The walker itself: a relative import from ops up to a face is seen and refused."""
    path = tmp_path / "bad.py"
    path.write_text("from ..functional import soft_topk\nfrom .lapsum import _LaplaceMask\n")
    found = imports("softtopk.ops.bad", path)
    assert ("softtopk.functional", "soft_topk", 1) in found and ("softtopk.ops.lapsum", "_LaplaceMask", 2) in found
    assert layer("softtopk.functional") > layer("softtopk.ops.bad")
