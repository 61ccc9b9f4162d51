"""--log-level and --log-format for every command: worker events and the CLI's own notices on stderr."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Final

from proletarian_ref.log import EXCEPTION, THROWABLE, log_value

LEVELS: Final = ("debug", "info", "warning", "error")
FORMATS: Final = ("text", "json")
# The event of a line the CLI itself writes (a notice, an error), named like Proletarian's events.
NOTICE_EVENT: Final = "proletarian-ref.cli/notice"
ERROR_EVENT: Final = "proletarian-ref.cli/error"
_CLI: Final = "proletarian-ref"

# The format of the command running now, for the lines the CLI prints itself.
_current = {"format": "text"}


def add_log_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level", choices=LEVELS, default="info", help="events on stderr from this level (default: info)"
    )
    group.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text lines, or one JSON object a line with Proletarian's event names and keys (default: text)",
    )


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, event and, for worker events, Proletarian's data keys."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
        }
        data = getattr(record, "proletarian", None)
        event = getattr(record, "proletarian_event", None)
        if isinstance(data, Mapping) and isinstance(event, str):
            line["event"] = event
            line.update(log_value({k: v for k, v in data.items() if k not in (EXCEPTION, THROWABLE)}))
            error = data.get(EXCEPTION) or data.get(THROWABLE)
            if isinstance(error, BaseException):
                key = EXCEPTION if EXCEPTION in data else THROWABLE
                line[key] = {
                    "type": type(error).__name__,
                    "message": str(error),
                    "traceback": "".join(traceback.format_exception(error)).rstrip(),
                }
        else:
            line["event"] = getattr(record, "cli_event", record.name)
            line["message"] = record.getMessage()
        return json.dumps(line, ensure_ascii=False)


def _handler(level: str, fmt: str) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(message)s"))
    handler.setLevel(level.upper())
    return handler


@contextmanager
def cli_logging(level: str = "info", fmt: str = "text") -> Iterator[None]:
    """The `proletarian_ref` logger on stderr at `level` in `fmt` for the duration of a command."""
    logger = logging.getLogger("proletarian_ref")
    handler = _handler(level, fmt)
    previous_level, previous_format = logger.level, _current["format"]
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    _current["format"] = fmt
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        _current["format"] = previous_format


def _line(level: str, event: str, message: str, prefix: str) -> None:
    if _current["format"] == "json":
        record = {"time": datetime.now(UTC).isoformat(), "level": level, "event": event, "message": message}
        text = json.dumps(record, ensure_ascii=False)
    else:
        text = f"{_CLI}: {prefix}{message}"
    # One write with its newline, as logging's StreamHandler does: print() writes the line and its
    # newline separately, so a worker thread's record could land between them and break both lines.
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def notice(message: str) -> None:
    """A line for the person running the command: `proletarian-ref: ...`, or a JSON object."""
    _line("info", NOTICE_EVENT, message, "")


def error(message: str) -> None:
    _line("error", ERROR_EVENT, message, "error: ")
