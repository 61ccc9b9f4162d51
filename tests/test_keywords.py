"""Tests for the EDN keyword text written to and read from the queue and job_type columns."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proletarian_ref import keywords
from proletarian_ref.errors import ConfigurationError, InvalidKeywordError
from proletarian_ref.keywords import DEFAULT_QUEUE, from_keyword_text, to_keyword_text

# Characters that end an EDN token or make clojure.edn/read-string throw inside one.
EDN_BREAKERS = frozenset(' \t\n\r\f\u000b,";^()[]{}\\@`~\u001c\u001d\u001e\u001f\u2028\u2029')
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp", "Zs"})


def test_default_queue_is_proletarians_default_keyword_without_the_colon() -> None:
    assert DEFAULT_QUEUE == "proletarian/default"
    assert to_keyword_text(DEFAULT_QUEUE, what="queue") == ":proletarian/default"


def test_a_name_without_a_colon_is_stored_with_one() -> None:
    assert to_keyword_text("send-email", what="job_type") == ":send-email"
    assert to_keyword_text("my.ns/job-type", what="job_type") == ":my.ns/job-type"


def test_text_with_a_leading_colon_is_stored_unchanged() -> None:
    assert to_keyword_text(":my.ns/job-type", what="job_type") == ":my.ns/job-type"


@pytest.mark.parametrize(
    "text",
    [
        ":my.ns/job-type",
        ":send-email",
        ":success",
        ":my_ns.sub/job_type!",
        ":a/b/c",  # Clojure reads namespace "a", name "b/c"; its str is the same text
        ":1abc",  # symbolPat matches it with the colon as the name's first character
        ":1/a",
        ":/",
        ":a//b",
        ":a#b",  # '#' does not terminate a token
        ":a'b",
        ":a:b",
        ":a/:b",
        ":nil",
        ":true",
        ":é/ü",
        ":emoji-😀",
    ],
)
def test_text_clojure_reads_back_as_the_same_keyword_is_accepted(text: str) -> None:
    assert to_keyword_text(text, what="job_type") == text


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (":has space", "would read ':has'"),
        ("::auto", "auto-resolved"),
        (":", "no name"),
        ("", "no name"),
        (":a/", "Invalid token"),
        (":a/1", "Invalid token"),
        (":a:", "name ends with ':'"),
        (":a:/b", "namespace ends with ':'"),
        (":a::b", "'::'"),
        (":a,b", "would read ':a'"),
        (":a\tb", "would read ':a'"),
        (":a\nb", "would read ':a'"),
        ("a\u2028b", "would read ':a'"),
        ("a\u2029b", "would read ':a'"),
        (":a\u001cb", "would read ':a'"),
        (':a"b', "would read ':a'"),
        (":a;b", "would read ':a'"),
        (":a^b", "would read ':a'"),
        (":a(b", "would read ':a'"),
        (":a)b", "would read ':a'"),
        (":a[b", "would read ':a'"),
        (":a]b", "would read ':a'"),
        (":a{b", "would read ':a'"),
        (":a}b", "would read ':a'"),
        (":a\\b", "would read ':a'"),
        (":a@b", "refuses '@'"),
        (":a`b", "refuses '`'"),
        (":a~b", "refuses '~'"),
        (" :a", "would read ':'"),
        # Clojure would read these as the same keyword; refused because they are invisible or ambiguous.
        (":a\u00a0b", "NO-BREAK SPACE"),
        (":a\u200bb", "ZERO WIDTH SPACE"),
        (":a\x00b", "category Cc"),
        (":a\x85b", "category Cc"),
        (":a\ud800", "category Cs"),
        (":a\u0378", "category Cn"),
    ],
)
def test_text_clojure_would_not_read_as_the_same_keyword_is_refused(value: str, reason: str) -> None:
    with pytest.raises(InvalidKeywordError) as raised:
        to_keyword_text(value, what="job_type")
    assert reason in str(raised.value)


def test_the_error_names_what_was_checked_the_value_and_the_reason() -> None:
    with pytest.raises(InvalidKeywordError) as raised:
        to_keyword_text("my queue", what="queue")
    message = str(raised.value)
    assert message.startswith("invalid queue 'my queue': ")
    assert "would read ':my'" in message


def test_an_invalid_keyword_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        to_keyword_text("::x", what="job_type")


@pytest.mark.parametrize("value", [None, 1, b":a", ["a"], {"a": 1}])
def test_a_non_str_value_is_refused_naming_its_type(value: object) -> None:
    with pytest.raises(InvalidKeywordError) as raised:
        to_keyword_text(value, what="job_type")  # type: ignore[arg-type]
    assert f"got {type(value).__name__}" in str(raised.value)
    assert "job_type" in str(raised.value)


def test_a_str_subclass_is_stored_as_a_plain_str() -> None:
    class Name(str):
        __slots__ = ()

    result = to_keyword_text(Name("a/b"), what="job_type")
    assert result == ":a/b"
    assert type(result) is str


def test_from_keyword_text_drops_the_leading_colon() -> None:
    assert from_keyword_text(":my.ns/job-type") == "my.ns/job-type"
    assert from_keyword_text(":proletarian/default") == DEFAULT_QUEUE


def test_from_keyword_text_returns_text_without_a_colon_unchanged() -> None:
    assert from_keyword_text("emails") == "emails"


def test_conversions_are_cached() -> None:
    before = keywords._to_keyword_text.cache_info().hits
    for _ in range(3):
        to_keyword_text("cached/job-type", what="job_type")
    assert keywords._to_keyword_text.cache_info().hits >= before + 2
    from_keyword_text(":cached/job-type")
    from_keyword_text(":cached/job-type")
    assert from_keyword_text.cache_info().hits >= 1


KEYWORDISH = st.from_regex(
    r"\A:?[a-zA-Z*+!_?<>=.-][a-zA-Z0-9*+!_?<>=.'#-]{0,8}(/[a-zA-Z*+!_?<>=-][a-zA-Z0-9_'#-]{0,8})?\Z"
)


@given(KEYWORDISH)
def test_ordinary_clojure_keyword_names_are_accepted(value: str) -> None:
    text = to_keyword_text(value, what="job_type")
    assert text == (value if value.startswith(":") else ":" + value)


@given(st.one_of(KEYWORDISH, st.text(max_size=12)))
def test_accepted_text_round_trips_and_is_one_plain_edn_token(value: str) -> None:
    try:
        text = to_keyword_text(value, what="job_type")
    except InvalidKeywordError:
        return
    name = value[1:] if value.startswith(":") else value
    assert from_keyword_text(text) == name
    assert to_keyword_text(from_keyword_text(text), what="job_type") == text
    assert text.startswith(":")
    assert not text.startswith("::")
    assert not any(char in EDN_BREAKERS for char in text)
    assert not any(char.isspace() or unicodedata.category(char) in REFUSED_CATEGORIES for char in text)


@given(st.text(max_size=6), st.sampled_from(sorted(EDN_BREAKERS)), st.text(max_size=6))
def test_text_holding_a_token_breaker_is_always_refused(before: str, breaker: str, after: str) -> None:
    with pytest.raises(InvalidKeywordError):
        to_keyword_text(f"a{before}{breaker}{after}", what="job_type")
