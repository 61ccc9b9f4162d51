"""Every table in README.md and docs/ renders as one: its header is followed by the separator row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parent.parent
PAGES: Final = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_SEPARATOR: Final = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def headers_without_separator(text: str) -> list[str]:
    """The first line of each table (a run of lines opening with "|", outside code blocks) whose next line
    is not a separator row of as many cells: GitHub shows such a table as one paragraph of pipes."""
    found = []
    lines = text.splitlines()
    in_code = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("|") or (i > 0 and lines[i - 1].startswith("|")):
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if not _SEPARATOR.match(following) or following.count("|") != line.count("|"):
            found.append(f"line {i + 1}: {line[:80]}")
    return found


def test_a_header_without_its_separator_row_is_found() -> None:
    assert headers_without_separator("| a | b |\n| 1 | 2 |\n") == ["line 1: | a | b |"]
    assert headers_without_separator("| a | b |\n|---|\n| 1 | 2 |\n") == ["line 1: | a | b |"]
    assert headers_without_separator("| a | b |\n|---|:-:|\n| 1 | 2 |\n") == []
    assert headers_without_separator("```\n| a | b |\n| 1 | 2 |\n```\n") == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_table_has_its_separator_row(page: Path) -> None:
    assert headers_without_separator(page.read_text(encoding="utf-8")) == []
