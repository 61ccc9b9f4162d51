"""Golden vectors: the exact payload text Proletarian (transit-java 1.0.362 on Jackson 2.14) writes.

Each vector cites the class whose rule it pins. Sources read: jackson-core 2.14.1 (UTF8JsonGenerator,
CharTypes, NumberOutput), transit-java (JsonEmitter, AbstractEmitter, WriteCache, WriteHandlerMap,
WriterFactory) and msolli/proletarian (proletarian.transit/encode: a ByteArrayOutputStream read back as
UTF-8). tests/test_transit_json_jvm.py checks the same rules against Jackson itself on a JVM.
"""

from __future__ import annotations

import math
import os
import re
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transit.transit_types import Keyword, frozendict
from transit_support import DECIMALS_JAVA_REFUSES, canon

from conformance.harness import SqlHarness
from proletarian_ref import enqueue, process_next_job
from proletarian_ref.errors import SerializationError
from proletarian_ref.serializers import TransitSerializer
from proletarian_ref.transit_json import big_decimal_text, double_text, string_text

PLAIN = TransitSerializer()
EXACT = TransitSerializer(exact=True)
K = Keyword

# --- strings: UTF8JsonGenerator._writeStringSegment2 with CharTypes.sOutputEscapes128 -----------------

STRINGS = [
    pytest.param("é ü € 中", '["é ü € 中"]', id="non-ASCII BMP chars as themselves (UTF-8)"),
    # _outputMultiByteChar escapes each UTF-16 surrogate code unit: a non-BMP char is an escaped pair.
    pytest.param("😀", '["\\uD83D\\uDE00"]', id="non-BMP char as an escaped surrogate pair"),
    pytest.param("a\U0010ffffb", '["a\\uDBFF\\uDFFFb"]', id="last code point"),
    # sOutputEscapes128: '"', '\' and \b \t \n \f \r are short escapes; the other chars below U+0020
    # are \u00XX with upper-case hex (JsonWriteFeature.WRITE_HEX_UPPER_CASE defaults to true).
    pytest.param(
        "\x00\x01\x07\x08\t\n\x0b\x0c\r\x0e\x1a\x1f",
        '["\\u0000\\u0001\\u0007\\b\\t\\n\\u000B\\f\\r\\u000E\\u001A\\u001F"]',
        id="control chars",
    ),
    pytest.param('say "hi" \\o/', '["say \\"hi\\" \\\\o/"]', id="quote and backslash; slash not escaped"),
    pytest.param("</script>", '["</script>"]', id="slash as itself"),
    pytest.param("\x7f", '["\x7f"]', id="U+007F as itself (outside the 128-entry table's escapes)"),
    pytest.param("a\u2028b\u2029c", '["a\u2028b\u2029c"]', id="U+2028 and U+2029 as themselves"),
    pytest.param("\ue000\uffff", '["\ue000\uffff"]', id="BMP chars above the surrogates as themselves"),
    # AbstractEmitter.escape: a string starting with ~ ^ or ` gets a leading ~; nowhere else.
    pytest.param(["~a", "^ ", "`b", "a~^`"], '["~~a","~^ ","~`b","a~^`"]', id="Transit escapes"),
]


@pytest.mark.parametrize(("value", "text"), STRINGS)
def test_strings_are_written_as_jackson_writes_them(value: Any, text: str) -> None:
    payload = value if isinstance(value, list) else [value]
    assert PLAIN.encode(payload) == text
    assert canon(EXACT.decode(text)) == canon(tuple(payload))


def test_a_lone_surrogate_is_escaped_as_jackson_does_but_a_payload_holding_one_is_refused() -> None:
    # Jackson writes a lone surrogate as its own \uXXXX escape (_outputMultiByteChar), so Proletarian
    # stores "\uD800". We refuse it on purpose (docs/transit.md): in Python it is the mark of undecodable
    # bytes (surrogateescape), not text, and no UTF-8 consumer of the job could read it back as written.
    assert string_text("a\ud800b\udc00") == '"a\\uD800b\\uDC00"'
    with pytest.raises(SerializationError, match="lone surrogate"):
        PLAIN.encode(["a\ud800"])
    # Reading stays lenient: a payload Proletarian wrote with one decodes to that str.
    assert EXACT.decode('["a\\uD800"]') == ("a\ud800",)


def test_a_map_key_is_escaped_like_a_string_value() -> None:
    # AbstractEmitter.marshal: a String key goes through the same escape() and emitString.
    value = frozendict({"~a": 1, "^b": 2, "`c": 3, "^ ": 4, "😀": 5})
    assert EXACT.encode(value) == '["^ ","~~a",1,"~^b",2,"~`c",3,"~^ ",4,"\\uD83D\\uDE00",5]'
    assert EXACT.decode(EXACT.encode(value)) == value


# --- doubles: UTF8JsonGenerator.writeNumber(double) -> NumberOutput.toString(d, false) = Double.toString --

DOUBLES = [
    (0.5, "0.5"),
    (0.1, "0.1"),
    (1.0, "1.0"),  # integral: still one digit after the point
    (100.0, "100.0"),
    (0.0, "0.0"),
    (-0.0, "-0.0"),
    (-2.5, "-2.5"),
    (0.001, "0.001"),  # plain from 1e-3 ...
    (9999999.0, "9999999.0"),  # ... to below 1e7
    (1e7, "1.0E7"),  # E notation from 1e7 up
    (123456789.125, "1.23456789125E8"),
    (0.0009, "9.0E-4"),  # and below 1e-3
    (1e-7, "1.0E-7"),
    (-2.5e-5, "-2.5E-5"),
    (1e16, "1.0E16"),
    (1e20, "1.0E20"),
    (1e300, "1.0E300"),
    (1.7976931348623157e308, "1.7976931348623157E308"),
    (2.2250738585072014e-308, "2.2250738585072014E-308"),  # smallest normal
    # Subnormals: when one digit suffices, JDK 19+ still picks the closest decimal of two digits.
    (5e-324, "4.9E-324"),  # Double.MIN_VALUE
    (1e-323, "9.9E-324"),  # 2 * MIN_VALUE
    (1.5e-323, "1.5E-323"),
    (1e-310, "1.0E-310"),
]


@pytest.mark.parametrize(("value", "text"), DOUBLES, ids=[text for _, text in DOUBLES])
def test_doubles_are_written_as_java_double_to_string(value: float, text: str) -> None:
    assert double_text(value) == text
    assert PLAIN.encode([value]) == f"[{text}]"
    assert canon(EXACT.decode(f"[{text}]")) == canon((value,))


def test_non_finite_doubles_are_transit_z_strings() -> None:
    # transit-java WriteHandlers.DoubleWriteHandler: tag "z", rep "NaN" / "INF" / "-INF".
    assert PLAIN.encode([math.nan, math.inf, -math.inf]) == '["~zNaN","~zINF","~z-INF"]'
    assert PLAIN.encode({math.inf: 1}) == '["^ ","~zINF",1]'


def test_a_double_map_key_is_tilde_d_and_double_to_string() -> None:
    # JsonEmitter.emitDouble(Object, asMapKey=true): "~d" + d.toString().
    assert PLAIN.encode({1e20: 1, 0.5: 2, -0.0: 3}) == '["^ ","~d1.0E20",1,"~d0.5",2,"~d-0.0",3]'
    assert PLAIN.decode('["^ ","~d1.0E20",1]') == {1e20: 1}


def test_a_top_level_double_is_quoted() -> None:
    assert PLAIN.encode(1e20) == '["~#\'",1.0E20]'


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_double_text_is_the_shortest_digits_in_javas_layout(value: float) -> None:
    text = double_text(value)
    assert float(text) == value and math.copysign(1.0, float(text)) == math.copysign(1.0, value)
    if 1e-3 <= abs(value) < 1e7 or value == 0.0:
        assert text == repr(value)  # the same plain notation, with ".0" when integral
    else:
        # Double.toString's computerized scientific notation: one digit, the point, at least one more.
        assert re.fullmatch(r"-?[1-9]\.(0|[0-9]*[1-9])E-?[1-9][0-9]*", text), text


# --- integers: JsonEmitter.emitInteger (JSON_INT_MAX = 2^53 - 1), BigInteger -> "~n" + toString ---------


def test_integers_are_numbers_up_to_2_53_then_tilde_i_then_tilde_n_past_64_bits() -> None:
    values = [2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**70]
    assert PLAIN.encode(values) == (
        "[9007199254740991,-9007199254740991,"
        '"~i9007199254740992","~i-9007199254740992","~i9223372036854775807","~i-9223372036854775808",'
        '"~n9223372036854775808","~n-9223372036854775809","~n1180591620717411303424"]'
    )
    assert PLAIN.decode(PLAIN.encode(values)) == values


def test_an_integer_map_key_is_always_tilde_i() -> None:
    # JsonEmitter.emitInteger: asMapKey -> "~i" + value, whatever its size.
    assert PLAIN.encode({1: "a", 2**63: "b"}) == '["^ ","~i1","a","~n9223372036854775808","b"]'


# --- big decimals: WriteHandlerMap maps BigDecimal to ToStringWriteHandler("f"): BigDecimal.toString ----

DECIMALS = [
    ("1.50", "1.50"),
    ("1000", "1000"),
    ("1E+3", "1E+3"),  # negative scale: scientific
    ("-1.5E+10", "-1.5E+10"),
    ("0.000001", "0.000001"),  # adjusted exponent -6: still plain
    ("0.00000001", "1E-8"),  # below -6: scientific
    ("0.000000123", "1.23E-7"),
    ("123E-2", "1.23"),
    ("-0.00", "0.00"),  # BigDecimal has no negative zero
    ("-0", "0"),
    ("0E+2", "0E+2"),
]


@pytest.mark.parametrize(("given_text", "text"), DECIMALS, ids=[given for given, _ in DECIMALS])
def test_decimals_are_written_as_java_big_decimal_to_string(given_text: str, text: str) -> None:
    assert big_decimal_text(Decimal(given_text)) == text
    assert PLAIN.encode([Decimal(given_text)]) == f'["~f{text}"]'
    assert PLAIN.encode({Decimal(given_text): 1}) == f'["^ ","~f{text}",1]'


def test_a_decimal_beyond_a_java_int_scale_is_refused_rather_than_stored_unreadable() -> None:
    # new BigDecimal(text) needs the written exponent and the scale to be Java ints; the oracle in
    # test_transit_json_jvm.py checks these very values against the JVM.
    assert PLAIN.encode([Decimal("1E+2147483647")]) == '["~f1E+2147483647"]'
    assert PLAIN.encode([Decimal("12E-2147483647")]) == '["~f1.2E-2147483646"]'
    for text in DECIMALS_JAVA_REFUSES:
        with pytest.raises(SerializationError, match="beyond Java's BigDecimal"):
            PLAIN.encode([Decimal(text)])


# --- the key cache: transit-java WriteCache (44 one-char codes, then two chars, reset at 44 * 44) -------


def test_the_45th_cached_key_gets_a_two_char_code() -> None:
    # WriteCache.indexToCode: index 43 -> "^" + chr(48 + 43) = "^[", index 44 -> "^1" + "0".
    maps = [{f"k{i:02}": i} for i in range(45)]
    text = PLAIN.encode([*maps, {"k43": 43, "k44": 44}])
    assert text.endswith('["^ ","~:k44",44],["^ ","^[",43,"^10",44]]')
    assert PLAIN.decode(text)[-1] == {"k43": 43, "k44": 44}


def test_the_cache_starts_over_after_44_times_44_entries() -> None:
    # WriteCache.cacheWrite: when index == MAX_CACHE_ENTRIES (1936) a new entry first clears the cache.
    # The exemplars map_1936_nested / map_1937_nested (test_interop.py) pin the same rule.
    maps = [{f"k{i:04}": i} for i in range(1937)]
    text = PLAIN.encode([*maps, {"k1935": 0}, {"k0000": 0}, {"k1936": 0}])
    # k1936 was entry 1937: the cache was cleared and it became "^0"; k1935 was cleared with it, so it is
    # written out again (and becomes "^1"), as is k0000 ("^2").
    assert text.endswith('["^ ","~:k1936",1936],["^ ","~:k1935",0],["^ ","~:k0000",0],["^ ","^0",0]]')
    assert PLAIN.decode(text)[-3:] == [{"k1935": 0}, {"k0000": 0}, {"k1936": 0}]


# --- reading stays lenient: other spellings of the same value read the same --------------------------


@pytest.mark.parametrize(
    ("spellings", "value"),
    [
        (['["😀"]', '["\\uD83D\\uDE00"]', '["\\ud83d\\ude00"]'], ("😀",)),
        (['["\\u000B"]', '["\\u000b"]'], ("\x0b",)),
        (['["\\/"]', '["/"]'], ("/",)),
        (["[1e+20]", "[1.0E20]", "[1E20]", "[100000000000000000000.0]"], (1e20,)),
        (["[5e-324]", "[4.9E-324]"], (5e-324,)),
        (["[1e-07]", "[1.0E-7]"], (1e-7,)),
    ],
)
def test_reading_accepts_other_spellings_of_the_same_value(spellings: list[str], value: Any) -> None:
    for text in spellings:
        assert canon(EXACT.decode(text)) == canon(value), text


# --- the point of escaping non-BMP chars: a utf8mb3 column stores the payload ------------------------


def test_a_non_bmp_payload_enqueues_into_a_mysql_utf8mb3_table_and_reads_back(mysql_db: SqlHarness) -> None:
    table, archived = mysql_db.job_table + "_mb3", mysql_db.archived_job_table + "_mb3"
    columns = (
        "job_id BINARY(16) PRIMARY KEY, queue TEXT NOT NULL, job_type TEXT NOT NULL, payload TEXT NOT NULL, "
        "attempts INTEGER NOT NULL, enqueued_at TIMESTAMP NOT NULL, process_at TIMESTAMP NOT NULL"
    )
    for name in (table, archived):
        mysql_db.execute(f"DROP TABLE IF EXISTS {name}")
    mysql_db.execute(f"CREATE TABLE {table} ({columns}) CHARSET=utf8mb3")
    mysql_db.execute(
        f"CREATE TABLE {archived} ({columns}, status TEXT NOT NULL, finished_at TIMESTAMP NOT NULL) "
        "CHARSET=utf8mb3"
    )
    payload = {"face": "😀", "name": "Zoë"}
    try:
        conn = mysql_db.connect()
        try:
            # The table really refuses 4-byte UTF-8 (error 1366), which is what a raw 😀 would need.
            with conn.cursor() as cursor, pytest.raises(Exception, match="1366"):
                cursor.execute(
                    f"INSERT INTO {table} (job_id, queue, job_type, payload, attempts, "
                    "enqueued_at, process_at) VALUES (%s, ':q', ':t', %s, 0, NOW(), NOW())",
                    (os.urandom(16), '["😀"]'),
                )
            conn.rollback()
            enqueue(conn, "greet", payload, job_table=table)
            conn.commit()
        finally:
            conn.close()
        assert mysql_db.select(f"SELECT payload FROM {table}") == [
            ('["^ ","~:face","\\uD83D\\uDE00","~:name","Zoë"]',)
        ]
        seen: list[Any] = []
        options: dict[str, Any] = {"job_table": table, "archived_job_table": archived}
        assert process_next_job(mysql_db.data_source, lambda _, data: seen.append(data), **options)
        assert seen == [payload]
        assert mysql_db.select(f"SELECT status FROM {archived}") == [(":success",)]
    finally:
        for name in (table, archived):
            mysql_db.execute(f"DROP TABLE IF EXISTS {name}")
