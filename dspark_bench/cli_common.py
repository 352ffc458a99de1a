"""Pieces every command-line module shares: the consoles, bad-input handling, option parsers."""

from __future__ import annotations

import functools
import sys

import click
from rich.console import Console

# Wide tables when piped (CI logs), the terminal's width otherwise.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
stdout = Console(width=None if sys.stdout.isatty() else 160)

# Errors that mean "bad input": reported as one clear line and exit status 2, without a traceback.
USER_ERRORS = (ValueError, FileNotFoundError)


def friendly(fn):
    """Bad input becomes one red line and exit status 2 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            console.print(f"[bold red]error:[/] {exc}")
            sys.exit(2)

    return wrapper


def parse_limit(value: str) -> int | None:
    """``--limit``: a positive count, or 'all' for the datasets' default caps."""
    if value in ("all", "none", "0"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a count; give a positive integer or 'all'") from None
    if n < 1:
        raise click.BadParameter(f"{value!r}: give a positive integer or 'all'")
    return n


def parse_options(items: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """``--drafter-opt NAME.KEY=VALUE`` pairs into {name: {key: value}}."""
    opts: dict[str, dict[str, str]] = {}
    for item in items:
        head, sep, value = item.partition("=")
        name, dot, key = head.partition(".")
        if not sep or not dot or not name or not key:
            raise click.BadParameter(f"{item!r}: expected DRAFTER.OPTION=VALUE, e.g. ngram.max_ngram=4")
        opts.setdefault(name, {})[key] = value
    return opts
