"""Render ``softtopk.methods()`` as the README's method table; ``--write`` puts it in README.md.

``tests/test_readme.py`` fails when the README's table differs from this rendering, so the table
cannot drift from the registry.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import softtopk

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- methods-table -->", "<!-- /methods-table -->"


def render() -> str:
    """The markdown table: one row per method, in the registry's order."""
    lines = ["| method | outputs | parameters (defaults) | cost per row |", "|---|---|---|---|"]
    for name, info in softtopk.methods().items():
        params = ", ".join(f"`{key}={value!r}`" for key, value in info.params.items())
        outputs = ", ".join(info.outputs) + (" (stochastic)" if info.stochastic else "")
        lines.append(f"| `{name}` | {outputs} | {params} | {info.cost} |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The table between the README's markers."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n?" + re.escape(END), text, flags=re.S)
    if match is None:
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return match.group(1).strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = parser.parse_args()
    if not args.write:
        print(render())
        return
    text = README.read_text()
    old = readme_table(text)
    README.write_text(text.replace(f"{BEGIN}\n{old}\n" if old else f"{BEGIN}\n", f"{BEGIN}\n{render()}\n", 1))


if __name__ == "__main__":
    main()
