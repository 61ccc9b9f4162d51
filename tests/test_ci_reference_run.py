"""README.md's run time of `ci/test.sh` is the reference CI run's, as ci/reference-run.md records it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
RECORD: Final = ROOT / "ci" / "reference-run.md"
README_MD: Final = ROOT / "README.md"
FIELDS: Final = ("command", "tree", "commit", "date", "passed", "skipped", "pytest seconds", "total seconds")


def record() -> dict[str, str]:
    """The fields of the record's table, by name."""
    rows = re.findall(r"^\| ([a-z ]+) \| (.+?) \|$", RECORD.read_text(encoding="utf-8"), re.M)
    return {name: value for name, value in rows if name != "field"}


def _prose(path: Path) -> str:
    return re.sub(r"\s+", " ", path.read_text(encoding="utf-8"))


def _duration(seconds: int) -> str:
    """'1,603 s (26 min 43 s)': the seconds as the README writes them, then in minutes."""
    minutes, rest = divmod(seconds, 60)
    return f"{seconds:,} s ({minutes} min {rest} s)"


def test_the_record_has_every_field_once() -> None:
    found = record()
    assert sorted(found) == sorted(FIELDS)
    for name in ("passed", "skipped", "pytest seconds", "total seconds"):
        assert found[name].isdigit(), f"{name} is not a whole number: {found[name]!r}"
    assert re.fullmatch(r"[0-9a-f]{7,40}", found["commit"]), found["commit"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", found["date"]), found["date"]


def test_the_readme_quotes_the_reference_run() -> None:
    found = record()
    expected = (
        f"How long: the reference CI run ({found['command']} on {found['tree']} at {found['commit']}, "
        f"{found['date']}; recorded in [ci/reference-run.md](ci/reference-run.md)) took "
        f"{_duration(int(found['total seconds']))} in all, installs included, of which pytest took "
        f"{_duration(int(found['pytest seconds']))}: {int(found['passed']):,} tests passed and "
        f"{int(found['skipped']):,} skipped."
    )
    assert expected in _prose(README_MD)


def test_the_readme_quotes_no_other_run_time() -> None:
    readme = _prose(README_MD)
    quoted = re.findall(r"How long:", readme)
    assert len(quoted) == 1
    # The baseline it replaced (git 9276560: 2,017 tests in 1,116 s) is gone.
    assert "9276560" not in readme and "2,017" not in readme
