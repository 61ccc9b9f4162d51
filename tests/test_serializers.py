"""Tests for the Transit JSON payload codec (encode rules, plain and exact decoding, errors)."""

from __future__ import annotations

import datetime
import enum
import json
import math
import uuid
from collections import OrderedDict
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from transit.transit_types import Keyword, List, Symbol, TaggedValue, false, frozendict, true
from transit_support import canon, utc

from proletarian_ref import serializers
from proletarian_ref.errors import PayloadDecodeError, ProletarianError, SerializationError
from proletarian_ref.serializers import FrozenMap, Serializer, TransitSerializer, create_serializer

UTC = datetime.UTC
PLAIN = TransitSerializer()
EXACT = TransitSerializer(exact=True)
K = Keyword


@pytest.fixture(autouse=True, scope="module", params=["recursion first", "iterative only"])
def walk(request: pytest.FixtureRequest) -> Any:
    """Every test here twice: as payloads go (the recursive paths, ordinary payloads being shallow),
    and with no recursion budget, so that the iterative paths deep payloads take give the same
    results and errors."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "iterative only":
            patch.setattr(serializers, "_RECURSION_BUDGET", 0)
        yield request.param


# --- encoding ----------------------------------------------------------------------------------------


def test_str_dict_keys_are_written_as_keywords() -> None:
    assert PLAIN.encode({"email": "a"}) == '["^ ","~:email","a"]'


def test_str_keys_are_written_as_keywords_at_every_nesting_level() -> None:
    payload = {"user": {"id": 1, "roles": [{"name": "admin"}]}, "tags": [{"k": "v"}]}
    assert PLAIN.encode(payload) == (
        '["^ ","~:user",["^ ","~:id",1,"~:roles",[["^ ","~:name","admin"]]],"~:tags",[["^ ","~:k","v"]]]'
    )


def test_namespaced_str_keys_become_namespaced_keywords() -> None:
    assert PLAIN.encode({"user/id": 42}) == '["^ ","~:user/id",42]'


def test_keyword_keys_stay_keywords() -> None:
    assert PLAIN.encode({K("email"): "a"}) == '["^ ","~:email","a"]'


def test_transit_frozendict_keys_are_written_as_given_so_str_keys_stay_strings() -> None:
    assert PLAIN.encode(frozendict({"email": "a", K("n"): 1})) == '["^ ","email","a","~:n",1]'


def test_frozen_map_str_keys_are_written_as_keywords_like_a_dict() -> None:
    assert PLAIN.encode(FrozenMap({"email": "a"})) == '["^ ","~:email","a"]'
    assert PLAIN.encode(OrderedDict([("b", 1), ("a", 2)])) == '["^ ","~:b",1,"~:a",2]'


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        ({1: "one"}, '["^ ","~i1","one"]'),
        ({None: 1}, '["^ ","~_",1]'),
        ({True: 1}, '["^ ","~?t",1]'),
        ({1.5: 1}, '["^ ","~d1.5",1]'),
        ({(1, 2): "x"}, '["~#cmap",[[1,2],"x"]]'),
        ({frozenset({1}): "x"}, '["~#cmap",[["~#set",[1]],"x"]]'),
        ({FrozenMap({"a": 1}): "x"}, '["~#cmap",[["^ ","~:a",1],"x"]]'),
    ],
)
def test_other_keys_are_written_as_transit_writes_them(payload: Any, text: str) -> None:
    assert PLAIN.encode(payload) == text


def test_str_values_stay_strings_and_are_escaped() -> None:
    assert PLAIN.encode(["email", "~x", "^x", "`x", "^ "]) == '["email","~~x","~^x","~`x","~^ "]'


def test_keyword_and_symbol_values_are_written_as_such() -> None:
    assert PLAIN.encode([K("status/ok"), Symbol("foo/bar")]) == '["~:status/ok","~$foo/bar"]'


def test_lists_and_tuples_are_written_as_arrays() -> None:
    assert PLAIN.encode({"a": [1, 2], "b": (3, 4)}) == '["^ ","~:a",[1,2],"~:b",[3,4]]'


def test_a_transit_list_is_written_as_a_clojure_list() -> None:
    assert PLAIN.encode(List([1, {"a": 2}])) == '["~#list",[1,["^ ","~:a",2]]]'


def test_sets_are_written_as_transit_sets() -> None:
    assert PLAIN.encode({"tags": {"x"}}) == '["^ ","~:tags",["~#set",["x"]]]'
    assert PLAIN.encode(frozenset()) == '["~#set",[]]'


def test_bools_and_none_are_written_as_json_literals() -> None:
    assert PLAIN.encode([True, False, None, true, false]) == "[true,false,null,true,false]"


def test_an_aware_datetime_is_written_as_epoch_milliseconds_without_its_sub_millisecond_part() -> None:
    assert PLAIN.encode(utc("2021-01-06T20:43:42.451999")) == '["~#\'","~m1609965822451"]'
    plus_two = datetime.timezone(datetime.timedelta(hours=2))
    moment = datetime.datetime(2023, 11, 15, 0, 13, 20, 123456, tzinfo=plus_two)
    assert PLAIN.encode([moment]) == '["~m1700000000123"]'


def test_sub_milliseconds_before_1970_are_dropped_towards_the_past_like_java_instant() -> None:
    assert PLAIN.encode([utc("1960-06-01T10:00:00.250999")]) == '["~m-302450399750"]'


def test_a_naive_datetime_is_refused_naming_the_problem() -> None:
    with pytest.raises(SerializationError) as raised:
        PLAIN.encode({"at": datetime.datetime(2020, 1, 1)})
    assert "payload['at']" in str(raised.value)
    assert "naive datetime" in str(raised.value)
    assert "timezone-aware" in str(raised.value)


def test_uuids_decimals_and_big_integers_use_their_transit_tags() -> None:
    value = [
        uuid.UUID("5a2cbea3-e8c6-428b-b525-21239370dd55"),
        Decimal("1.50"),
        2**53,
        2**63 - 1,
        2**63,
        -(2**70),
    ]
    assert PLAIN.encode(value) == (
        '["~u5a2cbea3-e8c6-428b-b525-21239370dd55","~f1.50","~i9007199254740992",'
        '"~i9223372036854775807","~n9223372036854775808","~n-1180591620717411303424"]'
    )


def test_special_floats_use_the_z_tag() -> None:
    assert PLAIN.encode([math.nan, math.inf, -math.inf, -0.0]) == '["~zNaN","~zINF","~z-INF",-0.0]'


@pytest.mark.parametrize("value", ["foo", 1, None, K("hello"), 1.5, utc("2000-01-01T12:00:00")])
def test_a_top_level_scalar_is_quoted(value: Any) -> None:
    text = PLAIN.encode(value)
    assert text.startswith('["~#\'",')
    assert canon(EXACT.decode(text)) == canon(value)


def test_each_payload_has_its_own_key_cache() -> None:
    payload = [{"email": "a"}, {"email": "b"}]
    first = PLAIN.encode(payload)
    assert first == '[["^ ","~:email","a"],["^ ","^0","b"]]'
    assert PLAIN.encode(payload) == first


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        # "~:é" is 3 UTF-16 code units (transit-python's native writer counts 4 UTF-8 bytes and caches it)
        ([{"é": 1}, {"é": 2}], '[["^ ","~:é",1],["^ ","~:é",2]]'),
        # "~:😀" is 4 UTF-16 code units (transit-python's pure writer counts 3 code points)
        # (Jackson writes the char outside the BMP as an escaped surrogate pair: test_transit_json.py.)
        ([{"😀": 1}, {"😀": 2}], '[["^ ","~:\\uD83D\\uDE00",1],["^ ","^0",2]]'),
        (
            [frozendict({"a😀": 1}), frozendict({"a😀": 2})],
            '[["^ ","a\\uD83D\\uDE00",1],["^ ","a\\uD83D\\uDE00",2]]',
        ),
        (
            [frozendict({"😀😀": 1}), frozendict({"😀😀": 2})],
            '[["^ ","\\uD83D\\uDE00\\uD83D\\uDE00",1],["^ ","^0",2]]',
        ),
    ],
)
def test_the_key_cache_counts_utf16_code_units_like_transit_java(payload: Any, text: str) -> None:
    assert PLAIN.encode(payload) == text
    assert PLAIN.encode(EXACT.decode(text)) == text
    # The raw spelling reads the same, cache codes included.
    raw = text.replace("\\uD83D\\uDE00", "😀")
    assert canon(EXACT.decode(raw)) == canon(EXACT.decode(text))


def test_payloads_cached_by_transit_java_decode_with_the_same_cache_codes() -> None:
    assert PLAIN.decode('[["^ ","~:😀",1],["^ ","^0",2]]') == [{"😀": 1}, {"😀": 2}]
    # Counting "~:é" as cacheable would make ^0 mean :é instead of :abcd.
    assert PLAIN.decode('[["^ ","~:é",1,"~:abcd",2],["^ ","^0",3]]') == [{"é": 1, "abcd": 2}, {"abcd": 3}]


def test_a_value_equal_to_a_cached_key_is_written_in_full_like_transit_java() -> None:
    assert PLAIN.encode(frozendict({"abcd": "abcd"})) == '["^ ","abcd","abcd"]'
    assert PLAIN.encode([{"abcd": K("abcd")}, K("abcd")]) == '[["^ ","~:abcd","^0"],"^0"]'


def test_enum_and_other_int_and_str_subclasses_are_written_as_plain_values() -> None:
    class Colour(enum.IntEnum):
        RED = 1

    class Name(str):
        __slots__ = ()

    assert PLAIN.encode({"c": Colour.RED, Name("k"): Name("v")}) == '["^ ","~:c",1,"~:k","v"]'


@pytest.mark.parametrize(
    ("payload", "where", "what"),
    [
        ({"k": object()}, "payload['k']", "builtins.object"),
        ([1, b"x"], "payload[1]", "builtins.bytes"),
        ({"d": [datetime.date(2020, 1, 1)]}, "payload['d'][0]", "datetime.date"),
        ({"s": {1, object}}, "payload['s']<set element", "builtins.type"),
        ({(1, object()): 1}, "payload<key (1, <object", "builtins.object"),
        ({"t": TaggedValue("point", [1, object()])}, "payload['t']<rep of #point>[1]", "builtins.object"),
        (Decimal("NaN"), "payload", "not finite"),
        ({"s": "a\ud800b"}, "payload['s']", "lone surrogate"),
    ],
)
def test_an_unencodable_value_is_refused_naming_its_type_and_path(
    payload: Any, where: str, what: str
) -> None:
    with pytest.raises(SerializationError) as raised:
        PLAIN.encode(payload)
    message = str(raised.value)
    assert f"cannot encode {where}" in message
    assert what in message


def test_two_keys_that_become_the_same_keyword_are_refused() -> None:
    with pytest.raises(SerializationError, match="both written as <Keyword a>"):
        PLAIN.encode({"a": 1, K("a"): 2})


def test_a_payload_that_contains_itself_is_refused() -> None:
    payload: list[Any] = []
    payload.append(payload)
    with pytest.raises(SerializationError, match="contains itself"):
        PLAIN.encode(payload)


def test_serialization_errors_are_library_errors() -> None:
    with pytest.raises(ProletarianError):
        PLAIN.encode(object())


# --- plain decoding ----------------------------------------------------------------------------------

NESTED = (
    '["^ ","~:user/id",42,"~:email","a@b.c","~:tags",["~#set",["x"]],"~:roles",["~:admin","~:user"],'
    '"~:meta",["^ ","~:source","web","~:ip",null],"~:active",true,"~:score",1.5,"~:count",0]'
)


def test_plain_decoding_gives_plain_python_values() -> None:
    value = PLAIN.decode(NESTED)
    expected = {
        "user/id": 42,
        "email": "a@b.c",
        "tags": {"x"},
        "roles": ["admin", "user"],
        "meta": {"source": "web", "ip": None},
        "active": True,
        "score": 1.5,
        "count": 0,
    }
    assert canon(value) == canon(expected)


def test_plain_decoding_turns_keywords_and_symbols_into_str_with_their_namespace() -> None:
    assert PLAIN.decode('["^ ","~:status","~:status/ok","~:sym","~$foo/bar"]') == {
        "status": "status/ok",
        "sym": "foo/bar",
    }


def test_plain_decoding_turns_clojure_lists_into_python_lists() -> None:
    assert canon(PLAIN.decode('["~#list",[1,["~#list",[2]]]]')) == canon([1, [2]])


def test_plain_decoding_makes_set_elements_and_map_keys_hashable() -> None:
    value = PLAIN.decode('["^ ","~:a",["~#set",[["^ ","~:b",1],[1,2],["~#list",[3]],["~#set",["~:c"]]]]]')
    assert canon(value) == canon({"a": {FrozenMap({"b": 1}), (1, 2), (3,), frozenset({"c"})}})
    keyed = PLAIN.decode('["~#cmap",[["^ ","~:k",[1]],"x",[1,2],"y"]]')
    assert canon(keyed) == canon({FrozenMap({"k": (1,)}): "x", (1, 2): "y"})


def test_plain_decoding_keeps_exact_set_elements_where_converting_would_merge_them() -> None:
    value = PLAIN.decode('["~#set",[0,1,true,false]]')
    assert canon(value) == canon({0, 1, true, false})
    mixed = PLAIN.decode('["~#set",["~:a","a"]]')
    assert canon(mixed) == canon({K("a"), "a"})
    assert PLAIN.decode('["~#set",[true,"a"]]') == {True, "a"}


def test_plain_decoding_keeps_exact_keys_where_converting_would_merge_them() -> None:
    value = PLAIN.decode('["^ ","~:a",["~:x"],"a",2]')
    assert canon(value) == canon(frozendict({K("a"): ["x"], "a": 2}))


def test_values_kept_exact_to_avoid_a_merge_are_written_back_unchanged() -> None:
    for text in ('["~#set",["~:a","a"]]', '["^ ","~:a",1,"a",2]', '["^ ","~?t",1,"~i1",2]'):
        assert canon(EXACT.decode(PLAIN.encode(PLAIN.decode(text)))) == canon(EXACT.decode(text))


def test_plain_decoding_leaves_tagged_values_without_a_python_type_as_transit_gives_them() -> None:
    value = PLAIN.decode('[["~#ratio",["~n1","~n3"]],"~ca",["~#point",[1,2]],"~rhttp://x"]')
    assert value[0] == TaggedValue("ratio", (1, 3))
    assert value[1] == TaggedValue("c", "a")
    assert value[2] == TaggedValue("point", (1, 2))
    assert value[3].rep == "http://x"


def test_plain_decoding_reads_uuids_decimals_and_big_integers() -> None:
    value = PLAIN.decode('["~u5a2cbea3-e8c6-428b-b525-21239370dd55","~f1.50","~n9223372036854775808","~i7"]')
    assert canon(value) == canon(
        [uuid.UUID("5a2cbea3-e8c6-428b-b525-21239370dd55"), Decimal("1.50"), 2**63, 7]
    )


@pytest.mark.parametrize("serializer", [PLAIN, EXACT], ids=["plain", "exact"])
@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ('["~#\'","~m1700000000123"]', utc("2023-11-14T22:13:20.123")),
        ('["~#\'","~m-302450399750"]', utc("1960-06-01T10:00:00.250")),
        ('["~#\'","~t2023-11-14T22:13:20.123Z"]', utc("2023-11-14T22:13:20.123")),
        ('["~#\'","~t2023-11-15T00:13:20.123+02:00"]', utc("2023-11-14T22:13:20.123")),
        ('["~#m","1700000000123"]', utc("2023-11-14T22:13:20.123")),
    ],
)
def test_instants_decode_to_aware_utc_datetimes_in_both_modes(
    serializer: TransitSerializer, text: str, moment: datetime.datetime
) -> None:
    value = serializer.decode(text)
    assert value == moment
    assert value.tzinfo is UTC


# --- exact decoding ----------------------------------------------------------------------------------


def test_exact_decoding_returns_transit_pythons_own_types() -> None:
    value = EXACT.decode(NESTED)
    assert type(value) is frozendict
    assert value[K("roles")] == (K("admin"), K("user"))
    assert value[K("tags")] == frozenset({"x"})
    assert value[K("active")] is true
    assert canon(EXACT.decode('["~$foo"]')) == canon((Symbol("foo"),))


def test_exact_decoding_reads_a_clojure_list_as_a_transit_list_and_writes_it_back_as_a_list() -> None:
    value = EXACT.decode('["~#list",[1,2,3]]')
    assert type(value) is List
    assert value.rep == (1, 2, 3)
    assert EXACT.encode(value) == '["~#list",[1,2,3]]'


def test_exact_values_are_written_back_as_the_same_transit() -> None:
    text = '["^ ","a",1,"~:b",["^ ","c",["~:d"]],"~:e",["~#set",[true]],"~:f",[false,"~$s"]]'
    assert EXACT.encode(EXACT.decode(text)) == text


# --- decode errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "JSONDecodeError"),
        ("not json", "JSONDecodeError"),
        ('["^ ","~:a"]', "key without a value"),
        ('["~#set"]', "0 representations"),
        ('["~#\'",1,2]', "2 representations"),
        ('["~#set",1]', "~#set needs an array"),
        ('["~#list",1]', "~#list needs an array"),
        ('["~#cmap",[1]]', "~#cmap needs an array of keys and values"),
        ('["^0"]', "unknown cache code ^0"),
        ('["~m1e3"]', "epoch milliseconds"),
        ('["~m99999999999999999"]', "outside the range"),
        ('["~uxyz"]', "UUID"),
        ('["~zfoo"]', "foo"),
        ("[NaN]", "NaN is not JSON"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_text_that_is_not_valid_transit_json_raises_payload_decode_error(text: str, problem: str) -> None:
    for serializer in (PLAIN, EXACT):
        with pytest.raises(PayloadDecodeError) as raised:
            serializer.decode(text)
        assert problem in str(raised.value)
        assert "payload: " in str(raised.value)


def test_the_decode_error_quotes_a_truncated_excerpt_of_the_payload() -> None:
    with pytest.raises(PayloadDecodeError) as raised:
        PLAIN.decode('["^ ","~:a"' + ',"x"' * 1000)
    message = str(raised.value)
    assert 'payload: \'["^ ","~:a",' in message
    assert message.endswith("...'")
    assert len(message) < 400


def test_decoding_a_non_str_raises_payload_decode_error() -> None:
    with pytest.raises(PayloadDecodeError, match="must be str, got bytes"):
        PLAIN.decode(b"[1]")  # type: ignore[arg-type]


# --- API ---------------------------------------------------------------------------------------------


def test_create_serializer_returns_a_transit_serializer_in_the_requested_mode() -> None:
    assert isinstance(create_serializer(), TransitSerializer)
    assert create_serializer().exact is False
    assert create_serializer(exact=True).exact is True
    assert isinstance(create_serializer(), Serializer)


def test_a_frozen_map_is_an_immutable_hashable_mapping() -> None:
    frozen = FrozenMap({"a": 1})
    assert frozen == {"a": 1}
    assert hash(frozen) == hash(FrozenMap([("a", 1)]))
    assert {frozen: "x"}[FrozenMap({"a": 1})] == "x"
    assert frozen["a"] == 1
    assert list(frozen) == ["a"]
    assert len(frozen) == 1
    assert repr(frozen) == "FrozenMap({'a': 1})"
    with pytest.raises(TypeError):
        frozen["b"] = 2  # type: ignore[index]


# --- round-trip properties ---------------------------------------------------------------------------

MOMENTS = st.datetimes(
    min_value=datetime.datetime(2, 1, 1), max_value=datetime.datetime(9998, 12, 31)
).flatmap(
    lambda moment: st.builds(
        lambda minutes: moment.replace(tzinfo=datetime.timezone(datetime.timedelta(minutes=minutes))),
        st.integers(min_value=-23 * 60, max_value=23 * 60),
    )
)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
HASHABLE_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    TEXT,
    st.uuids(),
)
SCALARS = st.one_of(
    HASHABLE_SCALARS,
    st.floats(),
    st.decimals(allow_nan=False, allow_infinity=False),
    MOMENTS,
)
PLAIN_VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(HASHABLE_SCALARS, children, max_size=4),
        st.sets(HASHABLE_SCALARS, max_size=4),
    ),
    max_leaves=12,
)


def truncated_to_milliseconds(value: Any) -> Any:
    """What a plain value decodes back to: datetimes become UTC, whole milliseconds."""
    if isinstance(value, datetime.datetime):
        epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
        return epoch + datetime.timedelta(milliseconds=(value - epoch) // datetime.timedelta(milliseconds=1))
    if isinstance(value, list):
        return [truncated_to_milliseconds(item) for item in value]
    if isinstance(value, dict):
        return {key: truncated_to_milliseconds(item) for key, item in value.items()}
    return value


@given(PLAIN_VALUES)
def test_plain_values_survive_encode_and_plain_decode(value: Any) -> None:
    assert canon(PLAIN.decode(PLAIN.encode(value))) == canon(truncated_to_milliseconds(value))


TRANSIT_SCALARS = st.one_of(SCALARS, st.builds(Keyword, TEXT), st.builds(Symbol, TEXT))
TRANSIT_KEYS = st.one_of(HASHABLE_SCALARS, st.builds(Keyword, TEXT))
TRANSIT_VALUES = st.recursive(
    TRANSIT_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(List),
        st.dictionaries(TRANSIT_KEYS, children, max_size=4),
        st.dictionaries(TRANSIT_KEYS, children, max_size=4).map(frozendict),
        st.sets(TRANSIT_KEYS, max_size=4),
    ),
    max_leaves=12,
)


@given(TRANSIT_VALUES)
def test_exact_decoding_and_re_encoding_gives_the_same_transit(value: Any) -> None:
    try:
        text = PLAIN.encode(value)
    except SerializationError as error:
        assert "both written as" in str(error)  # a dict holding both "a" and Keyword("a")
        return
    exact = EXACT.decode(text)
    again = EXACT.encode(exact)
    assert canon(EXACT.decode(again)) == canon(exact)
    if '"~#set"' not in text:  # set element order may change; everything else is written identically
        assert again == text


# --- the one-pass plain path -------------------------------------------------------------------------


def _two_pass(text: str) -> Any:
    """Plain decoding as the exact decoder and the conversion give it, the reference for the one pass."""
    return serializers._plain(serializers._read_exact(text))


def test_plain_decoding_reads_simple_payloads_without_the_exact_decoder(monkeypatch: Any) -> None:
    def refuse(text: str) -> Any:
        raise AssertionError(f"the exact decoder read {text!r}")

    monkeypatch.setattr(serializers, "_read_exact", refuse)
    text = '["^ ","~:user/id",42,"~:tags",["~:a","b"],"~:meta",["^ ","ip",null,"ok",true],"~:x",[1.5,[]]]'
    assert canon(PLAIN.decode(text)) == canon(
        {"user/id": 42, "tags": ["a", "b"], "meta": {"ip": None, "ok": True}, "x": [1.5, []]}
    )


@given(TRANSIT_VALUES)
def test_the_one_pass_plain_path_gives_what_the_exact_path_gives_for_written_payloads(value: Any) -> None:
    try:
        text = PLAIN.encode(value)
    except SerializationError:
        return
    assert canon(PLAIN.decode(text)) == canon(_two_pass(text))


# JSON the way a hostile or foreign writer could shape it: Transit's markers in odd places, cache codes,
# escapes, objects, odd-length maps, keys that merge.
MARKED_TEXT = st.sampled_from(["^ ", "^0", "^1", "~:a", "~:", "~$s", "~~x", "~^x", "~#set", "~#'", "a", ""])
JSON_TREES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), MARKED_TEXT, TEXT),
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(lambda items: ["^ ", *items]),
        st.dictionaries(MARKED_TEXT, children, max_size=2),
    ),
    max_leaves=10,
)


@given(JSON_TREES)
@example({"^ ": None, "~#set": None})  # a tag in a key's place: both paths give transit's bare Tag
def test_the_one_pass_plain_path_gives_what_the_exact_path_gives_for_any_json(tree: Any) -> None:
    text = json.dumps(tree)
    try:
        expected = canon(_two_pass(text))
    except PayloadDecodeError as error:
        with pytest.raises(PayloadDecodeError) as raised:
            PLAIN.decode(text)
        assert str(raised.value) == str(error)
        return
    assert canon(PLAIN.decode(text)) == expected


# --- the fast encoding path --------------------------------------------------------------------------


def test_plain_payloads_are_encoded_without_transit_pythons_marshaler(monkeypatch: Any) -> None:
    def refuse(data: Any) -> str:
        raise AssertionError(f"the general encoder wrote {data!r}")

    monkeypatch.setattr(serializers, "_general_encode", refuse)
    payload = {"user": {"id": 1, "name": "Zoë"}, "roles": [{"name": "a"}, {"name": "b"}], "x": (1.5, None)}
    assert PLAIN.encode(payload) == (
        '["^ ","~:user",["^ ","~:id",1,"~:name","Zoë"],"~:roles",[["^ ","^2","a"],["^ ","^2","b"]],'
        '"~:x",[1.5,null]]'
    )


# Values at the edges of what the fast path takes: Transit's markers, the exact-int bound, floats Java
# writes in E notation, non-BMP text, lone surrogates, short keys (not cached) and repeated ones (cached).
FAST_EDGE_TEXT = st.sampled_from(["", "a", "ab", "~a", "^0", "`x", "é", "😀", "\ud800", '"', "\x1f", "a b"])
FAST_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**54), max_value=2**54),
    st.sampled_from([2**53 - 1, 2**53, -(2**53) + 1, -(2**53)]),
    st.floats(),
    TEXT,
    FAST_EDGE_TEXT,
)
FAST_TREES = st.recursive(
    FAST_SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(
            st.one_of(FAST_EDGE_TEXT, TEXT, st.sampled_from(["id", "abc"])), children, max_size=4
        ),
    ),
    max_leaves=14,
)


@given(FAST_TREES)
def test_the_fast_encoding_path_writes_what_the_general_encoder_writes(value: Any) -> None:
    fast = serializers._fast_encode(value)
    try:
        general = serializers._general_encode(value)
    except SerializationError:
        assert fast is None  # the general path gives the error
        return
    assert fast is None or fast == general
    assert PLAIN.encode(value) == general


class _Small(enum.IntEnum):
    ONE = 1


def test_the_fast_encoding_path_leaves_other_shapes_to_the_general_encoder() -> None:
    for value in (
        1,
        "text",
        {"a": {1, 2}},
        {1: "int key"},
        {"a": K("kw")},
        {"a": "~tilde"},
        {"a": 2**53},
        {"a": math.inf},
        {"a": "\ud800"},
        {"a": Decimal("1.5")},
        {"a": datetime.datetime(2024, 1, 1, tzinfo=UTC)},
        OrderedDict(a=1),
        [True, _Small.ONE],
    ):
        assert serializers._fast_encode(value) is None, value
