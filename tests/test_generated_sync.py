"""The threaded job code is generated from its asyncio source, and the generated files are up to date."""

from __future__ import annotations

from pathlib import Path

from tools import generate_sync


def test_generated_sync_modules_match_their_async_source() -> None:
    # A hand edit of proletarian_ref/_sync/*.py, or a change of _async/*.py without regenerating, fails.
    assert generate_sync.stale() == [], "run: python -m tools.generate_sync"


def test_a_stale_generated_module_is_named(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    target = tmp_path / "_sync"
    target.mkdir()
    for name, text in generate_sync.generate().items():
        (target / name).write_text(text, encoding="utf-8")
    (target / "job_run.py").write_text(
        (target / "job_run.py").read_text(encoding="utf-8") + "# edited by hand\n", encoding="utf-8"
    )
    monkeypatch.setattr(generate_sync, "TARGET", target)
    assert generate_sync.stale() == ["job_run.py"]


def test_generated_job_code_has_no_await_and_names_the_threaded_types() -> None:
    text = (generate_sync.TARGET / "job_run.py").read_text(encoding="utf-8")
    assert "await " not in text and "async " not in text
    assert "backend: Backend," in text and "AsyncBackend" not in text
