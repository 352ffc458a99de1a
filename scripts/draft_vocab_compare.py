"""Full head vs reduced draft vocabulary for one drafter checkpoint, from the two runs of draft_vocab_compare.sh.

    python scripts/draft_vocab_compare.py FULL_RUN REDUCED_RUN --drafter NAME [--json OUT]

Both runs decoded the same prompts with the same seeds (the script checks the prompt list); each holds ``none`` and
the drafter. Per run it reports, for the drafter on all prompts (first repeat for acceptance, every repeat for
times): tau with its 95% bootstrap interval, the first-position acceptance (conditional acceptance at position 1)
and the acceptance rate; the **drafting cost per round**, the mean ``draft_s`` of the engine rounds (drafter
forward and sampling, one engine round of ``concurrency`` requests); the verify seconds per round; the vanilla
step, the mean wall time of a ``none`` round of the same run; drafting cost / vanilla step; tokens/s and the speedup
over ``none`` of the same run. Then the reduced head's change: delta tau, delta first-position acceptance and the
ratio of the drafting costs. Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from dspark_bench.metrics import group_summary
from dspark_bench.results import read_manifest, read_records


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _round_means(records, column: int) -> float | None:
    """Mean over the engine rounds of one timing column (records of a batch share their rounds' times)."""
    return _mean([t[column] for r in records if r.ok for t in r.timings])


def run_summary(folder: Path, drafter: str) -> dict:
    records = read_records(folder)
    manifest = read_manifest(folder)
    gamma = int(manifest["args"]["block_size"])
    mine = [r for r in records if r.drafter == drafter]
    none = [r for r in records if r.drafter == "none"]
    if not mine:
        raise SystemExit(f"{folder} has no records of drafter {drafter!r} (drafters: {sorted({r.drafter for r in records})})")
    g = group_summary(mine, gamma, none)
    vanilla = _mean([sum(t[:3]) for r in none if r.ok for t in r.timings])
    draft = _round_means(mine, 0)
    return {
        "run": str(folder), "prompts": sorted({(r.dataset, r.prompt_id) for r in mine}), "requests": g["n_requests"],
        "errors": g["n_errors"], "rounds": g["rounds"], "tau": g["tau"], "tau_ci95": g["tau_ci95"],
        "first_position_acceptance": g["positions"]["conditional"][0], "acceptance_rate": g["acceptance_rate"],
        "draft_s_per_round": draft, "verify_s_per_round": _round_means(mine, 1), "vanilla_step_s": vanilla,
        "draft_over_vanilla_step": draft / vanilla if draft is not None and vanilla else None,
        "tokens_per_s": g["tokens_per_s"], "speedup_vs_none": g["speedup_vs_none"],
    }


def _fmt(x, spec=".3f") -> str:
    if x is None:
        return "-"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(v, spec) for v in x) + "]"
    return format(x, spec)


def table(full: dict, reduced: dict) -> str:
    rows = [("tau", "tau", ".3f"), ("tau 95% CI", "tau_ci95", ".3f"), ("first-position acceptance",
            "first_position_acceptance", ".3f"), ("acceptance rate", "acceptance_rate", ".3f"),
            ("drafting s / round", "draft_s_per_round", ".5f"), ("verify s / round", "verify_s_per_round", ".5f"),
            ("vanilla step s", "vanilla_step_s", ".5f"), ("drafting / vanilla step", "draft_over_vanilla_step", ".3f"),
            ("tokens/s", "tokens_per_s", ".2f"), ("speedup vs none", "speedup_vs_none", ".3f"),
            ("rounds", "rounds", "d")]
    lines = ["| | full head | reduced vocabulary |", "|---|---:|---:|"]
    lines += [f"| {label} | {_fmt(full[k], s)} | {_fmt(reduced[k], s)} |" for label, k, s in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("full", type=Path)
    ap.add_argument("reduced", type=Path)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--json", type=Path, default=None, help="Also write the numbers here.")
    args = ap.parse_args(argv)
    full, reduced = run_summary(args.full, args.drafter), run_summary(args.reduced, args.drafter)
    if full["prompts"] != reduced["prompts"]:
        raise SystemExit("the two runs decoded different prompts: run both with the same --suite/--limit/--seed")
    delta = {"tau": _diff(reduced["tau"], full["tau"]),
             "first_position_acceptance": _diff(reduced["first_position_acceptance"], full["first_position_acceptance"]),
             "drafting_cost_ratio": (reduced["draft_s_per_round"] / full["draft_s_per_round"]
                                     if reduced["draft_s_per_round"] and full["draft_s_per_round"] else None)}
    print(f"{args.drafter}: {full['requests']} prompts, same seeds\n")
    print(table(full, reduced))
    print(f"\nreduced - full: tau {_fmt(delta['tau'], '+.3f')}, first-position acceptance "
          f"{_fmt(delta['first_position_acceptance'], '+.3f')}; drafting cost x{_fmt(delta['drafting_cost_ratio'])}")
    if args.json:
        for d in (full, reduced):
            d.pop("prompts")
        args.json.write_text(json.dumps({"drafter": args.drafter, "full": full, "reduced": reduced, "delta": delta},
                                        indent=2) + "\n")
    return 0


def _diff(a, b):
    return None if a is None or b is None else a - b


if __name__ == "__main__":
    sys.exit(main())
