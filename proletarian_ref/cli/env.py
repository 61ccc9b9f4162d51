"""Every option also from the environment: --some-option from PROLETARIAN_SOME_OPTION.

argparse has no environment support of its own, so the parser's defaults are taken from the environment
before parsing; a value given on the command line still wins.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

PREFIX: Final = "PROLETARIAN_"
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("", "0", "false", "no", "off")


def env_name(action: argparse.Action) -> str | None:
    longs = [s for s in action.option_strings if s.startswith("--")]
    if not longs or action.dest in ("help", "version"):
        return None
    return PREFIX + longs[0][2:].upper().replace("-", "_")


def leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from leaf_parsers(sub)


class EnvError(ValueError):
    """An environment variable holds a value its option does not accept."""


def _given(action: argparse.Action, argv: Sequence[str]) -> bool:
    options = argv[: argv.index("--")] if "--" in argv else argv
    return any(t == s or t.startswith(s + "=") for t in options for s in action.option_strings)


def apply_env_defaults(
    parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str] | None = None
) -> None:
    """Set each option's default from its PROLETARIAN_* variable, converted and checked as argparse would.

    `argv` is the command line: an appending option given there (the worker's --queue) replaces the
    variable's list rather than adding to it, as any other option given there does.
    """
    env = os.environ if environ is None else environ
    for sub in leaf_parsers(parser):
        for action in sub._actions:
            name = env_name(action)
            if name is None or name not in env:
                continue
            text = env[name]
            if isinstance(action, argparse._StoreTrueAction):
                lowered = text.strip().lower()
                if lowered not in _TRUE + _FALSE:
                    raise EnvError(f"{name}={text!r}: expected one of {', '.join(_TRUE + _FALSE[1:])}")
                action.default = lowered in _TRUE
            elif isinstance(action, argparse._AppendAction):
                if _given(action, argv):
                    continue
                action.default = [_convert(sub, action, name, part.strip()) for part in text.split(",")]
            elif isinstance(action, argparse._StoreAction):
                action.default = _convert(sub, action, name, text)
            else:
                continue
            action.required = False


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, name: str, text: str) -> object:
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise EnvError(f"{name}={text!r}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise EnvError(f"{name}={text!r}: choose from {', '.join(map(str, action.choices))}")
    return value
