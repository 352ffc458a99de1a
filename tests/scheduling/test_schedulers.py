"""Schedulers (Algorithm 1, async, threshold, retrospective control), the engine profile, the sweep and the
simulation, on CPU with table-driven cases and a tiny random target."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.core.verify import sample, to_probs
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.scheduling.profile import (
    Profile,
    load_profile,
    measure_profile,
    save_profile,
    table_profile,
)
from dspark_bench.scheduling.schedulers import (
    Async,
    HardwareAware,
    SchedulerError,
    Threshold,
    _Retrospective,
    create_scheduler,
    ranked_candidates,
    scheduler_names,
    survival,
)

APPENDIX_A = table_profile({1: 1.0, 2: 0.5, 3: 0.45})
FLAT = table_profile({1: 1.0, 1000: 1.0})


pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(eq=False)
class _Slot:
    request_id: int
    position: int = 10


def _ctx(rows: int, block: int = 7, slots=None) -> DraftContext:
    return DraftContext(None, 1.0, block, slots if slots is not None else [_Slot(r) for r in range(rows)])


def _proposal(conf, lengths=None) -> Proposal:
    conf = torch.as_tensor(conf, dtype=torch.float32)
    lengths = torch.full((conf.shape[0],), conf.shape[1]) if lengths is None else torch.as_tensor(lengths)
    return Proposal(torch.zeros(conf.shape, dtype=torch.long), lengths.long(), None, conf)


def _decreasing(seed: int) -> Profile:
    slope = np.random.default_rng(seed).uniform(0.02, 0.2)  # seconds per batch token after a fixed 1 s
    b = np.arange(1, 65)
    return table_profile(dict(zip(b.tolist(), (1.0 / (1.0 + b * slope)).tolist(), strict=True)))


# ---- Algorithm 1 ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c2", [0.9, 0.0])
def test_appendix_a_hardware_aware_verifies_nothing(c2):
    for layout in ("packed", "padded"):
        sched = HardwareAware(profile=APPENDIX_A, layout=layout)
        assert sched.decide(_proposal([[0.8, c2]]), _ctx(1)).tolist() == [0]


def test_appendix_a_retrospective_peeks_at_c2():
    """The global search admits x_1 only when c_2 (a function of x_1) is high: the paper's counterexample."""
    sched = _Retrospective(profile=APPENDIX_A)
    assert sched.decide(_proposal([[0.8, 0.9]]), _ctx(1)).tolist() == [2]  # Theta_2 = 2.52 * 0.45 = 1.134
    assert sched.decide(_proposal([[0.8, 0.0]]), _ctx(1)).tolist() == [0]
    assert "retrospective" not in scheduler_names()


def test_registry_holds_the_user_facing_schedulers():
    assert {"fixed", "threshold", "hardware-aware", "async"} <= set(scheduler_names())
    with pytest.raises(SchedulerError, match="known schedulers"):
        create_scheduler("nope")
    with pytest.raises(SchedulerError, match="its options: theta"):
        create_scheduler("threshold", window="3")
    assert create_scheduler("threshold", theta="0.7").theta == 0.7
    assert create_scheduler("fixed", length="1").length == 1
    assert create_scheduler("hardware-aware", profile="none", layout="padded").profile is None


def _all_schedulers(profile: Profile) -> list:
    return [create_scheduler("fixed"), create_scheduler("fixed", length=2), Threshold(theta=0.6),
            HardwareAware(profile=profile), HardwareAware(profile=profile, layout="padded"),
            Async(profile=profile), Async(profile=profile, layout="padded"), _Retrospective(profile=profile)]


@pytest.mark.parametrize("seed", range(20))
def test_lengths_are_valid_and_admission_is_a_prefix_of_the_ranking(seed):
    rng = np.random.default_rng(seed)
    rows, k = int(rng.integers(1, 9)), 7
    conf = rng.uniform(0, 1, (rows, k)) ** rng.uniform(0.2, 2)
    lengths = rng.integers(0, k + 1, rows)
    prop, profile = _proposal(conf, lengths), _decreasing(seed)
    for sched in _all_schedulers(profile):
        out = sched.decide(prop, _ctx(rows))
        assert out.shape == (rows,) and out.dtype == torch.long
        assert ((out >= 0) & (out <= prop.lengths)).all(), type(sched).__name__
    out = HardwareAware(profile=profile).decide(prop, _ctx(rows)).numpy()
    r, j, _ = ranked_candidates(survival(prop.confidence.numpy(), lengths))
    admitted = j < out[r]
    n = int(admitted.sum())
    assert admitted[:n].all() and not admitted[n:].any()  # the admitted set is a prefix of the ranking


def test_ties_break_by_request_then_position():
    profile = table_profile({3: 1.0, 5: 1.0, 6: 0.1})  # two admissions pay off, the third does not
    conf = [[0.5, 1.0, 0.5]] * 3  # a_{r,1} = a_{r,2} = 0.5 everywhere
    out = [HardwareAware(profile=profile).decide(_proposal(conf), _ctx(3)).tolist() for _ in range(3)]
    assert out == [[2, 0, 0]] * 3  # (0,1) then (0,2): request index first, then position


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_flat_sps_admits_every_candidate_with_positive_survival(layout):
    """With SPS constant, every admission raises Theta by a > 0: it verifies up to the first c = 0."""
    conf = [[0.9, 0.1, 0.5, 0.0, 0.9], [0.3, 0.3, 0.3, 0.3, 0.3], [0.0, 0.8, 0.8, 0.8, 0.8]]
    out = HardwareAware(profile=FLAT, layout=layout).decide(_proposal(conf, [5, 4, 5]), _ctx(3)).tolist()
    # padded: whole columns while any request adds a > 0 there; requests ride along inside the width for free
    assert out == ([3, 4, 0] if layout == "packed" else [4, 4, 4])


def test_no_confidences_fall_back_to_fixed():
    """...except hardware-aware, which schedules them from measured survival (tests/scheduling/test_cost_model.py)."""
    prop = Proposal(torch.zeros(2, 3, dtype=torch.long), torch.tensor([3, 1]))
    for sched in _all_schedulers(APPENDIX_A):
        if not getattr(sched, "length", None) and not isinstance(sched, HardwareAware):
            assert sched.decide(prop, _ctx(2)).tolist() == [3, 1]


@pytest.mark.parametrize("seed", range(15))
def test_lossless_schedulers_are_non_anticipating(seed):
    """Whether x_{r,j} is verified never depends on c_{r,j+1..} (which depend on x_{r,j}); the retrospective
    search fails this somewhere."""
    rng = np.random.default_rng(seed)
    rows, k, profile = int(rng.integers(1, 6)), 6, _decreasing(seed)
    conf = rng.uniform(0.05, 1, (rows, k))
    for sched in [Threshold(theta=0.5), HardwareAware(profile=profile), HardwareAware(profile=profile, layout="padded")]:
        base = sched.decide(_proposal(conf), _ctx(rows)).numpy()
        for r in range(rows):
            for j in range(k - 1):
                other = conf.copy()
                other[r, j + 1:] = rng.uniform(0.0, 1.0, k - j - 1)
                new = sched.decide(_proposal(other), _ctx(rows)).numpy()
                assert (new[r] > j) == (base[r] > j), (type(sched).__name__, r, j)


def test_async_capacity_never_reads_the_current_round():
    profile = _decreasing(3)
    rng = np.random.default_rng(0)
    slots = [_Slot(r) for r in range(4)]
    history = [rng.uniform(0.2, 1, (4, 7)) for _ in range(5)]
    capacities = []
    for variant in range(3):
        sched = Async(profile=profile)
        for conf in history:
            sched.decide(_proposal(conf), _ctx(4, slots=slots))
        current = rng.uniform(0, 1, (4, 7)) if variant else np.zeros((4, 7))
        out = sched.decide(_proposal(current), _ctx(4, slots=slots))
        capacities.append(sched.last_capacity)
        assert int(out.sum()) <= sched.last_capacity
    assert len(set(capacities)) == 1
    # two rounds back, not one: changing round t-1 leaves K unchanged, changing round t-2 moves it
    def capacity(t2, t1):
        sched = Async(profile=profile)
        for conf in (t2, t1):
            sched.decide(_proposal(conf), _ctx(4, slots=slots))
        return sched.capacity(_ctx(4, slots=slots))
    high, low = np.full((4, 7), 0.99), np.full((4, 7), 0.05)
    assert capacity(high, high) == capacity(high, low) != capacity(low, high)


def test_async_history_resets_for_a_new_request_with_a_reused_id():
    sched, s = Async(profile=_decreasing(1)), _Slot(0)
    for _ in range(2):
        sched.decide(_proposal(np.full((1, 7), 0.99)), _ctx(1, slots=[s]))
    assert sched.capacity(_ctx(1, slots=[s])) != sched.capacity(_ctx(1, slots=[_Slot(0)]))


def test_threshold_applies_calibration(tmp_path):
    path = tmp_path / "calibration.json"
    pos = {"n": 1, "before": {}, "after": {}}
    path.write_text(json.dumps({"positions": [{"k": 1, "temperature": 0.25, **pos}, {"k": 2, "temperature": 4.0, **pos}]}))
    conf = [[0.6, 0.6]]  # T = 0.25 sharpens 0.6 to 0.84; T = 4 flattens it to 0.525
    assert Threshold(theta=0.7).decide(_proposal(conf), _ctx(1)).tolist() == [0]
    assert Threshold(theta=0.7, calibration=str(path)).decide(_proposal(conf), _ctx(1)).tolist() == [1]


# ---- engine loop with a Markov-confidence drafter -------------------------------------------------------------
class MarkovConfidence(Drafter):
    """Samples x_k from a fixed random bigram law q(. | x_{k-1}) and predicts c_k = s(x_{k-1}): confidences that
    depend on the previous draft token (the Markov head's situation)."""

    name = "test-markov-confidence"

    @dataclass(frozen=True)
    class Config:
        pass

    def __init__(self, config, target):
        super().__init__(config, target)
        g = torch.Generator().manual_seed(7)
        self.logits = torch.randn(target.vocab_size, target.vocab_size, generator=g) * 3
        self.conf = torch.rand(target.vocab_size, generator=g)

    def propose(self, ctx):
        rows, k = len(ctx.slots), ctx.block_size
        tokens, conf = torch.zeros(rows, k, dtype=torch.long), torch.zeros(rows, k)
        q = torch.zeros(rows, k, self.target.vocab_size)
        u = ctx.draft_uniforms(k, "cpu")
        for r, slot in enumerate(ctx.slots):
            prev = slot.tokens[-1]
            for j in range(k):
                q[r, j] = to_probs(self.logits[prev], ctx.temperature)
                conf[r, j] = self.conf[prev]
                prev = tokens[r, j] = int(sample(q[r, j], u[r, j]))
        return Proposal(tokens, torch.full((rows,), k), q, conf)


def _engine_outputs(target, drafter, scheduler, temperature):
    reqs = [Request(i, tuple(p), 50 + i) for i, p in enumerate(random_prompts(4, seed=2))]
    results = []
    RoundLoop(target, drafter, EngineConfig(24, temperature, 5, 3), scheduler).run(reqs, results.append)
    return {r.request.request_id: r for r in results}


def test_greedy_output_is_the_same_under_every_scheduler(tiny):
    drafter = MarkovConfidence(MarkovConfidence.Config(), tiny)
    reference = _engine_outputs(tiny, drafters.create("none", tiny), None, 0.0)
    profile = table_profile({1: 1.0, 4: 0.9, 8: 0.6, 16: 0.3})
    for sched in _all_schedulers(profile):  # greedy cannot tell: even the retrospective search agrees
        out = _engine_outputs(tiny, drafter, sched, 0.0)
        assert {i: r.output_ids for i, r in out.items()} == {i: r.output_ids for i, r in reference.items()}
    pruned = _engine_outputs(tiny, drafter, HardwareAware(profile=profile, adapt=False), 1.0)  # table seconds
    rounds = [x for r in pruned.values() for x in r.rounds]
    assert any(x.verified < x.proposed for x in rounds) and all(x.confidence is not None for x in rounds if x.proposed)


# ---- profile --------------------------------------------------------------------------------------------------
def test_profile_interpolates_step_time_and_extrapolates_linearly():
    p = Profile("t", "bf16", "cpu", "m", (100, 300), (1, 2, 4), ((10.0, 5.0, 2.5), (5.0, 2.5, 1.25)))
    assert p.sps(2, 100) == pytest.approx(5.0)
    assert p.sps(3, 100) == pytest.approx(1 / 0.3)  # step time 0.2 -> 0.4 is linear in B
    assert p.sps(8, 100) == pytest.approx(1 / 0.8)  # slope 0.1 s per token past the last point
    assert p.sps(1, 200) == pytest.approx(1 / 0.15)  # halfway in context, in step time
    assert p.sps(1, 10_000) == pytest.approx(5.0)  # clamped to the measured contexts
    assert p.sps([1, 2], 100).tolist() == pytest.approx([10.0, 5.0])
    with pytest.raises(ValueError, match="increasing"):
        Profile("t", "", "", "", (1,), (2, 1), ((1.0, 1.0),))


def test_profile_measures_and_round_trips(tmp_path):
    target = tiny_target()
    p = measure_profile(target, (1, 3, 8, 16), (8, 24), width=8, repeats=1, warmup=0)
    assert p.batch_tokens == (1, 3, 8, 16) and len(p.steps_per_s) == 2 and min(min(r) for r in p.steps_per_s) > 0
    save_profile(p, tmp_path / "profile.json")
    assert load_profile(tmp_path / "profile.json") == p


# ---- sweep and simulation -------------------------------------------------------------------------------------
def test_sweep_writes_rows_and_the_simulation_replays_them(tmp_path, monkeypatch):
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies import simulate as sim
    from dspark_bench.studies.sweep import SweepSpec, read_cell, run_sweep

    target = tiny_target()
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text][:12])
    profile = tmp_path / "profile.json"
    save_profile(table_profile({1: 100.0, 8: 80.0, 64: 20.0}), profile)
    spec = SweepSpec("tiny", ("ngram-conf",), ("fixed", "hardware-aware", "async[layout=padded]"), (2,),
                     fixed_lengths=(1,), suite="chat", limit=3, max_new_tokens=12, block_size=4, baselines=())
    result = run_sweep(spec, target, load_suite("chat", 3), tmp_path / "sweep", str(profile))
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"]
    assert rows == json.loads(json.dumps(result["rows"])) and len(rows) == 4
    for row in rows:
        assert row["n_requests"] == 3 and row["n_errors"] == 0 and row["aggregate_tokens_per_s"] > 0
        assert 1 <= row["mean_verify_budget"] <= 5 and row["tau"] >= 1
    assert {r["label"] for r in rows} == {"fixed", "fixed[length=1]", "hardware-aware", "async[layout=padded]"}
    assert all(r["mean_verify_budget"] <= 2 for r in rows if r["label"] == "fixed[length=1]")
    records = read_cell(tmp_path / "sweep" / "cells" / "ngram-conf__fixed__c2")
    assert len(records) == 3 and records[0].confidence is not None and {r.concurrency for r in records} == {2}
    assert sorted(p.name for p in (tmp_path / "sweep" / "cells" / "ngram-conf__fixed__c2").iterdir()) == [
        "run"]  # one run per cell: continuous batching over all prompts, the cells interleaved round by round
    check = sim.validate(tmp_path / "sweep", load_profile(profile), block_size=4)
    assert len(check["rows"]) == 4 and check["mean_abs_rel_error"]["tau"] is not None
    fixed = next(r for r in check["rows"] if r["label"] == "fixed" and r["concurrency"] == 2)
    assert fixed["rel_error"]["tau"] == pytest.approx(0.0) and abs(fixed["rel_error"]["mean_verify_budget"]) < 0.2
    predicted = [r for r in check["rows"] if not r["replays_itself"]]  # the fixed cell replays its own records
    assert fixed["replays_itself"] and len(predicted) == 3
    assert check["mean_abs_rel_error_predicted"]["tau"] == pytest.approx(
        sum(abs(r["rel_error"]["tau"]) for r in predicted) / 3)


def test_simulation_projects_to_high_concurrency():
    from dspark_bench.studies.simulate import SimSpec, Trace, project, simulate

    rng = np.random.default_rng(0)
    traces = []
    for _ in range(5):
        acc = rng.integers(0, 8, 30)
        conf = tuple(tuple(np.where(np.arange(7) < a + 1, 0.9, 0.2).tolist()) for a in acc)
        traces.append(Trace((7,) * 30, tuple(int(a) for a in acc), conf, 60, 20))
    profile = table_profile({1: 10.0, 256: 9.0, 1024: 6.0, 2048: 2.0})  # memory-bound, then compute-bound
    fixed = simulate(traces, SimSpec("fixed", 1), FLAT)
    assert fixed["tau"] == pytest.approx(1 + np.mean([np.mean(t.accepted) for t in traces]), rel=0.1)
    # every candidate pays at a flat cost (adapt=false: adapt would spend its first round on a vanilla step)
    flat = simulate(traces, SimSpec("hardware-aware", 1, {"adapt": False}), FLAT)
    assert flat["mean_verify_budget"] == fixed["mean_verify_budget"]
    rows = project(traces, profile, [("fixed", {}), ("hardware-aware", {})], (1, 16, 256))
    assert [r["concurrency"] for r in rows] == [1, 1, 16, 16, 256, 256] and all(r["simulated"] for r in rows)
    high = {r["scheduler"]: r for r in rows if r["concurrency"] == 256}
    assert (high["hardware-aware"]["waste"] or 0.0) < high["fixed"]["waste"]
    assert high["hardware-aware"]["aggregate_tokens_per_s"] > high["fixed"]["aggregate_tokens_per_s"]


def test_isotonic_step_times_never_decrease():
    from dspark_bench.scheduling.profile import isotonic

    assert isotonic(np.array([1.0, 3.0, 2.0, 2.0, 5.0, 4.0, 6.0])).tolist() == pytest.approx(
        [1.0, 7 / 3, 7 / 3, 7 / 3, 4.5, 4.5, 6.0])


def test_cli_commands_parse():
    from click.testing import CliRunner

    from dspark_bench.cli.scheduling import calibrate, profile, simulate, sweep

    for command in (profile, sweep, calibrate, simulate):
        result = CliRunner().invoke(command, ["--help"])
        assert result.exit_code == 0 and "Usage" in result.output
    bad = CliRunner().invoke(sweep, ["--scheduler", "fixed,nope", "--concurrency", "1"])
    assert bad.exit_code == 2 and "unknown scheduler 'nope'" in bad.output


@pytest.mark.parametrize(("args", "says"), [
    (["--baseline", "none,foo"], "unknown baseline foo; accepted: a comma list of the drafters dflash, dspark"),
    (["--drafter", "dspak"], "unknown drafter dspak; accepted"),
    (["--drafter-opt", "eagle3.checkpoint=x"], "drafter options for eagle3, which is neither a swept drafter"),
    (["--drafter-opt", "dspark.nope=1"], "'dspark' has no option(s) nope"),
])
def test_sweep_refuses_unknown_drafters_before_the_target_loads(args, says, monkeypatch):
    from click.testing import CliRunner

    from dspark_bench.cli import scheduling

    def no_load(*a):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(scheduling, "_load_target", no_load)
    result = CliRunner().invoke(scheduling.sweep, args)
    assert result.exit_code == 2 and says in " ".join(result.output.split()), result.output


def test_measuring_a_profile_says_what_it_measures_and_how_long_it_took(capsys):
    from dspark_bench.cli.scheduling import measure_full_profile

    result = measure_full_profile(tiny_target(), 8, (16,), 2, 1, (1, 2), ("ngram",), {}, 2)
    assert result.verify is not None and "ngram" in result.draft
    err = " ".join(capsys.readouterr().err.split())
    for stage in ("measuring steps/s of the target: 8 batch sizes x 1 contexts", "measuring verify grid: 2 row counts",
                  "measuring round costs of ngram and the engine"):
        assert stage in err
    assert err.count("done in") == 3


def test_simulate_replays_one_drafter(tmp_path):
    """A run folder with several drafters must not be replayed as one population: simulate asks for --drafter,
    and with it replays exactly that drafter's fixed-length records."""
    from click.testing import CliRunner

    from dspark_bench.cli.scheduling import simulate
    from dspark_bench.core.records import RequestRecord
    from dspark_bench.evaluation.runs import RunWriter

    run = tmp_path / "run"
    with RunWriter(run, {"schema_version": 1, "args": {"block_size": 3}}) as w:
        for i, (name, acc) in enumerate([("none", 0), ("dspark", 2), ("dspark", 1), ("dflash", 0)]):
            rounds = ((3, 3, acc, acc + 1),) * 4
            w.add(RequestRecord(name, "fixed", "ds", "math", f"p{i}", i, 0, i, 1, "ok", "length", 5,
                                tuple(range(1 + 4 * (acc + 1))), rounds, ((0.01, 0.04, 0.0, 0.0),) * 4, 0.1, 0.2,
                                confidence=((0.9, 0.5, 0.2),) * 4 if name == "dspark" else None))
    save_profile(FLAT, tmp_path / "p.json")
    args = ["--records", str(run), "--profile", str(tmp_path / "p.json"), "--concurrency", "1", "--scheduler", "fixed"]
    mixed = CliRunner().invoke(simulate, [*args, "--out", str(tmp_path / "s.json")])
    assert mixed.exit_code == 2 and "several drafters (dflash, dspark, none)" in mixed.output
    ok = CliRunner().invoke(simulate, [*args, "--drafter", "dspark", "--out", str(tmp_path / "s.json")])
    assert ok.exit_code == 0, ok.output
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["drafter"] == "dspark" and result["traces"] == 2
    from dspark_bench.report.inputs import parse_simulate

    assert parse_simulate(result, tmp_path / "s.json").rows  # what simulate writes, the report reads
    missing = CliRunner().invoke(simulate, [*args, "--drafter", "eagle3", "--out", str(tmp_path / "s.json")])
    assert missing.exit_code == 2 and "of eagle3" in missing.output
