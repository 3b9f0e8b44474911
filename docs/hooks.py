"""mkdocs hook: publish the benchmark write-ups, their plots, the changelog and the contributing
guide from where they live (``benchmarks/``, ``CHANGELOG.md``, ``CONTRIBUTING.md``), so the site
never holds a stale copy."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def _published() -> dict[str, Path]:
    """Site path -> source file."""
    pages = {
        "benchmarks/index.md": ROOT / "benchmarks" / "README.md",
        "changelog.md": ROOT / "CHANGELOG.md",
        "contributing.md": ROOT / "CONTRIBUTING.md",
    }
    for path in sorted((ROOT / "benchmarks" / "results").glob("*")):
        if path.suffix in (".md", ".png"):
            pages[f"benchmarks/results/{path.name}"] = path
    return pages


def on_files(files: Files, config) -> Files:
    for uri, source in _published().items():
        files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


# The README is the site's home page (docs/index.md names it): its links are relative to the
# repository root, the site's to docs/, so the hook inlines it with its links rewritten.
_README_LINKS = {
    "](docs/": "](",
    "](benchmarks/README.md)": "](benchmarks/index.md)",
    "](CHANGELOG.md)": "](changelog.md)",
    "](CONTRIBUTING.md)": "](contributing.md)",
}
_README_INCLUDE = '--8<-- "README.md"'


def on_page_markdown(markdown: str, page, config, files) -> str:
    if _README_INCLUDE not in markdown:
        return markdown
    readme = (ROOT / "README.md").read_text()
    for old, new in _README_LINKS.items():
        readme = readme.replace(old, new)
    return markdown.replace(_README_INCLUDE, readme)
