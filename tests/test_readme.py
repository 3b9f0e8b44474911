"""The README is a front page that stays true: short, the library called early, the method table
generated from the registry, every relative link pointing at a file of the repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _methods_table():
    spec = importlib.util.spec_from_file_location("methods_table", ROOT / "scripts" / "methods_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_method_table_is_the_registry_rendered():
    table = _methods_table()
    assert table.readme_table(README) == table.render(), "run: python scripts/methods_table.py --write"


def test_the_front_page_is_short_and_calls_the_library_early():
    lines = README.splitlines()
    assert len(lines) <= 150
    first_python = next(i for i, line in enumerate(lines) if line.startswith(">>> "))
    first_block = next(i for i, line in enumerate(lines) if line.startswith("```"))
    assert first_block < 40 and first_python < 40


def test_every_relative_link_names_a_file_of_the_repository():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert relative, "the README links its documentation pages"
    missing = [link for link in relative if not (ROOT / link).is_file()]
    assert not missing


def test_the_test_command_follows_its_marker():
    block = README.split("<!-- test-command -->", 1)[1].lstrip()
    assert block.startswith("```bash\n")
    assert "pytest" in block.split("```")[1]
