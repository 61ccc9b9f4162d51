"""Interop proofs against payloads and column text written and read by Proletarian itself (Clojure).

The exemplar files are in tests/data/transit-exemplars/proletarian-interop; its README.txt says how they
were made (Proletarian 1384d7b, transit-clj 1.0.329, Clojure 1.11.1; transit-python 0.8.321). A missing
file fails the tests.
"""

from __future__ import annotations

import datetime
import math
import uuid
from collections import OrderedDict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from support import DATA_DIR, data_path
from transit.transit_types import Keyword, List, Symbol, TaggedValue, false, frozendict, true
from transit_support import canon, utc

from proletarian_ref.errors import InvalidKeywordError
from proletarian_ref.keywords import to_keyword_text
from proletarian_ref.serializers import FrozenMap, TransitSerializer

EXEMPLARS = DATA_DIR / "transit-exemplars"

PLAIN = TransitSerializer()
EXACT = TransitSerializer(exact=True)
K = Keyword
UTC = datetime.UTC

Row = dict[str, str]


@pytest.fixture(scope="module")
def interop_dir() -> Path:
    return data_path("transit-exemplars", "proletarian-interop")


def read_rows(path: Path) -> list[Row]:
    # Split on "\n" only: the unicode rows hold U+2028, which str.splitlines() would also split on.
    with open(path, encoding="utf-8") as file:
        lines = file.read().split("\n")
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:] if line]


def rows_by_name(path: Path, mode: str | None = None) -> dict[str, Row]:
    rows = [row for row in read_rows(path) if mode is None or row["transit_python_mode"] == mode]
    named = {row["name"]: row for row in rows}
    assert len(named) == len(rows), f"duplicate names in {path.name}"
    return named


# --- clj_written.tsv: payloads Proletarian (Clojure) stored -------------------------------------------

EXAMPLE_A_TIME = utc("2023-11-14T22:13:20.123")
CLJ_UUID = uuid.UUID("5a2cbea3-e8c6-428b-b525-21239370dd55")
BIG_MAP_ORDER = (8, 11, 5, 7, 9, 6, 0, 10, 3, 4, 1, 2)

# name -> (plain decode, exact decode), written by hand from the row's Clojure value column.
CLJ_WRITTEN: dict[str, tuple[Any, Any]] = {
    "job_test_vector": (["the-payload"], (K("the-payload"),)),
    "example_a": (
        {"message": "Hello world!", "timestamp": EXAMPLE_A_TIME},
        frozendict({K("message"): "Hello world!", K("timestamp"): EXAMPLE_A_TIME}),
    ),
    "nested_app_payload": (
        {
            "user/id": 42,
            "email": "a@b.c",
            "tags": {"x"},
            "roles": ["admin", "user"],
            "meta": {"source": "web", "ip": None},
            "active": True,
            "score": 1.5,
            "count": 0,
        },
        frozendict(
            {
                K("user/id"): 42,
                K("email"): "a@b.c",
                K("tags"): frozenset({"x"}),
                K("roles"): (K("admin"), K("user")),
                K("meta"): frozendict({K("source"): "web", K("ip"): None}),
                K("active"): true,
                K("score"): 1.5,
                K("count"): 0,
            }
        ),
    ),
    "repeated_keys": (
        [{"email": "a", "name": "n"}, {"email": "b", "name": "m"}, {"email": "c", "name": "o"}],
        tuple(frozendict({K("email"): email, K("name"): name}) for email, name in ("an", "bm", "co")),
    ),
    "uuid": ({"id": CLJ_UUID}, frozendict({K("id"): CLJ_UUID})),
    "ints": (
        [1, -1, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 1],
        (1, -1, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 1),
    ),
    "bigdec": ([Decimal("1.50")], (Decimal("1.50"),)),
    "ratio": ([TaggedValue("ratio", (1, 3))], (TaggedValue("ratio", (1, 3)),)),
    "char": ([TaggedValue("c", "a")], (TaggedValue("c", "a"),)),
    "list": ([1, 2, 3], List((1, 2, 3))),
    "lazy_seq": ([2, 3], List((2, 3))),
    "string_keys": ({"a": 1, "bcde": 2}, frozendict({"a": 1, "bcde": 2})),
    "int_keys": ({1: "one", 2: "two"}, frozendict({1: "one", 2: "two"})),
    "vector_keys": ({(1, 2): "x"}, frozendict({(1, 2): "x"})),
    "nil_payload": (None, None),
    "top_string": ("hello", "hello"),
    "top_keyword": ("hello", K("hello")),
    "java_util_date": (utc("2000-01-01T12:00:00"), utc("2000-01-01T12:00:00")),
    "instant_pre_1970": (utc("1960-06-01T10:00:00.250"), utc("1960-06-01T10:00:00.250")),
    "instant_nanos": (EXAMPLE_A_TIME, EXAMPLE_A_TIME),
    "escaped_strings": (["~x", "^x", "`x", "a~", "~", "^"], ("~x", "^x", "`x", "a~", "~", "^")),
    "symbol": (["foo/bar", "baz"], (Symbol("foo/bar"), Symbol("baz"))),
    "empty_map": ({}, frozendict({})),
    "empty_vector": ([], ()),
    "big_map": (
        {f"k{i}": i for i in BIG_MAP_ORDER},
        frozendict({K(f"k{i}"): i for i in BIG_MAP_ORDER}),
    ),
    "keyword_values": (
        {"status": "status/ok", "kind": "job"},
        frozendict({K("status"): K("status/ok"), K("kind"): K("job")}),
    ),
    # Plain mode keeps Transit's Booleans here: as bools, true and false would merge with 1 and 0.
    "bool_int_set": ({0, 1, true, false}, frozenset({0, 1, true, false})),
    "special_doubles": (
        [math.nan, math.inf, -math.inf, 0.1, 1e300, -0.0],
        (math.nan, math.inf, -math.inf, 0.1, 1e300, -0.0),
    ),
    "unicode": (["é\n\t😀\u2028"], ("é\n\t😀\u2028",)),
    "nil_key_map": ({None: 1, "a": 2}, frozendict({None: 1, K("a"): 2})),
    "same_string_key_and_value": ({"abcd": "abcd"}, frozendict({"abcd": "abcd"})),
    "nested_sets_maps": (
        {"a": {FrozenMap({"b": 1})}, "c": [{"d": {"e"}}]},
        frozendict(
            {
                K("a"): frozenset({frozendict({K("b"): 1})}),
                K("c"): (frozendict({K("d"): frozenset({K("e")})}),),
            }
        ),
    ),
}


def test_every_clj_written_row_has_an_expected_value(interop_dir: Path) -> None:
    names = set(rows_by_name(interop_dir / "clj_written.tsv"))
    assert names - set(CLJ_WRITTEN) == set(), "rows without an expected value in this test"
    assert set(CLJ_WRITTEN) - names == set(), "expected values for rows no longer in the file"


@pytest.mark.parametrize("name", sorted(CLJ_WRITTEN))
def test_payloads_written_by_proletarian_decode_to_the_values_clojure_reads(
    interop_dir: Path, name: str
) -> None:
    row = rows_by_name(interop_dir / "clj_written.tsv")[name]
    plain, exact = CLJ_WRITTEN[name]
    assert canon(PLAIN.decode(row["payload_written_by_proletarian_clojure"])) == canon(plain)
    assert canon(EXACT.decode(row["payload_written_by_proletarian_clojure"])) == canon(exact)


# --- py_written.tsv: payloads transit-python wrote and Clojure read -----------------------------------

PLUS_TWO = datetime.timezone(datetime.timedelta(hours=2))

# name -> the Python value given to our encoder for the row's Clojure value.
PY_WRITTEN: dict[str, Any] = {
    "str_keys": frozendict({"email": "a@b.c", "count": 3}),  # a frozendict keeps str keys as strings
    "keyword_keys": {"email": "a@b.c", "count": 3},
    "example_a_from_python": {"message": "Hello world!", "timestamp": utc("2023-11-14T22:13:20.123456")},
    "job_test_vector": [K("the-payload")],
    "nested_app_payload": {
        "user/id": 42,
        "email": "a@b.c",
        "tags": {"x"},
        "roles": [K("admin"), K("user")],
        "meta": {"source": "web", "ip": None},
        "active": True,
        "score": 1.5,
        "count": 0,
    },
    "ints": [1, -1, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**70],
    "bigdec": [Decimal("1.50")],
    "uuid": {"id": CLJ_UUID},
    "top_string": "hello",
    "nil_payload": None,
    "top_keyword": K("hello"),
    "tuple_keys": {(1, 2): "x"},
    "same_string_key_and_value": frozendict({"abcd": "abcd"}),
    "repeated_keys": [{"email": "a", "name": "n"}, {"email": "b", "name": "m"}],
    "floats": [0.1, 1e300, math.nan, math.inf, -0.0, 2.0],
    "unicode": ["é\n\t😀\u2028"],
    "bools": [True, False, True, False],
    "clojure_list": List([1, 2, 3]),
    "ordered_dict_with_cmap": OrderedDict([("a", OrderedDict([((1,), 2)]))]),
    "nil_key": {None: 1, "a": 2},
    "int_keys": {1: "one", 2: "two"},
    "set_mixed": {3, "a", K("b")},
    "datetime_plus2": datetime.datetime(2023, 11, 15, 0, 13, 20, 123456, tzinfo=PLUS_TWO),
    "datetime_pre_1970": utc("1960-06-01T10:00:00.250999"),
    "keyword_values": {"status": K("status/ok"), "kind": K("job")},
    "symbols": [Symbol("foo/bar")],
    "escaped_strings": ["~x", "^x", "`x", "a~", "~", "^"],
    "ratio_tagged": [TaggedValue("ratio", [1, 3])],
    "char_tagged": [TaggedValue("c", "a")],
    "empty": [{}, [], set()],
}
# Element order of a set with several elements changes between Python processes.
PY_WRITTEN_UNORDERED = {"set_mixed"}
# transit-python's native writer does not handle OrderedDict, so this row's native payload came from
# its pure-Python fallback ({"~#cmap": ...}); we write transit-java's ["~#cmap", ...] form.
PY_WRITTEN_NOT_NATIVE_FORM = {"ordered_dict_with_cmap"}
# transit-python writes these as Python's json module does (1e+300, a raw 😀); we write Proletarian's
# text (Double.toString, Jackson's escaped surrogate pair): test_transit_json.py pins each rule.
PY_WRITTEN_AS_PROLETARIAN_WRITES = {
    "floats": '[0.1,1.0E300,"~zNaN","~zINF",-0.0,2.0]',
    "unicode": '["é\\n\\t\\uD83D\\uDE00\u2028"]',
}


def test_every_py_written_row_has_a_python_value(interop_dir: Path) -> None:
    for mode in ("native", "pure"):
        names = set(rows_by_name(interop_dir / "py_written.tsv", mode))
        assert names - set(PY_WRITTEN) == set(), f"{mode} rows without a Python value in this test"
        assert set(PY_WRITTEN) - names == set(), f"Python values for {mode} rows no longer in the file"


@pytest.mark.parametrize("name", sorted(PY_WRITTEN))
def test_our_payloads_are_the_ones_clojure_was_shown_to_read(interop_dir: Path, name: str) -> None:
    native = rows_by_name(interop_dir / "py_written.tsv", "native")[name]
    pure = rows_by_name(interop_dir / "py_written.tsv", "pure")[name]
    for row in (native, pure):
        assert row["clojure_decode_status"] == "OK"
    assert native["clojure_value_after_proletarian_decode"] == pure["clojure_value_after_proletarian_decode"]

    ours = PLAIN.encode(PY_WRITTEN[name])
    for row in (native, pure):
        assert canon(EXACT.decode(ours)) == canon(EXACT.decode(row["payload_written_by_transit_python"]))
    if name in PY_WRITTEN_AS_PROLETARIAN_WRITES:
        assert ours == PY_WRITTEN_AS_PROLETARIAN_WRITES[name]
    elif name not in PY_WRITTEN_UNORDERED | PY_WRITTEN_NOT_NATIVE_FORM:
        assert ours == native["payload_written_by_transit_python"]


# --- clj_written.tsv again: re-encoding gives Proletarian's own text, byte for byte --------------------

# Rows whose Clojure value holds something Python has no type for, so writing it back cannot give the
# same bytes; each maps to the exact text we write instead, which py_reencoded.tsv shows Clojure reads as
# equal. Clojure's BigInt 1N (`"~n1"`) is a small number that transit-python reads as int, and a small
# int is a Long ("1"): Python has one integer type, so the BigInt-ness of a small value is not kept.
NOT_REPRESENTABLE = {
    "ints": '[1,-1,9007199254740991,"~i9007199254740992","~i9223372036854775807","~n9223372036854775808",1]',
    "ratio": '[["~#ratio",[1,3]]]',  # a Ratio's numerator and denominator are BigInts 1N and 3N
}
# A set's elements come out in Python's iteration order, not in the hash order of Clojure's set (no
# Clojure hashing here); Clojure reads any order as the same set.
UNORDERED = {"bool_int_set"}


def test_every_clj_written_row_was_reencoded(interop_dir: Path) -> None:
    assert set(rows_by_name(interop_dir / "py_reencoded.tsv", "native")) == set(CLJ_WRITTEN)


def assert_same_set_text(ours: str, theirs: str) -> None:
    """Only the order of set elements may differ: same value, and the same characters."""
    assert canon(EXACT.decode(ours)) == canon(EXACT.decode(theirs))
    assert sorted(ours) == sorted(theirs)


@pytest.mark.parametrize("name", sorted(CLJ_WRITTEN))
def test_reencoding_an_exact_decode_gives_proletarians_text_byte_for_byte(
    interop_dir: Path, name: str
) -> None:
    original = rows_by_name(interop_dir / "clj_written.tsv")[name]["payload_written_by_proletarian_clojure"]
    # Clojure read transit-python's own re-encoding as equal too (before ours matched byte for byte).
    reencoded = rows_by_name(interop_dir / "py_reencoded.tsv", "native")[name]
    assert reencoded["clojure_equal_to_its_own_roundtrip"] == "EQUAL"

    ours = EXACT.encode(EXACT.decode(original))
    if name in NOT_REPRESENTABLE:
        assert ours == NOT_REPRESENTABLE[name]
        assert ours != original
    elif name in UNORDERED:
        assert_same_set_text(ours, original)
    else:
        assert ours.encode("utf-8") == original.encode("utf-8")


# --- the official exemplars (transit-format examples/0.8, written by transit-clj) ---------------------

EXEMPLARS_DIR = EXEMPLARS / "examples" / "0.8"
# Clojure hash-set element order (see UNORDERED); every other exemplar value is of a kind we write.
EXEMPLARS_WITH_SETS = {"simple/set_mixed.json", "simple/set_nested.json", "simple/set_simple.json"}


def exemplar_files() -> list[str]:
    simple = sorted(
        f"simple/{path.name}"
        for path in (EXEMPLARS_DIR / "simple").glob("*.json")
        if not path.name.endswith(".verbose.json")
    )
    return ["example.json", *simple] if simple else []


@pytest.fixture(scope="module")
def exemplars_dir() -> Path:
    return data_path("transit-exemplars", "examples", "0.8")


def test_the_exemplars_are_all_here(exemplars_dir: Path) -> None:
    assert len(exemplar_files()) == 1 + 67
    assert set(exemplar_files()) >= EXEMPLARS_WITH_SETS


@pytest.mark.parametrize("name", exemplar_files())
def test_reencoding_a_transit_clj_exemplar_gives_its_bytes(exemplars_dir: Path, name: str) -> None:
    # example.json ends with a newline the file's writer added; transit's own text stops before it.
    original = (exemplars_dir / name).read_text(encoding="utf-8").removesuffix("\n")
    ours = EXACT.encode(EXACT.decode(original))
    if name in EXEMPLARS_WITH_SETS:
        assert_same_set_text(ours, original)
    else:
        assert ours.encode("utf-8") == original.encode("utf-8")


# --- job_type_text.tsv: what clojure.edn/read-string makes of the queue and job_type columns ---------


def test_keyword_validation_accepts_exactly_the_text_clojure_reads_as_that_keyword(interop_dir: Path) -> None:
    rows = read_rows(interop_dir / "job_type_text.tsv")
    assert len(rows) == 13
    for row in rows:
        text, clojure = row["text_in_job_type_column"], row["clojure_edn_read_string_result"]
        if clojure.startswith("ERROR"):
            with pytest.raises(InvalidKeywordError):
                to_keyword_text(text, what="job_type")
        elif clojure.endswith(" (Symbol)"):
            # Clojure reads a bare name as a symbol, so we never store it bare: we add the colon.
            assert to_keyword_text(text, what="job_type") == ":" + text
        elif clojure.removesuffix(" (Keyword)") == text:
            assert to_keyword_text(text, what="job_type") == text
        else:
            # Clojure reads some other keyword (":has space" -> :has), so the text is refused.
            with pytest.raises(InvalidKeywordError):
                to_keyword_text(text, what="job_type")


# --- claims in the spec (section 5.4) -----------------------------------------------------------------


def test_the_payload_vector_of_a_keyword_encodes_as_in_proletarians_job_test() -> None:
    assert PLAIN.encode([K("the-payload")]) == '["~:the-payload"]'


def test_a_top_level_string_is_wrapped_in_a_quote() -> None:
    assert PLAIN.encode("foo") == '["~#\'","foo"]'


def test_a_vector_of_two_maps_uses_the_key_cache() -> None:
    assert PLAIN.encode([{"email": "a"}, {"email": "b"}]) == '[["^ ","~:email","a"],["^ ","^0","b"]]'


def test_a_utc_datetime_is_written_as_epoch_milliseconds() -> None:
    assert PLAIN.encode({"at": utc("2021-01-06T20:43:42.451")}) == '["^ ","~:at","~m1609965822451"]'


def test_the_readme_example_decodes_to_keyword_keys_and_an_aware_utc_datetime() -> None:
    value = EXACT.decode('["^ ","~:message","Hello world!","~:timestamp","~m1700000000123"]')
    assert type(value) is frozendict
    assert value[K("message")] == "Hello world!"
    assert value[K("timestamp")] == EXAMPLE_A_TIME
    assert value[K("timestamp")].tzinfo is UTC
