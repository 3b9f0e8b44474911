"""The documentation's code examples run and print what the pages say they print.

Every ```` ```python ```` block of ``docs/`` with an import is run statement by statement, as in
a REPL (a block without one is a signature listing). Where a statement shows an output (a ``# ...``
comment on its line, or the comment lines below it), what it prints, plus the ``repr`` of its value
when it is an expression, must show the comment's numbers, each to the precision printed there
(half a unit in its last digit). An annotation after the output (a word or ``#`` after three
spaces or more, or ``= ...`` after a closing parenthesis) is not compared; a comment that does not
read as an output (``tensor(``, ``Array(``, ``(``, ``[``, a number, ``True``/``False``) is a remark.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
NUMBER = re.compile(r"(?<![\w.])-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|-?\binf\b|\bnan\b")
IMPORT = re.compile(r"^(?:import|from) \S", re.M)
OUTPUT = re.compile(r"^(?:tensor\(|Array\(|\(|\[|-?\d|True|False)")
ANNOTATION = re.compile(r"\s{3,}[A-Za-z#].*$|(?<=\))\s+=\s.*$")


def _examples() -> list:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for index, block in enumerate(BLOCK.findall(page.read_text())):
            if IMPORT.search(block):  # else a signature listing (``...`` arguments), not an example
                found.append(pytest.param(f"{page.relative_to(DOCS)}#{index}", block, id=f"{page.stem}#{index}"))
    return found


def _expected(source: str, node: ast.stmt, body: list[ast.stmt]) -> str | None:
    """The output the comments promise for ``node``, the last statement on its line: the comment on
    that line when it reads as an output, else the comment lines right below it; annotations cut.
    None when there is none."""
    if any(other.lineno == node.end_lineno and other.col_offset > node.col_offset for other in body):
        return None
    lines = source.splitlines()
    last = lines[node.end_lineno - 1]
    inline = last.split("# ", 1)[1].strip() if "  # " in last else ""
    below = []
    for line in lines[node.end_lineno :]:
        if not line.startswith("#"):
            break
        below.append(line[1:].strip())
    text = inline if OUTPUT.match(inline) else "\n".join(below)
    text = "\n".join(ANNOTATION.sub("", line) for line in text.splitlines())
    return text if OUTPUT.match(text) else None


def _close(shown: str, expected: str) -> bool:
    if expected in ("inf", "-inf", "nan"):
        return shown == expected
    digits = len(expected.lower().split("e")[0].split(".")[1]) if "." in expected else 0
    exponent = int(expected.lower().split("e")[1]) if "e" in expected.lower() else 0
    return abs(float(shown) - float(expected)) <= 0.51 * 10.0 ** (exponent - digits) + 1e-12


def _run(statement: ast.stmt, namespace: dict) -> str:
    """What a REPL shows for ``statement``."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if isinstance(statement, ast.Expr):
            value = eval(compile(ast.Expression(statement.value), "<docs>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        else:
            exec(compile(ast.Module([statement], type_ignores=[]), "<docs>", "exec"), namespace)
    return out.getvalue()


EXTRAS = {"softtopk.jax": ("jax", "jax"), "softtopk_lab": ("numpy", "lab")}  # module: (needs, extra)


@pytest.mark.parametrize("where, block", _examples())
def test_example_prints_what_the_page_says(where, block):
    for module, (needs, extra) in EXTRAS.items():
        if module in block:
            pytest.importorskip(needs, reason=f"the {extra} extra is not installed: pip install 'softtopk[{extra}]'")
    namespace: dict = {}
    body = ast.parse(block).body
    for statement in body:
        shown = _run(statement, namespace)
        expected = _expected(block, statement, body)
        if expected is None:
            continue
        want = NUMBER.findall(expected)
        got = NUMBER.findall(shown)[: len(want)]
        line = block.splitlines()[statement.lineno - 1]
        assert len(got) == len(want) and all(map(_close, got, want)), (
            f"{where}, `{line}`:\nthe page says\n{expected}\nit prints\n{shown}"
        )
