"""A small web dashboard (Starlette): queues, recent failures, a job's detail; retry and cancel if allowed.

Read-only unless `allow_actions`. An action is a POST that must carry the session cookie set by visiting
`/?token=TOKEN`, a CSRF field derived from the token, and an Origin (or Referer) of this very server;
the cookie is SameSite=Strict and HttpOnly, and pages may not be framed. The pages use no JavaScript.
Every request must name this server in its Host header (localhost, the loopback addresses, the address
it is bound to, or a name added with `allowed_hosts`), so a page on another site that rebinds its own
name to this address (DNS rebinding) cannot read it.
Needs starlette, jinja2 and python-multipart (pip install 'proletarian-ref[dashboard]').
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from proletarian_ref.errors import ConfigurationError
from proletarian_ref.keywords import from_keyword_text, to_keyword_text
from proletarian_ref.ops import jobs
from proletarian_ref.ops.db import Tables
from proletarian_ref.ops.durations import format_duration
from proletarian_ref.ops.stats import queue_stats, throughput

COOKIE: Final = "proletarian_dashboard"
FAILURES_SHOWN: Final = 20
# Queues a page of the overview shows: the page's size and the time to make it stay the same however many
# queues there are.
QUEUES_SHOWN: Final = 100
PAGE_SIZE: Final = 50
REFRESH_S: Final = 10
_PAYLOAD_EXCERPT: Final = 120
_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


# The names a browser on this machine reaches the dashboard by; starlette compares them without the port.
LOCAL_HOSTS: Final = ("localhost", "127.0.0.1", "[::1]", "::1")
# A token goes into an address and a cookie: URL-safe ASCII only.
_TOKEN: Final = re.compile(r"[A-Za-z0-9._~-]+")
_WILDCARD_BINDS: Final = ("0.0.0.0", "::", "[::]", "")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def allowed_hosts(bind_host: str, extra: Sequence[str] = ()) -> list[str]:
    """The Host header values the dashboard answers: local names, the bound address, and `extra`."""
    hosts = [*LOCAL_HOSTS]
    if bind_host not in _WILDCARD_BINDS:
        hosts.append(f"[{bind_host}]" if ":" in bind_host and not bind_host.startswith("[") else bind_host)
    hosts.extend(extra)
    return list(dict.fromkeys(h.lower() for h in hosts))


def check_token(token: str) -> None:
    """Refuse a token that could not travel in an address and a cookie as it is."""
    if not _TOKEN.fullmatch(token):
        raise ConfigurationError("the token may hold only ASCII letters, digits and - _ . ~")


def _same(given: str, expected: str) -> bool:
    """A constant-time comparison that takes any text: compare_digest refuses str with non-ASCII."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8"))


class Dashboard:
    """The pages over one database's tables; every query opens a connection of its own and closes it."""

    def __init__(
        self,
        connect: Callable[[], Any],
        tables: Tables,
        dialect: str,
        *,
        allow_actions: bool = False,
        token: str | None = None,
        hosts: Sequence[str] = LOCAL_HOSTS,
    ) -> None:
        if token is not None:
            check_token(token)
        self.connect = connect
        self.tables = tables
        self.dialect = dialect
        self.allow_actions = allow_actions
        self.hosts = list(hosts)
        self.token = token or new_token()
        self.csrf = hmac.new(self.token.encode(), b"csrf", hashlib.sha256).hexdigest()
        self.templates = Environment(
            loader=FileSystemLoader(Path(__file__).with_name("templates")),
            autoescape=select_autoescape(default=True),
        )

    # -- data ------------------------------------------------------------------------------------------

    def _with_connection(self, fn: Callable[[Any], Any]) -> Any:
        conn = self.connect()
        try:
            return fn(conn)
        finally:
            conn.close()

    def overview(self, after: str | None = None) -> dict[str, Any]:
        """One page of QUEUES_SHOWN queues after the queue `after` (by name), with the recent failures.

        The job table is read a page at a time (keyset, in the index's order); the throughput covers the
        last 15 minutes only, which also brings in the queues whose jobs all finished.
        """
        after_text = None if after is None else to_keyword_text(after, what="queue")

        def read(conn: Any) -> dict[str, Any]:
            options: dict[str, Any] = {
                "job_table": self.tables.job,
                "archived_job_table": self.tables.archived,
                "dialect": self.dialect,
            }
            stats = queue_stats(conn, archived=False, after=after_text, limit=QUEUES_SHOWN + 1, **options)
            done = throughput(conn, **options)
            failures = jobs.list_jobs(
                conn,
                jobs.JobFilter(status=jobs.STATUS_FAILURE),
                limit=FAILURES_SHOWN,
                tables=self.tables,
                dialect=self.dialect,
            )
            return {"stats": stats, "done": done, "failures": failures.jobs}

        data = self._with_connection(read)
        rows: dict[str, dict[str, Any]] = {}
        for q in data["stats"].queues:
            lag = format_duration(q.oldest_due_age) if q.oldest_due_age is not None else "-"
            rows[q.queue] = {
                "queue": q.queue,
                "due": q.due,
                "running": q.running,
                "scheduled": q.scheduled,
                "lag": lag,
            }
        for t in data["done"]:
            if after is not None and t.queue <= after:
                continue
            row = rows.setdefault(
                t.queue, {"queue": t.queue, "due": 0, "running": 0, "scheduled": 0, "lag": "-"}
            )
            done = row.setdefault("done", [0, 0, 0])
            row["done"] = [done[0] + t.last_1m, done[1] + t.last_5m, done[2] + t.last_15m]
            if t.status == "failure":
                row["failed15"] = row.get("failed15", 0) + t.last_15m
        for row in rows.values():
            row.setdefault("done", [0, 0, 0])
            row.setdefault("failed15", 0)
        ordered = sorted(rows.values(), key=lambda r: r["queue"])
        # Past the job table's page, a queue of the throughput alone may belong to a later page.
        page = ordered[:QUEUES_SHOWN]
        more = len(ordered) > QUEUES_SHOWN
        now = data["stats"].now
        failures = [{**view.to_json(now), "payload": _excerpt(view)} for view in data["failures"]]
        return {
            "now": now.strftime("%Y-%m-%d %H:%M:%SZ"),
            "queues": page,
            "next_url": "/?" + urlencode({"after": page[-1]["queue"]}) if more else None,
            "failures": failures,
        }

    def schedules(self) -> dict[str, Any]:
        """The periodic side table's rows with their next tick, or why there are none (docs/periodic.md)."""
        from proletarian_ref import side_tables
        from proletarian_ref.backends import backend_for_connection
        from proletarian_ref.periodic import recorded_next_tick, store_for

        def read(conn: Any) -> list[Any] | None:
            backend = backend_for_connection(conn)
            try:
                if not side_tables.exists(backend, conn, "periodic", self.tables.job):
                    return None
                return store_for(backend, self.tables.job).states(conn)
            finally:
                conn.rollback()

        states = self._with_connection(read)
        now = datetime.now(UTC)
        shown = "%Y-%m-%d %H:%M:%SZ"
        rows = [
            {
                "name": state.name,
                "definition": state.definition,
                "version": state.version,
                "last_tick": state.last_tick.strftime(shown) if state.last_job_id is not None else "-",
                "next_tick": next_at.strftime(shown) if (next_at := recorded_next_tick(state, now)) else "-",
                "updated_at": state.updated_at.strftime(shown),
            }
            for state in states or []
        ]
        return {"now": now.strftime(shown), "installed": states is not None, "schedules": rows}

    # -- HTTP ------------------------------------------------------------------------------------------

    def _has_session(self, request: Request) -> bool:
        return _same(request.cookies.get(COOKIE, ""), self.token)

    def _render(self, name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
        session = self._has_session(request)
        html = self.templates.get_template(name).render(
            tables=self.tables,
            # Buttons only for the browser whose POSTs would be accepted.
            actions=self.allow_actions and session,
            actions_allowed=self.allow_actions,
            csrf=self.csrf,
            flash=request.query_params.get("done"),
            **context,
        )
        return HTMLResponse(html, status_code=status_code, headers=_HEADERS)

    async def home(self, request: Request) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            # Trade the token in the address for a cookie, and drop it from the address bar and history.
            if not _same(given, self.token):
                return PlainTextResponse("wrong token", status_code=403, headers=_HEADERS)
            response = RedirectResponse("/", status_code=303, headers=_HEADERS)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            return response
        after = request.query_params.get("after") or None
        try:
            data = await run_in_threadpool(self.overview, after)
        except ConfigurationError as exc:
            return PlainTextResponse(str(exc), status_code=400, headers=_HEADERS)
        return self._render("overview.html", request, title="Queues", refresh=REFRESH_S, **data)

    async def schedules_page(self, request: Request) -> Response:
        data = await run_in_threadpool(self.schedules)
        return self._render("schedules.html", request, title="Schedules", refresh=REFRESH_S, **data)

    async def job_list(self, request: Request) -> Response:
        status = request.query_params.get("status", "queued")
        queue = request.query_params.get("queue") or None
        after = request.query_params.get("after") or None
        try:
            job_filter = jobs.JobFilter(status=status, queue=queue)
        except ConfigurationError as exc:
            return PlainTextResponse(str(exc), status_code=400, headers=_HEADERS)

        def read(conn: Any) -> jobs.Page:
            return jobs.list_jobs(
                conn, job_filter, after=after, limit=PAGE_SIZE, tables=self.tables, dialect=self.dialect
            )

        try:
            page = await run_in_threadpool(self._with_connection, read)
        except ConfigurationError as exc:
            return PlainTextResponse(str(exc), status_code=400, headers=_HEADERS)
        now = datetime.now(UTC)
        next_url = None
        if page.next_cursor is not None:
            query = {"status": status, "after": page.next_cursor, **({"queue": queue} if queue else {})}
            next_url = "/jobs?" + urlencode(query)
        return self._render(
            "jobs.html",
            request,
            title=f"{status} jobs",
            status=from_keyword_text(status),
            queue=queue,
            jobs=[view.to_json(now) for view in page.jobs],
            next_url=next_url,
        )

    async def job(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]

        def read(conn: Any) -> jobs.JobView | None:
            return jobs.show_job(conn, job_id, tables=self.tables, dialect=self.dialect)

        try:
            view = await run_in_threadpool(self._with_connection, read)
        except ConfigurationError as exc:
            return PlainTextResponse(str(exc), status_code=400, headers=_HEADERS)
        if view is None:
            return PlainTextResponse(f"no job {job_id}", status_code=404, headers=_HEADERS)
        payload, payload_error = None, None
        try:
            payload = json.dumps(jobs.jsonable(view.payload()), indent=2, ensure_ascii=False)
        except Exception as exc:
            payload_error = f"{type(exc).__name__}: {exc}"
        return self._render(
            "job.html",
            request,
            title=f"job {job_id}",
            job=view.to_json(datetime.now(UTC)),
            payload=payload,
            payload_error=payload_error,
        )

    def _refusal(self, request: Request, form: Any) -> str | None:
        """Why this POST is not an action the person at this dashboard asked for, or None."""
        if not self.allow_actions:
            return "actions are off: start the dashboard with --allow-actions"
        if not self._has_session(request):
            return "no valid session: open the address with ?token=... that the dashboard printed"
        if not _same(str(form.get("csrf", "")), self.csrf):
            return "the form's CSRF field is missing or wrong"
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"a cross-site request ({site})"
        origin = request.headers.get("origin") or request.headers.get("referer")
        expected = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin is None:
            return "the request has no Origin or Referer"
        parts = urlsplit(origin)
        if f"{parts.scheme}://{parts.netloc}" != expected:
            return f"the request comes from {parts.scheme}://{parts.netloc}, not {expected}"
        return None

    def _action(
        self, verb: str, run: Callable[[Any, Any], list[jobs.Result]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            form = await request.form()
            refusal = self._refusal(request, form)
            if refusal is not None:
                return PlainTextResponse(refusal, status_code=403, headers=_HEADERS)
            job_id = request.path_params["job_id"]
            try:
                [result] = await run_in_threadpool(self._with_connection, lambda conn: run(conn, job_id))
            except ConfigurationError as exc:
                return PlainTextResponse(str(exc), status_code=400, headers=_HEADERS)
            done = urlencode({"done": f"{verb}: {result.outcome}"})
            return RedirectResponse(f"/jobs/{job_id}?{done}", status_code=303, headers=_HEADERS)

        return endpoint

    def app(self) -> Starlette:
        def retry(conn: Any, job_id: Any) -> list[jobs.Result]:
            return jobs.retry_jobs(conn, [job_id], tables=self.tables, dialect=self.dialect)

        def cancel(conn: Any, job_id: Any) -> list[jobs.Result]:
            return jobs.cancel_jobs(conn, [job_id], tables=self.tables, dialect=self.dialect)

        return Starlette(
            routes=[
                Route("/", self.home),
                Route("/jobs", self.job_list),
                Route("/schedules", self.schedules_page),
                Route("/jobs/{job_id}", self.job),
                Route("/jobs/{job_id}/retry", self._action("retry", retry), methods=["POST"]),
                Route("/jobs/{job_id}/cancel", self._action("cancel", cancel), methods=["POST"]),
            ],
            middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=self.hosts, www_redirect=False)],
        )


def _excerpt(view: jobs.JobView) -> str:
    try:
        text = json.dumps(jobs.jsonable(view.payload()), ensure_ascii=False)
    except Exception:
        text = view.payload_text
    return text if len(text) <= _PAYLOAD_EXCERPT else text[: _PAYLOAD_EXCERPT - 1] + "…"
