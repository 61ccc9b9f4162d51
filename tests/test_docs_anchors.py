"""Every link to a heading in README.md and docs/ lands on a heading that exists (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parent.parent
PAGES: Final = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
_LINK = re.compile(r"\]\(([^)#\s]*)#([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives `path`'s headings: lower case, punctuation but - and _ dropped, spaces as
    -, a repeated one numbered -1, -2, ... Lines in code blocks are not headings."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in _HEADING.finditer(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_anchors_are_githubs() -> None:
    page = ROOT / "docs" / "benchmarks.md"
    assert "against-the-servers-limit-issue-31" in anchors(page)
    assert "the-database-on-cores-of-its-own-limit4-cores-2026-12-05-and-limit4-shared-2026-12-05" in anchors(
        page
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_to_a_heading_lands_on_one(page: Path) -> None:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for match in _LINK.finditer(text):
        target, anchor = match.group(1), match.group(2)
        if target.startswith(("http://", "https://")):
            continue
        linked = (page.parent / target).resolve() if target else page
        if not linked.is_file() or anchor not in anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{page.name}: links to no heading: {broken}"
