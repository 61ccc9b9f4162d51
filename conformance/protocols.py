"""The optional backend protocols as needs of a test: a section runs only for a backend with its protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from conformance.harness import Harness
from proletarian_ref.backend import BatchClaim, BatchEnqueue, Notifications, StreamEnqueue

# The positional facts of @requires that name an optional protocol; the backend a harness makes is asked.
NEEDS_BATCH_CLAIM: Final = "batch_claim"
NEEDS_BATCH_ENQUEUE: Final = "batch_enqueue"
NEEDS_RELEASE: Final = "release_connection"
NEEDS_NOTIFICATIONS: Final = "notifications"
NEEDS_CHAINED_CLAIM: Final = "chained_claim"
NEEDS_CHAINED_BATCH_CLAIM: Final = "chained_batch_claim"


def _releases(backend: Any) -> bool:
    return callable(getattr(backend, "release_connection", None))


def _chains(backend: Any) -> bool:
    # The worker chains only on chained_claims True: a backend with the method and the plan off is not.
    chained = getattr(backend, "chained_claims", False) is True
    return chained and callable(getattr(backend, "commit_and_get_next_job", None))


def _chains_batches(backend: Any) -> bool:
    # Batch mode chains on a chained backend that has BatchClaim and the batch claim's chained twin.
    chained = _chains(backend) and isinstance(backend, BatchClaim)
    return chained and callable(getattr(backend, "commit_and_get_next_jobs", None))


# Fact -> (what the backend must have, in the words a skip reason uses; the check of a backend).
PROTOCOLS: Final[dict[str, tuple[str, Callable[[Any], bool]]]] = {
    NEEDS_BATCH_CLAIM: (
        "BatchClaim (get_next_jobs, archive_jobs, delete_jobs, savepoint: batch mode)",
        lambda backend: isinstance(backend, BatchClaim),
    ),
    NEEDS_BATCH_ENQUEUE: (
        "BatchEnqueue or StreamEnqueue (enqueue_many or enqueue_stream)",
        lambda backend: isinstance(backend, (BatchEnqueue, StreamEnqueue)),
    ),
    NEEDS_RELEASE: ("release_connection(thread_id) (what QueueWorker.stop() releases with)", _releases),
    NEEDS_NOTIFICATIONS: (
        "Notifications (notify_enqueued, listen: instant wake-up)",
        lambda backend: isinstance(backend, Notifications),
    ),
    NEEDS_CHAINED_CLAIM: (
        "ChainedClaim with chained_claims True (commit_and_get_next_job: chained claims)",
        _chains,
    ),
    NEEDS_CHAINED_BATCH_CLAIM: (
        "ChainedBatchClaim with BatchClaim and chained_claims True (commit_and_get_next_jobs: batch mode's "
        "chained claims)",
        _chains_batches,
    ),
}


def unmet_protocol(harness: Harness, fact: str) -> str | None:
    """Why a test that needs protocol `fact` cannot run against `harness`, or None when it can."""
    what, check = PROTOCOLS[fact]
    backend = harness.make_backend()
    try:
        if check(backend):
            return None
    finally:
        backend.close()
    return f"{harness.name}: the backend ({type(backend).__name__}) has no {what}"
