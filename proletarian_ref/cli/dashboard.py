"""`proletarian-ref dashboard`: the web dashboard on 127.0.0.1, read-only unless --allow-actions."""

from __future__ import annotations

import argparse
import socket
from types import FrameType
from typing import Any

from proletarian_ref.cli.database import add_database_options, open_database, tables_from
from proletarian_ref.cli.errors import CannotListenError, CliError, ExitCode, UsageError, port
from proletarian_ref.cli.logs import notice
from proletarian_ref.errors import ConfigurationError
from proletarian_ref.ops.db import Tables


def listening_socket(host: str, port_number: int) -> socket.socket:
    """The dashboard's socket, bound before the command says it serves: a taken port is a clear error."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port_number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise CannotListenError(f"the dashboard cannot listen on {host}:{port_number}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CannotListenError(f"the dashboard cannot listen on {host}:{port_number}: {exc}") from exc
    return sock


def _server_class() -> Any:
    import uvicorn

    class QuietStopServer(uvicorn.Server):
        """uvicorn's server, but SIGINT/SIGTERM end it cleanly (exit 0), as they end a worker.

        uvicorn re-raises the signal after its shutdown, which would make Ctrl-C exit 130 and SIGTERM
        kill the process before it says it stopped.
        """

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    return QuietStopServer


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dashboard",
        help="serve a web page of queues, failures and jobs (read-only unless --allow-actions)",
        description="Serve a small web dashboard: queues with depth, lag and throughput, recent failures, "
        "a job's detail. With --allow-actions it has retry and cancel buttons, which work only for a browser "
        "that opened the address with the token printed at start (or given with --token).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=port, default=8089, help="(default: %(default)s)")
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a further name browsers reach the dashboard by (repeatable); localhost, 127.0.0.1, [::1] and "
        "the --host address are always allowed, any other Host header is refused (DNS rebinding)",
    )
    parser.add_argument("--allow-actions", action="store_true", help="show retry and cancel buttons")
    parser.add_argument("--token", help="the token actions need (default: a new random one, printed)")
    add_database_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from proletarian_ref.ops.dashboard import Dashboard, allowed_hosts, check_token
    except ImportError as exc:
        raise CliError(
            f"the dashboard needs its extra: pip install 'proletarian-ref[dashboard]' ({exc})"
        ) from exc
    if args.token is not None:
        if len(args.token) < 16:
            raise UsageError("--token must be at least 16 characters")
        try:
            check_token(args.token)
        except ConfigurationError as exc:
            raise UsageError(f"--token: {exc}") from exc
    cli_tables = tables_from(args)
    with open_database(args, cli_tables) as db:
        dashboard = Dashboard(
            db.connect,
            Tables(cli_tables.job, cli_tables.archived),
            db.dialect,
            allow_actions=args.allow_actions,
            token=args.token,
            hosts=allowed_hosts(args.host, args.allowed_host),
        )
        sock = listening_socket(args.host, args.port)
        address = f"http://{args.host}:{args.port}/"
        if args.allow_actions:
            notice(f"dashboard on {address}?token={dashboard.token} (actions allowed for that browser)")
        else:
            notice(f"dashboard on {address} (read-only)")
        config = uvicorn.Config(
            dashboard.app(),
            log_config=None,
            access_log=False,
            log_level="warning",
        )
        server = _server_class()(config)
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:
            # uvicorn exits on a failure to start; the command's own codes say what went wrong instead.
            raise CliError(f"the dashboard stopped at start-up (uvicorn exit {exc.code})") from exc
        finally:
            sock.close()
        if not server.started:
            raise CliError(f"the dashboard could not start on {args.host}:{args.port}")
    notice("dashboard stopped")
    return ExitCode.OK
