"""Pieces every command-line module shares: the consoles, bad-input handling, option parsers."""

from __future__ import annotations

import functools
import sys

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# Wide tables when piped (CI logs), the terminal's width otherwise.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
stdout = Console(width=None if sys.stdout.isatty() else 160)

# Errors that mean "bad input": reported as one clear line and exit status 2, without a traceback.
USER_ERRORS = (ValueError, FileNotFoundError)


def bad_input(message: str) -> None:
    """One line on stderr (never wrapped, never read as markup) and exit status 2."""
    console.print(f"[bold red]error:[/] {escape(' '.join(str(message).split()))}", soft_wrap=True)
    sys.exit(2)


def friendly(fn):
    """Bad input becomes one red line and exit status 2 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            bad_input(str(exc))
        except click.UsageError as exc:  # BadParameter raised by a command's own checks
            bad_input(exc.format_message())

    return wrapper


class OneLineErrors(click.Group):
    """A group whose option-parsing errors (a bad --limit type, a missing argument) are one line and exit 2, as
    the commands' own checks are (:func:`friendly`), instead of click's usage block. A group called with nothing
    at all (``dspark-bench``, ``dspark-bench data``) prints its help and exits 0, as ``--help`` does."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # not a usage error: a request for the help
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.UsageError as exc:
            name = exc.ctx.command_path if exc.ctx is not None else "dspark-bench"
            bad_input(f"{exc.format_message()} (see {name} --help)")
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click.Abort:
            console.print("Aborted!")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def parse_limit(value: str) -> int | None:
    """``--limit``: a positive count, or 'all' for the datasets' default caps (0 is refused: it is not 'all')."""
    if value in ("all", "none"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"--limit {value!r} is not a count; give a positive integer or 'all'") from None
    if n < 1:
        raise click.BadParameter(f"--limit {value}: give a positive integer (prompts per dataset) or 'all'")
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


def battery_table(report, title: str):
    """The lossless battery's rows (:func:`dspark_bench.lossless.render_rows`) as a rich table."""
    from rich.table import Table

    from dspark_bench.lossless import HEADERS, render_rows

    table = Table(title=title)
    for col in HEADERS:
        table.add_column(col)
    for row in render_rows(report):
        table.add_row(*row)
    return table


# The target's dtype for the decoding commands (run, bench, table1, profile, sweep, calibrate, compare-engines);
# each resolves it with target.resolve_dtype before anything is recorded, so a manifest names what ran.
DTYPE_OPTION = click.option(
    "--dtype", default="auto", show_default=True, type=click.Choice(["auto", "bf16", "fp32", "fp16"]),
    help="Target weights. auto: bf16 on a GPU or a CPU with native bf16 matmuls (AVX-512-BF16, AMX), fp32 on other "
         "CPUs, where bf16 runs many times slower.")


def sampling_options(fn):
    """``--top-p``, ``--top-k`` and ``--min-p``, beside a command's ``--temperature`` (checked by
    :func:`check_sampling`; the order they apply in: :class:`~dspark_bench.core.verify.Sampling`)."""
    options = [
        click.option("--top-p", default=1.0, show_default=True, type=float,
                     help="Top-p (nucleus): keep the most likely tokens that reach this share of the mass, "
                          "0 < P <= 1 (1: off). Applied to the target's law and the drafts' laws alike."),
        click.option("--top-k", default=0, show_default=True, type=int,
                     help="Top-k: keep the K most likely tokens, an integer >= 0 (0: off)."),
        click.option("--min-p", default=0.0, show_default=True, type=float,
                     help="Min-p: keep the tokens at least M times as likely as the most likely one, 0 <= M < 1 "
                          "(0: off)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def check_sampling(temperature: float, top_p: float, top_k: int, min_p: float):
    """The :class:`~dspark_bench.core.verify.Sampling` of the options, or bad input naming the option."""
    from dspark_bench.core.verify import Sampling

    try:
        return Sampling(temperature, top_p, top_k, min_p)
    except ValueError as exc:  # its messages begin with the field's name
        raise click.BadParameter("--" + str(exc).replace("_", "-", 1)) from None


class RunProgress:
    """Rich progress bar: requests done, and per drafter the running tau and tokens/s."""

    def __init__(self, total: int, names: tuple[str, ...]):
        self.total = total
        self.stats = {n: [0, 0, 0, 0.0] for n in names}  # committed, rounds, decode tokens, decode seconds
        self.progress = Progress(TextColumn("[bold]decoding"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.description}"), console=console)

    def __enter__(self):
        self.progress.start()
        self.task = self.progress.add_task("", total=self.total)
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def update(self, rec) -> None:
        s = self.stats[rec.drafter]
        s[0] += sum(r[3] for r in rec.rounds)
        s[1] += len(rec.rounds)
        s[2] += max(rec.n_output - 1, 0)
        s[3] += rec.decode_s
        text = "  ".join(f"{n} τ={c / r:.2f} {t / d:.1f} tok/s" for n, (c, r, t, d) in self.stats.items() if r and d)
        self.progress.update(self.task, advance=1, description=text)


def fmt(value, spec=".2f") -> str:
    return "–" if value is None else format(value, spec)


def print_summary(summary: dict) -> None:
    table = Table(title="dspark-bench summary (per domain; τ = committed tokens per round incl. bonus)")
    for col in ("drafter", "domain", "prompts", "errors", "τ", "τ 95% CI", "accept rate", "tok/s", "speedup vs none"):
        table.add_column(col, justify="left" if col in ("drafter", "domain") else "right")
    for g in summary["groups"]:
        if g["scope"] not in ("domain", "all"):
            continue
        ci = g["tau_ci95"]
        table.add_row(g["drafter"], g["name"], str(g["n_requests"]), str(g["n_errors"]), fmt(g["tau"]),
                      "–" if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}", fmt(g["acceptance_rate"], ".1%"),
                      fmt(g["tokens_per_s"], ".1f"), fmt(g["speedup_vs_none"], ".2f") + "×")
    stdout.print(table)
