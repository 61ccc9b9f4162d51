"""benchmarks.aio_speed: wait counter, profile buckets, asyncpg drain and bare-driver ceilings."""

from __future__ import annotations

import asyncio
import os

import psycopg
import pytest
from fix_db import table_suffix

from benchmarks.aio_speed import _source, _waits, measure, variants
from benchmarks.common import BackendSpec, bulk_load, open_harness, truncate


def _dsn() -> str:
    return os.environ.get("PROLETARIAN_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def test_the_wait_counter_counts_one_wait_a_statement_on_both_apis_and_unhooks_after() -> None:
    with psycopg.connect(_dsn()) as conn, _waits() as counted:
        conn.execute("SELECT 1")
        conn.execute("SELECT 2")
        conn.commit()
        assert counted[0] == 3

    async def on_async() -> None:
        conn = await psycopg.AsyncConnection.connect(_dsn())
        try:
            with _waits() as counted:
                await conn.execute("SELECT 1")
                await conn.commit()
                assert counted[0] == 2
            await conn.execute("SELECT 3")
            assert counted[0] == 2
        finally:
            await conn.close()

    asyncio.run(on_async())


def test_the_profile_buckets_name_the_library_the_driver_and_the_loop() -> None:
    assert _source("/x/proletarian_ref/_async/job_run.py", "run_next_job") == "proletarian_ref"
    assert _source("/x/site-packages/psycopg/waiting.py", "wait_async") == "psycopg"
    assert _source("/x/lib/python3.11/asyncio/base_events.py", "_run_once") == "asyncio event loop"
    assert _source("/x/lib/python3.11/selectors.py", "select") == "asyncio event loop"
    assert _source("~", "<method 'poll' of 'select.epoll' objects>") == "asyncio event loop"
    assert _source("~", "<built-in method builtins.isinstance>") == "built-ins"
    assert _source("/x/elsewhere.py", "f") == "other Python"


@pytest.mark.postgresql
@pytest.mark.parametrize(
    "variant",
    ["threaded compact", "asyncio asyncpg", "asyncio asyncpg compact", "raw threaded", "raw asyncpg compact"],
)
def test_each_quoted_variant_archives_every_job_it_counts_once(variant: str) -> None:
    # The named runs quote these drains: the asyncio worker on asyncpg, and the bare-driver loops (the
    # backends' own statements) it is measured against; each must archive every job it counts, once.
    harness = open_harness(
        BackendSpec("conformance.builtin:postgresql", {"dsn": _dsn()}), "aiospeed", f"_apg{table_suffix()}"
    )
    try:
        truncate(harness)
        bulk_load(harness, 0, 60, "due")
        wall, cpu = variants(_dsn(), harness, 2)[variant](50)
        assert wall > 0 and cpu > 0
        archived = harness.archived_jobs()
        assert len(archived) >= 50 and len({job.job_id for job in archived}) == len(archived)
        assert {(job.status, job.attempts) for job in archived} == {(":success", 1)}
        assert len(archived) + len(harness.jobs()) == 60
    finally:
        truncate(harness)
        harness.close()


def test_variants_refuses_a_name_it_does_not_have() -> None:
    with pytest.raises(SystemExit, match="no variant"):
        measure(_dsn(), 10, 1, 1, "_nosuch", ["threaded", "no such variant"])


@pytest.mark.postgresql
def test_pin_puts_the_client_on_one_cpu_and_its_backends_on_the_others() -> None:
    # --pin's figures are only what they claim if every backend of the drain moved, and the client did.
    before = os.sched_getaffinity(0)
    result = measure(_dsn(), 400, 1, 2, f"_pin{table_suffix()}", ["threaded"], pin=True)
    pinned = result["pinned"]
    client = sorted(before)[: len(before) // 2]
    assert pinned["client_cpus"] == client
    assert pinned["server_cpus"] == sorted(before - set(client))
    assert pinned["pinned"] >= 2 and pinned["failures"] == []
    assert os.sched_getaffinity(0) == before
