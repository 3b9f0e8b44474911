"""scripts/check_commits.py: the commit convention of CONTRIBUTING.md, checked on messages."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("check_commits", ROOT / "scripts" / "check_commits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_message_that_follows_the_convention_passes(check):
    assert check.problems("Add a MathML hook to the docs\n\nOffline, formulas showed as raw LaTeX.\n") == []
    assert check.problems("docs: render math at build time\n\nNo network needed.") == []
    assert check.problems("Fix the sparse mask's bias\n\nIt was measured at ...") == []


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("A" * 73 + "\n\nwhy", "subject has 73 characters (at most 72)"),
        ("Add the thing.\n\nwhy", "subject ends with a period"),
        ("Added the thing\n\nwhy", "subject starts with 'Added': use the imperative mood"),
        ("Fixes the thing\n\nwhy", "subject starts with 'Fixes': use the imperative mood"),
        ("lab: moving the loop\n\nwhy", "subject starts with 'moving': use the imperative mood"),
        ("Add the thing\nwhy", "no blank line after the subject"),
        ("Add the thing", "no body saying why"),
        ("", "empty subject"),
    ],
)
def test_each_broken_rule_is_named(check, message, problem):
    assert any(found.startswith(problem) for found in check.problems(message)), check.problems(message)


def test_the_cli_reads_a_range_from_git(check, capsys):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    assert check.main(["-n", "1"]) in (0, 1)
    with pytest.raises(SystemExit):
        check.main([])
    assert "give a revision range" in capsys.readouterr().err
