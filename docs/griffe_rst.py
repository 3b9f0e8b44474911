"""Griffe extension for the API reference: the docstrings are written for ``help()`` and Sphinx
(``:func:`x```, ``:math:`x```, ``.. math::`` blocks, ``>>>`` examples); this rewrites them, for the
site only, into what mkdocstrings renders: code spans, math delimiters (``\\( \\)``, ``\\[ \\]``,
rendered to MathML by ``mathml.py``) and fenced examples."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj):`~?([^`]+)`")
_MATH = re.compile(r":math:`([^`]+)`")


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """Index after the block that starts at ``start``: the lines indented deeper than ``indent``
    (blank lines inside it included)."""
    end = start
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return end


def _rewrite_blocks(text: str) -> str:
    """``.. math::`` blocks become ``\\[ ... \\]``; runs of ``>>>`` lines with their output become
    ```` ```pycon ```` fences."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        stripped, indent = line.strip(), len(line) - len(line.lstrip())
        pad = " " * indent
        if stripped == ".. math::":
            end = _block_end(lines, i + 1, indent)
            body = [body_line.strip() for body_line in lines[i + 1 : end] if body_line.strip()]
            out += [pad + "\\[", *(pad + body_line for body_line in body), pad + "\\]"]
            i = end
        elif stripped.startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            out += [pad + "```pycon", *(pad + example[indent:] for example in lines[i:end]), pad + "```"]
            i = end
        else:
            out.append(line)
            i += 1
    return "\n".join(out)


def rst_to_markdown(text: str) -> str:
    """The whole rewrite of one docstring."""
    text = _rewrite_blocks(text)
    text = _MATH.sub(lambda m: f"\\({m.group(1)}\\)", text)
    return _ROLE.sub(lambda m: f"`{m.group(1)}`", text)


class RstRoles(Extension):
    """Rewrite every docstring as it is loaded."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
