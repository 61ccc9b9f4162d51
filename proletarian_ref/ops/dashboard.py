"""A small web dashboard (Starlette): queues, recent failures, a job's detail; retry and cancel if allowed.

Read-only unless `allow_actions`. An action is a POST that must carry the session cookie set by visiting
`/?token=TOKEN`, a CSRF field derived from the token, and an Origin (or Referer) of this very server;
the cookie is SameSite=Strict and HttpOnly, and pages may not be framed. The pages use no JavaScript.
Needs starlette, jinja2 and python-multipart (pip install 'proletarian-ref[dashboard]').
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from proletarian_ref.errors import ConfigurationError
from proletarian_ref.keywords import from_keyword_text
from proletarian_ref.ops import jobs
from proletarian_ref.ops.db import Tables
from proletarian_ref.ops.durations import format_duration
from proletarian_ref.ops.stats import queue_stats, throughput

COOKIE: Final = "proletarian_dashboard"
FAILURES_SHOWN: Final = 20
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


def new_token() -> str:
    return secrets.token_urlsafe(24)


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
    ) -> None:
        self.connect = connect
        self.tables = tables
        self.dialect = dialect
        self.allow_actions = allow_actions
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

    def overview(self) -> dict[str, Any]:
        def read(conn: Any) -> dict[str, Any]:
            options: dict[str, Any] = {
                "job_table": self.tables.job,
                "archived_job_table": self.tables.archived,
                "dialect": self.dialect,
            }
            stats = queue_stats(conn, archived=False, **options)
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
            rows[q.queue] = {"queue": q.queue, "due": q.due, "scheduled": q.scheduled, "lag": lag}
        for t in data["done"]:
            row = rows.setdefault(t.queue, {"queue": t.queue, "due": 0, "scheduled": 0, "lag": "-"})
            done = row.setdefault("done", [0, 0, 0])
            row["done"] = [done[0] + t.last_1m, done[1] + t.last_5m, done[2] + t.last_15m]
            if t.status == "failure":
                row["failed15"] = row.get("failed15", 0) + t.last_15m
        for row in rows.values():
            row.setdefault("done", [0, 0, 0])
            row.setdefault("failed15", 0)
        now = data["stats"].now
        failures = [{**view.to_json(now), "payload": _excerpt(view)} for view in data["failures"]]
        return {
            "now": now.strftime("%Y-%m-%d %H:%M:%SZ"),
            "queues": sorted(rows.values(), key=lambda r: r["queue"]),
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

    def _render(self, name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
        html = self.templates.get_template(name).render(
            tables=self.tables,
            actions=self.allow_actions,
            csrf=self.csrf,
            flash=request.query_params.get("done"),
            **context,
        )
        return HTMLResponse(html, status_code=status_code, headers=_HEADERS)

    async def home(self, request: Request) -> Response:
        given = request.query_params.get("token")
        if given is not None:
            # Trade the token in the address for a cookie, and drop it from the address bar and history.
            if not hmac.compare_digest(given, self.token):
                return PlainTextResponse("wrong token", status_code=403, headers=_HEADERS)
            response = RedirectResponse("/", status_code=303, headers=_HEADERS)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
            return response
        data = await run_in_threadpool(self.overview)
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
        if not hmac.compare_digest(request.cookies.get(COOKIE, ""), self.token):
            return "no valid session: open the address with ?token=... that the dashboard printed"
        if not hmac.compare_digest(str(form.get("csrf", "")), self.csrf):
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
            ]
        )


def _excerpt(view: jobs.JobView) -> str:
    try:
        text = json.dumps(jobs.jsonable(view.payload()), ensure_ascii=False)
    except Exception:
        text = view.payload_text
    return text if len(text) <= _PAYLOAD_EXCERPT else text[: _PAYLOAD_EXCERPT - 1] + "…"
