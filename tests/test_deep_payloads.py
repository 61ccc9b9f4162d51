"""Deeply nested payloads: Proletarian's own deep Transit text, and far deeper, read and written back.

The 1,000-level files in tests/data/transit-exemplars/proletarian-deep were written by Proletarian
1.0.109 itself (their README says how); the 1,000- and 10,000-level mixed payloads are built here, with
the expected text made by plain string construction, independent of the serializer. Every check runs
without the interpreter's recursion limit: values are built and compared with loops, not recursion
(Python's own ``==`` on such values would stop at about 1,000 levels).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import wait_until
from transit.transit_types import Keyword, List, TaggedValue, frozendict
from transit_support import same

from conformance.harness import Harness, SqlHarness
from proletarian_ref import create_queue_worker, enqueue
from proletarian_ref import serializers as serializers_module
from proletarian_ref.errors import PayloadDecodeError, SerializationError
from proletarian_ref.serializers import MAX_NESTING, FrozenMap, TransitSerializer

PLAIN = TransitSerializer()
EXACT = TransitSerializer(exact=True)
DEEP_DIR = Path(__file__).resolve().parent / "data" / "transit-exemplars" / "proletarian-deep"
PROLETARIAN_FILES = ["map-1000", "map-600", "mixed-1000", "vector-1000"]
# A thread stack a quarter of the JVM's default (1 MiB): depth must not cost stack.
SMALL_STACK = 256 * 1024


def proletarian_text(name: str) -> str:
    """A file Proletarian wrote; a missing file fails the test (the vectors are in the repository)."""
    return (DEEP_DIR / f"{name}.transit.json").read_text(encoding="utf-8")


def nest(levels: int, wrap: Callable[[int, Any], Any], leaf: Any) -> Any:
    """``leaf`` wrapped ``levels`` times, innermost first: level i gives ``wrap(i, inner)``."""
    value = leaf
    for level in range(levels):
        value = wrap(level, value)
    return value


def proletarian_value(name: str) -> Any:
    """What each file holds (its README), as exact decoding gives it."""
    if name == "vector-1000":
        return nest(1000, lambda _, inner: (inner,), 1)
    if name.startswith("map-"):
        return nest(int(name[4:]), lambda _, inner: frozendict({Keyword("c"): inner}), 1)

    def mixed(level: int, inner: Any) -> Any:
        return (
            (inner, 1),
            frozendict({Keyword("k"): inner, Keyword("n"): level}),
            List((inner,)),
            frozenset({inner}),
            frozendict({"s": inner}),
        )[level % 5]

    return nest(1000, mixed, "leaf")


# --- Proletarian's own deep payloads ------------------------------------------------------------------


def test_the_deep_payloads_proletarian_wrote_are_all_in_the_repository() -> None:
    found = sorted(path.name for path in DEEP_DIR.glob("*.transit.json"))
    assert found == [f"{name}.transit.json" for name in PROLETARIAN_FILES]
    assert (DEEP_DIR / "README.txt").is_file()


def run_in_thread(work: Callable[[], Any], stack_size: int = SMALL_STACK) -> Any:
    """``work()`` in a new thread with a small stack; its result, or its exception raised here."""
    results: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(work())
        except BaseException as error:  # handed to the test's thread
            errors.append(error)

    previous = threading.stack_size(stack_size)
    try:
        thread = threading.Thread(target=target)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "small-stack thread"])
@pytest.mark.parametrize("name", PROLETARIAN_FILES)
def test_a_deep_payload_proletarian_wrote_decodes_to_its_value_and_is_written_back_byte_for_byte(
    name: str, in_thread: bool
) -> None:
    text = proletarian_text(name)

    def round_trip() -> tuple[Any, str]:
        value = EXACT.decode(text)
        return value, EXACT.encode(value)

    value, again = run_in_thread(round_trip) if in_thread else round_trip()
    assert same(value, proletarian_value(name))
    assert again == text


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        ("vector-1000", nest(1000, lambda _, inner: [inner], 1)),
        ("map-1000", nest(1000, lambda _, inner: {"c": inner}, 1)),
        ("map-600", nest(600, lambda _, inner: {"c": inner}, 1)),
    ],
)
def test_deep_payloads_proletarian_wrote_decode_plainly_and_plain_values_are_written_as_proletarian_does(
    name: str, plain: Any
) -> None:
    text = proletarian_text(name)
    assert same(PLAIN.decode(text), plain)
    assert PLAIN.encode(plain) == text


def test_plain_decoding_of_proletarians_mixed_payload_gives_plain_types_at_every_level() -> None:
    value = PLAIN.decode(proletarian_text("mixed-1000"))
    kinds = []
    for level in reversed(range(1000)):
        kinds.append(type(value))
        value = {0: lambda v: v[0], 1: lambda v: v["k"], 2: lambda v: v[0], 3: lambda v: next(iter(v))}.get(
            level % 5, lambda v: v["s"]
        )(value)
    assert value == "leaf"
    # The outermost level is {"s" #{...}}; inside the set everything is hashable: vectors and lists
    # are tuples, maps FrozenMaps, sets frozensets.
    assert kinds[:2] == [dict, set]
    assert set(kinds[2:]) == {tuple, FrozenMap, frozenset}


# --- deeper than Proletarian: 1,000 and 10,000 levels of every kind, mixed -----------------------------


def mixed_payload(levels: int) -> tuple[Any, str]:
    """An exact value ``levels`` deep and its Transit text, built by string construction.

    Level i (innermost first) by i mod 10: 0-5 a vector [v], 6 a map {"s" v}, 7 a Clojure list (v),
    8 a set #{v}, 9 a tagged value #deep v. The tags are cached by order of first appearance, outermost
    first, as Transit's rule says ("~#list" -> "^0", ...). 10,000 levels stay under MySQL's TEXT limit.
    """
    value: Any = "leaf"
    for level in range(levels):
        kind = level % 10
        if kind <= 5:
            value = (value,)
        elif kind == 6:
            value = frozendict({"s": value})
        elif kind == 7:
            value = List((value,))
        elif kind == 8:
            value = frozenset({value})
        else:
            value = TaggedValue("deep", value)
    opens: list[str] = []
    closes: list[str] = []
    cache: dict[str, str] = {}
    for level in reversed(range(levels)):
        kind = level % 10
        if kind <= 5:
            opens.append("[")
            closes.append("]")
        elif kind == 6:
            opens.append('["^ ","s",')
            closes.append("]")
        else:
            tag = {7: "~#list", 8: "~#set", 9: "~#deep"}[kind]
            written = cache.get(tag, tag)
            cache.setdefault(tag, f"^{len(cache)}")
            opens.append(f'["{written}",' + ("[" if kind != 9 else ""))
            closes.append("]]" if kind != 9 else "]")
    return value, "".join(opens) + '"leaf"' + "".join(reversed(closes))


def plain_payload(levels: int) -> tuple[Any, str]:
    """A plain value of lists and dicts ``levels`` deep, alternating, and its Transit text.

    Level i (innermost first): even i a list [v, i], odd i a dict {"key" v}. The outermost map writes
    "~:key" and every one inside it the cache code "^0".
    """
    value: Any = "leaf"
    for level in range(levels):
        value = {"key": value} if level % 2 else [value, level]
    opens, closes = [], []
    key = '"~:key"'
    for level in reversed(range(levels)):
        if level % 2:
            opens.append(f'["^ ",{key},')
            closes.append("]")
            key = '"^0"'
        else:
            opens.append("[")
            closes.append(f",{level}]")
    return value, "".join(opens) + '"leaf"' + "".join(reversed(closes))


def test_the_mixed_payload_text_is_built_as_transit_writes_it() -> None:
    # The string construction itself, checked on a small case written out by hand.
    _, text = mixed_payload(11)
    assert text == '[["~#deep",["~#set",[["~#list",[["^ ","s",[[[[[["leaf"]]]]]]]]]]]]]'
    _, text = mixed_payload(20)
    assert text.startswith('["~#deep",["~#set",[["~#list",[["^ ","s",[[[[[[["^0",["^1",[["^2",[["^ ","s",')
    _, text = plain_payload(4)
    assert text == '["^ ","~:key",[["^ ","^0",["leaf",0]],2]]'


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "small-stack thread"])
@pytest.mark.parametrize("levels", [1000, 10_000])
def test_a_mixed_payload_is_written_and_read_back_exactly_at_any_depth(levels: int, in_thread: bool) -> None:
    value, text = mixed_payload(levels)

    def round_trip() -> tuple[str, Any]:
        return EXACT.encode(value), EXACT.decode(text)

    written, read = run_in_thread(round_trip) if in_thread else round_trip()
    assert written == text
    assert same(read, value)


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "small-stack thread"])
@pytest.mark.parametrize("levels", [1000, 10_000])
def test_a_plain_payload_takes_the_fast_paths_at_any_depth(levels: int, in_thread: bool) -> None:
    value, text = plain_payload(levels)

    def paths() -> tuple[str | None, str, str, Any, Any]:
        return (
            serializers_module._fast_encode(value),
            serializers_module._general_encode(value),
            PLAIN.encode(value),
            PLAIN.decode(text),
            serializers_module._plain(serializers_module._read_exact(text)),
        )

    fast, general, written, one_pass, two_pass = run_in_thread(paths) if in_thread else paths()
    assert fast == general == written == text
    assert same(one_pass, value)
    assert same(two_pass, value)


# --- where recursion hands over to the iterative paths ---------------------------------------------


def all_paths(value: Any, text: str) -> None:
    """Every path of encoding and decoding gives ``text`` and ``value`` back (``value`` plain)."""
    assert serializers_module._fast_encode(value) == text
    assert serializers_module._general_encode(value) == text
    assert PLAIN.encode(value) == text
    assert same(PLAIN.decode(text), value)
    assert same(serializers_module._plain(serializers_module._read_exact(text)), value)
    assert EXACT.encode(EXACT.decode(text)) == text


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "128 KiB thread"])
@pytest.mark.parametrize("extra", [-1, 0, 1, 2])
def test_payloads_about_as_deep_as_the_recursion_budget_take_one_path_or_the_other_alike(
    extra: int, in_thread: bool
) -> None:
    levels = serializers_module._RECURSION_BUDGET + extra
    for value, text in (
        (nested_lists(levels), "[" * levels + "1" + "]" * levels),
        (nest(levels, lambda _, inner: {"c": inner}, 1), '["^ ","~:c",' * levels + "1" + "]" * levels),
    ):
        if in_thread:
            run_in_thread(functools.partial(all_paths, value, text), 128 * 1024)
        else:
            all_paths(value, text)


def test_a_wide_payload_deep_at_its_end_starts_again_with_a_new_key_cache() -> None:
    # The recursive walk writes and reads the first maps (caching "~:name"), then meets the deep list and
    # hands the whole payload to the iterative walk, whose cache must start empty again.
    deep = nested_lists(3 * serializers_module._RECURSION_BUDGET)
    value = [{"name": 1}, {"name": deep}, {"name": 2}]
    levels = 3 * serializers_module._RECURSION_BUDGET
    text = '[["^ ","~:name",1],["^ ","^0",' + "[" * levels + "1" + "]" * levels + '],["^ ","^0",2]]'
    all_paths(value, text)
    tagged = [{"name": frozenset({1})}, {"name": deep}, {"name": frozenset({2})}]
    tagged_text = text.replace(",1]", ',["~#set",[1]]]', 1).replace(",2]]", ',["^1",[2]]]]')
    assert PLAIN.encode(tagged) == tagged_text
    assert same(EXACT.decode(tagged_text), EXACT.decode(EXACT.encode(EXACT.decode(tagged_text))))


# --- the limit, and payloads that cannot be written ---------------------------------------------------


def nested_lists(levels: int) -> Any:
    return nest(levels, lambda _, inner: [inner], 1)


def test_payloads_nested_up_to_the_limit_are_written_and_read() -> None:
    text = "[" * MAX_NESTING + "1" + "]" * MAX_NESTING
    assert PLAIN.encode(nested_lists(MAX_NESTING)) == text
    assert EXACT.encode(nest(MAX_NESTING, lambda _, inner: (inner,), 1)) == text
    assert same(PLAIN.decode(text), nested_lists(MAX_NESTING))
    assert same(EXACT.decode(text), nest(MAX_NESTING, lambda _, inner: (inner,), 1))


def test_a_payload_nested_past_the_limit_is_refused_naming_the_limit() -> None:
    for payload in (nested_lists(MAX_NESTING + 1), nest(MAX_NESTING + 1, lambda _, inner: (inner,), 1)):
        with pytest.raises(SerializationError, match=f"nested more than {MAX_NESTING} levels deep") as raised:
            PLAIN.encode(payload)
        assert len(str(raised.value)) < 400  # the path keeps its two ends
        assert "more levels" in str(raised.value)
    text = "[" * (MAX_NESTING + 1) + "1" + "]" * (MAX_NESTING + 1)
    for serializer in (PLAIN, EXACT):
        with pytest.raises(PayloadDecodeError, match=f"nested too deeply to decode: more than {MAX_NESTING}"):
            serializer.decode(text)


def test_the_limit_counts_the_arrays_of_the_text_so_a_set_counts_two() -> None:
    sets = nest(MAX_NESTING // 2 + 1, lambda _, inner: frozenset({inner}), 1)
    with pytest.raises(SerializationError, match=f"nests more than {MAX_NESTING} arrays"):
        EXACT.encode(sets)


def test_a_payload_that_contains_itself_is_refused_naming_where() -> None:
    looped: list[Any] = [1]
    looped.append(looped)
    with pytest.raises(SerializationError, match=r"cannot encode payload\[1\]: list contains itself"):
        PLAIN.encode(looped)
    deeper: dict[str, Any] = {"a": [{"b": None}]}
    deeper["a"][0]["b"] = deeper
    with pytest.raises(SerializationError, match=r"payload\['a'\]\[0\]\['b'\]: dict contains itself"):
        PLAIN.encode(deeper)


def test_a_set_holding_maps_nested_too_deeply_to_hash_is_refused_with_a_clear_error() -> None:
    # transit's frozendict hashes itself recursively: about a thousand levels of maps inside a set
    # element cannot be hashed. Proletarian's own payloads (sets every few levels) stay far from it.
    levels = 2_000
    text = '["~#set",[' + '["^ ","~:c",' * levels + "1" + "]" * levels + "]]"
    for serializer in (PLAIN, EXACT):
        with pytest.raises(PayloadDecodeError, match="holds maps nested too deeply for Python to hash"):
            serializer.decode(text)

    # FrozenMap caches its hash, so a caller can build such a set level by level; written, its maps
    # become frozendicts, which cannot be hashed at that depth.
    def frozen_map(_: int, inner: Any) -> FrozenMap:
        made = FrozenMap({"c": inner})
        hash(made)
        return made

    with pytest.raises(SerializationError, match="holds maps nested too deeply for Python to hash"):
        PLAIN.encode({"a": [frozenset({nest(levels, frozen_map, 1)})]})


def test_a_value_met_twice_but_not_inside_itself_is_written_twice() -> None:
    shared = [1, 2]
    assert PLAIN.encode([shared, [shared]]) == "[[1,2],[[1,2]]]"


# --- the figures docs/transit.md quotes -------------------------------------------------------------


def test_docs_quote_the_named_serializer_run_as_it_printed() -> None:
    # The run: python -m benchmarks.versus REV --serializer ... --out <folder>/versus-serializer.json,
    # its printed table saved beside it as versus-serializer.md and pasted into docs/transit.md.
    root = Path(__file__).resolve().parent.parent
    folder = root / "benchmarks" / "results" / "serializer"
    printed = (folder / "versus-serializer.md").read_text(encoding="utf-8").strip()
    run = json.loads((folder / "versus-serializer.json").read_text(encoding="utf-8"))
    assert printed.startswith(f"`{run['command']}`")
    assert "--serializer" in run["command"]
    assert printed in (root / "docs" / "transit.md").read_text(encoding="utf-8")


ORDINARY = ("map of 5 scalars", "map + 20 maps", "map + 500 maps", "tagged values")
DEEP_KINDS = ("vectors", "maps", "sets")


def speed_figures(run: dict[str, Any]) -> list[str]:
    """The figures docs/transit.md's "Speed" prose quotes, as it writes them, from the named run."""
    summary = run["serializer"]
    now = summary["sides"][1]
    ratios, medians = summary["ratios"][now], summary["medians"][now]
    operations = list(ratios[ORDINARY[0]])
    ordinary = [ratios[name][op] for name in ORDINARY for op in operations]
    vectors = [ratios["vectors x200"][op] for op in operations]
    deep = [(kind, op) for kind in DEEP_KINDS for op in operations]
    growth = [medians[f"{kind} x10,000"][op] / medians[f"{kind} x1,000"][op] for kind, op in deep]
    per_level = [medians[f"{kind} x10,000"][op] / 10_000 for kind, op in deep]
    return [
        f"ordinary payloads take {min(ordinary):.2f} to {max(ordinary):.2f} of the time",
        f"vectors 200 deep: {min(vectors):.2f} to {max(vectors):.2f} of the time",
        f"ten times the levels, {min(growth):.1f} to {max(growth):.1f} times the time",
        f"from about {min(per_level):.1f} µs a level",
        f"to about {max(per_level):.0f} µs",
    ]


def test_the_speed_figures_docs_quote_are_the_named_runs() -> None:
    root = Path(__file__).resolve().parent.parent
    run = json.loads((root / "benchmarks" / "results" / "serializer" / "versus-serializer.json").read_text())
    prose = " ".join((root / "docs" / "transit.md").read_text(encoding="utf-8").split())
    for figure in speed_figures(run):
        assert figure in prose


# --- through a worker, on each database ---------------------------------------------------------------


def deep_jobs() -> list[tuple[str, Any, str]]:
    """(job type, exact value, the text it must be stored as) for each deep golden vector."""
    jobs = [(f"deep/{name}", proletarian_value(name), proletarian_text(name)) for name in PROLETARIAN_FILES]
    for levels in (1000, 10_000):
        value, text = mixed_payload(levels)
        jobs.append((f"deep/mixed-{levels}-generated", value, text))
    return jobs


@pytest.mark.sql_only
def test_deep_golden_payloads_go_through_a_worker_and_are_archived_byte_for_byte(db: Harness) -> None:
    jobs = deep_jobs()
    conn = db.connect()
    try:
        for job_type, value, _ in jobs:
            enqueue(conn, job_type, value, serializer=EXACT, job_table=db.job_table)
        conn.commit()
    finally:
        conn.close()
    stored, _ = db.payload_bytes()
    assert sorted(stored) == sorted(text.encode() for _, _, text in jobs)
    seen: dict[str, Any] = {}
    lock = threading.Lock()

    def handler(job_type: str, payload: Any) -> None:
        with lock:
            seen[job_type] = payload

    worker = create_queue_worker(
        db.data_source,
        handler,
        serializer=EXACT,
        worker_threads=2,
        polling_interval_ms=20,
        **db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(seen) == len(jobs), timeout=120), sorted(seen)
    for job_type, value, _ in jobs:
        assert same(seen[job_type], value), job_type
    archived = db.archived_jobs()
    assert {(row.job_type, row.status) for row in archived} == {(f":{t}", ":success") for t, _, _ in jobs}
    _, archived_bytes = db.payload_bytes()
    assert sorted(archived_bytes) == sorted(text.encode() for _, _, text in jobs)


class _Stored:
    """A serializer that stores the given text as it is: another program writing a payload."""

    def __init__(self, text: str) -> None:
        self.text = text

    def encode(self, data: Any) -> str:
        return self.text

    def decode(self, text: str) -> Any:
        return text


@pytest.mark.sql_only
def test_a_payload_past_the_limit_is_refused_at_enqueue_and_nothing_is_stored(db: Harness) -> None:
    conn = db.connect()
    try:
        with pytest.raises(SerializationError, match="nested more than"):
            enqueue(conn, "deep/too", nested_lists(MAX_NESTING + 1), job_table=db.job_table)
        conn.commit()
    finally:
        conn.close()
    assert db.jobs() == []


def test_a_payload_stored_past_the_limit_fails_only_its_job_and_keeps_its_text(pg_db: SqlHarness) -> None:
    """Another program stored it; the worker fails that job, archives its text and runs the next one.

    PostgreSQL only: such a text is over 100,000 bytes, more than MySQL's TEXT payload column holds.
    """
    too_deep = "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1)
    conn = pg_db.connect()
    try:
        enqueue(conn, "deep/stored", None, serializer=_Stored(too_deep), job_table=pg_db.job_table)
        enqueue(conn, "deep/after", [1], job_table=pg_db.job_table)
        conn.commit()
    finally:
        conn.close()
    seen: list[str] = []
    failures: list[BaseException] = []
    worker = create_queue_worker(
        pg_db.data_source,
        lambda job_type, _: seen.append(job_type),
        failed_job_fn=lambda _, error: failures.append(error),
        polling_interval_ms=20,
        **pg_db.table_options,
    )
    with worker:
        assert wait_until(lambda: len(pg_db.archived_jobs()) == 2, timeout=60)
    assert seen == ["deep/after"]
    statuses = {row.job_type: row.status for row in pg_db.archived_jobs()}
    assert statuses == {":deep/stored": ":failure", ":deep/after": ":success"}
    assert isinstance(failures[0], PayloadDecodeError)
    assert "nested too deeply" in str(failures[0])
    _, archived_bytes = pg_db.payload_bytes()
    assert too_deep.encode() in archived_bytes  # the job's text is kept as it was
