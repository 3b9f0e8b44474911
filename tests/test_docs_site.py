"""The documentation site: ``mkdocs build --strict`` (warnings are errors, so a broken link, a
missing page or a docstring griffe cannot parse fails), a site that works offline (no external
script, stylesheet or font; math rendered to MathML at build time), and the docstring rewrite behind
the API reference."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

ROOT = Path(__file__).resolve().parents[1]
_DOCS_EXTRA = "the docs extra (mkdocs, mkdocs-material, mkdocstrings-python, latex2mathml) is not installed"
pytest.importorskip("mkdocs", reason=_DOCS_EXTRA)
pytest.importorskip("latex2mathml", reason=_DOCS_EXTRA)

# an element that makes the browser fetch a file: its src/href attribute
_FETCHED = re.compile(r"<(script|link|img|iframe|source|embed)\b[^>]*?\b(?:src|href)=[\"']([^\"']*)[\"']", re.I)


def _docs_module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rst():
    return _docs_module("griffe_rst")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module's tests (a few seconds)."""
    out = tmp_path_factory.mktemp("docs") / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return out


def test_mkdocs_build_strict(site):
    api = (site / "api" / "index.html").read_text()
    assert 'id="softtopk.operators.soft_topk"' in api and 'id="softtopk.jax.operators.sparse_topk_mask"' in api
    for leftover in (":func:", ":math:", ".. math::", "<blockquote>"):  # every docstring was rewritten
        assert leftover not in api
    assert (site / "benchmarks" / "results" / "mask.png").is_file()


def test_site_fetches_nothing_from_the_network(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        for tag, url in _FETCHED.findall(page.read_text()):
            assert not re.match(r"(https?:)?//", url), f"{page.relative_to(site)}: <{tag}> loads {url}"
    css = "".join(path.read_text() for path in site.rglob("*.css"))
    assert "fonts.googleapis" not in css and "@import url(http" not in css


def test_math_is_rendered_to_mathml(site):
    formulas = 0
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r'class="arithmatex">\s*\\[\[(]', text), f"{page.relative_to(site)}: unrendered math"
        for formula in re.findall(r"<math .*?</math>", text, re.S):
            ElementTree.fromstring(formula)  # well-formed XML, as the browser's MathML parser needs
            formulas += 1
    assert formulas > 100
    lapsum = (site / "methods" / "lapsum" / "index.html").read_text()
    assert lapsum.count('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">') >= 3
    assert "<mfrac>" in lapsum
    assert "mathjax" not in lapsum.lower()


def test_mathml_hook_converts_delimiters_and_refuses_what_it_cannot_render():
    mathml = _docs_module("mathml")
    assert mathml.latex_to_mathml("\\big\\langle x, y \\big\\rangle", display=False).count("<mo") >= 2
    assert "arg" in mathml.latex_to_mathml("\\arg\\max_i x_i", display=True)
    with pytest.raises(ValueError, match="unconverted"):
        mathml.latex_to_mathml("a,\\\nb", display=True)


def test_rst_roles_math_and_examples_become_markdown():
    text = """Mask, see :func:`~softtopk.soft_topk` and :class:`TopK`, with :math:`\\tau > 0`:

    .. math::

        m_i = F(x_i - t)

    Example:
        >>> f(1)
        2
    """
    assert (
        _rst().rst_to_markdown(text)
        == """Mask, see `softtopk.soft_topk` and `TopK`, with \\(\\tau > 0\\):

    \\[
    m_i = F(x_i - t)
    \\]

    Example:
        ```pycon
        >>> f(1)
        2
        ```
    """
    )


def test_long_code_lines_wrap_instead_of_being_cut(site):
    home = (site / "index.html").read_text()
    assert 'href="assets/extra.css"' in home
    css = (site / "assets" / "extra.css").read_text()
    assert re.search(r"\.md-typeset pre > code \{[^}]*white-space: pre-wrap", css)
