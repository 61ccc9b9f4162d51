"""Durations as people type them: 90s, 15m, 2h, 7d, 1h30m, or a plain number of seconds."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from proletarian_ref.errors import ConfigurationError

_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
# About 31,700 years: far past any schedule, and short of timedelta's own limit.
_MAX_SECONDS: Final = 1e12


def parse_duration(text: str) -> timedelta:
    """`text` as a timedelta >= 0; raises ConfigurationError naming the text and the accepted forms."""
    value = text.strip().lower()
    seconds: float | None = None
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        seconds = float(value)
    elif value and _PART.sub("", value) == "":
        seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(value))
    if seconds is None or seconds > _MAX_SECONDS:
        raise ConfigurationError(
            f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 7d, 1h30m or a number of seconds)"
        )
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta | None) -> str:
    """A short age for tables: 4.2s, 3m 05s, 2h 10m, 3d 04h; '-' for None."""
    if delta is None:
        return "-"
    seconds = delta.total_seconds()
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"
