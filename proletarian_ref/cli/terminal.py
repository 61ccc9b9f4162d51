"""Text from the database made safe to print on a terminal: control characters shown as escapes.

A queue, job type or payload is whatever its writer stored (a Clojure service, a hand-written INSERT). Printed
raw, an escape sequence in it could retitle or clear the terminal, and a newline could forge a table row.
JSON output needs none of this: JSON escapes control characters itself.
"""

from __future__ import annotations

import re
from typing import Final

# C0 and C1 controls and DEL; line and paragraph separators; the bidirectional overrides and isolates,
# which reorder what follows them on the line (CVE-2021-42574, "Trojan Source").
_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every character that moves the cursor or changes the terminal written as an escape."""
    return _UNSAFE.sub(_escape, text)
