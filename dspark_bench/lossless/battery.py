"""The lossless battery: is every registered drafter x scheduler an exact sampler of the target at T = 1, and under
the sampling filters users set (top-k, top-p, min-p: :class:`~dspark_bench.core.verify.Sampling`)?

Families (details in :mod:`.checks`; verdict rules in :mod:`.report`):

1. ``exact``: float64 enumeration of the output law through :func:`~dspark_bench.core.verify.speculative_accept` and
   every registered scheduler on synthetic Markov cases with V = 2..5, k <= 3 (:mod:`.cases`), compared with
   the target law; max abs error <= 1e-9. Two cases run under filters (top-k; top-p with min-p), compared with
   the target's processed law (:func:`~dspark_bench.lossless.synthetic.exact_probs`, the float64 twin).
2. ``chi2-gof``: the engine samples the synthetic cases ``engine-v4-k3-eos`` and ``appendix-a`` with each
   scheduler, and ``engine-v4-k3-eos+filters`` (the engine's own processing of p and q) with one; Pearson
   chi-square of the joint law of 3 tokens against the exact law, cells pooled to >= 5.
3. ``chi2-homogeneity``: speculative vs vanilla (``none``) decoding, first 3 tokens of 2 fixed prompts of the
   synthetic engine case; thorough mode adds the first 2 tokens of 8 prompts on the real target.
4. ``pit-ks``: randomized PIT + KS of every emitted token: on the synthetic case ``long-v4-k3`` with each
   scheduler (32-token outputs, so stateful schedulers run many rounds per request), and on the real target (fp32, T = 1) for every registered
   drafter x scheduler, the conditional law recomputed by a teacher-forced full forward of the generated text;
   and every drafter with one scheduler under :data:`REAL_SAMPLING`, that law processed the same way (float64
   twin) before the PIT (a law with zeros keeps the randomized PIT uniform).
5. Holm at alpha = 1e-3 over every sampled row of a real configuration.
6. Negative controls (:mod:`.controls`) through exact enumeration and the engine chi-square, each with the
   sample size the chi-square needs for power 0.99; every one must be detected.

Modes, measured on this project's 2-vCPU machine (1 torch thread, so CPU seconds ~ unloaded wall seconds;
SmolLM2-135M in fp32; 6 drafters x 4 schedulers registered):

* ``fast`` (CI): synthetic ~21 s CPU (3,000 sequences per chi-square, 2,000 per homogeneity arm, 4,096 PIT
  tokens per scheduler) + real target ~3 s per configuration (>= 100 PIT tokens each, block 2): 102 s CPU in
  all (154 s wall while other jobs kept the machine at load ~6). With 7 drafters x 7 schedulers and the
  sampling-filter rows (7 more real configurations, ~6 s CPU synthetic): 308 s, 5m08s CPU (load ~3).
* ``thorough``: 5x the synthetic samples, >= 5,000 PIT tokens per real configuration (block 4) and the
  real-target homogeneity test (480 requests per arm): ~100 s synthetic + ~210 s per real configuration
  (measured on 2 drafters x 2 schedulers: 936 s CPU), i.e. ~86 min for 6 x 4 (extrapolated).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from dspark_bench.core.verify import Sampling, speculative_accept
from dspark_bench.drafters import create, names
from dspark_bench.lossless import cases, checks
from dspark_bench.lossless.checks import guarded, scheduler_for
from dspark_bench.lossless.report import ALPHA, BatteryReport, TestResult, finalize
from dspark_bench.scheduling.schedulers import parse_scheduler, scheduler_names

REAL_DTYPE = "fp32"  # the real target runs and is re-scored in fp32: the PIT reference has no bf16 noise
# The sampling of the real target's processed-law rows: every filter on, at a temperature other than 1.
REAL_SAMPLING = Sampling(0.8, top_p=0.9, top_k=40, min_p=0.02)
# Openings of texts the target continues (plain text, no chat template: short prompts keep prefill cheap).
PROMPTS = (
    "The lighthouse keeper climbed the stairs and",
    "Photosynthesis is the process by which",
    "Here are five surprising uses for a paperclip:",
    "When packing for a week-long hiking trip, you should",
    "In chess, each player begins the game with",
    "There once was a cat who lived",
    "The sky appears blue during the day because",
    "Three practical tips for learning a new language are",
)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """Sample sizes of one mode."""

    gof_n: int  # engine chi-square sequences per configuration (appendix-a and controls: the same)
    homogeneity_n: int  # requests per arm, synthetic
    pit_requests: int  # synthetic PIT: requests per scheduler ...
    pit_tokens: int  # ... of at most this many tokens
    real_prompts: int  # real target: the first this many of PROMPTS, one request each per wave ...
    real_tokens: int  # ... of at most this many tokens; waves until ...
    real_min_tokens: int  # ... this many tokens were emitted (PIT sample size per configuration)
    real_block: int  # block size (gamma) on the real target
    real_homogeneity_seeds: int = 0  # real-target homogeneity: seeds per prompt per arm (0: skipped)
    real_concurrency: int = 8


PLANS = MappingProxyType({
    "fast": Plan(gof_n=3000, homogeneity_n=2000, pit_requests=128, pit_tokens=32, real_prompts=8, real_tokens=16,
                 real_min_tokens=100, real_block=2),
    "thorough": Plan(gof_n=15000, homogeneity_n=10000, pit_requests=512, pit_tokens=64, real_prompts=8,
                     real_tokens=128, real_min_tokens=5000, real_block=4, real_homogeneity_seeds=60),
})
# Option variants checked besides every registered scheduler's defaults. hardware-aware skips the drafter in a
# round whose drafts would not pay (then it decodes as vanilla); on the battery's cases at concurrency 16 that is
# every round under its default prior. With skip=false the sampled checks see its length decisions in every
# round; with an optimistic prior it drafts until the acceptance it measures says otherwise, then skips, so a
# run holds both kinds of rounds (tests/scheduling/test_cost_model.py checks that it does). The battery's schedulers decide
# from its fixed table alone (checks.scheduler_for pins adapt=false and measure=false); the adapt=true,measure=true
# variant prices rounds by the engine's measured seconds against that table (its decisions follow the machine's
# timing) and scales its survivals by the acceptance it measured against them.
VARIANTS = ("hardware-aware[skip=false]", "hardware-aware[prior=0.8]",
            "hardware-aware[prior=0.8,adapt=true,measure=true]")
MAX_WAVES = 1000  # a safety stop for a target that ends every request at once
SYNTHETIC_PROMPTS = ((0,), (1,))


def run_battery(mode: str = "fast", target: str = "smollm2-135m", drafters: list[str] | None = None,
                schedulers: list[str] | None = None, seed: int = 0, progress: Progress | None = None) -> BatteryReport:
    """Run the battery; ``drafters`` / ``schedulers`` default to everything registered at call time."""
    if mode not in PLANS:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(PLANS)}")
    drafter_list = _pick(drafters, names(), "drafter")
    scheduler_list = _pick_schedulers(schedulers)
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    results = synthetic_results(PLANS[mode], scheduler_list, seed, say)
    results += real_results(PLANS[mode], target, drafter_list, scheduler_list, seed, say)
    return BatteryReport(mode, target, REAL_DTYPE, seed, ALPHA, time.perf_counter() - t0, finalize(results))


def _pick(chosen: Sequence[str] | None, known: Sequence[str], kind: str) -> list[str]:
    unknown = sorted(set(chosen or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown {kind}(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return list(known if chosen is None else chosen)


def _pick_schedulers(chosen: Sequence[str] | None) -> list[str]:
    """``chosen`` (NAME or NAME[KEY=VALUE,...]) or every registered scheduler plus :data:`VARIANTS`."""
    if chosen is None:
        return [*scheduler_names(), *VARIANTS]
    _pick([parse_scheduler(s)[0] for s in chosen], scheduler_names(), "scheduler")
    return list(chosen)


@contextlib.contextmanager
def _threads(n: int):
    """Run with ``n`` intra-op threads. The battery's tensors are tiny (synthetic) or small (batches of <= 40
    tokens of a 135M model): on 2 cores a second thread saves little and, when the machine is busy, its
    barriers cost 5-30x (measured). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- synthetic ------------------------------------------------------------------------------------------------
def synthetic_results(plan: Plan, schedulers: Sequence[str], seed: int, say: Progress) -> list[TestResult]:
    """Every synthetic row: exact laws, engine chi-square, controls, homogeneity and PIT."""
    engine, appendix = cases.engine_case(), cases.appendix_a_case()
    with _threads(1):
        say("exact enumeration")
        rows = [row for case in (*cases.exact_cases(), engine) for row in _exact_rows(case, schedulers)]
        say("engine chi-square")
        filtered = cases.filtered_engine_case()
        for case, names in ((engine, schedulers), (appendix, schedulers), (filtered, [_one(schedulers)])):
            for s in names:
                label = f"synthetic {case.name} | {s}"
                rows.append(guarded("chi2-gof", label, False, functools.partial(
                    _gof, case, label, s, plan.gof_n, seed)))
        say("negative controls")
        rows += [row for ctl in cases.controls() for row in _control_rows(ctl, plan, seed)]
        say("homogeneity and PIT (synthetic)")
        rows += _synthetic_homogeneity(plan, engine, schedulers, seed)
        long = cases.long_case()
        for s in schedulers:
            label = f"synthetic {long.name} | {s}"
            rows.append(guarded("pit-ks", label, False, functools.partial(_synthetic_pit, plan, long, label, s, seed)))
    return rows


def _one(schedulers: Sequence[str]) -> str:
    """The scheduler of the rows that vary the sampling, not the scheduler: ``fixed`` when checked, else the first."""
    return "fixed" if "fixed" in schedulers else schedulers[0]


def _exact_rows(case: cases.Case, schedulers: Sequence[str]) -> list[TestResult]:
    """The engine case is checked on its engine window (budget cap included), the others on k + 1 tokens."""
    window = case.name == cases.engine_case().name
    cache: dict = {}  # verdict laws depend on (target, drafter, rule), not on the scheduler
    rows = []
    for s in schedulers:
        label = f"synthetic {case.name}{' window' if window else ''} | {s}"
        rows.append(guarded("exact", label, False, lambda s=s, label=label: checks.exact_check(
            case, label, scheduler_for(s, case.sps), speculative_accept, cache, window=window)))
    return rows


def _gof(case: cases.Case, label: str, scheduler: str, n: int, seed: int) -> TestResult:
    return checks.gof_check(case, label, scheduler_for(scheduler, case.sps), speculative_accept, n, seed)


def _control_rows(ctl: cases.Control, plan: Plan, seed: int) -> list[TestResult]:
    """Exact row (with its power statement) and, unless the control is too small to sample, a chi-square row."""
    label, cache = f"control {ctl.name} @ {ctl.case.name}", {}

    def scheduler():
        return ctl.scheduler() if ctl.scheduler else scheduler_for("fixed", ctl.case.sps)

    runs = {"exact": lambda: checks.exact_check(ctl.case, label, scheduler(), ctl.rule, cache, is_control=True,
                                                window=True, pool_n=plan.gof_n)}
    if ctl.sampled:
        runs["chi2-gof"] = lambda: checks.gof_check(ctl.case, label, scheduler(), ctl.rule, plan.gof_n, seed,
                                                    is_control=True, cache=cache)
    rows = [guarded(test, label, True, run) for test, run in runs.items()]
    return [r if r.detail.startswith("error") else dataclasses.replace(r, detail="; ".join(
        x for x in (ctl.bug, r.detail) if x)) for r in rows]


def _synthetic_homogeneity(plan: Plan, case: cases.Case, schedulers: Sequence[str], seed: int) -> list[TestResult]:
    target, m = case.target(), checks.WINDOW
    vanilla = checks.first_token_counts(target, create("none", target), None, SYNTHETIC_PROMPTS, plan.homogeneity_n,
                                        m, m + 1, 1, f"vanilla/{target.name}", seed)
    rows = []
    for s in schedulers:
        label = f"synthetic {case.name} | {s}"
        rows.append(guarded("chi2-homogeneity", label, False, lambda s=s, label=label: checks.homogeneity_check(
            label, checks.first_token_counts(target, case.drafter(target), scheduler_for(s, case.sps),
                                             SYNTHETIC_PROMPTS, plan.homogeneity_n, m, m + 1, case.block_size,
                                             "homog/" + label, seed), vanilla)))
    return rows


def _synthetic_pit(plan: Plan, case: cases.Case, label: str, scheduler: str, seed: int) -> TestResult:
    target, n = case.target(), plan.pit_requests
    outs = checks.generate(target, case.drafter(target), scheduler_for(scheduler, case.sps), speculative_accept,
                           [case.prompt] * n, checks.seeds(seed, label, n), plan.pit_tokens, case.block_size, 8)
    return checks.pit_check(label, [(case.prompt, o) for o in outs], checks.chain_laws(case), seed)


# ---- real target ----------------------------------------------------------------------------------------------
def real_results(plan: Plan, target_name: str, drafters: Sequence[str], schedulers: Sequence[str], seed: int,
                 say: Progress) -> list[TestResult]:
    """PIT (and, in thorough mode, homogeneity) of every drafter x scheduler on the real target."""
    from dspark_bench.target.model import Target

    say(f"loading {target_name} ({REAL_DTYPE})")
    target = Target.load(target_name, dtype=REAL_DTYPE)
    prompts = [tuple(target.tokenizer(p)["input_ids"]) for p in PROMPTS[: plan.real_prompts]]
    rows = []
    with _threads(1):
        vanilla = None
        if plan.real_homogeneity_seeds:
            vanilla = checks.first_token_counts(target, create("none", target), None, prompts, _homogeneity_n(plan),
                                                2, 4, 1, f"vanilla/{target.name}", seed, plan.real_concurrency)
        for d in drafters:
            for s in schedulers:
                label = f"{target_name} | {d} | {s}"
                say(f"real target: {label}")
                rows.append(guarded("pit-ks", label, False, functools.partial(
                    _real_pit, plan, target, prompts, d, s, label, seed)))
                if vanilla is not None:
                    rows.append(guarded("chi2-homogeneity", label, False, functools.partial(
                        _real_homogeneity, plan, target, prompts, d, s, label, seed, vanilla)))
        for d in drafters:
            label = f"{target_name} | {d} | {_one(schedulers)} | {REAL_SAMPLING.label}"
            say(f"real target: {label}")
            rows.append(guarded("pit-ks", label, False, functools.partial(
                _real_pit, plan, target, prompts, d, _one(schedulers), label, seed, REAL_SAMPLING)))
    return rows


def _homogeneity_n(plan: Plan) -> int:
    return plan.real_prompts * plan.real_homogeneity_seeds


def _real_pit(plan: Plan, target, prompts, drafter: str, scheduler: str, label: str, seed: int,
              sampling: Sampling = checks.UNFILTERED) -> TestResult:
    """Waves of one request per prompt until ``real_min_tokens`` tokens, then PIT + KS on all of them under the
    target's law processed by ``sampling``."""
    pairs, tokens, wave = [], 0, 0
    while tokens < plan.real_min_tokens and wave < MAX_WAVES:
        outs = checks.generate(target, create(drafter, target), scheduler_for(scheduler, cases.SMOOTH_SPS),
                               speculative_accept, prompts, checks.seeds(seed, f"{label}#{wave}", len(prompts)),
                               plan.real_tokens, plan.real_block, plan.real_concurrency, sampling)
        pairs += zip(prompts, outs, strict=True)
        tokens, wave = tokens + sum(len(o) for o in outs), wave + 1
    return checks.pit_check(label, pairs, checks.teacher_forced_laws(target, sampling), seed)


def _real_homogeneity(plan: Plan, target, prompts, drafter: str, scheduler: str, label: str, seed: int,
                      vanilla) -> TestResult:
    spec = checks.first_token_counts(target, create(drafter, target), scheduler_for(scheduler, cases.SMOOTH_SPS),
                                     prompts, _homogeneity_n(plan), 2, 4, plan.real_block, "homog/" + label, seed,
                                     plan.real_concurrency)
    return checks.homogeneity_check(label, spec, vanilla)
