"""``dspark-bench diverge``: where two runs' tokens part, which draw made each, and whether rounding explains it;
and the tables of ``run``'s greedy-equality check (:mod:`dspark_bench.studies.diverge`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from dspark_bench.cli.common import console, friendly, stdout


def _num(x, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def _draw(d: dict) -> str:
    """A draw site as a reader names it: first token, draft x_j of round r, recovered / bonus / decode."""
    if d["kind"] == "first":
        return "first"
    if d["kind"] == "draft":
        return f"draft x{d['slot'] + 1} r{d['round']}"
    return f"{d['kind']} r{d['round']}"


def findings_table(rows: list[dict], title: str, labels: tuple[str, str] = ("A", "B")) -> Table:
    """One row per divergence (:meth:`~dspark_bench.studies.diverge.Finding.to_dict`); pairs read "A / B"."""
    table = Table(title=title)
    for col in ("drafter", "prompt #token", f"tokens {'/'.join(labels)}", "draws", "decision", "u", "margins",
                "law diff", "max|Δp|", "verdict"):
        table.add_column(col, justify="right" if col in ("u", "law diff", "max|Δp|") else "left")
    for f in rows:
        dec = f["decision"]
        what = {"greedy": f"argmax@{dec['position']}"}.get(dec["kind"], "–" if dec["kind"] is None else
                                                            f"{dec['purpose']}@{dec['position']}")
        margins = " / ".join(_num(m) for m in (f["margins"] or [None, None]))
        parted = f.get("rounds_parted")  # the decision judged is then the one where the rounds parted
        draws = " / ".join(_draw(d) if d else "–" for d in (parted or f)["draws"])
        where = f"{f['prompt_id']} #{f['index']}" + (f" (rounds parted #{parted['index']})" if parted else "")
        colour = {"floating-point": "green", "unexplained": "bold red"}.get(f["verdict"], "yellow")
        table.add_row(f["drafter"], where, " / ".join(str(t) for t in f["tokens"]),
                      draws, what, _num(f["u"], ".6f"), margins, _num(f["law_difference"]), _num(f["max_abs_p"]),
                      f"[{colour}]{f['verdict']}[/]")
    return table


def print_notes(rows: list[dict]) -> None:
    for f in rows:
        for note in f["notes"]:
            stdout.print(f"  {f['prompt_id']} token {f['index']}: {note}", soft_wrap=True, markup=False)


def print_greedy(report: dict) -> None:
    """``run``'s temperature-0 check: per drafter, requests equal to ``none``'s, and each divergence judged."""
    for name, g in report.items():
        first = g["first_divergent_token"]
        line = f"greedy == none: {name} {g['requests_equal']}/{g['requests']} requests equal"
        if first is not None:
            verdicts = [f["verdict"] for f in g["divergences"]]
            line += (f", first divergent token {first}; {verdicts.count('floating-point')} floating-point, "
                     f"{g['unexplained']} not explained")
        stdout.print(line)
    rows = [f for g in report.values() for f in g["divergences"]]
    if rows:
        stdout.print(findings_table(rows, "greedy divergences from none (none | drafter)", ("none", "drafter")))
        print_notes(rows)


def greedy_after_run(folder: Path, cache_dir: str | None) -> None:
    """``run`` at temperature 0: greedy equality of each drafter with ``none``, written to summary.json and shown
    (nothing when the run has no ``none`` or no other drafter)."""
    from dspark_bench.studies.diverge import greedy_equality

    try:
        report = greedy_equality(folder, Path(cache_dir) if cache_dir else None, say=console.print)
    except Exception as exc:  # noqa: BLE001 - the run is written; a failed check must not turn it into a failure
        console.print(f"[yellow]warning:[/] greedy equality not judged ({escape(f'{type(exc).__name__}: {exc}')}); "
                      "`dspark-bench gate` compares the outputs strictly", soft_wrap=True)
        return
    if report:
        print_greedy(report)


@click.command()
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--out", "out", default=None, type=click.Path(path_type=Path), help="Write the report as JSON here.")
@click.option("--cache-dir", default=None, help="Where the embedded target's safetensors copy lives.")
@friendly
def diverge(run_a, run_b, out, cache_dir):
    """Find each request's first divergent output token between two runs of the same target, prompts and seed
    (drafter by drafter), say which draw made it in each run, and judge it: floating-point when the draw's
    uniform lies within the two runs' law difference of its decision boundary, unexplained otherwise. Where the
    runs' rounds parted before their tokens did (one accepted a draft, the other drew the same token anew), the
    decision judged is the one where they parted. The laws are recomputed by replaying each run through the
    engine (docstring of dspark_bench/studies/diverge.py).

    Exit status: 0 when every divergence is floating-point (or none exists); 1 when one is unexplained; 2 for
    bad input (runs that are not comparable, said in one line)."""
    from dspark_bench.studies.diverge import RunData, compare_runs

    if out is not None and out.is_dir():
        raise ValueError(f"--out {out} is a folder; give a file name for the JSON report")
    runs = RunData.read(run_a), RunData.read(run_b)
    report = compare_runs(*runs, cache_dir=Path(cache_dir) if cache_dir else None, say=console.print)
    for name, c in report["drafters"].items():
        stdout.print(f"{name}: {c['requests_equal']}/{c['requests']} requests equal")
    rows = report["divergences"]
    if rows:
        stdout.print(findings_table(rows, f"divergences: A = {run_a}, B = {run_b}"))
        print_notes(rows)
    if out is not None:
        Path(out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        stdout.print(f"report written to [bold]{out}[/]")
    bad = [f for f in rows if f["verdict"] == "unexplained"]
    unexamined = sum(f["verdict"] == "unexamined" for f in rows)
    if unexamined:
        console.print(f"[yellow]warning:[/] {unexamined} divergence(s) could not be examined (see the notes)")
    if bad:
        console.print(f"[bold red]error:[/] {len(bad)} unexplained divergence(s): a bug until shown otherwise")
        sys.exit(1)
