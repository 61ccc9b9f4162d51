"""Whether a payload fits MySQL payload columns, by their type, length and character set."""

from __future__ import annotations

import codecs
import re
from functools import cache
from typing import Final, NamedTuple

from proletarian_ref.errors import PayloadTooLargeError, SerializationError
from proletarian_ref.sql import parse_named_blocks, read_sql_file

# MySQL character sets whose names are not Python codec names. utf8mb3 (alias utf8) is UTF-8 without the
# four-byte characters, which the check below refuses rather than let the server replace them with '?'.
_CODECS: Final = {
    "utf8mb4": "utf-8",
    "utf8mb3": "utf-8",
    "utf8": "utf-8",
    "latin1": "cp1252",  # MySQL's latin1 is Windows-1252
    "binary": "utf-8",  # bytes as the connection sends them: PyMySQL's default utf8mb4
    "ucs2": "utf-16-be",
    "utf16": "utf-16-be",
    "utf16le": "utf-16-le",
    "utf32": "utf-32-be",
}
_FULL_UNICODE: Final = frozenset({"utf8mb4", "binary", None})
_THREE_BYTE_UTF8: Final = frozenset({"utf8mb3", "utf8"})
_FOUR_BYTE_UTF8: Final = re.compile("[\U00010000-\U0010ffff]")
_TEXT_TYPES: Final = frozenset(
    {"tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob"}
)


class PayloadColumn(NamedTuple):
    """A row of information_schema.COLUMNS for a payload column."""

    schema: str
    table: str
    data_type: str
    max_chars: int | None
    max_bytes: int | None
    charset: str | None

    def describe(self) -> str:
        return f"{self.schema}.{self.table}.payload ({self.data_type.upper()}, {self.charset or 'binary'})"


@cache
def statements() -> dict[str, str]:
    return parse_named_blocks(read_sql_file("mysql", "columns.sql"))


def check_payload_fits(payload: str, columns: list[PayloadColumn], *, raise_error: bool) -> bool:
    """True if `payload` fits every column; else False, or PayloadTooLargeError with `raise_error`.

    TEXT and BLOB types hold a number of bytes whatever the characters; CHAR and VARCHAR a number of
    characters. Bytes are those of the payload in the column's character set.
    """
    for column in columns:
        # No character takes more than four bytes; and UTF-8 columns take every valid string.
        too_long = column.max_bytes is not None and len(payload) * 4 > column.max_bytes
        if too_long or (column.charset not in _FULL_UNICODE and not payload.isascii()):
            size = _encoded_size(payload, column)
            if column.max_bytes is not None and size > column.max_bytes:
                if raise_error:
                    raise PayloadTooLargeError(
                        f"payload is {size} bytes in {column.charset or 'binary'}, more than the "
                        f"{column.max_bytes} bytes {column.describe()} holds; the server would refuse or "
                        "truncate it, so nothing was written"
                    )
                return False
        if (
            column.data_type.lower() not in _TEXT_TYPES
            and column.max_chars is not None
            and len(payload) > column.max_chars
        ):
            if raise_error:
                raise PayloadTooLargeError(
                    f"payload is {len(payload)} characters, more than the {column.max_chars} characters "
                    f"{column.describe()} holds; nothing was written"
                )
            return False
    return True


def _encoded_size(payload: str, column: PayloadColumn) -> int:
    charset = (column.charset or "binary").lower()
    codec = _CODECS.get(charset, charset)
    try:
        codecs.lookup(codec)
    except LookupError:
        codec = "utf-8"  # an unusual character set: sized as the connection's UTF-8
    try:
        if charset in _THREE_BYTE_UTF8:
            beyond = _FOUR_BYTE_UTF8.search(payload)
            if beyond is not None:
                start = beyond.start()
                raise UnicodeEncodeError(charset, payload, start, start + 1, "four-byte character")
        return len(payload.encode(codec))
    except UnicodeEncodeError as exc:
        raise SerializationError(
            f"payload has {payload[exc.start]!r} at index {exc.start}, which {column.describe()} cannot "
            "store; nothing was written"
        ) from None
