"""CHANGELOG.md keeps the Keep a Changelog form: ``## [Unreleased]`` first, then one section per
release, each with at most one group of every kind, in the usual order."""

from __future__ import annotations

import re
from pathlib import Path

GROUPS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
TEXT = (Path(__file__).resolve().parents[1] / "CHANGELOG.md").read_text()


def _releases() -> list[tuple[str, list[str]]]:
    """``(release heading, [group headings])`` in file order."""
    releases: list[tuple[str, list[str]]] = []
    for line in TEXT.splitlines():
        if line.startswith("## "):
            releases.append((line[3:], []))
        elif line.startswith("### "):
            assert releases, f"group {line!r} before the first release"
            releases[-1][1].append(line[4:])
    return releases


def test_unreleased_comes_first_and_releases_are_bracketed():
    releases = _releases()
    assert releases[0][0] == "[Unreleased]"
    for title, _ in releases[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - .+", title), title


def test_each_release_has_each_group_once_in_order():
    for title, groups in _releases():
        assert set(groups) <= set(GROUPS), f"{title}: groups {groups}, allowed {GROUPS}"
        assert groups == sorted(groups, key=GROUPS.index), f"{title}: {groups} out of order or repeated"
        assert len(groups) == len(set(groups)), f"{title}: a group appears twice in {groups}"
