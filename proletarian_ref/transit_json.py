"""JSON text of strings, doubles and big decimals exactly as transit-java (Jackson 2.x, JDK 19+) writes it.

transit-java writes through ``new JsonFactory().createGenerator(OutputStream)``, a Jackson
``UTF8JsonGenerator`` with default features, and ``JsonEmitter`` hands it strings (``writeString``),
doubles (``writeNumber(double)``, i.e. ``Double.toString``) and longs (``writeNumber(long)``). BigDecimal
and BigInteger reach the JSON as ``"~f" + BigDecimal.toString()`` and ``"~n" + BigInteger.toString()``.
The rules, with the source each follows, are listed in docs/transit.md.

It also reads JSON text without recursion (:func:`parse_json`), for payloads nested deeper than the
standard library's scanner, which recurses once per level, can go.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal
from fractions import Fraction
from json import JSONDecodeError
from json.decoder import scanstring  # type: ignore[attr-defined]  # public, untyped
from typing import Any, Final

__all__ = ["NestingTooDeepError", "big_decimal_text", "double_text", "parse_json", "string_text"]

# Jackson's CharTypes.sOutputEscapes128: '"' and '\' and the five short escapes; every other char below
# U+0020 as \u00XX with upper-case hex (JsonWriteFeature.WRITE_HEX_UPPER_CASE is on by default).
_SHORT_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_ESCAPES: Final = {chr(code): f"\\u{code:04X}" for code in range(0x20)} | _SHORT_ESCAPES
# What UTF8JsonGenerator does not write as itself: the escapes above, and every UTF-16 surrogate, which
# _outputMultiByteChar writes as \uXXXX, one escape per code unit. A char outside the BMP is two code
# units in Java, so it becomes an escaped surrogate pair; a lone surrogate is escaped alone. U+007F,
# '/', U+2028 and U+2029 and all other BMP chars are written as themselves (in UTF-8).
_NEEDS_ESCAPE: Final = re.compile('["\\\\\x00-\x1f\ud800-\udfff\U00010000-\U0010ffff]')


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    escape = _ESCAPES.get(char)
    if escape is not None:
        return escape
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04X}"  # a lone surrogate
    code -= 0x10000
    return f"\\u{0xD800 | code >> 10:04X}\\u{0xDC00 | code & 0x3FF:04X}"


def string_text(value: str) -> str:
    """``value`` as a JSON string, as Jackson's ``UTF8JsonGenerator.writeString`` writes it."""
    if _NEEDS_ESCAPE.search(value) is None:
        return '"' + value + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape, value) + '"'


_MIN_NORMAL: Final = 2.2250738585072014e-308


def double_text(value: float) -> str:
    """A finite ``value`` as ``Double.toString`` writes it on JDK 19 and later.

    Python's ``repr`` gives the same shortest, closest digit string (JDK 19's Double.toString,
    Raffaello Giulietti's algorithm, is specified that way); only the layout differs. Java writes plain
    notation for 1e-3 <= |value| < 1e7 and otherwise ``d.dddEn``, always with a digit after the point.
    """
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7 or magnitude == 0.0:
        return repr(value)  # plain notation with at least one fraction digit ('-0.0', '0.5', '100.0')
    digits, exponent = _shortest_digits(magnitude)
    if len(digits) == 1 and magnitude < _MIN_NORMAL:
        digits, exponent = _closest_two_digits(magnitude, digits, exponent)
    sign = "-" if value < 0.0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exponent}"


def _shortest_digits(magnitude: float) -> tuple[str, int]:
    """The significant digits of ``repr(magnitude)`` and the decimal exponent of the first one."""
    mantissa, _, exponent_text = repr(magnitude).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    significant = digits.lstrip("0")
    exponent = len(whole) - 1 + int(exponent_text or 0) - (len(digits) - len(significant))
    return significant.rstrip("0"), exponent


def _closest_two_digits(magnitude: float, digits: str, exponent: int) -> tuple[str, int]:
    """JDK 19+ Double.toString: when one digit is enough, the closest decimal of at most two digits wins.

    Only a subnormal with few significant bits has a two-digit decimal closer than its one-digit
    shortest form that still reads back as itself: Double.MIN_VALUE is ``4.9E-324`` in Java, ``5e-324``
    in Python.
    """
    exact = Fraction(magnitude)
    quantum = Decimal(magnitude).adjusted() - 1  # two digits in the decade of the exact value
    scale = Fraction(10) ** quantum
    low = int(exact / scale)
    best: tuple[Fraction, int, int] | None = None
    for candidate in (low, low + 1):
        if float(candidate * scale) != magnitude:
            continue
        key = (abs(candidate * scale - exact), candidate % 2, candidate)
        if best is None or key < best:
            best = key
    if best is None:
        return digits, exponent
    text = str(best[2])
    return text.rstrip("0"), quantum + len(text) - 1


_BIG_DECIMAL: Final = Context(capitals=1)


def big_decimal_text(value: Decimal) -> str:
    """A finite ``value`` as ``BigDecimal.toString`` writes it.

    Both follow the General Decimal Arithmetic to-scientific-string rule (plain notation unless the
    exponent is positive or the adjusted exponent is below -6: ``1E+3``, ``1E-8``, ``0.000001``). A
    BigDecimal has no negative zero, so ``-0.00`` is written ``0.00``.
    """
    if value.is_zero() and value.is_signed():
        value = value.copy_abs()
    return _BIG_DECIMAL.to_sci_string(value)


# ---------------------------------------------------------------------------------------------------
# Reading JSON without recursion


class NestingTooDeepError(ValueError):
    """JSON text whose arrays and objects nest deeper than the limit :func:`parse_json` was given."""


_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")
# json.scanner.NUMBER_RE with ASCII digits only, as the C scanner reads them.
_NUMBER: Final = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_LITERALS: Final = (("null", None), ("true", True), ("false", False))
_CONSTANTS: Final = ("NaN", "Infinity", "-Infinity")


def parse_json(text: str, max_depth: int) -> Any:  # noqa: PLR0915  # one loop: no call per level
    """``json.loads(text)`` with an explicit stack instead of recursion, so its depth costs no C stack.

    It gives the same values as the standard library (``int`` or ``float`` as the number is written,
    the last of duplicate object keys) and raises :class:`json.JSONDecodeError` where it would; NaN and
    Infinity, which the standard library takes, are refused as they are not JSON. Arrays and objects
    nested more than ``max_depth`` deep raise :class:`NestingTooDeepError`.
    """
    end = len(text)
    # Open containers, innermost last, and for each open object the key its next value goes to.
    open_: list[Any] = []
    keys: list[Any] = []
    pos = _WHITESPACE.match(text, 0).end()  # type: ignore[union-attr]  # matches the empty string
    while True:
        # A value starts at pos.
        char = text[pos : pos + 1]
        if char in ("[", "{"):
            if len(open_) >= max_depth:
                raise NestingTooDeepError(f"JSON nested more than {max_depth} levels deep")
            pos = _WHITESPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
            if char == "[":
                if text[pos : pos + 1] != "]":
                    open_.append([])
                    keys.append(None)
                    continue
                value: Any = []
            else:
                if text[pos : pos + 1] != "}":
                    key, pos = _object_key(text, pos)
                    open_.append({})
                    keys.append(key)
                    continue
                value = {}
            pos += 1
        elif char == '"':
            value, pos = scanstring(text, pos + 1, True)
        else:
            value, pos = _scalar(text, pos)
        # A value ends at pos: add it to the innermost open container, closing those that end here.
        while True:
            if not open_:
                pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
                if pos != end:
                    raise JSONDecodeError("Extra data", text, pos)
                return value
            container = open_[-1]
            if type(container) is list:
                container.append(value)
            else:
                container[keys[-1]] = value
            pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
            char = text[pos : pos + 1]
            if char == ",":
                pos = _WHITESPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
                if type(container) is dict:
                    keys[-1], pos = _object_key(text, pos)
                break
            if char == ("]" if type(container) is list else "}"):
                value = open_.pop()
                keys.pop()
                pos += 1
                continue
            delimiter = "," if type(container) is list else "',' or '}'"
            raise JSONDecodeError(f"Expecting {delimiter!s} delimiter", text, pos)


def _object_key(text: str, pos: int) -> tuple[str, int]:
    """The key starting at ``pos`` and the position of its value, past the colon and whitespace."""
    if text[pos : pos + 1] != '"':
        raise JSONDecodeError("Expecting property name enclosed in double quotes", text, pos)
    key, pos = scanstring(text, pos + 1, True)
    pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
    if text[pos : pos + 1] != ":":
        raise JSONDecodeError("Expecting ':' delimiter", text, pos)
    return key, _WHITESPACE.match(text, pos + 1).end()  # type: ignore[union-attr]


def _scalar(text: str, pos: int) -> tuple[Any, int]:
    """The number or literal starting at ``pos`` and the position after it."""
    match = _NUMBER.match(text, pos)
    if match is not None:
        integer, fraction, exponent = match.groups()
        if fraction or exponent:
            return float(integer + (fraction or "") + (exponent or "")), match.end()
        return int(integer), match.end()
    for name, value in _LITERALS:
        if text.startswith(name, pos):
            return value, pos + len(name)
    for name in _CONSTANTS:
        if text.startswith(name, pos):
            raise ValueError(f"{name} is not JSON (Transit writes it as ~z)")
    raise JSONDecodeError("Expecting value", text, pos)
