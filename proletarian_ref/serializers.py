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
from proletarian_ref.transit_json import (
    NestingTooDeepError,
    big_decimal_text,
    double_text,
    parse_json,
    string_text,
)

__all__ = ["MAX_NESTING", "FrozenMap", "Serializer", "TransitSerializer", "create_serializer"]

MAX_NESTING: Final = 50_000
"""How deep a payload's Transit text may nest JSON arrays (a vector or a map is one level, a set, a
Clojure list or a tagged value two). Deeper payloads are refused by encode and decode alike; Proletarian
itself stops far below it (docs/transit.md)."""

_RECURSION_BUDGET: Final = 40
"""How many levels of containers the recursive paths (``*_shallow``) walk before handing the payload to
the iterative ones. Ordinary payloads nest a few levels and are read and written by recursion, which costs
less per container than an explicit stack; a deeper one is started again by the iterative path, which
also gives every error. 40 levels take at most a few hundred Python frames (transit-python's marshaler
spends up to five a level), far below the recursion limit and a small thread's stack."""


class _TooDeepToRecurse(Exception):
    """The payload nests deeper than _RECURSION_BUDGET: the iterative path takes it from the start."""


_TOO_DEEP_TO_RECURSE: Final = _TooDeepToRecurse()


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


def _make_decoder() -> Any:
    decoder = Decoder()
    decoder.register("list", _ListHandler)
    decoder.register("set", _SetHandler)
    decoder.register("cmap", _CmapHandler)
    decoder.register("m", _InstantHandler)
    return decoder


# Strings and tags are read by transit's Decoder; the nesting is walked by _decode_node, iteratively.
_DECODER: Final = _make_decoder()  # stateless: each decode gets its own key cache


def _refuse_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (Transit writes it as ~z)")


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "...")


_JSON: Final = json.JSONDecoder(parse_constant=_refuse_json_constant)
# The scanner JSONDecoder.decode runs, with the same settings, minus decode's whitespace handling.
_SCAN_JSON: Final = make_scanner(cast(Any, _JSON))


_UNHASHABLE_DEPTH: Final = (
    "a set element or map key in it holds maps nested too deeply for Python to hash (about a thousand "
    "levels; see docs/transit.md)"
)


def _too_deep(text: str) -> PayloadDecodeError:
    return PayloadDecodeError(
        f"payload is nested too deeply to decode: more than {MAX_NESTING} levels of arrays (see "
        f"docs/transit.md); payload: {_excerpt(text)}"
    )


def _read_exact(text: str) -> Any:
    try:
        try:
            node = _JSON.decode(text)
        except RecursionError:
            # The standard library's scanner recurses once per level: deeper text is read without it.
            node = parse_json(text, MAX_NESTING)
        try:
            return _decode_shallow(node, _JavaRollingCache(), False, 0)
        except (_TooDeepToRecurse, RecursionError):
            return _decode_node(node, _JavaRollingCache())  # a new cache: the walk starts again
    except NestingTooDeepError:
        raise _too_deep(text) from None
    except RecursionError:
        # transit's frozendict hashes itself recursively, so a set element or map key holding maps
        # nested about a thousand deep cannot be hashed (docs/transit.md).
        raise PayloadDecodeError(
            f"payload is nested too deeply to decode: {_UNHASHABLE_DEPTH}; payload: {_excerpt(text)}"
        ) from None
    except Exception as error:
        raise PayloadDecodeError(
            f"payload is not valid Transit JSON ({type(error).__name__}: {error}); payload: {_excerpt(text)}"
        ) from error


# _decode_node's frames: what the open JSON array or object becomes.
_ARRAY: Final = 0  # a vector, or a tagged value once its first element turns out to be a tag
_MAP: Final = 1  # ["^ ", k, v, ...]
_OBJECT: Final = 2  # a JSON object {k: v, ...} (transit-java never writes one, Transit allows it)
_TAGGED: Final = 3  # ["~#tag", rep] or {"~#tag": rep}


def _decode_shallow(node: Any, cache: Any, as_map_key: bool, depth: int) -> Any:
    """_decode_node by recursion, with its checks and results; raises _TooDeepToRecurse past the budget."""
    kind = type(node)
    if kind is str:
        return _DECODER.decode_string(node, cache, as_map_key)
    if kind is list:
        if not node:
            return ()
        if depth == _RECURSION_BUDGET:
            raise _TOO_DEEP_TO_RECURSE
        depth += 1
        size = len(node)
        if node[0] == MAP_AS_ARR:
            if size % 2 == 0:
                raise ValueError("a map (a '^ ' array) has a key without a value")
            built: dict[Any, Any] = {}
            for index in range(1, size, 2):
                key = _decode_shallow(node[index], cache, True, depth)
                value = node[index + 1]
                value_kind = type(value)
                if value_kind is str or value_kind is list or value_kind is dict or value_kind is bool:
                    value = _decode_shallow(value, cache, as_map_key, depth)
                built[key] = value
            return frozendict(built)
        first = _decode_shallow(node[0], cache, as_map_key, depth)
        if isinstance(first, Tag):
            if size != 2:
                raise ValueError(f"tagged value ~#{first.tag} has {size - 1} representations, not 1")
            return _DECODER.decode_tag(first.tag, _decode_shallow(node[1], cache, as_map_key, depth))
        items = [first]
        for index in range(1, size):
            items.append(_decode_shallow(node[index], cache, as_map_key, depth))
        return tuple(items)
    if kind is dict:
        if not node:
            return frozendict()
        if depth == _RECURSION_BUDGET:
            raise _TOO_DEEP_TO_RECURSE
        depth += 1
        entries = iter(node.items())
        first_key, first_value = next(entries)
        key = _decode_shallow(first_key, cache, True, depth)
        if len(node) == 1 and isinstance(key, Tag):
            return _DECODER.decode_tag(key.tag, _decode_shallow(first_value, cache, as_map_key, depth))
        built = {key: _decode_shallow(first_value, cache, False, depth)}
        for json_key, value in entries:
            key = _decode_shallow(json_key, cache, True, depth)
            built[key] = _decode_shallow(value, cache, False, depth)
        return frozendict(built)
    if kind is bool:
        return transit_types.true if node else transit_types.false
    return node


def _decode_node(root: Any, cache: Any) -> Any:  # noqa: PLR0915  # one loop, inline: a call per node would slow the common payloads
    """What transit's Decoder gives for the JSON value ``root``, strictly, without recursion.

    transit's Decoder silently drops a map's odd trailing key and a tagged value's extra elements; they
    are refused here so that a damaged payload is an error, not missing data. Elements are decoded
    exactly once and in order, to keep the key cache in step with the writer.
    """
    # Each open frame: [kind, JSON node, index of the next child, items so far, as_map_key, map key/tag]
    stack: list[list[Any]] = []
    node = root
    as_map_key = False
    while True:
        kind = type(node)
        if kind is str:
            value = _DECODER.decode_string(node, cache, as_map_key)
        elif kind is list:
            if not node:
                value = ()
            elif node[0] == MAP_AS_ARR:
                if len(node) % 2 == 0:
                    raise ValueError("a map (a '^ ' array) has a key without a value")
                if len(node) == 1:
                    value = frozendict()
                else:
                    stack.append([_MAP, node, 1, {}, as_map_key, None])
                    node, as_map_key = node[1], True
                    continue
            else:
                stack.append([_ARRAY, node, 0, [], as_map_key, None])
                node = node[0]
                continue
        elif kind is dict:
            if not node:
                value = frozendict()
            else:
                stack.append([_OBJECT, list(node.items()), 0, {}, as_map_key, None])
                node, as_map_key = next(iter(node)), True
                continue
        elif kind is bool:
            value = transit_types.true if node else transit_types.false
        else:
            value = node
        # Give value to the innermost frame; close the frames it completes; descend into the next child.
        while stack:
            frame = stack[-1]
            frame_kind, items, index, built, frame_key, key = frame
            if frame_kind == _ARRAY and index == 0 and isinstance(value, Tag):
                if len(items) != 2:
                    raise ValueError(
                        f"tagged value ~#{value.tag} has {len(items) - 1} representations, not 1"
                    )
                frame[0], frame[2], frame[5] = _TAGGED, 1, value.tag
                node, as_map_key = items[1], frame_key
                break
            if frame_kind == _MAP and index % 2:  # value was a key: its value comes next
                frame[2], frame[5] = index + 1, value
                node, as_map_key = items[index + 1], frame_key
                break
            if frame_kind in (_ARRAY, _MAP):
                if frame_kind == _ARRAY:
                    built.append(value)
                else:
                    built[key] = value
                index += 1
                if index < len(items):
                    frame[2] = index
                    node, as_map_key = items[index], frame_kind == _MAP or frame_key
                    break
                value = tuple(built) if frame_kind == _ARRAY else frozendict(built)
            elif frame_kind == _OBJECT:
                if key is None:  # value was the key of items[index]
                    if len(items) == 1 and isinstance(value, Tag):
                        frame[0], frame[5] = _TAGGED, value.tag
                        node, as_map_key = items[0][1], frame_key
                        break
                    frame[5] = (value,)
                    node, as_map_key = items[index][1], False
                    break
                built[key[0]] = value
                index += 1
                if index < len(items):
                    frame[2], frame[5] = index, None
                    node, as_map_key = items[index][0], True
                    break
                value = frozendict(built)
            else:
                value = _DECODER.decode_tag(key, value)
            stack.pop()
        else:
            return value


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
    object, a key that is not a scalar or that would merge with another) or that is not valid goes
    through the exact decoder, so results and error messages never depend on which path read it.
    """
    if text[:1] == "[":
        try:
            # Whitespace around the payload, or text after it, is left to the exact path.
            try:
                node, end = _SCAN_JSON(text, 0)
            except RecursionError:
                node, end = parse_json(text, MAX_NESTING), len(text)
                if text[-1:] != "]":
                    raise _NOT_PLAIN_JSON from None  # trailing whitespace
            if end == len(text):
                try:
                    return _plain_json_shallow(node, 0)
                except (_TooDeepToRecurse, RecursionError):
                    return _plain_json(node)
        except (_NotPlainJson, StopIteration, ValueError):
            pass
    return _plain(_read_exact(text))


def _plain_key(key: Any) -> Any:
    kind = type(key)
    if kind is str:
        if key[:1] in _MARKERS:
            if key[:2] == "~:":
                return key[2:]
            raise _NOT_PLAIN_JSON
        return key
    if kind is list or kind is dict:
        raise _NOT_PLAIN_JSON
    return key


def _plain_json_shallow(items: list[Any], depth: int) -> Any:
    """_plain_json of the JSON array ``items`` by recursion; raises _TooDeepToRecurse past the budget."""
    if depth == _RECURSION_BUDGET:
        raise _TOO_DEEP_TO_RECURSE
    depth += 1
    size = len(items)
    if size and items[0] == "^ ":
        if size % 2 == 0:
            raise _NOT_PLAIN_JSON
        built: dict[Any, Any] = {}
        for index in range(1, size, 2):
            # Keyword keys and unmarked scalar values, nearly all of a payload, inline.
            key = items[index]
            key = key[2:] if type(key) is str and key[:2] == "~:" else _plain_key(key)
            value = items[index + 1]
            value_kind = type(value)
            if value_kind is list:
                value = _plain_json_shallow(value, depth)
            elif value_kind not in _JSON_SCALARS or (value_kind is str and value[:1] in _MARKERS):
                value = _plain_key(value)
            built[key] = value
        if 2 * len(built) < size - 1:
            raise _NOT_PLAIN_JSON  # two keys became one
        return built
    converted: list[Any] = []
    for item in items:
        item_kind = type(item)
        if item_kind is list:
            converted.append(_plain_json_shallow(item, depth))
        elif item_kind not in _JSON_SCALARS or (item_kind is str and item[:1] in _MARKERS):
            converted.append(_plain_key(item))
        else:
            converted.append(item)
    return converted


def _plain_json(root: Any) -> Any:
    """The plain value of the JSON value ``root``, if it is a plain shape; without recursion."""
    if type(root) is not list:
        return _plain_key(root)
    # Suspended frames: (JSON array, index of its next element, what it becomes, key of the open child)
    stack: list[tuple[list[Any], int, Any, Any]] = []
    items: list[Any] = root
    while True:
        size = len(items)
        built: Any
        if size and items[0] == "^ ":
            if size % 2 == 0:
                raise _NOT_PLAIN_JSON
            built, index = {}, 1
        else:
            built, index = [], 0
        while True:  # run the frame of `items` until it opens a child or ends
            child: Any = None
            is_map = type(built) is dict
            key = None
            while index < size:
                if is_map:
                    # Keyword keys and unmarked scalar values, nearly all of a payload, inline.
                    key = items[index]
                    key = key[2:] if type(key) is str and key[:2] == "~:" else _plain_key(key)
                    value = items[index + 1]
                    index += 2
                else:
                    value = items[index]
                    index += 1
                value_kind = type(value)
                if value_kind is list:
                    stack.append((items, index, built, key))
                    child = value
                    break
                if value_kind not in _JSON_SCALARS or (value_kind is str and value[:1] in _MARKERS):
                    value = _plain_key(value)
                if is_map:
                    built[key] = value
                else:
                    built.append(value)
            else:
                if is_map and 2 * len(built) < size - 1:
                    raise _NOT_PLAIN_JSON  # two keys became one
            if child is not None:
                items = child
                break
            # This frame is complete: hand it to its parent and run the parent on.
            if not stack:
                return built
            done = built
            items, index, built, key = stack.pop()
            size = len(items)
            if type(built) is dict:
                built[key] = done
            else:
                built.append(done)


# _plain's frames: what the converted children of a value become.
_SEQUENCE: Final = 0
_SET: Final = 1
_KEYS_AND_VALUES: Final = 2
_PLAIN_AS_THEY_ARE: Final = frozenset({str, int, float, type(None)})
_EXACT_CONTAINERS: Final = frozenset({tuple, List, frozendict, frozenset})


def _plain(root: Any) -> Any:
    """The plain form of an exact value (the rules in the module documentation)."""
    if type(root) not in _EXACT_CONTAINERS:
        return _plain_leaf(root)
    try:
        return _plain_shallow(root, False, 0)
    except (_TooDeepToRecurse, RecursionError):
        return _plain_deep(root)


def _plain_shallow(value: Any, hashable: bool, depth: int) -> Any:
    """_plain_deep of an exact container by recursion; raises _TooDeepToRecurse past the budget."""
    if depth == _RECURSION_BUDGET:
        raise _TOO_DEEP_TO_RECURSE
    depth += 1
    kind = type(value)
    if kind is frozendict:
        # Keys first (hashable), then values: a map whose keys merge keeps its exact keys.
        keys = [
            key
            if type(key) in _PLAIN_AS_THEY_ARE
            else _plain_shallow(key, True, depth)
            if type(key) in _EXACT_CONTAINERS
            else _plain_leaf(key)
            for key in value
        ]
        items = [
            item
            if type(item) in _PLAIN_AS_THEY_ARE
            else _plain_shallow(item, hashable, depth)
            if type(item) in _EXACT_CONTAINERS
            else _plain_leaf(item)
            for item in value.values()
        ]
        if len(set(keys)) < len(keys):
            # e.g. :a and "a": keep the exact keys; a frozendict is written back with its keys as given.
            return frozendict(zip(value.keys(), items, strict=True))
        converted = dict(zip(keys, items, strict=True))
        return FrozenMap(converted) if hashable else converted
    if kind is frozenset:
        elements = frozenset(
            [
                element
                if type(element) in _PLAIN_AS_THEY_ARE
                else _plain_shallow(element, True, depth)
                if type(element) in _EXACT_CONTAINERS
                else _plain_leaf(element)
                for element in value
            ]
        )
        if len(elements) < len(value):
            elements = value  # e.g. true and 1: keep Transit's own objects rather than lose one
        return elements if hashable else set(elements)
    children = [
        item
        if type(item) in _PLAIN_AS_THEY_ARE
        else _plain_shallow(item, hashable, depth)
        if type(item) in _EXACT_CONTAINERS
        else _plain_leaf(item)
        for item in (value if kind is tuple else value.rep)
    ]
    return tuple(children) if hashable else children


def _plain_deep(root: Any) -> Any:
    """The plain form of an exact container, without recursion."""
    # Suspended frames: (kind, container, its children, next index, converted so far, hashable)
    stack: list[tuple[int, Any, Any, int, list[Any], bool]] = []
    value, hashable = root, False
    while True:
        kind = type(value)
        if kind is frozendict:
            # Keys first (hashable), then values: a map whose keys merge keeps its exact keys.
            frame_kind, children = _KEYS_AND_VALUES, (*value.keys(), *value.values())
        elif kind is frozenset:
            frame_kind, children = _SET, tuple(value)
        else:
            frame_kind, children = _SEQUENCE, value if kind is tuple else value.rep
        original, converted, index = value, [], 0
        while True:  # run this frame until it opens a child or ends
            child: Any = None
            size = len(children)
            while index < size:
                item = children[index]
                index += 1
                item_kind = type(item)
                if item_kind in _PLAIN_AS_THEY_ARE:
                    converted.append(item)
                elif item_kind in _EXACT_CONTAINERS:
                    child = item
                    break
                else:
                    converted.append(_plain_leaf(item))
            if child is not None:
                stack.append((frame_kind, original, children, index, converted, hashable))
                if frame_kind == _SET or (frame_kind == _KEYS_AND_VALUES and index <= len(original)):
                    hashable = True  # a set element or a map key
                value = child
                break
            value = _plain_built(frame_kind, original, converted, hashable)
            if not stack:
                return value
            frame_kind, original, children, index, converted, hashable = stack.pop()
            converted.append(value)


def _plain_leaf(value: Any) -> Any:
    kind = type(value)
    if kind is Keyword or kind is Symbol:
        return value.str
    if kind is Boolean:
        return bool(value)
    return value


def _plain_built(kind: int, original: Any, converted: list[Any], hashable: bool) -> Any:
    if kind == _SEQUENCE:
        return tuple(converted) if hashable else converted
    if kind == _SET:
        elements = frozenset(converted)
        if len(elements) < len(original):
            elements = original  # e.g. true and 1: keep Transit's own objects rather than lose one
        return elements if hashable else set(elements)
    size = len(original)
    keys = converted[:size]
    if len(set(keys)) < size:
        # e.g. :a and "a": keep the exact keys; a frozendict is written back with its keys as given.
        return frozendict(zip(original.keys(), converted[size:], strict=True))
    items = dict(zip(keys, converted[size:], strict=True))
    return FrozenMap(items) if hashable else items


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


# _prepare's frames: the kind of container whose children are being prepared.
_ITEMS: Final = 0  # list or tuple
_CLOJURE_LIST: Final = 1  # transit List
_ELEMENTS: Final = 2  # set or frozenset
_ENTRIES: Final = 3  # a Mapping: each key, then its value
_REP: Final = 4  # a TaggedValue's rep
# A path in an error message keeps this many steps at each end.
_PATH_ENDS: Final = 8


def _prepare(root: Any) -> Any:  # noqa: PLR0915  # one loop, inline: a call per node would slow the common payloads
    """Return ``root`` in the types transit-python's writer handles, applying the rules above.

    An explicit stack rather than recursion, so depth is bounded by MAX_NESTING, not by the
    interpreter; a container met again inside itself is refused as a cycle.
    """
    # Each open frame: [kind, container, iterator of its children, prepared children, hashable,
    # the child being prepared (index, key or element), for a map: the given key of each prepared key]
    stack: list[list[Any]] = []
    open_ids: set[int] = set()
    value = root
    hashable = False
    try:
        while True:
            kind = type(value)
            frame: list[Any] | None = None
            if kind is str:
                value = _checked_text(value)
            elif kind in _PREPARED_AS_THEY_ARE or value is None:
                pass
            elif isinstance(value, Mapping):
                frame = [_ENTRIES, value, iter(value.items()), {}, hashable, None, {}]
            elif isinstance(value, list | tuple):
                frame = [_ITEMS, value, iter(value), [], hashable, -1, None]
            elif isinstance(value, set | frozenset):
                frame = [_ELEMENTS, value, iter(value), [], True, None, None]
            elif isinstance(value, List):
                frame = [_CLOJURE_LIST, value, iter(value.rep), [], True, -1, None]
            elif isinstance(value, TaggedValue) and not isinstance(value, transit_types.URI):
                if not isinstance(value.tag, str) or not value.tag:
                    raise _UnencodableError(f"TaggedValue tag must be a non-empty str, got {value.tag!r}")
                frame = [_REP, value, iter((value.rep,)), [], hashable, None, None]
            else:
                value = _prepare_leaf(value)
            if frame is not None:
                if id(value) in open_ids:
                    raise _UnencodableError(
                        f"{type(value).__name__} contains itself, which no Transit text can hold"
                    )
                if len(stack) >= MAX_NESTING:
                    raise _UnencodableError(
                        f"it is nested more than {MAX_NESTING} levels deep, the limit (docs/transit.md)"
                    )
                stack.append(frame)
                open_ids.add(id(value))
            else:
                frame = stack[-1] if stack else None
                if frame is None:
                    return value
                _add_prepared(frame, value)
            # Find the next child to prepare, closing the frames that have none left.
            while True:
                frame = stack[-1]
                if frame[0] == _ENTRIES and frame[5] is not None:
                    value, hashable = frame[5][1], frame[4]  # the value of the key just prepared
                    break
                entry = next(frame[2], _END)
                if entry is _END:
                    stack.pop()
                    open_ids.discard(id(frame[1]))
                    value = _prepared(frame)
                    if not stack:
                        return value
                    _add_prepared(stack[-1], value)
                    continue
                if frame[0] == _ENTRIES:
                    key, item = entry
                    frame[5] = (key, item, _NO_KEY)
                    if not (isinstance(key, str) and not isinstance(frame[1], frozendict)):
                        value, hashable = key, True
                        break
                    _add_prepared(frame, Keyword(_checked_text(key)))
                    entry = item
                elif frame[0] in (_ITEMS, _CLOJURE_LIST):
                    frame[5] += 1
                else:
                    frame[5] = entry
                # The scalars most payloads are made of, without a turn of the outer loop.
                entry_kind = type(entry)
                if entry_kind in _PREPARED_AS_THEY_ARE or entry is None:
                    _add_prepared(frame, entry)
                elif entry_kind is str:
                    _add_prepared(frame, _checked_text(entry))
                elif frame[0] != _ENTRIES:
                    value, hashable = entry, frame[4]
                    break
    except _UnencodableError as error:
        error.steps = [_step(frame) for frame in reversed(stack)]
        raise


_PREPARED_AS_THEY_ARE: Final = frozenset({int, float, bool, Keyword, Symbol, Boolean, uuid.UUID})
_END: Final[Any] = object()
_NO_KEY: Final = object()  # a map entry whose key is not prepared yet


def _add_prepared(frame: list[Any], value: Any) -> None:
    """Give ``frame`` its child prepared as ``value``."""
    if frame[0] != _ENTRIES:
        frame[3].append(value)
        return
    key, item, prepared_key = frame[5]
    if prepared_key is not _NO_KEY:
        frame[3][prepared_key] = value
        frame[5] = None
        return
    prepared, given_keys = frame[3], frame[6]
    if value in prepared:
        frame[5] = None  # the error is the map's, not its key's
        raise _UnencodableError(
            f"keys {_short_repr(given_keys[value])} and {_short_repr(key)} of one map are both "
            f"written as {_short_repr(value)} (a str key of a dict is written as a keyword)"
        )
    given_keys[value] = key
    frame[5] = (key, item, value)  # its value is prepared next


def _prepared(frame: list[Any]) -> Any:
    kind, container, _, built, hashable = frame[:5]
    if kind == _ITEMS:
        return tuple(built) if hashable else built
    if kind == _CLOJURE_LIST:
        return List(tuple(built))
    if kind == _ELEMENTS:
        return frozenset(built)
    if kind == _ENTRIES:
        return frozendict(built) if hashable else built
    return TaggedValue(container.tag, built[0])


def _step(frame: list[Any]) -> str:
    """The step of an error's path that ``frame``'s current child is."""
    kind, container, current = frame[0], frame[1], frame[5]
    if kind in (_ITEMS, _CLOJURE_LIST):
        return f"[{current}]"
    if kind == _ELEMENTS:
        return f"<set element {_short_repr(current)}>"
    if kind == _REP:
        return f"<rep of #{container.tag}>"
    if current is None:
        return ""
    key, _, prepared_key = current
    return f"<key {_short_repr(key)}>" if prepared_key is _NO_KEY else f"[{_short_repr(key)}]"


def _prepare_leaf(value: Any) -> Any:
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
    if isinstance(value, transit_types.URI | transit_types.Link):
        return value
    raise _UnencodableError(
        f"{type(value).__module__}.{type(value).__qualname__} {_short_repr(value)} has no Transit form"
    )


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
        try:
            _fast_shallow(data, parts, _JavaRollingCache(), 0)
        except (_TooDeepToRecurse, RecursionError):
            parts = []
            _fast_value(data, parts, _JavaRollingCache())
    except (_NotPlainJson, UnicodeEncodeError):
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


def _fast_shallow(node: Any, parts: list[str], cache: Any, depth: int) -> None:  # noqa: PLR0915  # scalars inline: no call each
    """_fast_value by recursion, scalars inline; raises _TooDeepToRecurse past _RECURSION_BUDGET levels."""
    if depth == _RECURSION_BUDGET:
        raise _TOO_DEEP_TO_RECURSE
    depth += 1
    if type(node) is dict:
        parts.append('["^ "')
        for key, value in node.items():
            if type(key) is not str:
                raise _NOT_FAST
            # A str key is a keyword, its name cached from its second use as transit-java does.
            name = "~:" + key
            code = cache.value_to_key.get(name)
            if code is None:
                parts.append("," + _fast_str(cache.encode(name, True)) + ",")
            else:
                parts.append(',"' + code + '",')  # a cache code is ASCII that needs no escape
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
            elif kind is dict or kind is list or kind is tuple:
                _fast_shallow(value, parts, cache, depth)
            else:
                raise _NOT_FAST
        parts.append("]")
        return
    parts.append("[")
    for value in node:  # each item followed by ",", the last one's replaced by "]"
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
        elif kind is dict or kind is list or kind is tuple:
            _fast_shallow(value, parts, cache, depth)
        else:
            raise _NOT_FAST
        parts.append(",")
    if parts[-1] == ",":  # a separator, never a value: values are JSON strings, numbers or brackets
        parts[-1] = "]"
    else:
        parts.append("]")


def _fast_value(root: Any, parts: list[str], cache: Any) -> None:  # noqa: PLR0915  # see _plain
    """Append the text of ``root`` (a dict, list or tuple) to ``parts``; raises _NotPlainJson for a
    shape that is not plain.

    An explicit stack of the open dicts and lists rather than recursion; past MAX_NESTING levels (or
    in a cycle) it gives up and leaves the payload to the general path, which names the problem.
    """
    # Suspended containers, innermost last: the iterator of their entries, and whether they are dicts.
    stack: list[tuple[Iterator[Any], bool]] = []
    node = root
    while True:
        if len(stack) >= MAX_NESTING:
            raise _NOT_FAST
        is_map = type(node) is dict
        if is_map:
            parts.append('["^ "')
            entries = iter(node.items())
        else:
            parts.append("[")
            entries = iter(node)
        first = True
        while True:  # write this container's entries until one is a container or they end
            child: Any = None
            for entry in entries:
                if is_map:
                    key, value = entry
                    if type(key) is not str:
                        raise _NOT_FAST
                    # A str key is a keyword, its name cached from its second use as transit-java does.
                    parts.append(",")
                    parts.append(_fast_str(cache.encode("~:" + key, True)))
                    parts.append(",")
                else:
                    value = entry
                    if first:
                        first = False
                    else:
                        parts.append(",")
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
                elif kind is dict or kind is list or kind is tuple:
                    child = value
                    break
                else:
                    raise _NOT_FAST
            if child is not None:
                stack.append((entries, is_map))
                node = child
                break
            parts.append("]")
            if not stack:
                return
            entries, is_map = stack.pop()
            first = False


# Types _prepare gives that the marshaler writes as one JSON value (their handlers' tags are one char).
_WRITTEN_AS_LEAVES: Final = frozenset(
    {str, int, float, bool, type(None), Keyword, Symbol, Boolean, uuid.UUID, datetime.datetime, Decimal}
)


def _write(root: Any, marshaler: _JsonMarshaler, cache: Any) -> None:
    """Write the prepared ``root`` as transit-python's marshaler would, without its recursion.

    The marshaler writes every value that is not a container (and the separators, with its own state);
    this walks the arrays, maps, sets and tagged values in the same order, so the key cache numbers
    keys as transit-java does.
    """
    handlers = marshaler.handlers
    if len(handlers[root].tag(root)) == 1:
        marshaler.marshal_top(root, cache)  # a scalar, quoted: ["~#'",x]
        return
    # The open JSON arrays, innermost last: an iterator of the children to write, and whether they are
    # a map's entries (key, value).
    stack: list[tuple[Iterator[Any], bool]] = []
    node = root
    while True:
        if type(node) in _WRITTEN_AS_LEAVES:
            marshaler.marshal(node, False, cache)  # the marshaler finds its handler once, not twice
        elif len(handlers[node].tag(node)) == 1:
            marshaler.marshal(node, False, cache)
        else:
            handler = handlers[node]
            tag = handler.tag(node)
            if len(stack) >= MAX_NESTING:
                raise SerializationError(
                    f"cannot encode payload: its Transit text nests more than {MAX_NESTING} arrays, the "
                    "limit (docs/transit.md)"
                )
            marshaler.emit_array_start(None)
            rep = handler.rep(node)
            if tag == "array":
                stack.append((iter(rep), False))
            elif tag == "map" and marshaler.are_stringable_keys(rep):
                marshaler.emit_object(MAP_AS_ARR)
                stack.append((iter(rep.items()), True))
            else:
                # A tagged value: ["~#tag", rep]. transit-java writes a map with composite keys as
                # ["~#cmap",[k,v,...]]; a set's rep is an "array" TaggedMap of its elements.
                if tag == "map":
                    tag, rep = "cmap", flatten_map(rep)
                marshaler.emit_string(ESC, "#", tag, False, cache)
                stack.append((iter((rep,)), False))
        while stack:
            children, entries = stack[-1]
            child = next(children, _END)
            if child is _END:
                stack.pop()
                marshaler.emit_array_end()
                continue
            if entries:
                key, node = child
                marshaler.marshal(key, True, cache)
            else:
                node = child
            break
        else:
            marshaler.flush()
            return


def _prepare_shallow(value: Any, hashable: bool, depth: int) -> Any:
    """_prepare by recursion, with its rules and results; scalars inline.

    Raises _TooDeepToRecurse past _RECURSION_BUDGET levels (a cycle among them), and _UnencodableError
    without a path for what cannot be written: _general_encode then runs _prepare, which names it.
    """
    kind = type(value)
    if kind is str:
        return _checked_text(value)
    if kind in _PREPARED_AS_THEY_ARE or value is None:
        return value
    if depth == _RECURSION_BUDGET:
        raise _TOO_DEEP_TO_RECURSE
    depth += 1
    if isinstance(value, Mapping):
        keys_as_given = isinstance(value, frozendict)
        prepared: dict[Any, Any] = {}
        for key, item in value.items():
            if not keys_as_given and isinstance(key, str):
                prepared_key: Any = Keyword(_checked_text(key))
            else:
                prepared_key = _prepare_shallow(key, True, depth)
            if prepared_key in prepared:
                raise _UnencodableError("two keys are written alike")
            item_kind = type(item)
            if item_kind is str:
                prepared[prepared_key] = _checked_text(item)
            elif item_kind in _PREPARED_AS_THEY_ARE or item is None:
                prepared[prepared_key] = item
            else:
                prepared[prepared_key] = _prepare_shallow(item, hashable, depth)
        return frozendict(prepared) if hashable else prepared
    if isinstance(value, list | tuple):
        items = [_prepare_shallow(item, hashable, depth) for item in value]
        return tuple(items) if hashable else items
    if isinstance(value, set | frozenset):
        return frozenset([_prepare_shallow(element, True, depth) for element in value])
    if isinstance(value, List):
        return List(tuple([_prepare_shallow(item, True, depth) for item in value.rep]))
    if isinstance(value, TaggedValue) and not isinstance(value, transit_types.URI):
        if not isinstance(value.tag, str) or not value.tag:
            raise _UnencodableError("a TaggedValue's tag is not a non-empty str")
        return TaggedValue(value.tag, _prepare_shallow(value.rep, hashable, depth))
    return _prepare_leaf(value)


def _general_encode(data: Any) -> str:
    """Any payload through transit-python's marshaler, with the rules of _prepare."""
    try:
        # Ordinary payloads: prepared by recursion and written by transit-python's own (recursive)
        # marshaler, the quickest way; anything else, errors included, goes the iterative way below.
        prepared = _prepare_shallow(data, False, 0)
        buffer = io.StringIO()
        _JsonMarshaler(buffer).marshal_top(prepared, _JavaRollingCache())
        return buffer.getvalue()
    except Exception:  # the iterative path below gives the error, if there is one
        pass
    try:
        prepared = _prepare(data)
    except _UnencodableError as error:
        raise SerializationError(f"cannot encode {_path(error.steps)}: {error.reason}") from None
    except RecursionError:
        # transit's frozendict hashes itself recursively (see _read_exact).
        raise SerializationError(f"cannot encode payload: {_UNHASHABLE_DEPTH}") from None
    buffer = io.StringIO()
    try:
        # A new cache per payload, as transit-clj makes a new writer per payload. transit-python's
        # Writer is not used: its key cache can disagree with transit-java's (see _is_cacheable).
        _write(prepared, _JsonMarshaler(buffer), _JavaRollingCache())
    except SerializationError:
        raise
    except Exception as error:
        raise SerializationError(
            f"Transit could not encode the payload ({type(error).__name__}: {error})"
        ) from error
    return buffer.getvalue()


def _path(steps: list[str]) -> str:
    """``payload`` and the steps to a value in it, outermost first; a deep path keeps its two ends."""
    steps = steps[::-1]
    if len(steps) > 2 * _PATH_ENDS:
        skipped = len(steps) - 2 * _PATH_ENDS
        steps = [*steps[:_PATH_ENDS], f"...({skipped} more levels)...", *steps[-_PATH_ENDS:]]
    return "payload" + "".join(steps)


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
