"""mkdocs hook: render the site's math to MathML when the site is built, so that formulas show
without JavaScript and without a network (browsers render MathML Core natively).

``pymdownx.arithmatex`` (generic mode) wraps every formula of the pages and of the API reference as
``<span class="arithmatex">\\( ... \\)</span>`` or ``<div class="arithmatex">\\[ ... \\]</div>``;
this hook replaces each wrapper by the MathML that ``latex2mathml`` (the ``docs`` extra) makes
of its LaTeX. A formula it cannot convert fails the build, naming the page and the formula."""

from __future__ import annotations

import html
import re
from typing import Any

from latex2mathml.converter import convert

_WRAPPED = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
# latex2mathml keeps these commands as literal text after a size command (\big\langle) or alone
# (\arg): spell them as the characters or operator names it knows
_SIZED_DELIMITER = re.compile(r"(\\[bB]igg?[lr]?)\s*\\(langle|rangle|lfloor|rfloor|lceil|rceil)\b")
_DELIMITER_CHARS = {"langle": "⟨", "rangle": "⟩", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉"}
_NAMED_OPERATOR = re.compile(r"\\(arg)\b")


def latex_to_mathml(tex: str, *, display: bool) -> str:
    """MathML ``<math>`` element for the LaTeX ``tex`` (without delimiters)."""
    tex = _SIZED_DELIMITER.sub(lambda m: m.group(1) + _DELIMITER_CHARS[m.group(2)], tex)
    tex = _NAMED_OPERATOR.sub(r"\\operatorname{\1}", tex)
    mathml = convert(tex, display="block" if display else "inline")
    if re.search(r">[^<]*\\[^<]*<", mathml):
        raise ValueError(f"latex2mathml left a LaTeX command unconverted in {tex!r}: {mathml}")
    return mathml


def _replace(match: re.Match[str], page: str) -> str:
    display = match.group(1) == "div"
    tex = html.unescape(match.group(2)).strip()
    opening, closing = ("\\[", "\\]") if display else ("\\(", "\\)")
    if not (tex.startswith(opening) and tex.endswith(closing)):
        raise ValueError(f"{page}: math without {opening} {closing} delimiters: {tex!r}")
    try:
        mathml = latex_to_mathml(tex[2:-2], display=display)
    except Exception as error:
        raise ValueError(f"{page}: cannot render the formula {tex!r} to MathML: {error}") from error
    return f'<div class="arithmatex">{mathml}</div>' if display else f'<span class="arithmatex">{mathml}</span>'


def on_page_content(content: str, page: Any, **kwargs: Any) -> str:
    return _WRAPPED.sub(lambda match: _replace(match, page.file.src_uri), content)
