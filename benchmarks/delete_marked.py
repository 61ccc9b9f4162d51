"""What a MariaDB/MySQL claim reads past the index entries of jobs deleted but not yet purged (issue 31).

`python -m benchmarks.delete_marked --dsn mysql://... --marked 0,1000,2000,4000 --out FILE.json` loads
`--rows` due jobs into a job table of its own and, for each count N of `--marked`: holds InnoDB's purge back
with a consistent snapshot opened on another connection (so the N jobs deleted next leave their index
entries delete-marked, as they stay while the purge lags behind a drain), deletes the N oldest jobs, and runs
batch mode's claim (`get_next_jobs`, `--batch` jobs) as Proletarian words it `--claims` times at READ
COMMITTED, the level the worker's claims run at (MySQLBackend sets it), and as many at REPEATABLE READ, the
server's default, then the library's bounded claim (queries.sql, claim_bounded) as many times at
READ COMMITTED, each under `ANALYZE FORMAT=JSON` and rolled back at once (benchmarks.limit_probe.ClaimPages):
the median pages each claim read. Then it lets the purge go and reloads the deleted jobs for the next count.
`--table FILE.json` prints the table.

The jobs are due in process_at order, a second apart (`APART`), so every entry deleted lies ahead of the rows
the claim returns, in the index the claim scans (queue, process_at), exactly where a drain's deleted jobs lie,
and in seconds before the oldest due job's: MySQL's TIMESTAMP keeps whole seconds, and within one second the
bounded claim's bound cannot part deleted entries from the due rows (docs/mysql.md, "The bounded claim").
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from benchmarks.common import BackendSpec, bulk_load, count_rows, open_harness, require_sql, truncate
from benchmarks.limit_probe import ClaimPages, load, save
from benchmarks.machine import describe
from conformance.harness import Harness
from proletarian_ref.backends.dsn import dialect_of_dsn, redact

LEVELS: Final = ("READ COMMITTED", "REPEATABLE READ")
# Each job a second of its own, as the named runs marked-2026-12-07 and bounded-2026-12-07 loaded them.
APART: Final = timedelta(seconds=1)
# Each claim measured, as (claim, isolation level): Proletarian's at both levels, the bounded one at the
# worker's. Results of runs before the bounded claim have no "claim": theirs was the classic one.
CLAIMS: Final = (("classic", LEVELS[0]), ("classic", LEVELS[1]), ("bounded", LEVELS[0]))


def claim_pages(harness: Harness, batch: int, level: str, claims: int, claim: str) -> dict[str, Any]:
    """The median pages and rows of `claims` claims of `batch` jobs at isolation `level`, each rolled back:
    the `claim` "classic" (Proletarian's statement) or "bounded" (the library's)."""
    sampler = ClaimPages(
        harness,
        "mysql",
        batch,
        isolation=f"SET SESSION TRANSACTION ISOLATION LEVEL {level}",
        bounded=claim == "bounded",
    )
    try:
        found = [sampler.claim() for _ in range(claims)]
    finally:
        sampler.stop()
    return {
        "claim": claim,
        "isolation": level,
        "pages": statistics.median(pages for pages, _ in found),
        "rows": statistics.median(rows for _, rows in found),
    }


def measure(
    dsn: str,
    marked: list[int],
    rows: int,
    batch: int,
    claims: int,
    suffix: str = "",
    apart: timedelta = APART,
) -> list[dict[str, Any]]:
    """For each count of delete-marked entries, each isolation level's claim_pages (see the module), on the
    bench tables `marked` + `suffix`, the jobs due `apart` from each other."""
    if dialect_of_dsn(dsn) != "mysql":
        raise ValueError(f"delete-marked entries are InnoDB's: {redact(dsn)!r} names no MariaDB or MySQL")
    harness = open_harness(BackendSpec("conformance.builtin:mysql", {"dsn": dsn}), "marked", suffix)
    sql_harness, _ = require_sql(harness)
    results = []
    try:
        for count in marked:
            if count >= rows:
                raise ValueError(f"--marked {count} deletes every one of the {rows} jobs: a larger --rows")
            truncate(harness)
            bulk_load(harness, 0, rows, "due", apart=apart)
            with (
                contextlib.closing(sql_harness.connect()) as holder,
                contextlib.closing(sql_harness.connect()) as deleter,
            ):
                snapshot = holder.cursor()
                # The purge cannot remove what a read view older than the delete may still see.
                snapshot.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                snapshot.execute(f"SELECT COUNT(*) FROM {harness.job_table}")
                snapshot.fetchall()
                cursor = deleter.cursor()
                cursor.execute(f"DELETE FROM {harness.job_table} ORDER BY process_at LIMIT %s", (count,))
                deleter.commit()
                if count_rows(harness) != rows - count:
                    raise RuntimeError(f"{count} jobs were to be deleted, {rows - count_rows(harness)} were")
                for claim, level in CLAIMS:
                    found = claim_pages(harness, batch, level, claims, claim)
                    results.append({"marked": count, "batch": batch, **found})
                snapshot.execute("ROLLBACK")
    finally:
        with contextlib.suppress(Exception):
            truncate(harness)
        harness.close()
    return results


def table(results: list[dict[str, Any]]) -> str:
    """Pages a claim read at each count of delete-marked entries ahead of it, each claim and level measured,
    and at READ COMMITTED the pages each such entry added over none."""
    columns = [c for c in CLAIMS if any(_key(r) == c for r in results)]
    by_count: dict[int, dict[tuple[str, str], float]] = {}
    for r in results:
        by_count.setdefault(r["marked"], {})[_key(r)] = r["pages"]
    heads = [f"pages a claim, {_name(c)}" for c in columns]
    added = [c for c in columns if c[1] == LEVELS[0]]
    heads += [f"pages an entry added, {_name(c)}" for c in added]
    lines = ["| delete-marked entries ahead | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for count, pages in sorted(by_count.items()):
        cells = [f"{pages[c]:,.0f}" for c in columns]
        for c in added:
            base = by_count.get(0, {}).get(c)
            cells.append("-" if base is None or count == 0 else f"{(pages[c] - base) / count:.2f}")
        lines.append(f"| {count:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _key(result: dict[str, Any]) -> tuple[str, str]:
    return result.get("claim", "classic"), result["isolation"]


def _name(claim: tuple[str, str]) -> str:
    kind, level = claim
    return level if kind == "classic" else f"bounded claim, {level}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.delete_marked", description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--table", type=Path, help="print the table of a result's JSON and exit")
    parser.add_argument(
        "--marked", default="0,1000,2000,4000", help="counts of deleted jobs, comma-separated"
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--claims", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.table:
        print(table(load(args.table)))
        return
    if not args.dsn:
        parser.error("--dsn is needed to measure")
    meta = describe([BackendSpec("conformance.builtin:mysql", {"dsn": args.dsn})])
    results = measure(args.dsn, [int(n) for n in args.marked.split(",")], args.rows, args.batch, args.claims)
    print(table(results))
    if args.out:
        save(args.out, meta, results)


if __name__ == "__main__":
    main()
