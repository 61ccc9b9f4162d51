"""The command line's notices and log records stay one whole line each while threads write at once."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading

import pytest

from proletarian_ref.cli.logs import cli_logging, notice


class _SlowStream(io.StringIO):
    """A stream that yields the GIL between writes, so a line written in two parts gets split."""

    def write(self, text: str) -> int:
        written = super().write(text)
        threading.Event().wait(0.0005)
        return written


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_notices_and_worker_log_records_never_share_a_line(monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    stream = _SlowStream()
    monkeypatch.setattr(sys, "stderr", stream)
    per_thread = 50
    with cli_logging("info", fmt):
        logger = logging.getLogger("proletarian_ref")

        def notices() -> None:
            for n in range(per_thread):
                notice(f"notice {n}")

        def records() -> None:
            for n in range(per_thread):
                logger.info("record %d", n)

        threads = [threading.Thread(target=f) for f in (notices, records, notices, records)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4 * per_thread
    if fmt == "json":
        messages = [json.loads(line)["message"] for line in lines]
    else:
        messages = [line.rsplit(" ", 2)[-2] + " " + line.rsplit(" ", 2)[-1] for line in lines]
    assert sorted(messages) == sorted(
        [f"notice {n}" for n in range(per_thread)] * 2 + [f"record {n}" for n in range(per_thread)] * 2
    )
