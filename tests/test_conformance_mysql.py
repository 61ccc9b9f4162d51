"""The MySQL/MariaDB backend (PyMySQL, mysqlclient) through the conformance suite as a third party runs it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator

import pytest

from conformance import BackendSuite, SqlHarness, WorkerSuite
from conformance.contract_chain import ChainedClaimTests
from conformance.runner import run_suite_test
from conformance.suite import clauses
from proletarian_ref.backends.mysql import MySQLBackend


class _AssumedPrecise(MySQLBackend):
    capabilities = dataclasses.replace(MySQLBackend.capabilities, claim_locks_only_the_claimed_row=True)


class TestMySQL(BackendSuite):
    @pytest.fixture
    def harness(self, mysql_db: SqlHarness) -> SqlHarness:
        return mysql_db


class TestMySQLBatch(WorkerSuite):
    """The clauses that run a worker again, every queue worker and process_next_job in batch mode."""

    @pytest.fixture
    def harness(self, mysql_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = mysql_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestMySQLCompact(BackendSuite):
    """The same suite with the backend on its compact statement plan (MySQLBackend(compact=True))."""

    @pytest.fixture
    def harness(self, mysql_compact_db: SqlHarness) -> SqlHarness:
        return mysql_compact_db


class TestMySQLCompactBatch(WorkerSuite):
    """The worker clauses in batch mode on the compact plan: a batch's two statements in one query."""

    @pytest.fixture
    def harness(self, mysql_compact_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = mysql_compact_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestMySQLChain(WorkerSuite):
    """The worker clauses with chained claims: each job still its own transaction, claimed and run once."""

    @pytest.fixture
    def harness(self, mysql_chain_db: SqlHarness) -> SqlHarness:
        return mysql_chain_db


class TestMySQLChainBatch(WorkerSuite):
    """The worker clauses in batch mode with chained claims: each batch its own transaction."""

    @pytest.fixture
    def harness(self, mysql_chain_db: SqlHarness) -> Iterator[SqlHarness]:
        batched = mysql_chain_db.with_worker_options(batch_size=8)
        try:
            yield batched
        finally:
            batched.close()


class TestMySQLChainClassicClaim(BackendSuite):
    """The chained plan with Proletarian's claim statements (bounded_claim=False, conformance.builtin:
    mysql_chain_classic): the claims the bounded ones replace stay under the whole suite."""

    @pytest.fixture
    def harness(self, mysql_chain_db: SqlHarness) -> SqlHarness:
        backend = functools.partial(MySQLBackend, compact=True, chain=True, bounded_claim=False)
        return mysql_chain_db.with_backend(backend, "mysql-chain-classic")


class TestMySQLChainClauses(ChainedClaimTests):
    """J1-J7, what a backend with chained claims owes the worker, on MySQL's chained plan."""

    __test__ = True

    @pytest.fixture
    def harness(self, mysql_chain_db: SqlHarness) -> SqlHarness:
        return mysql_chain_db


class TestMySQLClient(BackendSuite):
    """The whole suite with the backend on mysqlclient's connections (MySQLdb, the C driver)."""

    @pytest.fixture
    def harness(self, mysqlclient_db: SqlHarness) -> SqlHarness:
        return mysqlclient_db


class TestMySQLClientChain(WorkerSuite):
    """The worker clauses on mysqlclient with chained claims: its multi-statement queries, its values
    written into their text (mysql_driver.quote), the server's count checks read back with nextset."""

    @pytest.fixture
    def harness(self, mysqlclient_chain_db: SqlHarness) -> SqlHarness:
        return mysqlclient_chain_db


class TestMySQLClientChainClauses(ChainedClaimTests):
    """J1-J7 on mysqlclient's chained plan."""

    __test__ = True

    @pytest.fixture
    def harness(self, mysqlclient_chain_db: SqlHarness) -> SqlHarness:
        return mysqlclient_chain_db


def test_innodb_claims_keep_the_lock_on_the_record_that_ends_their_scan(mysql_db: SqlHarness) -> None:
    """Why MySQLBackend declares claim_locks_only_the_claimed_row False, so S7 and P-order skip.

    An empty poll of one queue keeps the lock on the next queue's oldest job until it commits, and that
    queue's worker takes a later job first. Should this test fail, the server no longer does that:
    declare the capability True and let S7 and P-order run on MySQL.
    """
    assumed_precise = mysql_db.with_backend(_AssumedPrecise, name="mysql, assumed to lock only claimed rows")
    result = run_suite_test(BackendSuite, clauses()["S7"][0], assumed_precise)
    assert result.outcome == "failed", f"S7 {result.outcome} on this server: {result.message}"
    assert "expected its oldest job" in result.text and "which the empty polls locked" in result.text, (
        result.text
    )
