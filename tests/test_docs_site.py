"""The documentation site: ``mkdocs build --strict`` (warnings are errors, so a broken link, a
missing page or a docstring griffe cannot parse fails), and the docstring rewrite behind the API
reference."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs", reason="the docs extra (mkdocs, mkdocs-material, mkdocstrings-python) is not installed")


def _rst():
    spec = importlib.util.spec_from_file_location("griffe_rst", ROOT / "docs" / "griffe_rst.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mkdocs_build_strict(tmp_path):
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert 'id="softtopk.operators.soft_topk"' in api and 'id="softtopk.jax.operators.sparse_topk_mask"' in api
    for leftover in (":func:", ":math:", ".. math::", "<blockquote>"):  # every docstring was rewritten
        assert leftover not in api
    assert (tmp_path / "site" / "benchmarks" / "results" / "mask.png").is_file()


def test_rst_roles_math_and_examples_become_markdown():
    text = """Mask, see :func:`~softtopk.soft_topk` and :class:`TopK`, with :math:`\\tau > 0`:

    .. math::

        m_i = F(x_i - t)

    Example:
        >>> f(1)
        2
    """
    assert _rst().rst_to_markdown(text) == """Mask, see `softtopk.soft_topk` and `TopK`, with \\(\\tau > 0\\):

    \\[
    m_i = F(x_i - t)
    \\]

    Example:
        ```pycon
        >>> f(1)
        2
        ```
    """
