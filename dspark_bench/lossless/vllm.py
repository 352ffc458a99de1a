"""``dspark-bench check-lossless --engine vllm``: is vLLM's speculative decoding an exact sampler of the target?

For every vLLM configuration (``none`` included: vLLM without speculation must pass too), on the battery's
plain-text prompts (:data:`dspark_bench.lossless.battery.PROMPTS`), T = 1, float32:

1. ``pit-ks``: waves of one request per prompt (``real_tokens`` tokens each, per-request seeds) until at least
   ``real_min_tokens`` tokens; randomized PIT of every emitted token under the target law recomputed by a
   teacher-forced full forward of the same weights through our HF :class:`~dspark_bench.target.model.Target`
   (:func:`~dspark_bench.lossless.checks.teacher_forced_laws`), then KS against U(0, 1).
2. ``chi2-homogeneity`` (speculative configurations): the first 2 tokens of ``seeds_per_prompt`` requests per
   prompt, vs vLLM ``none`` on the same prompts (two-sample Pearson, cells pooled). The arms' seeds are derived
   from the same base seed but differ (as in our battery): the test needs independent samples, and with equal
   seeds an engine that draws the same uniforms in both arms would pass by construction, not by its law.
3. Holm at ``ALPHA`` over every row (:func:`~dspark_bench.lossless.report.finalize`), the battery's table and JSON.

Power (``detail``): the KS row states the smallest sup-distance between the emitted PIT law and U(0, 1) it detects
with probability 0.99 at the Holm level of its family, ``(K(alpha / m) + K(0.01)) / sqrt(n)`` with ``K`` the
Kolmogorov distribution's upper quantile (a sufficient bound: the empirical process stays within ``K(0.01) /
sqrt(n)`` of its law with probability 0.99); the homogeneity row states the smallest Cohen ``w2`` (pooled cells)
with power 0.99 at that level for two arms of n each (noncentrality ``n w2 / 2``).
Evidence kept per configuration: per-position acceptance counts of every sampled request (vLLM's per-request
metrics) and example outputs (token ids and text).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from scipy import stats

from dspark_bench.engines.vllm.fixes import facts, warnings_for
from dspark_bench.engines.vllm.llm import (
    VllmError,
    VllmLLM,
    VllmRequest,
    VllmSettings,
    open_llm,
    parse_engine_options,
    speculative_config,
    split_options,
    vllm_version,
)
from dspark_bench.evaluation.metrics import acceptance, count_rounds
from dspark_bench.lossless import checks
from dspark_bench.lossless.battery import PROMPTS, REAL_DTYPE
from dspark_bench.lossless.power import sample_size
from dspark_bench.lossless.report import ALPHA, BatteryReport, TestResult, errored, finalize

HOMOGENEITY_TOKENS = 2
EXAMPLES = 3


@dataclass(frozen=True)
class VllmPlan:
    prompts: int  # the first this many of the battery's PROMPTS
    tokens: int  # max_tokens per PIT request
    min_tokens: int  # PIT sample size per configuration (tokens)
    seeds_per_prompt: int  # homogeneity: requests per prompt per arm
    block: int  # num_speculative_tokens


VLLM_PLANS = MappingProxyType({
    "fast": VllmPlan(prompts=8, tokens=16, min_tokens=100, seeds_per_prompt=16, block=3),
    "thorough": VllmPlan(prompts=8, tokens=128, min_tokens=5000, seeds_per_prompt=60, block=4),
})
Progress = Callable[[str], None]


def ks_detectable(n: int, level: float, power: float = 0.99) -> float:
    """Smallest sup-distance |F - U| the KS test of ``n`` values detects with ``power`` at ``level`` (module doc)."""
    return float((stats.kstwobign.isf(level) + stats.kstwobign.isf(1 - power)) / math.sqrt(n))


def homogeneity_detectable(n: int, df: int, level: float, power: float = 0.99) -> float | None:
    """Smallest Cohen w2 two arms of ``n`` requests detect with ``power`` at ``level`` (noncentrality n w2 / 2)."""
    if df < 1 or n < 1:
        return None
    return 2.0 * sample_size(1.0, df, level, power) / n  # sample_size(1, ...) = the noncentrality needed


def with_power(rows: Sequence[TestResult]) -> tuple[TestResult, ...]:
    """Each sampled row's detail gains the smallest deviation it detects at its Holm level (first step: alpha/m)."""
    m = sum(r.p_value is not None for r in rows)
    level, out = ALPHA / max(m, 1), []
    for r in rows:
        if r.test == "pit-ks" and r.n:
            note = f"detects sup|F-U| >= {ks_detectable(r.n, level):.3f} with power .99"
        elif r.test == "chi2-homogeneity" and r.df:
            w2 = homogeneity_detectable(r.n, r.df, level)
            note = f"detects w2 >= {w2:.3g} with power .99" if w2 else ""
        else:
            note = ""
        out.append(replace(r, detail="; ".join(x for x in (r.detail, note) if x)))
    return tuple(out)


# ---- sampling through vLLM -----------------------------------------------------------------------------------
def sample(engine: VllmLLM, prompts: Sequence[tuple[int, ...]], request_seeds: Sequence[int], max_tokens: int,
           label: str) -> list[Any]:
    """Records of one ``generate`` over ``prompts`` (T = 1, one group); any failed request is an error."""
    reqs = [VllmRequest(tuple(p), s, "lossless", "", f"{label}#{i}", i)
            for i, (p, s) in enumerate(zip(prompts, request_seeds, strict=True))]
    records = engine.run(reqs, 1.0, max_tokens, 0, len(reqs))
    failed = [r for r in records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} vLLM requests failed, first: {failed[0].error}")
    return records


def pit_row(engine: VllmLLM, plan: VllmPlan, prompts, laws_of, label: str, seed: int,
            evidence: dict) -> TestResult:
    pairs, records, wave = [], [], 0
    while sum(len(o) for _, o in pairs) < plan.min_tokens and wave < 1000:
        recs = sample(engine, prompts, checks.seeds(seed, f"{label}#{wave}", len(prompts)), plan.tokens, label)
        pairs += [(p, r.output_ids) for p, r in zip(prompts, recs, strict=True)]
        records, wave = records + recs, wave + 1
    evidence["positions"] = acceptance(count_rounds([x for r in records for x in r.rounds], plan.block))
    evidence["examples"] = [list(o) for _, o in pairs[:EXAMPLES]]
    return checks.pit_check(label, pairs, laws_of, seed)


def first_tokens(engine: VllmLLM, plan: VllmPlan, prompts, seed: int, label: str) -> Counter:
    """(prompt index, first tokens) over ``seeds_per_prompt`` requests per prompt (seeds from ``label``)."""
    ids = [i % len(prompts) for i in range(len(prompts) * plan.seeds_per_prompt)]
    recs = sample(engine, [prompts[i] for i in ids], checks.seeds(seed, "homog/" + label, len(ids)),
                  HOMOGENEITY_TOKENS, "homogeneity")
    return Counter((i, r.output_ids[:HOMOGENEITY_TOKENS]) for i, r in zip(ids, recs, strict=True))


def config_rows(name: str, setting: VllmSettings, plan: VllmPlan, prompts, laws_of, vanilla: Counter | None,
                seed: int, target: str, evidence: dict) -> tuple[list[TestResult], Counter | None]:
    """The rows of one configuration (its engine opened and closed here) and its first-token counts."""
    label = f"vllm {target} | {name}"
    try:
        engine = open_llm(setting, name)
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot start fails, visibly
        return [errored("pit-ks", label, exc)], None
    try:
        rows = [checks.guarded("pit-ks", label, False, lambda: pit_row(engine, plan, prompts, laws_of, label, seed,
                                                                       evidence))]
        counts = first_tokens(engine, plan, prompts, seed, label)
    finally:
        engine.close()
    if vanilla is not None:
        rows.append(checks.guarded("chi2-homogeneity", label, False, lambda: checks.homogeneity_check(
            label, counts, vanilla)))
    return rows, counts


def run_vllm_battery(mode: str, target_name: str, drafters: Sequence[str], seed: int, model: str,
                     llm_options: dict[str, Any], progress: Progress | None = None,
                     drafter_options: dict[str, dict[str, str]] | None = None,
                     fixes: Sequence[str] = ()) -> tuple[BatteryReport, dict]:
    """The report (``none`` first, then each speculative configuration) and the evidence per configuration;
    ``drafter_options`` as ``--drafter-opt`` gives them (e.g. ``eagle3.model``); ``fixes``: names of
    :data:`vllm_fixes.FIXES` applied in vLLM's processes."""
    from dspark_bench.target.model import Target

    if mode not in VLLM_PLANS:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(VLLM_PLANS)}")
    plan, say, t0 = VLLM_PLANS[mode], progress or (lambda _m: None), time.perf_counter()
    names = ["none", *[d for d in drafters if d != "none"]]
    opts = drafter_options or {}
    settings = {d: VllmSettings(model, REAL_DTYPE, seed, 1024, speculative_config(d, plan.block, opts.get(d)),
                                llm_options, tuple(fixes))
                for d in names}  # every configuration validated before a model loads
    say(f"loading {target_name} ({REAL_DTYPE}) for the teacher-forced target law")
    hf = Target.load(target_name, dtype=REAL_DTYPE)
    prompts = [tuple(hf.tokenizer(p)["input_ids"]) for p in PROMPTS[: plan.prompts]]
    laws_of = checks.teacher_forced_laws(hf)
    rows, evidence, vanilla = [], {}, None
    for name in names:
        say(f"vLLM {name}: PIT and first-token samples")
        evidence[name] = {"speculative_config": settings[name].speculative}
        got, counts = config_rows(name, settings[name], plan, prompts, laws_of, vanilla, seed, target_name,
                                  evidence[name])
        rows += got
        evidence[name]["example_texts"] = [hf.tokenizer.decode(o) for o in evidence[name].get("examples", [])]
        if name == "none":
            vanilla = counts
    report = BatteryReport(mode, f"vllm:{target_name}", REAL_DTYPE, seed, ALPHA, time.perf_counter() - t0,
                           with_power(finalize(rows)))
    return report, evidence


def lossless_options(engine_opt, command: str) -> tuple[tuple[str, ...], dict]:
    """(fixes, ``LLM`` options) of a vLLM lossless check from ``--engine-opt``: EngineArgs fields and ``fix``."""
    fixes, llm_opts, spec_opts = split_options(parse_engine_options(engine_opt))
    if spec_opts:
        raise VllmError(f"{command} takes EngineArgs options and fix= only, not {sorted(spec_opts)}")
    return fixes, llm_opts


def engine_facts(fixes, speculative: bool, say: Callable[[str], None] = lambda msg: None) -> dict:
    """lossless.json's ``engine``: vLLM's version and its known bugs (present? fixed?), warning on stderr about
    an unfixed one (through ``say``) that makes this check's speculative configurations lossy (T = 1)."""
    bugs = facts(fixes)
    for line in warnings_for(bugs, speculative):
        say(f"warning: {line}")
    return {"name": "vllm", "version": vllm_version(), "known_bugs": bugs}
