"""What every section of a pair of named runs against the server's limit (LimitPair) quotes alike is its
runs': the pasted tables, the revision, machine and load, the asyncio chain's one exchange a job, the table
of issue 31's targets per point and the sentence of where they stand, for each pair from limit9 on."""

from __future__ import annotations

import pytest
from docs_support import LIMIT_PAIRS, LimitPair

from benchmarks.async_drain import ASYNC_CHAIN_BACKENDS

pytestmark = pytest.mark.parametrize(
    "pair", LIMIT_PAIRS, ids=[pair.cores_run.split("-")[0] for pair in LIMIT_PAIRS]
)


def test_both_runs_tables_are_pasted(pair: LimitPair) -> None:
    pair.assert_tables_pasted()


def test_the_runs_are_named_with_their_revision_machine_and_load(pair: LimitPair) -> None:
    pair.assert_named()


def test_the_asyncio_chain_drained_on_the_backends_own_exchange_one_a_job(pair: LimitPair) -> None:
    pair.assert_async_chain_one_exchange_a_job(ASYNC_CHAIN_BACKENDS["postgresql"])


def test_the_targets_table_is_the_runs(pair: LimitPair) -> None:
    pair.assert_targets_table()


def test_where_the_targets_stand_is_the_runs(pair: LimitPair) -> None:
    pair.assert_where_the_targets_stand()
