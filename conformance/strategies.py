"""Hypothesis strategies: payloads (unicode, large, nested) and workloads of jobs and competing workers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from hypothesis import strategies as st

from conformance.workload import Due, PlannedJob, Script, Workload
from proletarian_ref.errors import SerializationError
from proletarian_ref.job import default_serializer

DUES: Final[tuple[Due, ...]] = ("past", "now", "future")
QUEUES: Final = ("conformance/alpha", "conformance.queues/beta", "conformance/γάμμα")
JOB_TYPES: Final = ("conformance/echo", "my.ns/type", "conformance.ünï/tÿpe")
# Proletarian's payload column is TEXT, which MySQL caps at 65,535 bytes; stay clear of it.
MAX_PAYLOAD_BYTES: Final = 60_000

_text = st.text(max_size=24)  # Any code point but lone surrogates: astral emoji, RTL marks, NUL, U+2028.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | _text
    | st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
)
_nested = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=16,
)


def _repeat(unit: str, target_bytes: int) -> str:
    return unit * max(1, target_bytes // len(unit.encode("utf-8")))


_large = st.builds(_repeat, st.text(min_size=1, max_size=4), st.integers(min_value=2_000, max_value=20_000))


def _fits(payload: Any) -> bool:
    try:
        text = default_serializer().encode(payload)
    except SerializationError:
        return False  # e.g. two keys that become one keyword; not a payload anyone could enqueue.
    return len(text.encode("utf-8")) <= MAX_PAYLOAD_BYTES


def payloads() -> st.SearchStrategy[Any]:
    """Payloads the default serializer can write: scalars, unicode, nested lists and maps, large text."""
    return st.one_of(
        _nested,
        _large,
        st.fixed_dictionaries({"big": _large, "nested": _nested}),
    ).filter(_fits)


def scripts() -> st.SearchStrategy[Script]:
    return st.builds(
        Script,
        fail_times=st.integers(min_value=0, max_value=3),
        retries=st.integers(min_value=0, max_value=2),
        delay_ms=st.sampled_from([0, 400, 1_500, 20_000]),
        work_ms=st.sampled_from([0, 1, 3]),
    )


@st.composite
def planned_jobs(draw: st.DrawFn, queues: tuple[str, ...]) -> PlannedJob:
    due: Due = draw(st.sampled_from(DUES))
    if due == "past":
        offset = timedelta(seconds=draw(st.integers(min_value=1, max_value=86_400)))
    elif due == "future":
        offset = timedelta(seconds=draw(st.integers(min_value=1, max_value=90)))
    else:
        offset = timedelta(0)
    # A fraction of a second on top, so that second-precision columns have something to round.
    offset += timedelta(microseconds=draw(st.integers(min_value=0, max_value=999_999)))
    return PlannedJob(
        queue=draw(st.sampled_from(queues)),
        job_type=draw(st.sampled_from(JOB_TYPES)),
        payload=draw(payloads()),
        due=due,
        offset=offset,
        script=draw(scripts()),
    )


@st.composite
def thread_workloads(draw: st.DrawFn, max_jobs: int = 20) -> Workload:
    """Jobs over one to three queues, each queue drained by one to three queue workers of 1-2 threads."""
    queues = tuple(draw(st.lists(st.sampled_from(QUEUES), min_size=1, max_size=3, unique=True)))
    jobs = tuple(draw(st.lists(planned_jobs(queues), min_size=1, max_size=max_jobs)))
    workers = {
        queue: tuple(draw(st.lists(st.integers(min_value=1, max_value=2), min_size=1, max_size=3)))
        for queue in queues
    }
    return Workload(jobs=jobs, workers=workers)


@st.composite
def process_workloads(draw: st.DrawFn, max_jobs: int = 20) -> Workload:
    """Jobs over one or two queues, drained by two or three worker processes; each serves some queues."""
    queues = tuple(draw(st.lists(st.sampled_from(QUEUES), min_size=1, max_size=2, unique=True)))
    jobs = tuple(draw(st.lists(planned_jobs(queues), min_size=1, max_size=max_jobs)))
    processes = draw(st.integers(min_value=2, max_value=3))
    workers = {
        queue: tuple(
            draw(
                st.lists(
                    st.integers(min_value=0, max_value=2), min_size=processes, max_size=processes
                ).filter(any)
            )
        )
        for queue in queues
    }
    # Every process serves at least one queue, so none of them is there for nothing.
    for slot in range(processes):
        if not any(counts[slot] for counts in workers.values()):
            first = queues[0]
            counts = list(workers[first])
            counts[slot] = 1
            workers[first] = tuple(counts)
    return Workload(jobs=jobs, workers=workers)
