"""Full head against reduced draft vocabulary for one drafter checkpoint, from the two runs of
recipes/draft_vocab_compare.sh (``dspark-bench study draft-vocab-compare``).

Both runs decoded the same prompts with the same seeds (:func:`compare` checks the prompt list); each holds ``none``
and the drafter. Per run, :func:`dspark_bench.studies.claims.run_summary` of the drafter; then the reduced head's
change: delta tau, delta first-position acceptance and the ratio of the drafting costs. Timings are only
meaningful on a quiet machine.
"""

from __future__ import annotations

from pathlib import Path

from dspark_bench.studies.claims import ClaimsError, fmt, run_summary


def _diff(a, b):
    return None if a is None or b is None else a - b


def compare(full: Path, reduced: Path, drafter: str) -> dict:
    """``{"drafter", "full", "reduced", "delta"}``: the two runs' summaries of ``drafter`` and the change."""
    a, b = run_summary(full, drafter), run_summary(reduced, drafter)
    if a["prompts"] != b["prompts"]:
        raise ClaimsError("the two runs decoded different prompts: run both with the same --suite/--limit/--seed")
    delta = {"tau": _diff(b["tau"], a["tau"]),
             "first_position_acceptance": _diff(b["first_position_acceptance"], a["first_position_acceptance"]),
             "drafting_cost_ratio": (b["draft_s_per_round"] / a["draft_s_per_round"]
                                     if b["draft_s_per_round"] and a["draft_s_per_round"] else None)}
    for summary in (a, b):
        summary.pop("prompts")
    return {"drafter": drafter, "full": a, "reduced": b, "delta": delta}


def table(full: dict, reduced: dict) -> str:
    rows = [("tau", "tau", ".3f"), ("tau 95% CI", "tau_ci95", ".3f"), ("first-position acceptance",
            "first_position_acceptance", ".3f"), ("acceptance rate", "acceptance_rate", ".3f"),
            ("drafting s / round", "draft_s_per_round", ".5f"), ("verify s / round", "verify_s_per_round", ".5f"),
            ("vanilla step s", "vanilla_step_s", ".5f"), ("drafting / vanilla step", "draft_over_vanilla_step", ".3f"),
            ("tokens/s", "tokens_per_s", ".2f"), ("speedup vs none", "speedup_vs_none", ".3f"),
            ("rounds", "rounds", "d")]
    lines = ["| | full head | reduced vocabulary |", "|---|---:|---:|"]
    lines += [f"| {label} | {fmt(full[k], s)} | {fmt(reduced[k], s)} |" for label, k, s in rows]
    return "\n".join(lines)


def text(c: dict) -> str:
    """What ``dspark-bench study draft-vocab-compare`` prints for :func:`compare`'s result."""
    d = c["delta"]
    return (f"{c['drafter']}: {c['full']['requests']} prompts, same seeds\n\n{table(c['full'], c['reduced'])}\n\n"
            f"reduced - full: tau {fmt(d['tau'], '+.3f')}, first-position acceptance "
            f"{fmt(d['first_position_acceptance'], '+.3f')}; drafting cost x{fmt(d['drafting_cost_ratio'])}\n")
