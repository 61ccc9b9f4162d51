"""BackendSuite: the whole conformance suite as one base class; subclass it, give it a `harness` fixture."""

from __future__ import annotations

import inspect
import re
from typing import Final

from conformance.contract import ContractTests
from conformance.contract_batch import BatchClaimTests
from conformance.contract_chain import ChainedClaimTests
from conformance.contract_enqueue_many import EnqueueManyTests
from conformance.contract_release import ReleaseTests
from conformance.isolation import IsolationTests
from conformance.job_transaction import HandlerTransactionTests
from conformance.notifications import NotificationProtocolTests, NotificationTests
from conformance.payloads import PayloadTests
from conformance.properties import PropertyTests
from conformance.sessions import SessionTests
from conformance.zones import ZoneTests


class BackendSuite(
    ContractTests,
    SessionTests,
    IsolationTests,
    ZoneTests,
    PayloadTests,
    NotificationTests,
    # The optional protocols' sections: each clause skips, saying so, for a backend without its protocol.
    BatchClaimTests,
    EnqueueManyTests,
    ReleaseTests,
    ChainedClaimTests,
    NotificationProtocolTests,
    HandlerTransactionTests,
    PropertyTests,
):
    """Proof that a backend behaves as Proletarian's database does.

    Subclass it in a test module and override the `harness` fixture to yield your installed Harness;
    the subclass is collected as a test class, the base is not. See docs/conformance.md.
    """

    __test__ = False


_CLAUSE = re.compile(r"([A-Z]\d+)\b")


def clauses(suite: type = BackendSuite) -> dict[str, tuple[str, str]]:
    """Clause id ("S5") -> (the test of `suite` that proves it, the first line of its docstring).

    `suite` is BackendSuite unless told (conformance.side_tables.SideTableTests has the side tables' own).
    """
    found: dict[str, tuple[str, str]] = {}
    for name in sorted(dir(suite)):
        if not name.startswith("test_"):
            continue
        doc = inspect.getdoc(getattr(suite, name)) or ""
        match = _CLAUSE.match(doc)
        if match is None:
            raise ValueError(
                f"{suite.__name__}.{name} does not name its clause at the start of its docstring"
            )
        if match.group(1) in found:
            raise ValueError(f"clause {match.group(1)} is claimed by {found[match.group(1)][0]} and {name}")
        found[match.group(1)] = (name, doc.splitlines()[0])
    return found


# The clauses that run a queue worker or process_next_job. The others call the backend's verbs directly,
# so a harness's worker_options (batch mode) change nothing in them.
WORKER_CLAUSES: Final = frozenset(
    {"A2", "A3", "A4", "B1", "H1", "H2", "K1", "L1", "L2", "P1", "P2", "R2", "T1", "T3", "T5", "Z2"}
)


class WorkerSuite(BackendSuite):
    """The clauses of WORKER_CLAUSES only: for a second run of a backend's suite with worker_options
    (`harness.with_worker_options(batch_size=8)`), after BackendSuite has run the rest once."""

    __test__ = False


for _clause, (_name, _doc) in clauses().items():
    if _clause not in WORKER_CLAUSES:
        setattr(WorkerSuite, _name, None)
