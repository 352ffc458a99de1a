"""The offline protocol's single-request table (stage ``r1``) from one run folder: every drafter against ``none``.

    python scripts/r1_table.py RUN [--json OUT]

Per drafter, read as scripts/draft_vocab_compare.py reads one run: tau with its 95% bootstrap interval, the
first-position acceptance, the drafting and verify seconds per engine round (means), the drafting cost over the
vanilla step (the mean wall time of a ``none`` round of the same run), tokens/s and the speedup over ``none``
measured in the same run. Timings mean something only when the run had a quiet machine (see its manifest's load).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_vocab_compare import _fmt, run_summary  # noqa: E402

from dspark_bench.results import read_manifest  # noqa: E402


def r1_rows(folder: Path) -> list[dict]:
    drafters = [d for d in read_manifest(folder)["args"]["drafters"] if d != "none"]
    return [dict(run_summary(folder, d), drafter=d) for d in drafters]


def table(rows: list[dict]) -> str:
    lines = ["| drafter | tau [95%] | first-position acceptance | drafting ms / round | verify ms / round "
             "| drafting / vanilla step | tokens/s | speedup vs none |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = {k: None if r[k] is None else 1e3 * r[k] for k in ("draft_s_per_round", "verify_s_per_round")}
        lines.append(f"| {r['drafter']} | {_fmt(r['tau'], '.3f')} {_fmt(r['tau_ci95'], '.2f')} "
                     f"| {_fmt(r['first_position_acceptance'], '.3f')} | {_fmt(ms['draft_s_per_round'], '.1f')} "
                     f"| {_fmt(ms['verify_s_per_round'], '.1f')} | {_fmt(r['draft_over_vanilla_step'], '.3f')} "
                     f"| {_fmt(r['tokens_per_s'], '.2f')} | {_fmt(r['speedup_vs_none'], '.3f')} |")
    step = rows[0]["vanilla_step_s"] if rows else None
    lines.append(f"\nvanilla step (mean `none` round): {_fmt(None if step is None else 1e3 * step, '.1f')} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="Also write the numbers here.")
    args = ap.parse_args(argv)
    rows = r1_rows(args.run)
    if not rows:
        raise SystemExit(f"{args.run} holds no drafter besides none")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
