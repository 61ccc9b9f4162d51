"""enqueue_many's batch paths write what the per-job ones do: ids, COPY text, MySQL VALUES, names."""

from __future__ import annotations

import os
import pickle
import threading
import uuid
from datetime import UTC, datetime
from itertools import islice
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.adapt import Transformer
from test_enqueue_many import ListedIds, one_by_one_and_batched

from conformance.harness import Harness
from proletarian_ref import ConfigurationError, JobSpec, enqueue_many
from proletarian_ref.backends.memory import MemoryDatabase
from proletarian_ref.backends.postgres import _copy_text
from proletarian_ref.job_ids import (
    MysqlUuidStrategy,
    PostgresqlUuidStrategy,
    default_job_id_strategy,
    random_uuids,
)

try:
    from psycopg._copy_base import format_row_text
except ImportError:  # pragma: no cover - older psycopg keeps it in psycopg.copy
    from psycopg.copy import format_row_text  # type: ignore[attr-defined,no-redef]


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"])
def test_the_default_strategies_batch_ids_are_the_v4_uuids_uuid4_makes(dialect: str) -> None:
    strategy = default_job_id_strategy(dialect)
    supply = random_uuids(strategy)
    assert supply is not None
    pairs = list(islice(supply, 600))  # past one block of os.urandom
    for job_id, stored in pairs:
        assert type(job_id) is uuid.UUID
        assert job_id.version == 4 and job_id.variant == uuid.RFC_4122
        assert job_id.is_safe is uuid.SafeUUID.unknown
        assert uuid.UUID(bytes=job_id.bytes, version=4) == job_id  # uuid4()'s construction, bit for bit
        assert pickle.loads(pickle.dumps(job_id)) == job_id
        assert uuid.UUID(str(job_id)) == job_id and hash(job_id) == hash(uuid.UUID(int=job_id.int))
        assert stored == strategy.encode_id(job_id)
    assert len({job_id for job_id, _ in pairs}) == 600


class CountingUuids(PostgresqlUuidStrategy):
    def __init__(self) -> None:
        self.calls = 0

    def generate_id(self) -> uuid.UUID:
        self.calls += 1
        return super().generate_id()


def test_a_strategy_of_ones_own_is_called_for_every_job_even_a_subclass_of_the_default() -> None:
    assert random_uuids(CountingUuids()) is None
    assert random_uuids(ListedIds("mysql", [])) is None
    assert random_uuids(MysqlUuidStrategy()) is not None
    strategy = CountingUuids()
    conn = MemoryDatabase().connect()
    ids = enqueue_many(conn, [("a", n) for n in range(5)], job_id_strategy=strategy)
    assert strategy.calls == 5 and len(set(ids)) == 5


class NoneAfterFirst:
    def __init__(self) -> None:
        self.first = True

    def generate_id(self) -> Any:
        first, self.first = self.first, False
        return uuid.uuid4() if first else None

    def encode_id(self, job_id: Any) -> Any:
        return job_id

    def decode_id(self, value: Any) -> Any:
        return value


def test_a_strategy_returning_none_for_some_jobs_only_is_refused_at_the_first_such_job() -> None:
    db = MemoryDatabase()
    conn = db.connect()
    with pytest.raises(ConfigurationError, match=r"^jobs\[1\]: job_id_strategy returned None") as raised:
        enqueue_many(conn, [("a", 1), ("a", 2)], job_id_strategy=NoneAfterFirst())
    assert raised.value.index == 1
    conn.commit()
    assert db.jobs() == []


def psycopg_copy_text(rows: list[tuple[Any, ...]]) -> bytes:
    """What psycopg's write_row sends for `rows` in a text COPY on a UTF-8 connection."""
    out = bytearray()
    transformer = Transformer()
    for row in rows:
        format_row_text(row, transformer, out)
    return bytes(out)


COPY_TEXT = st.text(st.one_of(st.characters(), st.sampled_from(list("\b\t\n\v\f\r\\N"))), max_size=12).filter(
    lambda text: "\x00" not in text and all(not "\ud800" <= char <= "\udfff" for char in text)
)
NOW = datetime(2026, 1, 2, 3, 4, 5, 6789, tzinfo=UTC).isoformat()


@given(
    st.lists(
        st.tuples(
            st.uuids(),
            st.sampled_from([":q", ":a/b", "\\x"]),
            st.sampled_from([":t", "\t"]),
            COPY_TEXT,
            st.integers(min_value=0, max_value=2**40),
            st.sampled_from([NOW, "x\ny"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_copy_text_is_what_psycopgs_write_row_sends(values: list[tuple[Any, ...]]) -> None:
    rows = [
        (job_id, queue, job_type, payload, n, at, at) for job_id, queue, job_type, payload, n, at in values
    ]
    text = _copy_text(rows)
    assert text is not None
    assert text.encode("utf-8") == psycopg_copy_text(rows)


@pytest.mark.parametrize(
    "row",
    [
        (str(uuid.uuid4()), ":q", ":t", "p", 0, NOW, NOW),  # an id psycopg dumps its own way
        (uuid.uuid4(), ":q", ":t", "p", True, NOW, NOW),
        (uuid.uuid4(), ":q", ":t", None, 0, NOW, NOW),
        (uuid.uuid4(), ":q", ":t", "p", 0, datetime.now(UTC), NOW),
        (uuid.uuid4(), ":q", ":t", "p", 0, NOW),
        (uuid.uuid4(), None, None, "p", None, None, None),
    ],
)
def test_copy_text_leaves_a_row_of_other_types_to_psycopg(row: tuple[Any, ...]) -> None:
    assert _copy_text([row]) is None
    assert _copy_text([(uuid.uuid4(), ":q", ":t", "p", 0, NOW, NOW), row]) is None


# Payloads quoted as they are (no escape needed; % where PyMySQL would format parameters) and, in a
# batch of their own, one that needs PyMySQL's escaping.
PLAIN_PAYLOADS: list[Any] = [{"email": "a@b.c", "n": 1}, "100% %s %(x)s", ["é", "日本", "\U0001f600"], "\"'"]


@pytest.mark.parametrize("payloads", [PLAIN_PAYLOADS[:3], PLAIN_PAYLOADS])
def test_a_batch_of_plain_payloads_writes_the_rows_single_enqueues_write(
    db: Harness, payloads: list[Any]
) -> None:
    # The batch as (job_type, payload) tuples: enqueue_many's own path for them, the queue its option.
    written = one_by_one_and_batched(
        db,
        [JobSpec("a/b", payload, queue="q") for payload in payloads],
        [("a/b", payload) for payload in payloads],
        queue="q",
    )
    assert written.returned == written.ids
    assert written.batched == written.one_by_one


def test_each_thread_draws_ids_from_its_own_supply() -> None:
    # A generator run by two threads at once raises; each thread has its own block of random bytes.
    strategy = default_job_id_strategy("postgresql")
    supplies: dict[str, object] = {}

    def draw(name: str) -> None:
        supplies[name] = random_uuids(strategy)

    threads = [threading.Thread(target=draw, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert supplies["a"] is not supplies["b"]
    assert random_uuids(strategy) is random_uuids(strategy)  # the same thread keeps its supply


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    # The child inherits the parent's memory, its unused block of ids included: it must not use it.
    supply = random_uuids(default_job_id_strategy("postgresql"))
    assert supply is not None
    next(supply)  # a block drawn and partly used before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        child_supply = random_uuids(default_job_id_strategy("postgresql"))
        ids = [job_id.hex for job_id, _ in islice(child_supply or iter(()), 10)]
        os.write(write, " ".join(ids).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_ids = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent_ids = {job_id.hex for job_id, _ in islice(supply, 10)}
    assert len(child_ids) == 10 and not child_ids & parent_ids
