"""The dashboard in headless Chromium: its numbers are the database's, and a retry click moves a job."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cli_support import (
    TESTS_DIR,
    Target,
    parametrize_dialects,
    run,
    start_cli,
    subprocess_env,
    target,
    wait_for,
)
from fix_throwaway import LEFTOVER_AGE_S, free_port

from proletarian_ref import enqueue, process_next_job
from proletarian_ref.cli.errors import ExitCode
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.ops.dashboard import COOKIE, LOCAL_HOSTS, Dashboard, allowed_hosts
from proletarian_ref.ops.db import Tables
from proletarian_ref.ops.stats import queue_stats

pytest_generate_tests = parametrize_dialects

TOKEN = "test-token-0123456789abcdef"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Chromium keeps its singleton socket in a directory of TMPDIR and leaves it there when it quits: its TMPDIR
# is one of these, removed after, and a run removes those an earlier, killed run left.
CHROMIUM_TMP_PREFIX = "proletarian-chromium-"
# Set to 1 to refresh the screenshots in docs/img (they are written to the test's tmp_path otherwise).
SCREENSHOTS_ENV = "PROLETARIAN_DOC_SCREENSHOTS"


@pytest.fixture
def database(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from target(request, "dash")


def _seed(database: Target) -> None:
    conn = database.harness.connect()
    try:
        for n in range(4):
            enqueue(
                conn, "my.app/report", {"n": n, "to": f"user{n}@example.com"}, job_table=database.job_table
            )
        enqueue(
            conn,
            "my.app/mail",
            {"to": "a@b"},
            queue="mail/q",
            process_in=timedelta(hours=1),
            job_table=database.job_table,
        )
        conn.commit()
    finally:
        conn.close()

    def fails(job_type: str, payload: Any) -> None:
        if payload["n"] < 2:
            raise RuntimeError("planned failure")

    # Every report job, so which ones ran does not hang on the order of equal process_at values.
    for _ in range(4):
        _run_one(database, fails)


def _run_one(database: Target, handler: Callable[[str, Any], None]) -> None:
    process_next_job(
        database.harness.data_source,
        handler,
        job_table=database.job_table,
        archived_job_table=database.archived_job_table,
        log=lambda event, data: None,
    )


def _get(url: str, **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _post(url: str, data: dict[str, str], **headers: str) -> int:
    body = urllib.parse.urlencode(data).encode()
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def dashboard(database: Target) -> Iterator[str]:
    """The CLI's dashboard with actions allowed, on a free port; yields its address."""
    port = free_port()
    process = start_cli(
        "dashboard",
        "--allow-actions",
        "--token",
        TOKEN,
        "--port",
        str(port),
        *database.args,
        env=subprocess_env(),
    )
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return _get(base + "/")[0] == 200
        except OSError:
            return False

    try:
        wait_for(answers, timeout=30, what="the dashboard to answer", process=process)
        yield base
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    # SIGTERM stops it cleanly, as it stops a worker.
    assert process.returncode == 0, err
    assert "dashboard stopped" in err


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for leftover in Path(tempfile.gettempdir()).glob(f"{CHROMIUM_TMP_PREFIX}*"):
        # Older than any run still going: a killed run's (another run's browser may be using a newer one).
        if time.time() - leftover.stat().st_mtime > LEFTOVER_AGE_S:
            shutil.rmtree(leftover, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=CHROMIUM_TMP_PREFIX)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,800"):
        options.add_argument(argument)
    service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": tmp})
    try:
        driver = webdriver.Chrome(service=service, options=options)
        try:
            # Its singleton socket's directory is in ours, so nothing of it stays in the machine's TMPDIR.
            assert list(Path(tmp).glob("org.chromium.Chromium.*")), os.listdir(tmp)
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _screenshot(browser: Any, name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.png"
    assert browser.save_screenshot(str(path))
    if os.environ.get(SCREENSHOTS_ENV) == "1":
        target_dir = TESTS_DIR.parent / "docs" / "img"
        target_dir.mkdir(exist_ok=True)
        shutil.copy(path, target_dir / f"{name}.png")


def test_the_page_shows_the_database_numbers_and_a_retry_click_moves_the_job(
    database: Target, dashboard: str, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    _seed(database)
    browser.get(f"{dashboard}/?token={TOKEN}")
    assert browser.current_url == f"{dashboard}/"
    conn = database.harness.connect()
    try:
        stats = queue_stats(
            conn, job_table=database.job_table, archived_job_table=database.archived_job_table
        )
    finally:
        conn.close()
    for queue in stats.queues:
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue.queue}"]')
        due = row.find_element(By.CSS_SELECTOR, "td.due").text
        scheduled = row.find_element(By.CSS_SELECTOR, "td.scheduled").text
        assert (int(due), int(scheduled)) == (queue.due, queue.scheduled)
    default = browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="proletarian/default"]')
    assert default.find_element(By.CSS_SELECTOR, "td.done15").text == "4"
    assert default.find_element(By.CSS_SELECTOR, "td.failed15").text == "2"
    failures = browser.find_elements(By.CSS_SELECTOR, "#failures tr[data-job-id]")
    failed_ids = sorted(row.get_attribute("data-job-id") for row in failures)
    assert failed_ids == sorted(
        str(_uuid(a.job_id)) for a in database.archived_jobs() if a.status == ":failure"
    )
    _screenshot(browser, "dashboard-overview", tmp_path)

    chosen = failed_ids[0]
    browser.find_element(By.ID, f"retry-{chosen}").click()
    # The click posts the form; the job's page comes after the redirect, not at once.
    flash = WebDriverWait(browser, 20).until(
        expected_conditions.presence_of_element_located((By.ID, "flash"))
    )
    assert flash.text == "retry: retried"
    assert browser.find_element(By.CSS_SELECTOR, "#job td.state").text == "due"
    assert browser.find_element(By.CSS_SELECTOR, "#job td.attempts").text == "0"
    _screenshot(browser, "dashboard-job", tmp_path)
    assert chosen in {str(_uuid(j.job_id)) for j in database.jobs()}
    assert chosen not in {str(_uuid(a.job_id)) for a in database.archived_jobs()}


def _uuid(value: Any) -> Any:
    return uuid.UUID(bytes=bytes(value)) if isinstance(value, bytes | bytearray) else value


@contextmanager
def _serving(board: Dashboard) -> Iterator[str]:
    """`board` served by uvicorn in a thread of this process; yields its address."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(board.app(), host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, what="the dashboard to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _board(
    database: Target, *, allow_actions: bool, token: str = TOKEN, hosts: Sequence[str] = LOCAL_HOSTS
) -> Dashboard:
    return Dashboard(
        database.harness.data_source,
        Tables.of(database.job_table, database.archived_job_table),
        database.dialect,
        allow_actions=allow_actions,
        token=token,
        hosts=hosts,
    )


def test_actions_refuse_requests_without_the_session_csrf_field_or_same_origin(database: Target) -> None:
    _seed(database)
    [failed, *_] = [a for a in database.archived_jobs() if a.status == ":failure"]
    board = _board(database, allow_actions=True)
    csrf, cookie = board.csrf, f"{COOKIE}={TOKEN}"
    with _serving(board) as base:
        url = f"{base}/jobs/{_uuid(failed.job_id)}/retry"
        assert _post(url, {"csrf": csrf}, Origin=base) == 403  # no session cookie
        assert _post(url, {"csrf": "forged"}, Origin=base, Cookie=cookie) == 403
        assert _post(url, {"csrf": csrf}, Origin="http://evil.example", Cookie=cookie) == 403
        cross_site = {"Sec-Fetch-Site": "cross-site", "Origin": base}
        assert _post(url, {"csrf": csrf}, Cookie=cookie, **cross_site) == 403
        assert _post(url, {"csrf": csrf}, Cookie=cookie) == 403  # neither Origin nor Referer
        assert _get(f"{base}/?token=wrong")[0] == 403
        assert len(database.archived_jobs()) == 4  # nothing was retried
        assert _post(url, {"csrf": csrf}, Origin=base, Cookie=cookie) == 200  # 303, then the job page
    assert len(database.archived_jobs()) == 3


def test_without_allow_actions_the_page_has_no_buttons_and_posts_are_refused(database: Target) -> None:
    _seed(database)
    [failed, *_] = [a for a in database.archived_jobs() if a.status == ":failure"]
    board = _board(database, allow_actions=False)
    with _serving(board) as base:
        status, html = _get(base + "/")
        assert status == 200 and "read-only" in html and "<button" not in html
        url = f"{base}/jobs/{_uuid(failed.job_id)}/retry"
        assert _post(url, {"csrf": board.csrf}, Origin=base, Cookie=f"{COOKIE}={TOKEN}") == 403
        assert _get(f"{base}/jobs/not-an-id")[0] == 400
        status, listed = _get(f"{base}/jobs?status=failure")
        failed_ids = {str(_uuid(a.job_id)) for a in database.archived_jobs() if a.status == ":failure"}
        assert status == 200 and all(f'data-job-id="{i}"' in listed for i in failed_ids)
        status, detail = _get(f"{base}/jobs/{_uuid(failed.job_id)}")
        assert status == 200 and "user" in detail and "@example.com" in detail
    assert len(database.archived_jobs()) == 4


def test_a_request_naming_another_host_is_refused_so_dns_rebinding_reads_nothing(database: Target) -> None:
    _seed(database)
    board = _board(database, allow_actions=False)
    with _serving(board) as base:
        port = base.rsplit(":", 1)[1]
        # A page of evil.example whose name was rebound to 127.0.0.1 sends its own name as the Host.
        assert _get(base + "/", Host=f"evil.example:{port}") == (400, "Invalid host header")
        assert _get(base + "/jobs?status=failure", Host="evil.example")[0] == 400
        for host in ("127.0.0.1", "localhost", "LOCALHOST"):
            assert _get(base + "/", Host=f"{host}:{port}")[0] == 200
    named = _board(database, allow_actions=False, hosts=allowed_hosts("127.0.0.1", ["dash.internal"]))
    with _serving(named) as base:
        assert _get(base + "/", Host="dash.internal:8089")[0] == 200
        assert _get(base + "/", Host="evil.example")[0] == 400


def test_allowed_hosts_are_the_local_names_the_bound_address_and_the_added_ones() -> None:
    assert allowed_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "[::1]", "::1"]
    assert allowed_hosts("0.0.0.0", ["Jobs.Example"]) == [
        "localhost",
        "127.0.0.1",
        "[::1]",
        "::1",
        "jobs.example",
    ]
    assert allowed_hosts("10.0.0.5")[-1] == "10.0.0.5"
    assert allowed_hosts("fd00::5")[-1] == "[fd00::5]"


def test_a_non_ascii_token_cookie_or_csrf_field_is_refused_not_an_error(database: Target) -> None:
    _seed(database)
    [failed, *_] = [a for a in database.archived_jobs() if a.status == ":failure"]
    board = _board(database, allow_actions=True)
    with _serving(board) as base:
        url = f"{base}/jobs/{_uuid(failed.job_id)}/retry"
        assert _get(base + "/?token=" + urllib.parse.quote("tökén-0123456789abcdef"))[0] == 403
        assert _post(url, {"csrf": board.csrf}, Origin=base, Cookie=f"{COOKIE}=t\xf6ken") == 403
        assert _post(url, {"csrf": "cs\u0155f"}, Origin=base, Cookie=f"{COOKIE}={TOKEN}") == 403
    assert len(database.archived_jobs()) == 4
    with pytest.raises(ConfigurationError, match="ASCII"):
        _board(database, allow_actions=True, token="tökén-0123456789abcdef")


def test_retry_and_cancel_buttons_show_only_to_the_session_that_may_use_them(database: Target) -> None:
    _seed(database)
    [failed, *_] = [a for a in database.archived_jobs() if a.status == ":failure"]
    board = _board(database, allow_actions=True)
    with _serving(board) as base:
        for page in ("/", f"/jobs/{_uuid(failed.job_id)}"):
            status, html = _get(base + page)
            assert status == 200 and "<button" not in html and "?token=" in html
            status, html = _get(base + page, Cookie=f"{COOKIE}={TOKEN}")
            assert status == 200 and f'id="retry-{_uuid(failed.job_id)}"' in html


def test_the_command_refuses_a_token_that_cannot_travel_in_an_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = run(
        capsys, "dashboard", "--token", "tökén-0123456789abcdef", "--dsn", "postgresql://u@127.0.0.1:1/x"
    )
    assert result.code == ExitCode.USAGE_ERROR
    assert "--token: the token may hold only ASCII letters" in result.err


def test_the_overview_pages_its_queues_and_visits_each_once(
    database: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many queues there are, a page shows QUEUES_SHOWN of them; the next-page links visit every
    queue of the job table, and one whose jobs all finished lately, exactly once."""
    monkeypatch.setattr("proletarian_ref.ops.dashboard.QUEUES_SHOWN", 2)
    conn = database.harness.connect()
    try:
        for name in ("q/a", "q/b", "q/c", "q/d", "q/e"):
            enqueue(conn, "t/x", {}, queue=name, job_table=database.job_table)
        conn.commit()
    finally:
        conn.close()
    assert process_next_job(
        database.harness.data_source,
        lambda job_type, payload: None,
        queue="q/c",
        job_table=database.job_table,
        archived_job_table=database.archived_job_table,
        log=lambda event, data: None,
    )
    board = _board(database, allow_actions=False)
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        page = board.overview(after)
        pages += 1
        assert len(page["queues"]) <= 2
        seen += [row["queue"] for row in page["queues"]]
        if page["next_url"] is None:
            break
        after = urllib.parse.parse_qs(urllib.parse.urlsplit(page["next_url"]).query)["after"][0]
    assert (seen, pages) == (["q/a", "q/b", "q/c", "q/d", "q/e"], 3)
    finished = next(row for row in board.overview("q/b")["queues"] if row["queue"] == "q/c")
    assert (finished["due"], finished["done"][2]) == (0, 1)


def test_the_schedules_page_lists_each_recorded_schedule_with_its_last_and_next_tick(
    database: Target, dashboard: str
) -> None:
    from datetime import UTC, datetime

    from conformance.side_tables import tick_once
    from proletarian_ref import side_tables
    from proletarian_ref.periodic import Schedule

    for statement in side_tables.install_statements(database.dialect, ["periodic"], database.job_table):
        database.harness.execute(statement)
    database.harness.execute(f"DELETE FROM {side_tables.side_table(database.job_table, 'periodic')}")
    schedule = Schedule("hourly-report", "0 * * * *", "app/report", zone="Europe/Oslo")
    first_seen, now = datetime(2026, 1, 1, 9, 30, tzinfo=UTC), datetime(2026, 1, 1, 10, 1, tzinfo=UTC)
    assert len(tick_once(database.harness, [schedule], first_seen, now)) == 1
    status, html = _get(f"{dashboard}/schedules")
    assert status == 200
    row = html[html.index('data-schedule="hourly-report"') :].split("</tr>", 1)[0]
    assert '<td class="last">2026-01-01 10:00:00Z</td>' in row
    assert "0 * * * * | Europe/Oslo | app/report" in row
    # The next tick is the recorded cron's first tick after now, whatever now is.
    assert '<td class="next">' in row and '<td class="next">-</td>' not in row


def test_the_job_page_shows_each_failed_attempt_of_the_error_history(
    database: Target, dashboard: str
) -> None:
    from proletarian_ref import side_tables

    for statement in side_tables.install_statements(database.dialect, ["errors"], database.job_table):
        database.harness.execute(statement)
    conn = database.harness.connect()
    try:
        job_id = enqueue(conn, "my.app/mail", {"to": "<b>x</b>"}, job_table=database.job_table)
        conn.commit()
    finally:
        conn.close()

    def fails(job_type: str, payload: Any) -> None:
        raise RuntimeError(f"cannot send to {payload['to']}")

    _run_one(database, fails)
    status, html = _get(f"{dashboard}/jobs/{job_id}")
    assert status == 200
    table = html[html.index('<table id="errors">') :].split("</table>", 1)[0]
    assert '<td class="attempt">1</td>' in table
    # Escaped as every row value is: the handler's message cannot write markup into the page.
    assert "RuntimeError: cannot send to &lt;b&gt;x&lt;/b&gt;" in table and "<b>x</b>" not in table
