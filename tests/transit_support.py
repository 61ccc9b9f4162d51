"""Shared by the Transit tests: a type-strict comparable form of decoded values, and UTC datetimes."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal
from typing import Any

from transit.decoder import Tag
from transit.transit_types import Boolean, Keyword, List, Symbol, TaggedValue, frozendict

from proletarian_ref.serializers import FrozenMap

UTC = datetime.UTC

# Decimals whose exponent or scale is beyond a Java int: new BigDecimal(text) refuses them.
DECIMALS_JAVA_REFUSES = ["1E+2147483648", "1E-2147483648", "1.2E+2147483648", "0E+2147483648"]


def canon(value: Any) -> Any:
    """A hashable, type-strict form of a decoded value: True differs from 1, a list from a tuple."""
    kind = type(value)
    if value is None:
        return ("nil",)
    if kind in (bool, int, str):
        return (kind.__name__, value)
    if kind is float:
        return ("float", repr(value))  # NaN equals NaN, -0.0 differs from 0.0
    if kind is Boolean:
        return ("Boolean", bool(value))
    if kind in (Keyword, Symbol):
        return (kind.__name__, value.str)
    if kind in (Decimal, uuid.UUID):
        return (kind.__name__, str(value))
    if kind is datetime.datetime:
        return ("datetime", value.isoformat())
    if kind in (list, tuple):
        return (kind.__name__, tuple(canon(item) for item in value))
    if kind is List:
        return ("List", tuple(canon(item) for item in value.rep))
    if kind in (dict, frozendict, FrozenMap):
        return (kind.__name__, frozenset((canon(key), canon(item)) for key, item in value.items()))
    if kind in (set, frozenset):
        return (kind.__name__, frozenset(canon(element) for element in value))
    if kind is Tag:
        # transit-python reads a "~#tag" string in a map key's place as a bare Tag (transit-java too).
        return ("Tag", value.tag)
    if isinstance(value, TaggedValue):
        return ("tagged", value.tag, canon(value.rep))
    raise TypeError(f"canon: unexpected {kind}")


def utc(iso: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(iso).replace(tzinfo=UTC)


def same(left: Any, right: Any) -> bool:
    """Whether two values are equal and of the same types throughout, at any depth, without recursion.

    Type-strict like :func:`canon` (True differs from 1, a list from a tuple). Python's own ``==``
    recurses and stops at about 1,000 levels; deep payloads are compared here instead. A set is compared
    element by element when it has one element, with ``==`` otherwise (deep sets of several elements
    are not needed by the tests).
    """
    pending = [(left, right)]
    while pending:
        a, b = pending.pop()
        kind = type(a)
        if kind is not type(b):
            return False
        if kind in (list, tuple):
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
        elif kind is List or (isinstance(a, TaggedValue) and kind is TaggedValue):
            if a.tag != b.tag:
                return False
            pending.append((a.rep, b.rep))
        elif kind in (dict, frozendict, FrozenMap):
            if len(a) != len(b) or set(map(canon, a)) != set(map(canon, b)):
                return False
            pending.extend((a[key], b[key]) for key in a)
        elif kind in (set, frozenset) and len(a) == len(b) == 1:
            pending.append((next(iter(a)), next(iter(b))))
        elif canon(a) != canon(b):
            return False
    return True
