"""The proletarian-ref command line: schema, enqueue, worker, stats, demo and embedded subcommands."""

from proletarian_ref.cli.app import build_parser, main
from proletarian_ref.cli.errors import ExitCode

__all__ = ["ExitCode", "build_parser", "main"]
