"""Exit codes and the errors the CLI turns into them, each with a message a person can act on."""

from __future__ import annotations

import argparse
from enum import IntEnum


class ExitCode(IntEnum):
    """The exit codes of every subcommand (docs/cli.md, "Exit codes")."""

    OK = 0
    RUNTIME_ERROR = 1
    USAGE_ERROR = 2
    CANNOT_CONNECT = 3
    SCHEMA_MISSING = 4
    # Only `health`: a probe tells what is wrong from the code alone.
    QUEUE_LAGGING = 5
    CLAIM_HELD_TOO_LONG = 6
    # `dashboard` and `worker --metrics-port`: the address to serve on is taken or not allowed.
    CANNOT_LISTEN = 7
    INTERRUPTED = 130


class CliError(Exception):
    """An error that ends the command with `exit_code` and its message on stderr."""

    exit_code: ExitCode = ExitCode.RUNTIME_ERROR

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(CliError):
    """A wrong argument: bad JSON, an invalid keyword or table name, a handler that does not import."""

    exit_code = ExitCode.USAGE_ERROR


class CannotConnectError(CliError):
    """No database to use: the DSN does not connect, or the embedded server cannot start."""

    exit_code = ExitCode.CANNOT_CONNECT


class SchemaMissingCliError(CliError):
    """The job or archive table does not exist."""

    exit_code = ExitCode.SCHEMA_MISSING


class CannotListenError(CliError):
    """A server of the command (the dashboard, the worker's metrics) cannot listen on its address."""

    exit_code = ExitCode.CANNOT_LISTEN


def port(text: str) -> int:
    """A TCP port option: a whole number from 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a port number (1 to 65535): {text!r}")
    return value
