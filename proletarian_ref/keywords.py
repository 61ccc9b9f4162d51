"""EDN keyword text for the queue and job_type columns, as Proletarian writes and reads them.

Proletarian stores a keyword with ``(str kw)``, e.g. ``":my.ns/job-type"``, and reads the column back
with ``clojure.edn/read-string``. Python code names queues and job types without the colon
(``"my.ns/job-type"``); this module converts between the two and refuses any text that Clojure would not
read back as the very same keyword.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Final

from proletarian_ref.errors import InvalidKeywordError

__all__ = ["DEFAULT_QUEUE", "from_keyword_text", "to_keyword_text"]

DEFAULT_QUEUE: Final = "proletarian/default"

# clojure.lang.EdnReader (Clojure 1.11) symbolPat. Java's \D is "not an ASCII digit" (the pattern is
# compiled without UNICODE_CHARACTER_CLASS) and Java's "." excludes all of its line terminators, not
# just "\n" as Python's does; both are spelled out so that backtracking picks the same groups.
_JAVA_DOT: Final = "[^\n\r\u0085\u2028\u2029]"
_SYMBOL_PATTERN: Final = re.compile(f"[:]?([^0-9/]{_JAVA_DOT}*/)?(/|[^0-9/][^/]*)")

# EdnReader.isTerminatingMacro: these end a token, so nothing after them is part of the keyword.
_TERMINATING_MACROS: Final = frozenset('";^()[]{}\\')
# EdnReader.nonConstituent: these make read-string throw when they appear inside a token.
_NON_CONSTITUENTS: Final = frozenset("@`~")
# Stricter than Clojure on purpose: such characters are invisible or ambiguous in logs, SQL consoles
# and other languages' readers, and a job type never needs them. Cs (lone surrogates) cannot even be
# stored as UTF-8, and Cn (unassigned here) might be whitespace in the JVM's newer Unicode tables.
_REFUSED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp", "Zs"})

# java.lang.Character.isWhitespace: Zs, Zl and Zp except the no-break spaces, plus these controls.
# It differs from str.isspace() (e.g. on U+0085 and U+00A0), and EdnReader adds ','.
_JAVA_WHITESPACE_CONTROLS: Final = frozenset("\t\n\u000b\f\r\u001c\u001d\u001e\u001f")
_JAVA_NON_BREAKING_SPACES: Final = frozenset("\u00a0\u2007\u202f")


def _is_edn_whitespace(char: str) -> bool:
    if char == "," or char in _JAVA_WHITESPACE_CONTROLS:
        return True
    return char not in _JAVA_NON_BREAKING_SPACES and unicodedata.category(char) in ("Zs", "Zl", "Zp")


def _edn_refusal(text: str) -> str | None:
    """Why ``clojure.edn/read-string`` would not read ``text`` as exactly that keyword, or None."""
    if not text.startswith(":"):
        return "keyword text must start with ':'"
    for index, char in enumerate(text):
        if index > 0 and (_is_edn_whitespace(char) or char in _TERMINATING_MACROS):
            return (
                f"Clojure's EDN reader ends the keyword at {char!r} (index {index}) and would read "
                f"{text[:index]!r} instead"
            )
        if char in _NON_CONSTITUENTS:
            return f"Clojure's EDN reader refuses {char!r} (index {index}) inside a keyword"
    if text == ":":
        return "the keyword has no name"
    if text.startswith("::"):
        return "'::' is an auto-resolved keyword, which clojure.edn/read-string refuses"
    match = _SYMBOL_PATTERN.fullmatch(text)
    if match is None:
        return "it is not a valid EDN keyword (Clojure: Invalid token)"
    namespace, name = match.group(1), match.group(2)
    if namespace is not None and namespace.endswith(":/"):
        return "the namespace ends with ':' (Clojure: Invalid token)"
    if name.endswith(":"):
        return "the name ends with ':' (Clojure: Invalid token)"
    if text.find("::", 1) != -1:
        return "it contains '::' (Clojure: Invalid token)"
    return None


def _strict_refusal(text: str) -> str | None:
    for index, char in enumerate(text):
        category = unicodedata.category(char)
        if char.isspace() or category in _REFUSED_CATEGORIES:
            name = unicodedata.name(char, f"U+{ord(char):04X}")
            return f"it contains {name} ({char!r}, category {category}) at index {index}"
    return None


@functools.lru_cache(maxsize=4096)
def _to_keyword_text(value: str, what: str) -> str:
    text = value if value.startswith(":") else ":" + value
    reason = _edn_refusal(text) or _strict_refusal(text)
    if reason is not None:
        raise InvalidKeywordError(
            f"invalid {what} {value!r}: {reason}; "
            f"expected a Clojure keyword such as 'my.ns/job-type' or ':my.ns/job-type'"
        )
    return text


def to_keyword_text(value: str, *, what: str) -> str:
    """Return the column text for a queue or job type: ``"a.b/c"`` or ``":a.b/c"`` -> ``":a.b/c"``.

    Raises InvalidKeywordError (naming ``what``) unless ``clojure.edn/read-string`` reads the result back
    as the same keyword; whitespace, control and format characters are refused even where Clojure
    would accept them.
    """
    if not isinstance(value, str):
        raise InvalidKeywordError(f"invalid {what}: expected str, got {type(value).__name__} ({value!r})")
    # A str subclass could override hashing or slicing; the cache and the checks need a plain str.
    return _to_keyword_text(str.__str__(value), what)


@functools.lru_cache(maxsize=4096)
def from_keyword_text(text: str) -> str:
    """Return the name Python code uses for column text: ``":a.b/c"`` -> ``"a.b/c"``.

    Text without a leading colon (written by some other program) is returned unchanged.
    """
    return text[1:] if text.startswith(":") else text
