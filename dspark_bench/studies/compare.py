"""Cross-engine comparison: the same prompts, seeds and drafters through our engine and through vLLM, side by side.

``dspark-bench compare-engines`` writes ``OUT/dspark`` and ``OUT/vllm`` (ordinary run folders, each with its
``lossless.json`` when ``--lossless`` ran) and ``OUT/compare.md`` / ``compare.json`` from what they recorded:
per drafter and engine, tau, acceptance rate, the per-position conditional acceptance (the paper's Figure 2:
P(x_j accepted | x_1..x_{j-1} were)), tokens/s, and the lossless verdicts of that drafter's rows. Nothing is
recomputed from outputs: the numbers are the summaries' (:mod:`dspark_bench.evaluation.metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ENGINE_FOLDERS = ("dspark", "vllm")


def _all_group(summary: Mapping[str, Any], drafter: str) -> dict[str, Any] | None:
    return next((g for g in summary["groups"] if g["scope"] == "all" and g["drafter"] == drafter), None)


def lossless_verdicts(lossless: Mapping[str, Any] | None, drafter: str) -> str:
    """"pass" / "FAIL" per test of the rows whose configuration names ``drafter``; "not run" without a report."""
    if not lossless:
        return "not run"
    rows = [r for r in lossless.get("rows", []) if not r.get("is_control")
            and drafter in [p.strip() for p in str(r.get("configuration", "")).split("|")]]
    if not rows:
        return "not run"
    return ", ".join(f"{r['test']} {'pass' if r['verdict'] == 'pass' else 'FAIL'}" for r in rows)


def comparison_rows(runs: Mapping[str, Mapping[str, Any]], lossless: Mapping[str, Mapping[str, Any] | None],
                    drafters: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (drafter, engine) that recorded the drafter: ``runs[engine]`` is a summary.json."""
    rows = []
    for d in drafters:
        for engine, summary in runs.items():
            g = _all_group(summary, d)
            if g is None:
                continue
            rows.append({"drafter": d, "engine": engine, "prompts": g["n_requests"], "tau": g["tau"],
                         "acceptance_rate": g["acceptance_rate"], "conditional": g["positions"]["conditional"],
                         "tokens_per_s": g["tokens_per_s"], "lossless": lossless_verdicts(lossless.get(engine), d)})
    return rows


def _num(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def markdown(rows: Sequence[Mapping[str, Any]], title: str) -> str:
    width = max((len(r["conditional"]) for r in rows), default=0)
    head = ["drafter", "engine", "prompts", "τ", "accept rate", *[f"acc@{j}" for j in range(1, width + 1)],
            "tok/s", "lossless"]
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cond = [_num(c) for c in r["conditional"]] + [""] * (width - len(r["conditional"]))
        lines.append("| " + " | ".join([r["drafter"], r["engine"], str(r["prompts"]), _num(r["tau"]),
                                         _num(r["acceptance_rate"]), *cond, _num(r["tokens_per_s"], ".1f"),
                                         r["lossless"]]) + " |")
    lines += ["", "acc@j: P(draft token j accepted | tokens 1..j-1 were), from each engine's recorded rounds (ours: "
              "the engine's; vLLM: its per-request speculative metrics). tok/s are decode tokens per second of "
              "each engine on this machine: compare them within one engine (speedup vs none), not across."]
    return "\n".join(lines) + "\n"


def write_comparison(out: Path, drafters: Sequence[str], title: str) -> list[dict[str, Any]]:
    """Read ``out/<engine>/summary.json`` (and ``lossless.json``) and write ``compare.json`` / ``compare.md``."""
    runs, lossless = {}, {}
    for engine in ENGINE_FOLDERS:
        folder = Path(out) / engine
        if (folder / "summary.json").is_file():
            runs[engine] = json.loads((folder / "summary.json").read_text())
            path = folder / "lossless.json"
            lossless[engine] = json.loads(path.read_text()) if path.is_file() else None
    rows = comparison_rows(runs, lossless, drafters)
    (Path(out) / "compare.json").write_text(json.dumps({"drafters": list(drafters), "rows": rows}, indent=2) + "\n")
    (Path(out) / "compare.md").write_text(markdown(rows, title), encoding="utf-8")
    return rows
