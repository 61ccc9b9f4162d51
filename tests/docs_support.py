"""What the tests of the docs' named-run sections share: a section's text, its prose, a run's rows, a span."""

from __future__ import annotations

import functools
import json
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

RESULTS_DIR: Final = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
BENCHMARKS_MD: Final = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
# Issue 31's target: a drain's rate at least this share of the server's own limit.
LIMIT_TARGET: Final = 0.6
# Issue 31's bar for Proletarian's exact plan: this share of pgbench running the same statements.
PGBENCH_BAR: Final = 0.95
# Issue 31's drains for each target, from limit5 on: default mode on the compact plan or the asyncio worker,
# each with or without chained claims (PostgreSQL; from limit13 on, MySQL's threaded chain too, from limit15
# on its asyncio one); and from limit6 on, batch mode on either worker, with or without chained batches.
DEFAULT_DRAINS: Final = ("compact", "async", "chain", "async_chain")
CHAINED_BATCH_DRAINS: Final = ("library", "async", "chain", "async_chain")
DATABASES: Final = {"postgresql": "PostgreSQL", "mysql": "MariaDB"}
# MariaDB's drains one job a commit and in batch mode in limit13 and limit14 (no asyncio chain there yet).
MARIADB_DEFAULT: Final = ("compact", "chain", "async")
MARIADB_BATCH: Final = ("library", "chain", "async")
# The targets table's decimals: enough that a point counted as missed never reads as 0.60.
TARGET_DIGITS: Final = 3
# Each drain as the run's cost tables name it, one job a commit and in batch mode.
DRAIN_LABELS: Final = {
    "compact": "compact",
    "async": "async",
    "chain": "chain",
    "async_chain": "async chain",
    "async_chain_uvloop": "async chain uvloop",
}
BATCH_DRAIN_LABELS: Final = {
    "library": "batch",
    "async": "async batch",
    "chain": "batch chain",
    "async_chain": "async batch chain",
    "async_chain_uvloop": "async batch chain uvloop",
}
# From limit20 on the asyncio chain drains on uvloop's event loop too (`worker --loop uvloop`): one more
# drain of the asyncio worker for each target.
UVLOOP_DEFAULT_DRAINS: Final = (*DEFAULT_DRAINS, "async_chain_uvloop")
UVLOOP_BATCH_DRAINS: Final = (*CHAINED_BATCH_DRAINS, "async_chain_uvloop")


def section(path: Path, heading: str, end: str) -> str:
    """The text of `path` from `heading` up to the next `end` (the opening of a heading, as "\\n## ")."""
    text = path.read_text(encoding="utf-8")
    start = text.index(heading)
    return text[start : text.index(end, start + 1)]


def prose(text: str) -> str:
    """`text` with every run of white space as one space: a quoted sentence matches across line breaks."""
    return re.sub(r"\s+", " ", text)


def throughput_rows(results: dict[str, Any], backend: str, *, batch: bool) -> list[dict[str, Any]]:
    """A `python -m benchmarks run` result's throughput rows of `backend`, batch mode's or the others."""
    (entry,) = [e for e in results["benchmarks"]["throughput"] if e["backend"] == backend]
    rows: list[dict[str, Any]] = entry["rows"]
    return [r for r in rows if (r.get("batch_size", 1) > 1) == batch]


def load_runs(*names: str) -> dict[str, dict[str, Any]]:
    """The results.json of each named run kept in benchmarks/results, by its name."""
    return {
        name: json.loads((RESULTS_DIR / name / "results.json").read_text(encoding="utf-8")) for name in names
    }


def cores_runs(*, before: int) -> list[str]:
    """The named runs with the database on cores of its own (limitN-cores-...) kept in benchmarks/results
    whose N is under `before`, in N's order."""
    numbered: dict[str, int] = {}
    for path in RESULTS_DIR.iterdir():
        found = re.fullmatch(r"limit(\d+)-cores-.+", path.name)
        if found and int(found.group(1)) < before:
            numbered[path.name] = int(found.group(1))
    return sorted(numbered, key=numbered.__getitem__)


def point_row(results: dict[str, Any], backend: str, processes: int, threads: int) -> dict[str, Any]:
    """The one-job-a-commit throughput row of `backend` at `processes` x `threads`."""
    (row,) = [
        r
        for r in throughput_rows(results, backend, batch=False)
        if (r["processes"], r["threads"]) == (processes, threads)
    ]
    return row


def best_of_limit(row: dict[str, Any], drains: Iterable[str]) -> float:
    """The best share of the server's limit any of `drains` reached at the row's point."""
    return max(float(row[f"{d}_ratio_limit"]) for d in drains if f"{d}_ratio_limit" in row)


def targets_table(
    runs: Mapping[str, dict[str, Any]],
    readings: Mapping[str, str],
    names: Mapping[str, str],
    default_drains: Iterable[str],
    batch_drains: Iterable[str],
    digits: int = 2,
) -> list[str]:
    """The table of issue 31's targets per point a section pastes: for each run (its reading) and backend
    (its name), the best of `default_drains` at each one-job-a-commit point and of `batch_drains` at each
    batch point, to `digits` decimals, and how many points reach LIMIT_TARGET."""
    default_drains, batch_drains = tuple(default_drains), tuple(batch_drains)
    lines = [
        "| reading | database | default mode, best of limit per point | points met | batch mode "
        "| points met |",
        "|---|---|---|---|---|---|",
    ]
    for run, reading in readings.items():
        for backend, name in names.items():
            cells: list[str] = []
            for batch, drains in ((False, default_drains), (True, batch_drains)):
                rows = throughput_rows(runs[run], backend, batch=batch)
                best = [best_of_limit(r, drains) for r in rows]
                points = ", ".join(
                    f"{r['processes']} x {r['threads']}: {b:.{digits}f}"
                    for r, b in zip(rows, best, strict=True)
                )
                cells += [points, f"{sum(b >= LIMIT_TARGET for b in best)} of {len(best)}"]
            lines.append(f"| {reading} | {name} | {' | '.join(cells)} |")
    return lines


def best_drain(row: dict[str, Any], drains: Iterable[str]) -> str:
    """The one of `drains` that reached the largest share of the limit at the row's point."""
    return max((d for d in drains if f"{d}_ratio_limit" in row), key=lambda d: row[f"{d}_ratio_limit"])


def cpu_ceiling(results: dict[str, Any], row: dict[str, Any], drains: Iterable[str]) -> float:
    """The share of the limit the run's cores could give the row's best drain if nothing were waited for:
    every core's time over that drain's client and server CPU a job, against the limit's rate."""
    drain = best_drain(row, drains)
    client, server = row[f"{drain}_client_cpu_us_per_job"], row[f"{drain}_server_cpu_us_per_job"]
    cores = int(results["meta"]["machine"]["logical_cores"])
    return float(cores * 1e6 / (client + server) / row["limit_jobs_per_s"])


def cpu_bound(
    results: dict[str, Any], row: dict[str, Any], drains: Iterable[str], labels: Mapping[str, str]
) -> str:
    """What bounds a point sharing the cores, as the docs' prose says it: its best drain's client and server
    CPU a job, and its CPU ceiling (cpu_ceiling)."""
    drains = tuple(drains)
    drain = best_drain(row, drains)
    client, server = row[f"{drain}_client_cpu_us_per_job"], row[f"{drain}_server_cpu_us_per_job"]
    cap = cpu_ceiling(results, row, drains)
    point = f"{row['processes']} x {row['threads']}"
    return (
        f"at {point} the best drain (*{labels[drain]}*) spent {client:.0f} µs of client CPU and {server:.0f} "
        f"µs of server CPU a job: with both cores busy and nothing waited for, at most {cap:.2f} of the "
        f"limit's {row['limit_jobs_per_s']:,.0f} jobs/s (it reached {row[f'{drain}_ratio_limit']:.2f})"
    )


def missed(
    results: dict[str, Any], backend: str, drains: Iterable[str], *, batch: bool
) -> list[dict[str, Any]]:
    """The points of `backend` (batch mode's or the others) where none of `drains` reached the target."""
    drains = tuple(drains)
    return [
        r for r in throughput_rows(results, backend, batch=batch) if best_of_limit(r, drains) < LIMIT_TARGET
    ]


def over_ceiling(results: dict[str, Any], default_drains: Iterable[str], batch_drains: Iterable[str]) -> str:
    """The PostgreSQL points the run missed whose CPU ceiling (cpu_ceiling) is over the target, as the docs'
    prose names them ("none" if there is no such point)."""
    named = [
        f"at {r['processes']} x {r['threads']}{' in batch mode' if batch else ''}"
        for batch, drains in ((False, tuple(default_drains)), (True, tuple(batch_drains)))
        for r in missed(results, "postgresql", drains, batch=batch)
        if cpu_ceiling(results, r, drains) >= LIMIT_TARGET
    ]
    return ", and ".join(named) if named else "none"


def missed_cpu_bounds(
    results: dict[str, Any],
    default_drains: Iterable[str] = DEFAULT_DRAINS,
    batch_drains: Iterable[str] = CHAINED_BATCH_DRAINS,
) -> list[str]:
    """cpu_bound of every PostgreSQL point the run missed, one job a commit (`default_drains`) and in batch
    mode (`batch_drains`), as the docs' prose says them, in that order."""
    return [
        cpu_bound(results, r, drains, labels)
        for batch, drains, labels in (
            (False, tuple(default_drains), DRAIN_LABELS),
            (True, tuple(batch_drains), BATCH_DRAIN_LABELS),
        )
        for r in missed(results, "postgresql", drains, batch=batch)
    ]


def one_connections_bound(row: dict[str, Any]) -> float:
    """At one connection a job's client and server turns mostly follow each other: the rate their sum (client
    + server CPU a job) allows MySQL's chain, against the limit's rate (the server's part overlapping the
    client's turn can take the chain past it)."""
    client, server = row["chain_client_cpu_us_per_job"], row["chain_server_cpu_us_per_job"]
    return float(1e6 / (client + server) / row["limit_jobs_per_s"])


def assert_pair_named(cores: dict[str, Any], shared: dict[str, Any], text: str) -> None:
    """`text` names a pair of runs of one clean revision, the database on cores of its own then sharing
    them (their `meta`): the machine, the revision, and each run's load at its start and end."""
    assert not cores["git"]["dirty"] and not shared["git"]["dirty"]
    # One revision for both: what they drained is the same code.
    assert cores["git"]["commit"] == shared["git"]["commit"]
    assert f"{cores['machine']['logical_cores']}-core {cores['machine']['cpu_model']}" in text
    for phrase in run_named(cores, end="at its end"):
        assert phrase in text, phrase
    assert (
        f"load average {shared['machine']['load_average'][0]} at its start, "
        f"{shared['machine_at_end']['load_average'][0]} at its end" in text
    )


def probe_shares(results: list[dict[str, Any]], point: list[int]) -> list[tuple[str, float]]:
    """Each drain's jobs/s over its round's limit at `point`, in a benchmarks.limit_probe file's results
    (each round runs the limit, then the drains): (drain, share), round by round."""
    found, limit = [], None
    for r in results:
        if r["point"] != point:
            continue
        if r["factory"] == "limit":
            limit = r
        else:
            assert limit is not None, "a drain before its round's limit"
            found.append((str(r["factory"]), float(r["jobs_per_s"]) / float(limit["jobs_per_s"])))
    return found


def probe_medians(results: list[dict[str, Any]], point: list[int]) -> dict[str, float]:
    """Each drain's median share of its round's limit at `point`, as the probe's table prints it."""
    found: dict[str, list[float]] = {}
    for drain, share in probe_shares(results, point):
        found.setdefault(drain, []).append(share)
    return {drain: statistics.median(values) for drain, values in found.items()}


def assert_quoted(text: str, found: Mapping[str, str], phrases: Mapping[str, str]) -> None:
    """Each of `phrases`, its placeholder filled with the figure `found` names, is in `text` (prose's)."""
    assert found.keys() == phrases.keys()
    for name, phrase in phrases.items():
        assert phrase.format(found[name]) in text, (name, phrase.format(found[name]))


def span(values: Iterable[float]) -> str:
    """The lowest and the highest of `values`, as the docs quote a range: "0.25 to 0.33"."""
    found = list(values)
    assert found, "no figure to quote"
    return f"{min(found):.2f} to {max(found):.2f}"


def table_lines(printed: str, marker: str) -> list[str]:
    """The table lines of a run's printed report from `marker` on: what the docs paste."""
    return [line for line in printed[printed.index(marker) :].splitlines() if line.startswith("| ")]


def run_named(meta: dict[str, Any], *, end: str = "at the end") -> list[str]:
    """The phrases that name a `python -m benchmarks run` result in prose: its commit and its load."""
    return [
        f"git {meta['git']['commit'][:10]}",
        f"load average {meta['machine']['load_average'][0]} at the start",
        f"{meta['machine_at_end']['load_average'][0]} {end}",
    ]


def assert_pasted(results_md: Path, marker: str, section_text: str, *, must: str) -> None:
    """Every table line of the run's printed report from `marker` on stands in the docs' section, and the
    report has a line with `must` (so an empty or moved table cannot pass)."""
    lines = table_lines(results_md.read_text(encoding="utf-8"), marker)
    assert any(must in line for line in lines), (
        f"{results_md} has no table line with {must!r} after {marker!r}"
    )
    missing = [line for line in lines if line not in section_text]
    assert not missing, f"not pasted from {results_md}: {missing}"


def point_name(row: dict[str, Any], batch: bool) -> str:
    """A throughput row's point as prose names it: "1 x 4", "4 x 4 in batch mode"."""
    return f"{row['processes']} x {row['threads']}{' in batch mode' if batch else ''}"


class LimitPair:
    """A pair of named runs against the server's limit of one revision, the database on cores of its own
    then sharing them, and the docs/benchmarks.md section that quotes them (from its heading, `title` and
    the two runs, to the next "## "): the checks each such section makes alike, on its figures recomputed
    from the runs (tests/test_docs_limit_pairs.py runs them on every pair). `default_drains` and
    `batch_drains` are the drains each target counts, `databases` the backends the targets name."""

    def __init__(
        self,
        cores_run: str,
        shared_run: str,
        title: str,
        *,
        default_drains: tuple[str, ...] = DEFAULT_DRAINS,
        batch_drains: tuple[str, ...] = CHAINED_BATCH_DRAINS,
        databases: Mapping[str, str] = DATABASES,
    ) -> None:
        self.cores_run, self.shared_run = cores_run, shared_run
        self.default_drains, self.batch_drains, self.databases = default_drains, batch_drains, databases
        # Each target's drains, one job a commit and in batch mode.
        self.targets = ((False, default_drains), (True, batch_drains))
        self.readings = {cores_run: "on cores of its own", shared_run: "sharing the cores"}
        self.heading = f"### {title}: `{cores_run}` and `{shared_run}`"

    @functools.cached_property
    def runs(self) -> dict[str, dict[str, Any]]:
        """Both runs' results.json, by name (read once, when first asked for)."""
        return load_runs(self.cores_run, self.shared_run)

    def text(self) -> str:
        """The section, as written."""
        return section(BENCHMARKS_MD, self.heading, "\n## ")

    def rows(self, run: str, backend: str, *, batch: bool) -> list[dict[str, Any]]:
        return throughput_rows(self.runs[run], backend, batch=batch)

    def beside(self, run: str, before: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        """Each PostgreSQL point of `run` (one job a commit, then batch mode) as the prose names it ("1 x 4
        in batch mode"), its row, and the row of the same point in `before` (an earlier run's results)."""
        points = []
        for batch in (False, True):
            for r, b in zip(
                self.rows(run, "postgresql", batch=batch),
                throughput_rows(before, "postgresql", batch=batch),
                strict=True,
            ):
                assert (r["processes"], r["threads"]) == (b["processes"], b["threads"])
                points.append((f"{r['processes']} x {r['threads']}{' in batch mode' if batch else ''}", r, b))
        return points

    def met(self, run: str, backend: str, *, batch: bool) -> str:
        """How many of `run`'s points of `backend` met the target, as the prose says it: "3 of 4"."""
        rows = self.rows(run, backend, batch=batch)
        drains = self.batch_drains if batch else self.default_drains
        return f"{sum(best_of_limit(r, drains) >= LIMIT_TARGET for r in rows)} of {len(rows)}"

    def mariadb_batch_shared(self) -> tuple[str, float]:
        """MariaDB's best drain in batch mode at 4 x 4 sharing the cores, and its share of the limit."""
        (row,) = [r for r in self.rows(self.shared_run, "mysql", batch=True) if r["processes"] == 4]
        return best_drain(row, self.batch_drains), best_of_limit(row, self.batch_drains)

    def assert_tables_pasted(self) -> None:
        for run in self.runs:
            assert_pasted(
                RESULTS_DIR / run / "results.md",
                "#### Against the server's limit",
                self.text(),
                must="async batch chain",
            )

    def assert_named(self) -> None:
        assert_pair_named(
            self.runs[self.cores_run]["meta"], self.runs[self.shared_run]["meta"], prose(self.text())
        )

    def assert_async_chain_one_exchange_a_job(self, backend_name: str) -> None:
        """Both runs drained the asyncio chain on `backend_name`, one exchange a job (counted at 1 x 1, and
        quoted from the run on cores of its own)."""
        for run in self.runs.values():
            (pg,) = [e for e in run["benchmarks"]["throughput"] if e["backend"] == "postgresql"]
            assert pg["async_chain_backend"] == backend_name
            assert round(point_row(run, "postgresql", 1, 1)["async_chain_round_trips_per_job"]) == 1
        one = point_row(self.runs[self.cores_run], "postgresql", 1, 1)
        assert f"At 1 x 1 it took {one['async_chain_round_trips_per_job']:.2f} round trips a job" in prose(
            self.text()
        )

    def assert_targets_table(self) -> None:
        text = self.text()
        for line in targets_table(
            self.runs, self.readings, self.databases, self.default_drains, self.batch_drains, TARGET_DIGITS
        ):
            assert line in text, line

    def assert_where_the_targets_stand(self) -> None:
        text = prose(self.text())
        for run, reading in self.readings.items():
            for backend, name in self.databases.items():
                phrase = (
                    f"{reading}, {name} meets 0.6 at {self.met(run, backend, batch=False)} points one job a "
                    f"commit and {self.met(run, backend, batch=True)} in batch mode"
                )
                assert phrase in text or phrase[0].upper() + phrase[1:] in text, phrase

    def assert_missed_cpu_bounds(self) -> None:
        """The CPU bound of each PostgreSQL point missed sharing the cores, and which are over the target."""
        text = prose(self.text())
        shared = self.runs[self.shared_run]
        for phrase in missed_cpu_bounds(shared, self.default_drains, self.batch_drains):
            assert phrase in text, phrase
        assert f"Over 0.6: {over_ceiling(shared, self.default_drains, self.batch_drains)}." in text

    def assert_every_missed_shared_point_waited(self) -> None:
        """Sharing the cores, PostgreSQL missed some point, and each one it missed has a CPU ceiling over the
        target: the cores were not kept busy."""
        shared = self.runs[self.shared_run]
        found = [
            (r, drains)
            for batch, drains in self.targets
            for r in missed(shared, "postgresql", drains, batch=batch)
        ]
        assert found and all(cpu_ceiling(shared, r, drains) >= LIMIT_TARGET for r, drains in found)

    def chain_beside_unchained(self, run: str) -> str:
        """At each MariaDB point of `run`, MySQL's chain's share of the limit beside the same threaded worker
        unchained (the compact plan one job a commit, batch mode's own in batch mode), as prose says it."""
        phrases = []
        for batch, unchained in ((False, "the compact plan"), (True, "unchained")):
            for r in self.rows(run, "mysql", batch=batch):
                other = r["library_ratio_limit"] if batch else r["compact_ratio_limit"]
                phrases.append(
                    f"{r['processes']} x {r['threads']}{' in batch mode' if batch else ''} "
                    f"{r['chain_ratio_limit']:.3f} chained, {other:.3f} {unchained}"
                )
        return "; ".join(phrases)

    def chain_best_points(self, run: str) -> str:
        """The MariaDB points of `run` where MySQL's chain was the best of MariaDB's drains."""
        points = [
            f"{r['processes']} x {r['threads']}{' in batch mode' if batch else ''}"
            for batch, drains in ((False, MARIADB_DEFAULT), (True, MARIADB_BATCH))
            for r in self.rows(run, "mysql", batch=batch)
            if best_drain(r, drains) == "chain"
        ]
        return ", ".join(points) if points else "no point"

    def largest_chain_gap_elsewhere(self) -> float:
        """The largest difference, either way, between MySQL's chain's share of the limit and the compact
        plan's at a MariaDB point of more than one connection, one job a commit, in either run."""
        return max(
            abs(float(r["chain_ratio_limit"]) - float(r["compact_ratio_limit"]))
            for run in self.runs
            for r in self.rows(run, "mysql", batch=False)
            if (r["processes"], r["threads"]) != (1, 1)
        )

    def pipeline_beside(self, run: str) -> str:
        """At each PostgreSQL point of `run`, Proletarian's exact plan pipelined against pgbench of the same
        statements, beside the library's unpipelined exact plan, and how many points reach issue 31's bar."""
        return self._against_pgbench(
            run,
            ("pipeline_ratio_pgbench", "pipelined"),
            ("ratio_pgbench", "unpipelined"),
            lambda mine, other: f"{mine:.2f} ({other:.2f} unpipelined)",
        )

    def async_pipeline_beside(self, run: str) -> str:
        """At each PostgreSQL point of `run`, the exact plan pipelined on the asyncio worker against pgbench,
        beside the threaded worker's, and how many points reach issue 31's bar on each."""
        return self._against_pgbench(
            run,
            ("async_pipeline_ratio_pgbench", "on the asyncio worker"),
            ("pipeline_ratio_pgbench", "threaded"),
            lambda mine, other: f"{mine:.2f} (threaded {other:.2f})",
        )

    def _against_pgbench(
        self, run: str, drain: tuple[str, str], beside: tuple[str, str], cell: Callable[[float, float], str]
    ) -> str:
        """Each PostgreSQL point's ratio to pgbench of `drain` (its key and how prose names it) beside
        `beside`'s, then how many points each meets issue 31's bar at."""
        rows = self.rows(run, "postgresql", batch=False)
        figures = ", ".join(f"{point_name(r, False)} {cell(r[drain[0]], r[beside[0]])}" for r in rows)
        met = [sum(r[key] >= PGBENCH_BAR for r in rows) for key, _name in (drain, beside)]
        return (
            f"{figures}: {PGBENCH_BAR} met at {met[0]} of {len(rows)} points {drain[1]}, {met[1]} of "
            f"{len(rows)} {beside[1]}"
        )

    def pipeline_costs(self) -> str:
        """The pipelined exact plan's round trips and client CPU a job beside the unpipelined one's, at each
        PostgreSQL point of one process on cores of its own (where the driver counts its exchanges)."""
        return "; ".join(
            f"{point_name(r, False)} {r['pipeline_round_trips_per_job']:.2f} round trips and "
            f"{r['pipeline_client_cpu_us_per_job']:.0f} µs (unpipelined "
            f"{r['library_round_trips_per_job']:.2f} and {r['library_client_cpu_us_per_job']:.0f} µs)"
            for r in self.rows(self.cores_run, "postgresql", batch=False)
            if r["processes"] == 1
        )

    def async_pipeline_costs(self, run: str) -> str:
        """The exact plan's client CPU a job on the asyncio worker beside the threaded worker's at each
        PostgreSQL point of `run`, and its round trips where the driver counts them (one process)."""
        return "; ".join(
            f"{point_name(r, False)} "
            + (
                f"{r['async_pipeline_round_trips_per_job']:.2f} round trips and "
                if r["processes"] == 1
                else ""
            )
            + f"{r['async_pipeline_client_cpu_us_per_job']:.0f} µs (threaded "
            f"{r['pipeline_client_cpu_us_per_job']:.0f} µs)"
            for r in self.rows(run, "postgresql", batch=False)
        )

    def cpu_bound_points(self, *, under: bool) -> str:
        """The PostgreSQL points missed sharing the cores whose CPU ceiling is under the target (`under`) or
        not, as prose names them."""
        shared = self.runs[self.shared_run]
        named = [
            point_name(r, batch)
            for batch, drains in self.targets
            for r in missed(shared, "postgresql", drains, batch=batch)
            if (cpu_ceiling(shared, r, drains) < LIMIT_TARGET) == under
        ]
        return ", ".join(named) if named else "none"

    def assert_async_chain_best_sharing_the_cores(self) -> None:
        for batch, drains in self.targets:
            for r in self.rows(self.shared_run, "postgresql", batch=batch):
                assert best_drain(r, drains) == "async_chain", (r["processes"], r["threads"], batch)
        assert "Sharing the cores the asyncio chain was the best drain at every PostgreSQL point" in prose(
            self.text()
        )


# The named pairs against the limit whose sections LimitPair checks, oldest first.
LIMIT9: Final = LimitPair(
    "limit9-cores-2026-12-05", "limit9-shared-2026-12-05", "The asyncio exchange of its own"
)
LIMIT10: Final = LimitPair(
    "limit10-cores-2026-12-06", "limit10-shared-2026-12-06", "The watch kept between exchanges"
)
LIMIT11: Final = LimitPair(
    "limit11-cores-2026-12-06", "limit11-shared-2026-12-06", "BEGIN and COMMIT prepared"
)
LIMIT12: Final = LimitPair(
    "limit12-cores-2026-12-06", "limit12-shared-2026-12-06", "The limit's own costs a job"
)
LIMIT13: Final = LimitPair("limit13-cores-2026-12-06", "limit13-shared-2026-12-06", "MySQL's chain")
LIMIT14: Final = LimitPair(
    "limit14-cores-2026-12-06", "limit14-shared-2026-12-06", "MySQL's chain checked by SET"
)
LIMIT15: Final = LimitPair(
    "limit15-cores-2026-12-06",
    "limit15-shared-2026-12-06",
    "The asyncio chain on MariaDB, and the exact plan pipelined",
)
LIMIT16: Final = LimitPair(
    "limit16-cores-2026-12-06",
    "limit16-shared-2026-12-06",
    "The exact plan's BEGIN sent with its claim",
)
LIMIT17: Final = LimitPair(
    "limit17-cores-2026-12-06",
    "limit17-shared-2026-12-06",
    "The exact plan on the asyncio worker",
)
LIMIT18: Final = LimitPair(
    "limit18-cores-2026-12-07",
    "limit18-shared-2026-12-07",
    "The bounded claim against the limit",
)
# From limit20 on: MariaDB on mysqlclient beside PyMySQL, and the asyncio chain on uvloop counted too.
LIMIT20: Final = LimitPair(
    "limit20-cores-2026-12-07",
    "limit20-shared-2026-12-07",
    "The asyncio chain on uvloop against the limit",
    default_drains=UVLOOP_DEFAULT_DRAINS,
    batch_drains=UVLOOP_BATCH_DRAINS,
    databases={**DATABASES, "mysqlclient": "MariaDB on mysqlclient"},
)
LIMIT_PAIRS: Final = (
    LIMIT9,
    LIMIT10,
    LIMIT11,
    LIMIT12,
    LIMIT13,
    LIMIT14,
    LIMIT15,
    LIMIT16,
    LIMIT17,
    LIMIT18,
    LIMIT20,
)
