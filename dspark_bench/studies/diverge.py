"""Divergence forensics over run folders: find where two runs' tokens part, replay each run to recompute the laws
it drew from there, and judge the divergence (:mod:`dspark_bench.evaluation.forensics` holds the math).

**Why a replay.** A record keeps per round ``[proposed, verified, accepted, committed]`` and the batch size, not
the laws. Teacher-forcing the common prefix through the target in a guessed forward shape recomputes a law close
to the run's, but the run's own law came from a KV cache written by its earlier rounds, in its batch, with its
block widths, and for a recovered token also from the drafter's law q at that round. So each run is replayed
through the engine's own loop (:class:`~dspark_bench.engines.native.loop.RoundLoop`) with the settings its
manifest recorded: the same requests in the same order at the same concurrency, so the same batches and block
widths, with an acceptance rule that keeps what the round computed for the request of interest (target logits
and law, draft law, drafts, correction weights, the uniforms consumed) and then runs the engine's rule
unchanged. A replay on the machine and code that made the run reproduces its tokens bit for bit, and the
report says whether it did (``Laws.token``, ``Laws.prefix_equal``); elsewhere its laws approximate the run's and
the verdict says so. The replay stops once every wanted position is captured, so it costs at most the run's own
decoding of that drafter up to the last divergence.

**Rounds that parted first.** Two runs can keep the same tokens while their rounds part: one accepts a draft
where the other rejects a (differently drawn) draft and recovers the same token, so the first run's round goes on
where the second's ends, their later rounds start at different positions, and from there each run draws other
uniforms at the same positions. A later token divergence
then comes from rounds that start at different positions, and no draw of its own decided it; the decision judged
is the one at the token where the rounds parted (:func:`~dspark_bench.evaluation.forensics.parting`), and the
report names that token (``rounds_parted``).

``greedy_equality`` is the temperature-0 check ``run`` makes: each drafter's outputs against ``none``'s on the
same prompts, and every divergence judged by the top-2 logit gap of the target at that position against the
difference of the logits its two paths (a one-token decode, a verify block) computed there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from dspark_bench.core import rng
from dspark_bench.core.records import RequestRecord, ResultsError
from dspark_bench.core.rounds import Request
from dspark_bench.core.verify import correction_weights, sample, to_probs
from dspark_bench.engines.base import RunSpec
from dspark_bench.engines.native.loop import RoundLoop, Session
from dspark_bench.engines.native.runner import Run, build_requests, fit_requests, spec_from_manifest
from dspark_bench.evaluation import forensics as fx
from dspark_bench.evaluation.runs import SUMMARY, read_json, read_manifest, read_records, write_json
from dspark_bench.evaluation.suites import Prompt, load_suite
from dspark_bench.target.model import Target

Key = tuple[str, str]  # (dataset, prompt id)


@dataclass(frozen=True)
class Divergence:
    """One request whose tokens differ between record ``a`` and record ``b`` (same drafter, or a drafter against
    ``none``), from output token ``index`` on."""

    a: RequestRecord
    b: RequestRecord
    index: int

    @property
    def key(self) -> Key:
        return self.a.dataset, self.a.prompt_id


@dataclass(frozen=True)
class Finding:
    """A divergence explained: the draw sites of the token in each run, the decision and its judgement."""

    divergence: Divergence
    sites: tuple[fx.DrawSite, fx.DrawSite]
    decision: fx.Decision
    judgement: fx.Judgement
    replay: tuple[dict, dict]  # per run: reproduced, prefix_equal, rows, width
    parted: tuple[int, tuple[fx.DrawSite, fx.DrawSite]] | None = None  # (index, sites) where the rounds parted

    def to_dict(self) -> dict:
        d, dec = self.divergence, self.decision
        parted = None
        if self.parted is not None:
            index, sites = self.parted
            parted = {"index": index, "token": _token_at(d.a, index), "draws": [s.to_dict() for s in sites]}
        return {
            "drafter": d.a.drafter if d.a.drafter == d.b.drafter else f"{d.a.drafter} vs {d.b.drafter}",
            "dataset": d.a.dataset, "prompt_id": d.a.prompt_id, "repeat": d.a.repeat, "index": d.index,
            "tokens": [_token_at(d.a, d.index), _token_at(d.b, d.index)],
            "draws": [s.to_dict() if s else None for s in self.sites], "rounds_parted": parted,
            "decision": {"kind": dec.kind, "purpose": fx.PURPOSE_NAMES.get(dec.purpose), "position": dec.position},
            **self.judgement.to_dict(), "replay": list(self.replay),
        }


def _token_at(rec: RequestRecord, i: int) -> int | None:
    return rec.output_ids[i] if i < len(rec.output_ids) else None


# ---- reading and pairing runs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunData:
    folder: Path
    manifest: dict
    records: list[RequestRecord]

    @staticmethod
    def read(folder: Path) -> RunData:
        manifest = read_manifest(folder)
        engine = manifest.get("args", {}).get("engine", "dspark")
        if engine != "dspark":
            raise ResultsError(f"{folder}: a run of engine {engine!r}; divergence forensics replays runs of our "
                               "engine (dspark) only")
        parts = manifest.get("parts")
        if parts:
            raise ResultsError(f"{folder} was joined by `dspark-bench merge` from {len(parts)} runs "
                               f"({', '.join(str(p.get('folder')) for p in parts)}); each decoded its prompts in "
                               "batches of its own, which a replay of the joined run would not repeat: compare the "
                               "parts pairwise (diverge PART_A PART_B for each pair)")
        return RunData(Path(folder), manifest, read_records(folder))

    @property
    def temperature(self) -> float:
        return float(self.manifest["args"].get("temperature") or 0)


def divergences(a: Sequence[RequestRecord], b: Sequence[RequestRecord]) -> tuple[dict[str, tuple[int, int]],
                                                                                   list[Divergence]]:
    """Pair two runs' records drafter by drafter (:func:`compare_outputs`): per drafter both decoded, (equal,
    compared), and every pair whose outputs differ."""
    names = [n for n in dict.fromkeys(r.drafter for r in a) if any(r.drafter == n for r in b)]
    counts, out = {}, []
    for name in names:
        equal, compared, divs = compare_outputs([r for r in a if r.drafter == name],
                                                [r for r in b if r.drafter == name])
        counts[name] = (equal, compared)
        out += divs
    return counts, out


# ---- replaying a run to recompute its laws --------------------------------------------------------------------
class _Recorder:
    """Keeps what the loop computed at the wanted output positions of the wanted requests: an acceptance rule
    that looks at the round and then runs the engine's own rule, plus the target's logits of that forward."""

    def __init__(self, wanted: dict[int, dict[int, tuple[int, ...]]], rule, sampling):
        self.wanted = wanted  # request id -> {output index: the record's tokens up to and including it}
        self.rule, self.sampling = rule, sampling
        self.found: dict[tuple[int, int], fx.Laws] = {}
        self.session: Session | None = None
        self.logits: torch.Tensor | None = None  # [R, L, V] of the last forward

    @property
    def done(self) -> bool:
        return len(self.found) == sum(len(v) for v in self.wanted.values())

    def accept(self, p, draft, q, lengths, draws, eos_ids):
        verdicts = self.rule(p, draft, q, lengths, draws, eos_ids)
        for r, item in enumerate(self.session.live):
            for i, recorded in self.wanted.get(item.request.request_id, {}).items():
                made = len(item.output)
                accepted, eos = int(verdicts.accepted[r]), bool(verdicts.eos[r])
                new = draft[r, :accepted].tolist() + ([] if eos else [int(verdicts.token[r])])
                if made <= i < made + len(new):
                    self.found[(item.request.request_id, i)] = self._round_laws(
                        (p, draft, q, lengths, draws), r, i - made, accepted,
                        (list(item.output) + new[: i - made + 1], recorded))
        return verdicts

    def _round_laws(self, round_, r: int, j: int, accepted: int, tokens) -> fx.Laws:
        """Row r's laws at block slot j (the slot that predicts the token)."""
        p, draft, q, lengths, draws = round_
        made, recorded = tokens
        width, verified = draft.shape[1], int(lengths[r])
        weights = None
        if j == accepted:  # the target's own token: residual at a rejection, else p at slot j
            rows = slice(r, r + 1)
            weights = correction_weights(p[rows], draft[rows], None if q is None else q[rows],
                                         torch.tensor([accepted], device=p.device), lengths[rows])[0].cpu()
        return fx.Laws(  # copies: p lives in memory the loop writes again next round
            logits=self.logits[r, j].float().cpu().clone(), p=p[r, j].float().cpu().clone(),
            q=q[r, j].float().cpu().clone() if q is not None and j < verified else None,
            draft=int(draft[r, j]) if j < verified else None, weights=weights,
            u_accept=float(draws.accept[r, j]) if j < width else None, u_token=float(draws.token[r]),
            token=made[-1], prefix_equal=tuple(made[:-1]) == tuple(recorded[:-1]), rows=p.shape[0], width=width + 1)

    def first_tokens(self, admitted, logits: torch.Tensor) -> None:
        """Capture the first tokens of the requests a step admitted (``logits`` [J, 1, V] of their prefill)."""
        u = rng.uniforms([req.seed for req in admitted], [len(req.prompt_ids) - 1 for req in admitted], rng.TARGET)
        probs = to_probs(logits[:, -1], self.sampling)  # [J, V], as the loop draws them: all joiners at once
        first = sample(probs, u.to(probs.device)).tolist()
        for row, req in enumerate(admitted):
            if 0 in self.wanted.get(req.request_id, {}):
                self.found[(req.request_id, 0)] = fx.Laws(
                    logits=logits[row, -1].float().cpu(), p=probs[row].cpu(), q=None, draft=None,
                    weights=probs[row].cpu(), u_accept=None, u_token=float(u[row]), token=first[row],
                    prefix_equal=True, rows=len(admitted), width=0)


@contextmanager
def _watching(target: Target, recorder: _Recorder) -> Iterator[dict]:
    """The target's prefill and verify forwards, wrapped on this instance only for the replay: the recorder sees
    each forward's logits; ``seen["prefill"]`` holds the last prefill's."""
    seen: dict = {}
    prefill, forward_block = target.prefill, target.forward_block

    def watched_prefill(*args, **kwargs):
        batch, out = prefill(*args, **kwargs)
        seen["prefill"] = out.logits
        return batch, out

    def watched_block(*args, **kwargs):
        out = forward_block(*args, **kwargs)
        recorder.logits = out.logits
        return out

    target.prefill, target.forward_block = watched_prefill, watched_block
    try:
        yield seen
    finally:
        del target.prefill, target.forward_block  # the class's methods again


def run_requests(run: RunData, target: Target) -> tuple[RunSpec, list[Prompt], list[Request]]:
    """The spec, prompts and requests (rendered and fitted as the run did) of a run folder."""
    spec = spec_from_manifest(run.manifest)
    prompts = load_suite(spec.suite, spec.limit, skip=spec.skip)
    listed = [(p["dataset"], p["prompt_id"]) for p in run.manifest.get("prompts", [])]
    if listed != [(p.dataset, p.prompt_id) for p in prompts]:
        raise ResultsError(f"{run.folder}: the suite {spec.suite!r} at --limit {spec.limit} no longer selects the "
                           f"prompts its manifest lists; the run cannot be replayed")
    requests, _ = fit_requests(build_requests(target, prompts, spec.seed), prompts, spec, target)
    return spec, prompts, requests


def load_target(args: dict, cache_dir: Path | None) -> Target:
    """The target a run's ``args`` name, in the run's dtype."""
    return Target.load(args["target"], dtype=args["dtype"], cache_dir=cache_dir)


def replay(target: Target, run: RunData, drafter: str, wanted: dict[Key, dict[int, tuple[int, ...]]],
           say: Callable[[str], None] = lambda s: None) -> dict[tuple[Key, int], fx.Laws]:
    """Replay ``drafter``'s decoding of ``run`` through the engine's loop and return the laws at the wanted output
    positions: ``wanted[(dataset, prompt id)] = {index: the record's tokens up to and including it}``. At
    concurrency 1 only the wanted requests decode (each ran alone); above it every request of the run does, in
    the run's order, so that the batches are the run's."""
    spec, prompts, requests = run_requests(run, target)
    spec = dataclasses.replace(spec, drafters=(drafter,))
    ids = {(r.dataset, r.prompt_id): r.request_id for r in requests}
    by_id = {ids[k]: v for k, v in wanted.items()}
    queue = requests if spec.concurrency > 1 else [r for r in requests if r.request_id in by_id]
    engine = Run(spec, target, prompts, run.folder)._engine(drafter)  # the run's own engine builder
    recorder = _Recorder(by_id, engine.accept, engine.config.sampling)
    loop = RoundLoop(engine.target, engine.drafter, engine.config, engine.scheduler, accept=recorder.accept)
    say(f"replaying {drafter} of {run.folder} ({len(queue)} requests, concurrency {spec.concurrency}) ...")
    with _threads(run.manifest), _watching(target, recorder) as seen:
        session = loop.session(queue, lambda res: None)
        recorder.session = session
        while not recorder.done:
            pending = list(session.queue)
            seen.pop("prefill", None)
            more = session.step()
            admitted = pending[: len(pending) - len(session.queue)]
            if admitted and "prefill" in seen:
                recorder.first_tokens(admitted, seen["prefill"])
            if not more:
                break
    key_of = {v: k for k, v in ids.items()}
    return {(key_of[rid], i): laws for (rid, i), laws in recorder.found.items()}


@contextmanager
def _threads(manifest: dict) -> Iterator[None]:
    """The torch thread count the run recorded, for the replay (a GEMM may split its work by threads)."""
    want = (manifest.get("machine") or {}).get("torch_threads")
    before = torch.get_num_threads()
    if want and want != before:
        torch.set_num_threads(int(want))
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- explaining divergences -----------------------------------------------------------------------------------
def explain(divs: Sequence[Divergence], runs: tuple[RunData, RunData], cache_dir: Path | None = None,
            say: Callable[[str], None] = lambda s: None) -> list[Finding]:
    """Judge every divergence: replay each run's drafter (record ``a`` from ``runs[0]``, ``b`` from ``runs[1]``)
    once for all its wanted positions, then decode the draw sites and judge. Repeats of one prompt share its
    replay (they decode the same tokens)."""
    targets: dict[str, Target] = {}
    laws: list[dict] = [{}, {}]
    greedy = runs[0].temperature == 0
    parted = {id(d): None if greedy else _parting(d) for d in divs}
    for side, run in enumerate(runs):
        wanted: dict[str, dict[Key, dict[int, tuple[int, ...]]]] = {}
        for d in divs:
            rec = (d.a, d.b)[side]
            for i in (d.index, parted[id(d)]):
                if i is not None and i < len(rec.output_ids):
                    wanted.setdefault(rec.drafter, {}).setdefault(d.key, {})[i] = rec.output_ids[: i + 1]
        for drafter, want in wanted.items():
            target = _target(targets, run, cache_dir, say)
            for (key, i), law in replay(target, run, drafter, want, say).items():
                laws[side][(drafter, key, i)] = law
    return [_finding(d, laws, greedy, parted[id(d)]) for d in divs]


def _sites(rec: RequestRecord) -> list[fx.DrawSite]:
    return fx.draw_sites(rec.prompt_len, rec.rounds, len(rec.output_ids))


def _parting(d: Divergence) -> int | None:
    """The output token where the two records' rounds parted before their tokens did (:func:`fx.parting`)."""
    return fx.parting(_sites(d.a), _sites(d.b), d.index)


def _target(loaded: dict[str, Target], run: RunData, cache_dir: Path | None, say) -> Target:
    """The run's target in the run's dtype, loaded once per dtype."""
    args = run.manifest["args"]
    key = f"{args['target']}:{args['dtype']}"
    if key not in loaded:
        say(f"loading target {args['target']} ({args['dtype']}) ...")
        loaded[key] = load_target(args, cache_dir)
    return loaded[key]


def _finding(d: Divergence, laws: list[dict], greedy: bool, parted: int | None = None) -> Finding:
    """Judge divergence ``d`` from the replayed laws. Where the runs' rounds parted first (``parted``, an output
    index before ``d.index``), the decision judged is the one at that token, which both runs kept: from there on
    they drew with other uniforms, so the token at ``d.index`` needs no rounding of its own to differ."""
    recs = (d.a, d.b)
    tokens = tuple(_token_at(r, d.index) for r in recs)
    every = tuple(_sites(r) for r in recs)  # each record's draw sites, made once
    sites = tuple(s[d.index] if t is not None else None for s, t in zip(every, tokens, strict=True))
    at = d.index if parted is None else parted  # the output token whose decision is judged
    at_tokens = tokens if parted is None else (_token_at(d.a, at), _token_at(d.b, at))
    at_sites = sites if parted is None else tuple(s[at] for s in every)
    got = tuple(laws[s].get((r.drafter, d.key, at)) for s, r in enumerate(recs))
    replayed = tuple({} if law is None else {"reproduced": law.token == tok, "prefix_equal": law.prefix_equal,
                                             "rows": law.rows, "width": law.width}
                     for law, tok in zip(got, at_tokens, strict=True))
    where = None if parted is None else (parted, at_sites)
    missing = [f"run {n} has no token {at}" for n, t in zip("AB", at_tokens, strict=True) if t is None]
    missing += [f"the replay of run {n} never reached token {at}" for n, t, law in zip("AB", at_tokens, got,
                                                                                        strict=True)
                if t is not None and law is None]
    if missing:
        return Finding(d, sites, fx.Decision(None, why="; ".join(missing)), fx.Judgement.unexamined(
            "; ".join(missing)), replayed, where)
    rejected = tuple(law.draft if site.kind == fx.RECOVERED else None
                     for law, site in zip(got, at_sites, strict=True))
    dec = fx.decision(at_sites[0], at_sites[1], at_tokens[0], at_tokens[1], greedy, rejected_b=rejected[1],
                      rejected_a=rejected[0])
    judgement = fx.judge(dec, d.a.seed, at_tokens, at_sites, got)
    if parted is not None:
        judgement = dataclasses.replace(judgement, notes=(
            f"the runs' rounds parted at output token {parted} (token {at_tokens[0]} in both: "
            f"{at_sites[0].kind} in A, {at_sites[1].kind} in B); from there each drew with other uniforms, so "
            f"the decision judged is the one at token {parted}", *judgement.notes))
    return Finding(d, sites, dec, judgement, replayed, where)


def compare_runs(a: RunData, b: RunData, cache_dir: Path | None = None,
                 say: Callable[[str], None] = lambda s: None) -> dict:
    """``diverge``'s report: per drafter both runs decoded, requests equal / compared, and every divergence
    judged. Raises ValueError naming what differs when the runs' tokens are not comparable."""
    differ = fx.incomparable(a.manifest, b.manifest)
    if differ:
        raise ValueError(f"{a.folder} and {b.folder} are not comparable token by token: {'; '.join(differ)} "
                         f"(they must share target, seed, sampling and prompts, and at temperature > 0 the "
                         f"block size, scheduler and drafter options)")
    counts, divs = divergences(a.records, b.records)
    findings = explain(divs, (a, b), cache_dir, say) if divs else []
    return {"runs": [str(a.folder), str(b.folder)], "temperature": a.temperature,
            "settings": {k: [a.manifest["args"].get(k), b.manifest["args"].get(k)]
                         for k in ("dtype", "concurrency", "drafters")},
            "drafters": {name: {"requests_equal": e, "requests": n} for name, (e, n) in counts.items()},
            "divergences": [f.to_dict() for f in findings]}


def greedy_equality(folder: Path, cache_dir: Path | None = None,
                    say: Callable[[str], None] = lambda s: None) -> dict | None:
    """Temperature-0 check of a run folder of our engine: every drafter's outputs against ``none``'s on the same
    prompts, each divergence judged (module docstring). Adds ``greedy_equality`` to the run's summary.json and
    returns it: per drafter ``requests_equal``, ``requests``, ``first_divergent_token`` (the smallest index over
    its requests, None when all are equal), ``unexplained`` (divergences not shown to be rounding: verdict
    unexplained or unexamined) and ``divergences``. None when the run is sampled or has no ``none``."""
    run = RunData.read(Path(folder))
    names = list(run.manifest["args"].get("drafters") or [])
    if run.temperature != 0 or "none" not in names:
        return None
    none = [r for r in run.records if r.drafter == "none"]
    report = {}
    for name in (n for n in names if n != "none"):
        equal, compared, divs = compare_outputs(none, [r for r in run.records if r.drafter == name])
        findings = [f.to_dict() for f in explain(divs, (run, run), cache_dir, say)] if divs else []
        report[name] = {"requests_equal": equal, "requests": compared,
                        "first_divergent_token": min((d.index for d in divs), default=None),
                        "unexplained": sum(f["verdict"] != fx.FLOATING for f in findings),
                        "divergences": findings}
    summary = read_json(Path(folder) / SUMMARY, f"the {SUMMARY} that dspark-bench run writes")
    write_json(Path(folder) / SUMMARY, {**summary, "greedy_equality": report})
    return report


def compare_outputs(a: Sequence[RequestRecord], b: Sequence[RequestRecord]) -> tuple[int, int, list[Divergence]]:
    """(equal, compared, divergences) of the ok records of ``a`` and ``b`` paired by (dataset, prompt, repeat)."""
    theirs = {(r.dataset, r.prompt_id, r.repeat): r for r in b if r.ok}
    equal = compared = 0
    out = []
    for rec in (r for r in a if r.ok):
        other = theirs.get((rec.dataset, rec.prompt_id, rec.repeat))
        if other is None:
            continue
        compared += 1
        index = fx.first_divergence(rec.output_ids, other.output_ids)
        if index is None:
            equal += 1
        else:
            out.append(Divergence(rec, other, index))
    return equal, compared, out
