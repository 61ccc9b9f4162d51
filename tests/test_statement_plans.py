"""PostgreSQL's pipelined statement plan (PostgresBackend(pipeline=True)): same rows, same transaction."""

from __future__ import annotations

from typing import Any

import pytest
from support import enqueue_committed

from conformance.harness import SqlHarness
from proletarian_ref import ConfigurationError, process_next_job
from proletarian_ref.backends.postgres import PostgresBackend
from proletarian_ref.errors import DatabaseError
from proletarian_ref.tables import TableName


def _noop(job_type: str, payload: Any) -> None:
    return None


class _ArchivesNothing(PostgresBackend):
    """The archive INSERT matches no row: its count is 0, which the backend must refuse before COMMIT."""

    def _render(self, name: str, job_table: TableName, archived_job_table: TableName | None = None) -> str:
        text = super()._render(name, job_table, archived_job_table)
        if name == "archive_job":
            assert "WHERE" in text
            text = text.replace("WHERE", "WHERE false AND", 1)
        return text


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipelined"])
def test_both_plans_archive_a_job_into_the_same_row(pg_db: SqlHarness, pipeline: bool) -> None:
    job_id = enqueue_committed(pg_db, "plans/job", {"n": 1})
    backend = PostgresBackend(pg_db.data_source, pipeline=pipeline)
    try:
        assert process_next_job(pg_db.data_source, _noop, backend=backend, **pg_db.table_options) is True
        assert process_next_job(pg_db.data_source, _noop, backend=backend, **pg_db.table_options) is None
    finally:
        backend.close()
    assert pg_db.jobs() == []
    (archived,) = pg_db.archived_jobs()
    assert (archived.job_id, archived.job_type, archived.payload, archived.status) == (
        job_id,
        ":plans/job",
        '["^ ","~:n",1]',
        ":success",
    )


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipelined"])
def test_a_write_that_changes_no_row_rolls_back_before_commit_and_keeps_the_job(
    pg_db: SqlHarness, pipeline: bool
) -> None:
    job_id = enqueue_committed(pg_db, "plans/job", {"n": 2})
    backend = _ArchivesNothing(pg_db.data_source, pipeline=pipeline)
    try:
        with pytest.raises(DatabaseError, match="archive_job changed 0 rows"):
            process_next_job(pg_db.data_source, _noop, backend=backend, **pg_db.table_options)
    finally:
        backend.close()
    # The DELETE ran in the same transaction; without the check before COMMIT the job would be gone.
    assert [job.job_id for job in pg_db.jobs()] == [job_id]
    assert pg_db.archived_jobs() == []


def test_the_pipeline_option_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="pipeline must be True or False"):
        PostgresBackend(lambda: None, pipeline=1)  # type: ignore[arg-type]
