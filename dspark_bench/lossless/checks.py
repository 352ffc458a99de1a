"""The battery's tests, one function per test family, each returning :class:`~.report.TestResult` rows.

* :func:`exact_check`: exact law (enumeration) of a synthetic configuration vs the target law.
* :func:`gof_check`: the engine samples a synthetic configuration; Pearson chi-square of the joint law of
  the tokens after the first (``WINDOW`` of them, the engine's whole remaining budget) against the exact law.
* :func:`homogeneity_check`: two-sample chi-square of a configuration's first tokens against vanilla
  decoding (``none``) on fixed prompts, independent seeds for the two arms.
* :func:`pit_check`: randomized PIT of every emitted token under the target's conditional law, then KS.
  On the real target that law is recomputed by a separate teacher-forced full forward of the generated text.

Sampling seeds are ``base + i`` with ``base`` derived from the battery seed and the row's label (CRC32), so
rows are independent of each other and of the order they run in.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from dspark_bench.core.verify import AcceptRule, Sampling, speculative_accept
from dspark_bench.drafters.base import Drafter
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.lossless import exact
from dspark_bench.lossless.cases import Case
from dspark_bench.lossless.hypothesis import (
    align,
    chi_square_gof,
    chi_square_homogeneity,
    ks_uniform,
    pool_cells,
    randomized_pit,
)
from dspark_bench.lossless.power import effect_size, pooled, sample_size
from dspark_bench.lossless.report import ALPHA, EXACT_BOUND, TestResult, errored
from dspark_bench.lossless.synthetic import exact_probs
from dspark_bench.scheduling.profile import table_profile
from dspark_bench.scheduling.schedulers import Scheduler, create_scheduler, parse_scheduler, scheduler_class

WINDOW = 3  # tokens after the first one in the engine chi-square (max_new_tokens = WINDOW + 1)
CONCURRENCY = 16
UNFILTERED = Sampling(1.0)  # T = 1, no filter: the battery's default law


def scheduler_for(item: str, sps: dict[int, float]) -> Scheduler:
    """Registered scheduler ``NAME`` or ``NAME[KEY=VALUE,...]``; one that takes a ``profile`` gets the fixed
    table ``sps`` (no profiling) and, unless ``item`` sets ``adapt`` or ``measure``, decides from it alone
    (``adapt=false``, ``measure=false``: decisions that do not depend on the machine's timing, so the case's
    designed paths are the ones sampled; the battery's ``VARIANTS`` check the adaptive path)."""
    name, options = parse_scheduler(item)
    cls = scheduler_class(name)
    fields = {f.name for f in dataclasses.fields(cls) if f.init} if dataclasses.is_dataclass(cls) else set()
    table = {"profile": table_profile(sps, "battery")} if "profile" in fields else {}
    pinned = {key: "false" for key in ("adapt", "measure") if key in fields and key not in options}
    return create_scheduler(name, **table, **pinned, **options)


def seeds(seed: int, label: str, n: int) -> list[int]:
    base = (seed * 1_000_003 + zlib.crc32(label.encode())) % (2**31)
    return [base + i for i in range(n)]


def guarded(test: str, configuration: str, is_control: bool, run: Callable[[], TestResult]) -> TestResult:
    """``run()``, or a failing row that records the exception."""
    try:
        return run()
    except Exception as exc:  # noqa: BLE001 - a configuration that cannot run fails the battery, visibly
        return errored(test, configuration, exc, is_control)


def generate(target, drafter: Drafter, scheduler: Scheduler | None, rule: AcceptRule, prompts: Sequence[tuple],
             request_seeds: Sequence[int], max_new: int, block: int, concurrency: int = CONCURRENCY,
             sampling: Sampling = UNFILTERED) -> list[tuple]:
    """Outputs of one engine run (request order) under ``sampling``; any failed request is an error."""
    config = EngineConfig(max_new, sampling.temperature, block, concurrency, sampling.top_p, sampling.top_k,
                          sampling.min_p)
    engine = RoundLoop(target, drafter, config, scheduler, rule)
    results = []
    engine.run([Request(i, tuple(p), s) for i, (p, s) in enumerate(zip(prompts, request_seeds, strict=True))],
               results.append)
    failed = [r for r in results if r.status != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(results)} requests failed, first: {failed[0].error}")
    return [r.output_ids for r in sorted(results, key=lambda r: r.request.request_id)]


# ---- exact ----------------------------------------------------------------------------------------------------
def exact_check(case: Case, label: str, scheduler: Scheduler, rule: AcceptRule, cache: dict,
                is_control: bool = False, window: bool = False, pool_n: int = 2000) -> TestResult:
    """max |law - target law| of the first ``block + 1`` tokens after every non-EOS context (uncapped), or, with
    ``window``, of the engine test's window after the prompt (budget cap included; controls then also get the
    chi-square's n for power 0.99, cells pooled as for ``pool_n`` samples)."""
    target = case.target()
    setting = exact.Setting(target, case.drafter(target), scheduler, rule, case.block_size, case.sampling)
    if window:
        laws = [(window_law(setting, case, cache), target_window_law(case))]
    else:
        m, probs = case.block_size + 1, setting.probs
        laws = [(exact.spec_law(setting, c, m, False, cache), exact.markov_law(probs, c, m, target.eos_ids))
                for c in range(target.vocab_size) if c not in target.eos_ids]
    error = max(exact.max_abs_error(a, b) for a, b in laws)
    power_n = power_for(laws[0][1], laws[0][0], pool_n) if is_control and window else None
    return TestResult("exact", label, sum(len(b) for _, b in laws), error, bound=EXACT_BOUND, is_control=is_control,
                      expected="fail" if is_control else "pass", power_n=power_n)


def power_for(law: exact.Law, biased: exact.Law, n: int) -> int | None:
    """Samples the chi-square of ``biased`` draws against ``law`` needs for power 0.99 at ``ALPHA`` (cells
    pooled as for ``n`` samples); None when the pooled laws do not differ."""
    cells = sorted(set(law) | set(biased), key=repr)
    p0, p1 = [law.get(c, 0.0) for c in cells], [biased.get(c, 0.0) for c in cells]
    groups = pool_cells([n * x for x in p0])
    w2, df = effect_size(pooled(p0, groups), pooled(p1, groups)), max(groups, default=0)
    return sample_size(w2, df, ALPHA) if w2 > 0 and df > 0 else None


def target_window_law(case: Case) -> exact.Law:
    probs, eos = case.chain.probs(case.sampling), frozenset(case.eos_ids)
    return exact.after_first(probs[case.prompt[-1]], lambda y: exact.markov_law(probs, y, WINDOW, eos), eos)


def window_law(setting: exact.Setting, case: Case, cache: dict) -> exact.Law:
    """Exact law of the engine test's window for ``setting`` (engine budget cap included)."""
    first = setting.probs[case.prompt[-1]]
    return exact.after_first(first, lambda y: exact.spec_law(setting, y, WINDOW, True, cache), setting.target.eos_ids)


# ---- engine chi-square (synthetic) --------------------------------------------------------------------------
def gof_check(case: Case, label: str, scheduler: Scheduler, rule: AcceptRule, n: int, seed: int,
              is_control: bool = False, cache: dict | None = None) -> TestResult:
    """Engine samples of the window vs its exact target law; controls also get the n for power 0.99."""
    target = case.target()
    outs = generate(target, case.drafter(target), scheduler, rule, [case.prompt] * n, seeds(seed, label, n),
                    WINDOW + 1, case.block_size, case.concurrency, case.sampling)
    expected = target_window_law(case)
    _, observed, law = align(Counter(tuple(o[1:]) for o in outs), expected)
    res = chi_square_gof(observed, law)
    power_n = None
    if is_control:
        setting = exact.Setting(target, case.drafter(target), scheduler, rule, case.block_size, case.sampling)
        power_n = power_for(expected, window_law(setting, case, {} if cache is None else cache), n)
    return TestResult("chi2-gof", label, n, res.statistic, res.p_value, is_control=is_control, df=res.df,
                      expected="fail" if is_control else "pass", power_n=power_n, detail=f"df={res.df}")


# ---- homogeneity ----------------------------------------------------------------------------------------------
def first_token_counts(target, drafter: Drafter, scheduler: Scheduler | None, prompts: Sequence[tuple], n: int,
                       m: int, max_new: int, block: int, label: str, seed: int,
                       concurrency: int = CONCURRENCY) -> Counter:
    """Counts of (prompt index, first ``m`` output tokens) over ``n`` requests cycling through ``prompts``."""
    ids = [i % len(prompts) for i in range(n)]
    outs = generate(target, drafter, scheduler, speculative_accept, [prompts[i] for i in ids], seeds(seed, label, n),
                    max_new, block, concurrency)
    return Counter((i, tuple(o[:m])) for i, o in zip(ids, outs, strict=True))


def homogeneity_check(label: str, spec: Counter, vanilla: Counter) -> TestResult:
    cells = sorted(set(spec) | set(vanilla), key=repr)
    res = chi_square_homogeneity([spec.get(c, 0) for c in cells], [vanilla.get(c, 0) for c in cells])
    return TestResult("chi2-homogeneity", label, sum(spec.values()), res.statistic, res.p_value, df=res.df,
                      detail=f"df={res.df}, vs none ({sum(vanilla.values())})")


# ---- PIT ------------------------------------------------------------------------------------------------------
Pairs = Sequence[tuple[tuple, tuple]]  # (prompt ids, output ids) per request


def pit_check(label: str, pairs: Pairs, laws_of: Callable[[Pairs], list[torch.Tensor]], seed: int) -> TestResult:
    """KS of randomized PIT values of every emitted token; ``laws_of(pairs)`` gives [len(output), V] per pair."""
    pairs = [(p, o) for p, o in pairs if o]
    gen = torch.Generator().manual_seed(seeds(seed, "pit/" + label, 1)[0])
    values = torch.cat([randomized_pit(law, torch.tensor(o), gen) for law, (_, o) in zip(laws_of(pairs), pairs,
                                                                                          strict=True)])
    d, p = ks_uniform(values)
    return TestResult("pit-ks", label, int(values.numel()), d, p, detail=f"{len(pairs)} requests")


def chain_laws(case: Case) -> Callable[[Pairs], list[torch.Tensor]]:
    """Exact conditional laws of the synthetic target: row ``previous token`` of its (processed) transition matrix."""
    probs = case.chain.probs(case.sampling)

    def laws_of(pairs: Pairs) -> list[torch.Tensor]:
        return [probs[[*p, *o][len(p) - 1 : -1]] for p, o in pairs]

    return laws_of


def teacher_forced_laws(target, sampling: Sampling = UNFILTERED, chunk: int = 8
                        ) -> Callable[[Pairs], list[torch.Tensor]]:
    """The real target's law of every output token under ``sampling``, from full forwards of prompt + output (the
    HF model's own causal forward, right-padded batches of ``chunk`` sequences: no KV cache, no engine code),
    processed in float64 by the battery's own twin of the engine's processing
    (:func:`~dspark_bench.lossless.synthetic.exact_probs`). A law with zeros keeps the randomized PIT valid."""

    def laws_of(pairs: Pairs) -> list[torch.Tensor]:
        out = []
        for start in range(0, len(pairs), chunk):
            part = pairs[start : start + chunk]
            seqs = [[*p, *o[:-1]] for p, o in part]
            width = max(len(x) for x in seqs)
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            for r, x in enumerate(seqs):
                ids[r, : len(x)], mask[r, : len(x)] = torch.tensor(x), 1
            with torch.inference_mode():
                logits = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device)).logits
            out += [exact_probs(logits[r, len(p) - 1 : len(p) - 1 + len(o)].double().cpu(), sampling)
                    for r, (p, o) in enumerate(part)]
        return out

    return laws_of
