"""The payload codec: Transit JSON, read and written exactly as Proletarian's own serializer does.

Proletarian (``proletarian.transit/create-serializer``) writes payloads with transit-clj in ``:json``
(non-verbose) mode, a new writer per payload, and maps Transit's ``m`` tag to ``java.time.Instant``
(epoch milliseconds). :class:`TransitSerializer` is the Python side of that contract.

Encoding (the same in both modes)
---------------------------------
The text is byte for byte what Proletarian writes (transit-java through Jackson's UTF8JsonGenerator);
docs/transit.md gives the exact text of every kind below and the rule behind it.

============================================  ==============================================
Python value                                  Transit written
============================================  ==============================================
``dict``, :class:`FrozenMap`, other Mapping   map; **str keys are written as keywords**
                                              (``{"email": "a"}`` -> ``["^ ","~:email","a"]``),
                                              at every level; other keys as Transit does
transit ``frozendict``                        map with its keys exactly as given, so a str key
                                              stays a string key (what exact decode returns)
``str`` (as a value)                          string, escaped as Jackson does (``"\\uD83D\\uDE00"``
                                              for a char outside the BMP, ``\\u001F``)
``Keyword`` / ``Symbol``                      keyword / symbol
``list``, ``tuple``                           array (a vector in Clojure)
transit ``List``                              ``["~#list", [...]]`` (a list in Clojure)
``set``, ``frozenset``                        ``["~#set", [...]]``
``bool`` / transit ``Boolean`` / ``None``     ``true`` / ``false`` / ``null``
``int``                                       number, ``"~i..."`` from 2**53, ``"~n..."`` (BigInt)
                                              beyond 64 bits
``float``                                     number as ``Double.toString`` (``1.0E20``, ``0.5``),
                                              ``"~zNaN"``, ``"~zINF"``, ``"~z-INF"``
``Decimal`` (finite)                          ``"~f..."`` as ``BigDecimal.toString`` (``~f1E+3``)
aware ``datetime``                            ``"~m<epoch ms>"`` (sub-millisecond part dropped, as
                                              Proletarian's Instant handler does)
``uuid.UUID``                                 ``"~u..."``
other ``TaggedValue``, ``URI``                as transit-python writes them
============================================  ==============================================

A top-level scalar is wrapped as ``["~#'", x]``. Anything else (a naive datetime, a ``date``, bytes,
an arbitrary object, a Decimal that is not finite or beyond Java's BigDecimal, a str with a lone
surrogate, two keys of one map that become the same keyword) raises :class:`SerializationError` naming
the type and its path in the payload.

The key cache (``^0``, ``^1``, ...) follows transit-java's rule, which counts UTF-16 code units, and a
map with composite keys is written as ``["~#cmap", [...]]`` as transit-java writes it. transit-python's
own Writer differs on both (see ``_is_cacheable``), so it is not used.

Decoding
--------
``exact=True`` returns what transit-python's Reader gives: ``Keyword``, ``Symbol``, ``frozendict``,
``tuple`` for vectors, ``frozenset``, transit ``Boolean`` (``true``/``false``) and so on, except that
``~#list`` is read as a transit ``List`` (its ``rep`` a tuple) so that a Clojure list is written back
as a list. Re-encoding an exact value gives the same Transit value back.

``exact=False`` (the default, "plain") converts that to ordinary Python values:

* keywords and symbols (keys and values) -> ``str`` with the namespace and no colon (``"user/id"``);
* maps -> ``dict``; vectors and lists -> ``list``; sets -> ``set``; ``Boolean`` -> ``bool``;
* inside a set or a map key, where values must be hashable: maps -> :class:`FrozenMap`, vectors and
  lists -> ``tuple``, sets -> ``frozenset``;
* when that conversion would merge distinct elements of one set or keys of one map (``#{0 1 true
  false}``, ``{:a 1 "a" 2}``), nothing is dropped: that set keeps its elements exactly as read, and that
  map is returned as a transit ``frozendict`` with its keys exactly as read (its values still plain);
* unchanged in both modes: ``str``, ``int`` (also BigInt), ``float``, ``None``, ``Decimal`` (``~f``),
  ``uuid.UUID``, aware UTC ``datetime`` (``~m`` and ``~t``), and the tagged values transit-python has no
  Python type for (ratio, char, unknown tags) which stay transit ``TaggedValue`` objects.

Plain mode is lossy by design (a keyword value and a string value both decode to ``str``, a Clojure list
becomes a ``list`` that is written back as a vector); use ``exact=True`` to keep the distinction.
Text that is not valid Transit JSON raises :class:`PayloadDecodeError`.
"""

from __future__ import annotations

import datetime
import io
import json
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal
from json.scanner import make_scanner
from typing import Any, Final, Protocol, cast, runtime_checkable

from transit import transit_types
from transit.constants import ESC, MAP_AS_ARR
from transit.decoder import Decoder, Tag
from transit.helpers import pairs
from transit.rolling_cache import RollingCache, is_cache_key
from transit.transit_types import Boolean, Keyword, List, Symbol, TaggedValue, frozendict
from transit.write_handlers import WriteHandler
from transit.writer import JsonMarshaler, flatten_map

from proletarian_ref.errors import PayloadDecodeError, SerializationError
from proletarian_ref.transit_json import big_decimal_text, double_text, string_text

__all__ = ["FrozenMap", "Serializer", "TransitSerializer", "create_serializer"]


@runtime_checkable
class Serializer(Protocol):
    """Turns a payload into the text stored in the payload column and back (proletarian.protocols)."""

    def encode(self, data: Any) -> str: ...

    def decode(self, text: str) -> Any: ...


class FrozenMap(Mapping[Any, Any]):
    """An immutable, hashable map: what plain decoding gives for a map inside a set or used as a key.

    It compares equal to any mapping with the same items. Its str keys are written as keywords, like a
    dict's.
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = ()) -> None:
        self._items: dict[Any, Any] = dict(items)
        self._hash: int | None = None

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            # The same hash as transit's frozendict, so equal maps of either type hash alike.
            self._hash = hash(frozenset(self._items.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


# ---------------------------------------------------------------------------------------------------
# The key cache (^0, ^1, ...), as transit-java keeps it

_CACHEABLE_PREFIXES: Final = ("~#", "~$", "~:")
_MIN_SIZE_CACHEABLE: Final = 4  # transit-java WriteCache.MIN_SIZE_CACHEABLE


def _is_cacheable(name: str, as_map_key: bool) -> bool:
    """transit-java's WriteCache.isCacheable, which measures ``String.length()`` in UTF-16 code units.

    transit-python measures code points (pure Python) or UTF-8 bytes (native extension) instead, so for
    short non-ASCII keys ("~:é", "~:😀") it numbers the cache differently from Clojure; a later ``^N``
    would then silently name the wrong key on the other side.
    """
    if not (as_map_key or name[:2] in _CACHEABLE_PREFIXES):
        return False
    size = len(name)
    if size < _MIN_SIZE_CACHEABLE and not name.isascii():
        size += sum(1 for char in name if char > "\uffff")
    return size >= _MIN_SIZE_CACHEABLE


class _JavaRollingCache(RollingCache):  # type: ignore[misc]  # transit ships no type information
    def decode(self, name: str, as_map_key: bool = False) -> str:
        if is_cache_key(name):
            try:
                return self.key_to_value[name]  # type: ignore[no-any-return]
            except KeyError:
                raise ValueError(f"unknown cache code {name}") from None
        if _is_cacheable(name, as_map_key):
            self.encache(name)
        return name

    def encode(self, name: str, as_map_key: bool = False) -> str:
        # Unlike RollingCache, a string is replaced by its code only where transit-java would do so.
        if _is_cacheable(name, as_map_key):
            code = self.value_to_key.get(name)
            if code is not None:
                return code  # type: ignore[no-any-return]
            self.encache(name)
        return name


class _BigDecimalHandler:
    """transit-java's BigDecimal handler: ``"~f" + BigDecimal.toString()``."""

    @staticmethod
    def tag(_: Decimal) -> str:
        return "f"

    @staticmethod
    def rep(value: Decimal) -> str:
        return big_decimal_text(value)

    string_rep = rep


def _make_write_handlers() -> Any:
    handlers = WriteHandler()
    handlers[Decimal] = _BigDecimalHandler
    return handlers


_WRITE_HANDLERS: Final = _make_write_handlers()  # stateless, so one map serves every payload


class _JsonMarshaler(JsonMarshaler):  # type: ignore[misc]
    """transit-python's JSON marshaler, with the JSON text of transit-java's JsonEmitter and Jackson."""

    def _init_handlers(self) -> None:
        self.handlers = _WRITE_HANDLERS

    def emit_cmap(self, m: Any, _: Any, cache: Any) -> None:
        # transit-java (as stored by Proletarian) writes ["~#cmap",[k,v,...]], not {"~#cmap":[...]}.
        self.emit_tagged("cmap", flatten_map(m), cache)

    def emit_double(self, d: Any, as_map_key: bool, cache: Any) -> None:
        if as_map_key:
            # JsonEmitter.emitDouble: a key is "~d" + Double.toString; transit-python passes str(float).
            self.emit_string(ESC, "d", double_text(float(d)), True, cache)
        else:
            self.emit_object(d)

    def emit_object(self, obj: Any, as_map_key: bool = False) -> None:
        self.write_sep()
        kind = type(obj)
        if kind is str:
            self.io.write(string_text(obj))
        elif kind is int:
            self.io.write(str(obj))
        elif kind is float:
            self.io.write(double_text(obj))
        elif kind is bool:
            self.io.write("true" if obj else "false")
        elif obj is None:
            self.io.write("null")
        else:
            raise AssertionError(f"no JSON form for {type(obj).__name__} {obj!r}")


# ---------------------------------------------------------------------------------------------------
# Decoding

_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_MILLIS: Final = re.compile(r"[+-]?[0-9]+")
_EXCERPT_CHARS: Final = 120


class _ListHandler:
    @staticmethod
    def from_rep(rep: Any) -> Any:
        if not isinstance(rep, tuple):
            raise ValueError(f"~#list needs an array, got {rep!r}")
        return List(rep)


class _SetHandler:
    @staticmethod
    def from_rep(rep: Any) -> frozenset[Any]:
        if not isinstance(rep, tuple):
            raise ValueError(f"~#set needs an array, got {rep!r}")
        return frozenset(rep)


class _CmapHandler:
    @staticmethod
    def from_rep(rep: Any) -> Any:
        if not isinstance(rep, tuple) or len(rep) % 2:
            raise ValueError(f"~#cmap needs an array of keys and values, got {rep!r}")
        return frozendict(pairs(rep))


class _InstantHandler:
    """Proletarian's ``m`` read handler: epoch milliseconds to an instant (here an aware UTC datetime)."""

    @staticmethod
    def from_rep(rep: Any) -> datetime.datetime:
        if isinstance(rep, bool) or not isinstance(rep, int | str):
            raise ValueError(f"~m needs epoch milliseconds, got {rep!r}")
        if isinstance(rep, str) and not _EPOCH_MILLIS.fullmatch(rep):
            raise ValueError(f"~m needs epoch milliseconds, got {rep!r}")
        millis = int(rep)
        try:
            return _EPOCH + datetime.timedelta(milliseconds=millis)
        except OverflowError:
            raise ValueError(f"instant ~m{millis} is outside the range of Python's datetime") from None


# transit's Decoder has no strict mode: it silently drops a map's odd trailing key and a tagged value's
# extra elements. This subclass refuses them so that a damaged payload is an error, not missing data.
class _StrictDecoder(Decoder):  # type: ignore[misc]  # transit ships no type information
    def decode_list(self, node: list[Any], cache: Any, as_map_key: bool) -> Any:
        if not node:
            return ()
        if node[0] == MAP_AS_ARR:
            if len(node) % 2 == 0:
                raise ValueError("a map (a '^ ' array) has a key without a value")
            return super().decode_list(node, cache, as_map_key)
        # Elements are decoded exactly once and in order, to keep the key cache in step with the writer.
        first = self._decode(node[0], cache, as_map_key)
        if isinstance(first, Tag):
            if len(node) != 2:
                raise ValueError(f"tagged value ~#{first.tag} has {len(node) - 1} representations, not 1")
            return self.decode_tag(first.tag, self._decode(node[1], cache, as_map_key))
        return (first, *(self._decode(item, cache, as_map_key) for item in node[1:]))


def _make_decoder() -> Any:
    decoder = _StrictDecoder()
    decoder.register("list", _ListHandler)
    decoder.register("set", _SetHandler)
    decoder.register("cmap", _CmapHandler)
    decoder.register("m", _InstantHandler)
    return decoder


_DECODER: Final = _make_decoder()  # stateless: each decode gets its own key cache


def _refuse_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (Transit writes it as ~z)")


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "...")


_JSON: Final = json.JSONDecoder(parse_constant=_refuse_json_constant)
# The scanner JSONDecoder.decode runs, with the same settings, minus decode's whitespace handling.
_SCAN_JSON: Final = make_scanner(cast(Any, _JSON))


def _read_exact(text: str) -> Any:
    try:
        node = _JSON.decode(text)
        return _DECODER.decode(node, _JavaRollingCache())
    except RecursionError:
        raise PayloadDecodeError(
            f"payload is nested too deeply to decode; payload: {_excerpt(text)}"
        ) from None
    except Exception as error:
        raise PayloadDecodeError(
            f"payload is not valid Transit JSON ({type(error).__name__}: {error}); payload: {_excerpt(text)}"
        ) from error


class _NotPlainJson(Exception):
    """The payload uses more of Transit than _plain_json reads; the exact decoder must read it."""


_NOT_PLAIN_JSON: Final = _NotPlainJson()
# What a JSON string starts with when it means more than itself in Transit.
_MARKERS: Final = ("~", "^")
_JSON_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _read_plain(text: str) -> Any:
    """Plain decoding in one pass, for the payloads most jobs carry; the same result as the exact path.

    Maps written as ``["^ ", k, v, ...]``, arrays, keywords, strings, numbers, booleans and null are read
    straight from the JSON. A payload with anything else (a tag, an escaped or cached string, a JSON
    object, a key that would merge with another) or that is not valid goes through the exact decoder, so
    results and error messages never depend on which path read it.
    """
    if text[:1] == "[":
        try:
            # Whitespace around the payload, or text after it, is left to the exact path.
            node, end = _SCAN_JSON(text, 0)
            if end == len(text):
                return _plain_json(node, False)
        except (_NotPlainJson, StopIteration, ValueError, RecursionError):
            pass
    return _plain(_read_exact(text), False)


def _plain_json(node: Any, hashable: bool) -> Any:
    kind = type(node)
    if kind is str:
        if node[:1] in _MARKERS:
            if node[:2] == "~:":
                return node[2:]
            raise _NOT_PLAIN_JSON
        return node
    if kind is list:
        size = len(node)
        if size and node[0] == "^ ":
            if size % 2 == 0:
                raise _NOT_PLAIN_JSON
            converted = {}
            for index in range(1, size, 2):
                # Keyword keys and unmarked scalar values, nearly all of a payload, without a call each.
                key = node[index]
                key = key[2:] if type(key) is str and key[:2] == "~:" else _plain_json(key, True)
                value = node[index + 1]
                value_kind = type(value)
                if value_kind not in _JSON_SCALARS or (value_kind is str and value[:1] in _MARKERS):
                    value = _plain_json(value, hashable)
                converted[key] = value
            if 2 * len(converted) < size - 1:
                raise _NOT_PLAIN_JSON  # two keys became one
            return FrozenMap(converted) if hashable else converted
        items = [_plain_json(item, hashable) for item in node]
        return tuple(items) if hashable else items
    if kind is dict:
        raise _NOT_PLAIN_JSON
    return node  # int, float, bool or None, as the exact path also gives them


def _plain(value: Any, hashable: bool) -> Any:
    kind = type(value)
    if kind is str or kind is int or kind is float or value is None:
        return value
    if kind is Keyword or kind is Symbol:
        return value.str
    if kind is Boolean:
        return bool(value)
    if kind is tuple or kind is List:
        items = value if kind is tuple else value.rep
        converted = [_plain(item, hashable) for item in items]
        return tuple(converted) if hashable else converted
    if kind is frozendict:
        return _plain_map(value, hashable)
    if kind is frozenset:
        elements = frozenset(_plain(element, True) for element in value)
        if len(elements) < len(value):
            elements = value  # e.g. true and 1: keep Transit's own objects rather than lose one
        return elements if hashable else set(elements)
    return value


def _plain_map(value: Any, hashable: bool) -> Any:
    keys = [_plain(key, True) for key in value]
    if len(set(keys)) < len(keys):
        # e.g. :a and "a": keep the exact keys; a frozendict is written back with its keys as given.
        return frozendict({key: _plain(item, hashable) for key, item in value.items()})
    converted = {key: _plain(item, hashable) for key, item in zip(keys, value.values(), strict=True)}
    return FrozenMap(converted) if hashable else converted


# ---------------------------------------------------------------------------------------------------
# Encoding


class _UnencodableError(Exception):
    """Raised while preparing a payload; each enclosing container adds its step of the path."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.steps: list[str] = []


_JAVA_INT_MIN: Final = -(2**31)
_JAVA_INT_MAX: Final = 2**31 - 1


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checked_text(value: str) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            # Jackson would write it as a \uXXXX escape; refused on purpose (docs/transit.md): in Python
            # it marks undecodable bytes, not text that any UTF-8 reader of the job gets back.
            raise _UnencodableError(
                f"str {_short_repr(value)} holds a lone surrogate at index {error.start}, which is not "
                "Unicode text"
            ) from None
    return value if type(value) is str else str.__str__(value)


def _prepare(value: Any, hashable: bool) -> Any:
    """Return ``value`` in the types transit-python's writer handles, applying the rules above."""
    kind = type(value)
    if kind is str:
        return _checked_text(value)
    if value is None or kind is int or kind is float or kind is bool:
        return value
    if kind is Keyword or kind is Symbol or kind is Boolean or kind is uuid.UUID:
        return value
    if isinstance(value, Mapping):
        return _prepare_map(value, hashable)
    if isinstance(value, list | tuple):
        return _prepare_items(value, hashable)
    if isinstance(value, set | frozenset):
        return frozenset(_prepare_element(element) for element in value)
    if isinstance(value, datetime.datetime):
        if value.utcoffset() is None:
            raise _UnencodableError(
                f"naive datetime {value!r}: a payload datetime must be timezone-aware "
                "(e.g. tzinfo=datetime.timezone.utc), since Transit writes an instant"
            )
        return value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise _UnencodableError(f"{value!r} is not finite; Clojure's BigDecimal cannot represent it")
        exponent = cast(int, value.as_tuple().exponent)  # an int, as the value is finite
        if exponent <= _JAVA_INT_MIN or value.adjusted() > _JAVA_INT_MAX:
            # new BigDecimal(text) refuses these ("Exponent overflow", "Scale out of range"): the job
            # would be stored but Proletarian could never read it.
            raise _UnencodableError(
                f"{_short_repr(value)} has an exponent beyond Java's BigDecimal, whose scale is a 32-bit int"
            )
        return value
    if isinstance(value, int):
        return int(value)  # IntEnum and other int subclasses: the writer needs a plain int
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return _checked_text(value)
    if isinstance(value, List):
        return List(tuple(_prepare_items(value.rep, True)))
    if isinstance(value, transit_types.URI | transit_types.Link):
        return value
    if isinstance(value, TaggedValue):
        if not isinstance(value.tag, str) or not value.tag:
            raise _UnencodableError(f"TaggedValue tag must be a non-empty str, got {value.tag!r}")
        try:
            rep = _prepare(value.rep, hashable)
        except _UnencodableError as error:
            error.steps.append(f"<rep of #{value.tag}>")
            raise
        return TaggedValue(value.tag, rep)
    raise _UnencodableError(
        f"{type(value).__module__}.{type(value).__qualname__} {_short_repr(value)} has no Transit form"
    )


def _prepare_items(items: Iterable[Any], hashable: bool) -> Any:
    prepared = []
    for index, item in enumerate(items):
        try:
            prepared.append(_prepare(item, hashable))
        except _UnencodableError as error:
            error.steps.append(f"[{index}]")
            raise
    return tuple(prepared) if hashable else prepared


def _prepare_element(element: Any) -> Any:
    try:
        return _prepare(element, True)
    except _UnencodableError as error:
        error.steps.append(f"<set element {_short_repr(element)}>")
        raise


def _prepare_map(value: Mapping[Any, Any], hashable: bool) -> Any:
    keys_as_given = isinstance(value, frozendict)
    prepared: dict[Any, Any] = {}
    given_keys: dict[Any, Any] = {}
    for key, item in value.items():
        try:
            if not keys_as_given and isinstance(key, str):
                prepared_key = Keyword(_checked_text(key))
            else:
                prepared_key = _prepare(key, True)
        except _UnencodableError as error:
            error.steps.append(f"<key {_short_repr(key)}>")
            raise
        if prepared_key in prepared:
            raise _UnencodableError(
                f"keys {_short_repr(given_keys[prepared_key])} and {_short_repr(key)} of one map are both "
                f"written as {_short_repr(prepared_key)} (a str key of a dict is written as a keyword)"
            )
        given_keys[prepared_key] = key
        try:
            prepared[prepared_key] = _prepare(item, hashable)
        except _UnencodableError as error:
            error.steps.append(f"[{_short_repr(key)}]")
            raise
    return frozendict(prepared) if hashable else prepared


# The fast path: the JSON text of the shapes most payloads have, without transit-python's marshaler.

_JSON_MAX_INT: Final = 2**53 - 1  # transit-python's JSON range for a plain number, as transit-java's
_JSON_MIN_INT: Final = -_JSON_MAX_INT
_NOT_FAST: Final = _NotPlainJson()
# What a str value must not start with to be written as itself (transit escapes these with a "~").
_TRANSIT_RESERVED: Final = ("~", "^", "`")


def _fast_encode(data: Any) -> str | None:
    """``data`` as the exact Transit text the marshaler writes, or None if it is not a plain shape.

    Plain shapes: dicts with str keys, lists and tuples, of str, int within JSON's exact range, finite
    float, bool and None, at any depth, with a dict or a list at the top. Anything else (a str starting
    with a Transit marker, a lone surrogate, a Keyword, a set, a datetime, ...) returns None and goes
    the general way, which also gives the errors. tests/test_serializers.py checks both paths agree.
    """
    kind = type(data)
    if kind is dict:
        text = _flat_map_text(data)
        if text is not None:
            return text
    elif kind is not list and kind is not tuple:
        return None
    parts: list[str] = []
    try:
        _fast_value(data, parts, _JavaRollingCache())
    except (_NotPlainJson, UnicodeEncodeError, RecursionError):
        return None
    return "".join(parts)


# ',"~:name",' for a map key `name` seen before (a bounded number of them), as _fast_value writes it.
_KEY_TEXTS: dict[str, str] = {}
_KEY_TEXTS_MAX: Final = 4096


def _flat_map_text(data: dict[Any, Any]) -> str | None:
    """_fast_value's text for a dict of str keys and plain scalars, or None for any other dict.

    Most payloads are such a map. Its keys are all different, so none is written as a cache code
    (only a key seen before is), and _fast_value's cache and recursion are not needed.
    """
    text = '["^ "'
    try:
        for key, item in data.items():
            key_text = _KEY_TEXTS.get(key) if type(key) is str else None
            if key_text is None:
                if type(key) is not str:
                    return None
                key_text = "," + _fast_str("~:" + key) + ","
                if len(_KEY_TEXTS) < _KEY_TEXTS_MAX:
                    _KEY_TEXTS[key] = key_text
            kind = type(item)
            if kind is int:
                if not _JSON_MIN_INT <= item <= _JSON_MAX_INT:
                    return None
                text = f"{text}{key_text}{item}"
            elif kind is str:
                if item[:1] in _TRANSIT_RESERVED:
                    return None
                text = f"{text}{key_text}{_fast_str(item)}"
            elif kind is bool:
                text = f"{text}{key_text}{'true' if item else 'false'}"
            elif item is None:
                text = f"{text}{key_text}null"
            elif kind is float and math.isfinite(item):
                text = f"{text}{key_text}{double_text(item)}"
            else:
                return None
    except UnicodeEncodeError:
        return None
    return text + "]"


def _fast_str(value: str) -> str:
    if not value.isascii():
        value.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError: the general path refuses it
    return string_text(value)


def _fast_value(value: Any, parts: list[str], cache: Any) -> None:
    kind = type(value)
    if kind is str:
        if value[:1] in _TRANSIT_RESERVED:
            raise _NOT_FAST
        parts.append(_fast_str(value))
    elif kind is int:
        if not -_JSON_MAX_INT <= value <= _JSON_MAX_INT:
            raise _NOT_FAST
        parts.append(str(value))
    elif kind is float:
        if not math.isfinite(value):
            raise _NOT_FAST
        parts.append(double_text(value))
    elif kind is bool:
        parts.append("true" if value else "false")
    elif value is None:
        parts.append("null")
    elif kind is dict:
        parts.append('["^ "')
        for key, item in value.items():
            if type(key) is not str:
                raise _NOT_FAST
            parts.append(",")
            # A str key is a keyword; its name is cached from the second time as transit-java does.
            parts.append(_fast_str(cache.encode("~:" + key, True)))
            parts.append(",")
            _fast_value(item, parts, cache)
        parts.append("]")
    elif kind is list or kind is tuple:
        parts.append("[")
        for index, item in enumerate(value):
            if index:
                parts.append(",")
            _fast_value(item, parts, cache)
        parts.append("]")
    else:
        raise _NOT_FAST


def _general_encode(data: Any) -> str:
    """Any payload through transit-python's marshaler, with the rules of _prepare."""
    try:
        prepared = _prepare(data, False)
    except _UnencodableError as error:
        path = "payload" + "".join(reversed(error.steps))
        raise SerializationError(f"cannot encode {path}: {error.reason}") from None
    except RecursionError:
        raise SerializationError(
            "cannot encode payload: it is nested too deeply or contains itself"
        ) from None
    buffer = io.StringIO()
    try:
        # A new cache per payload, as transit-clj makes a new writer per payload. transit-python's
        # Writer is not used: its key cache can disagree with transit-java's (see _is_cacheable).
        _JsonMarshaler(buffer).marshal_top(prepared, _JavaRollingCache())
    except Exception as error:
        raise SerializationError(
            f"Transit could not encode the payload ({type(error).__name__}: {error})"
        ) from error
    return buffer.getvalue()


class TransitSerializer:
    """Transit JSON (non-verbose) payload codec compatible with ``proletarian.transit/create-serializer``.

    ``exact`` chooses what :meth:`decode` returns (see the module documentation); :meth:`encode` accepts
    both plain and exact values whatever ``exact`` is.
    """

    __slots__ = ("_exact",)

    def __init__(self, *, exact: bool = False) -> None:
        self._exact = exact

    @property
    def exact(self) -> bool:
        """True if decode returns transit-python's own types rather than plain Python values."""
        return self._exact

    def __repr__(self) -> str:
        return f"TransitSerializer(exact={self._exact!r})"

    def encode(self, data: Any) -> str:
        """Return ``data`` as Transit JSON text; raises SerializationError if it cannot be encoded."""
        text = _fast_encode(data)
        return text if text is not None else _general_encode(data)

    def decode(self, text: str) -> Any:
        """Return the value stored as Transit JSON ``text``; raises PayloadDecodeError if it is not."""
        if not isinstance(text, str):
            raise PayloadDecodeError(f"payload must be str, got {type(text).__name__}")
        if self._exact:
            return _read_exact(text)
        return _read_plain(text)


def create_serializer(*, exact: bool = False) -> TransitSerializer:
    """Return the default payload serializer (``proletarian.transit/create-serializer``)."""
    return TransitSerializer(exact=exact)
