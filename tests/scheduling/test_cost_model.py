"""The schedulers' cost model: the verify grid, the drafter's and the engine's round costs, the
drafter skip (``plan``), measured survival for confidence-free drafters, and the simulation that prices them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import FIXTURES, random_prompts, tiny_target

from dspark_bench import drafters
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal
from dspark_bench.engines.native.loop import EngineConfig, Request, RoundLoop
from dspark_bench.scheduling.profile import (
    Curve,
    Profile,
    ProfileError,
    VerifyGrid,
    load_profile,
    measure_verify_grid,
    save_profile,
    table_profile,
)
from dspark_bench.scheduling.schedulers import AcceptanceCounts, HardwareAware, Scheduler, create_scheduler
from dspark_bench.studies.profile import measure_round_costs

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(eq=False)
class _Slot:
    request_id: int
    position: int = 10


def _ctx(rows: int, block: int = 4, drafter: str = "d") -> DraftContext:
    return DraftContext(None, 1.0, block, [_Slot(r) for r in range(rows)], drafter=drafter)


def _costed(draft_s: float, overhead_s: float = 0.0, verify_s: float = 1.0, per_token: float = 0.0) -> Profile:
    """Verify = verify_s + per_token x (tokens - 1) at every R; the drafter's propose draft_s at every R."""
    rows, widths = (1, 64), (1, 2, 8)
    grid = VerifyGrid((0,), rows, widths,
                      ((tuple(tuple(verify_s + per_token * r * (w - 1) for w in widths) for r in rows)),))
    base = table_profile({1: 1.0, 64: 1.0})
    return dataclasses.replace(base, verify=grid, draft={"d": Curve((1, 64), (draft_s, draft_s))},
                               overhead=Curve((1, 64), (overhead_s, overhead_s)) if overhead_s else None)


# ---- profile parts --------------------------------------------------------------------------------------------
def test_verify_grid_interpolates_in_rows_width_and_context():
    g = VerifyGrid((100, 300), (1, 4), (1, 3), (((1.0, 3.0), (4.0, 12.0)), ((2.0, 6.0), (8.0, 24.0))))
    assert float(g.seconds_at(1, 2, 100)) == pytest.approx(2.0)  # halfway in width
    assert float(g.seconds_at(2, 1, 100)) == pytest.approx(2.0)  # a third of the way in rows
    assert float(g.seconds_at(4, 3, 200)) == pytest.approx(18.0)  # halfway in context
    assert float(g.seconds_at(4, 5, 100)) == pytest.approx(20.0)  # chord slope past the widest: 4 s per token
    assert g.seconds_at(1, np.array([1, 3]), 100).tolist() == pytest.approx([1.0, 3.0])
    with pytest.raises(ProfileError, match="contexts\\]\\[rows\\]\\[widths"):
        VerifyGrid((0,), (1, 2), (1,), (((1.0,),),))


def test_profile_without_a_grid_prices_rows_x_width_from_sps():
    p = table_profile({1: 10.0, 8: 5.0})
    assert float(p.verify_seconds(2, 4)) == pytest.approx(0.2)  # 1 / SPS(8)
    assert p.draft_seconds("dspark", 4) is None and float(p.overhead_seconds(4)) == 0.0


def test_measured_profile_parts_round_trip(tmp_path):
    target = tiny_target()
    grid = measure_verify_grid(target, (1, 3), (1, 2, 4), (8, 16), repeats=1, warmup=0)
    assert np.asarray(grid.seconds).shape == (2, 2, 3) and np.all(np.diff(np.asarray(grid.seconds), axis=2) >= 0)
    draft, overhead = measure_round_costs(target, {"ngram": drafters.create("ngram", target)}, (1, 3), block_size=3,
                                          context=12, rounds=2, warmup=0)
    assert set(draft) == {"ngram"} and draft["ngram"].rows == (1, 3) and overhead.rows == (1, 3)
    assert all(s > 0 for s in (*draft["ngram"].seconds, *overhead.seconds))
    p = dataclasses.replace(table_profile({1: 5.0, 8: 4.0}), verify=grid, draft=draft, overhead=overhead,
                            block_size=3)
    save_profile(p, tmp_path / "profile.json")
    assert load_profile(tmp_path / "profile.json") == p


def test_the_grid_times_the_engines_masked_path_wherever_rows_differ(monkeypatch):
    """A batch of several rows always differs in length in the engine, so its forward goes through the explicit
    mask; the profile must time that path, not the model's own causal mask of equal rows (timed that way, it
    priced multi-token verifies 21-57 % low at 16-32 rows). A single row has no pad."""
    target = tiny_target()
    biases = []
    real_bias, real_forward = target._mask_bias, target.forward_block
    monkeypatch.setattr(target, "_mask_bias", lambda mask, width: biases.append(1) or real_bias(mask, width))
    forwards = []  # (rows, whether the forward built the explicit mask)

    def counted_forward(batch, ids, lengths, taps=()):
        before = len(biases)
        out = real_forward(batch, ids, lengths, taps)
        forwards.append((batch.rows, len(biases) > before))
        return out

    monkeypatch.setattr(target, "forward_block", counted_forward)
    measure_verify_grid(target, (1, 3), (1, 2), (8,), repeats=2, warmup=0)
    assert sorted(forwards) == [(1, False)] * 4 + [(3, True)] * 4  # 2 widths x 2 repeats per row count


def test_old_profile_files_still_load(tmp_path):
    old = {"target": "t", "dtype": "bf16", "device": "cpu", "machine": "m", "context_lengths": [0],
           "batch_tokens": [1, 2], "steps_per_s": [[2.0, 1.0]]}
    (tmp_path / "p.json").write_text(__import__("json").dumps(old))
    assert load_profile(tmp_path / "p.json").verify is None
    (tmp_path / "q.json").write_text(__import__("json").dumps({**old, "extra": 1}))
    with pytest.raises(ProfileError, match="optionally"):
        load_profile(tmp_path / "q.json")


# ---- measured survival ------------------------------------------------------------------------------------------
def test_acceptance_counts_measure_conditional_survival():
    counts = AcceptanceCounts()
    counts.add([3, 3, 2, 0], [3, 1, 0, 0])  # position 1: 3 tested, 2 passed; 2: 2 tested, 1 passed; 3: 1 and 1
    assert counts.tested.tolist() == [3, 2, 1] and counts.passed.tolist() == [2, 1, 1]
    assert counts.conditional(4, 0.5).tolist() == pytest.approx([3 / 5, 2 / 4, 2 / 3, 0.5])


def test_confidence_free_proposals_are_scheduled_from_measured_survival():
    sched = HardwareAware(profile=_costed(0.0, per_token=0.05), layout="padded", skip=False)
    prop = Proposal(torch.zeros(2, 4, dtype=torch.long), torch.tensor([4, 4]))
    for _ in range(20):
        sched.observe(_ctx(2), [4, 4], [0, 0])  # every first draft token rejected so far
    assert sched.decide(prop, _ctx(2)).tolist() == [0, 0]
    for _ in range(200):
        sched.observe(_ctx(2), [4, 4], [4, 4])
    assert sched.decide(prop, _ctx(2)).tolist() == [4, 4]


# ---- plan: skip the drafter when its drafts do not pay ----------------------------------------------------------
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_plan_skips_the_drafter_when_its_cost_exceeds_the_gain(layout):
    cheap, dear = _costed(0.01), _costed(5.0)
    if layout == "packed":
        cheap, dear = (dataclasses.replace(p, verify=None) for p in (cheap, dear))
    assert HardwareAware(profile=cheap, layout=layout).plan(_ctx(4))
    assert not HardwareAware(profile=dear, layout=layout).plan(_ctx(4))
    assert HardwareAware(profile=dear, layout=layout, skip=False).plan(_ctx(4))
    assert HardwareAware(profile=dear, layout=layout, costs=False).plan(_ctx(4))  # the paper's model: free drafts


def test_plan_follows_measured_acceptance():
    sched = HardwareAware(profile=_costed(0.3), layout="padded")
    assert sched.plan(_ctx(2))  # prior 0.5: 2 x (0.5 + 0.25 + ...) expected tokens beat the 30% cost
    for _ in range(50):
        sched.observe(_ctx(2), [4, 4], [0, 0])
    assert not sched.plan(_ctx(2))


def test_bool_options_parse_from_cli_strings():
    assert create_scheduler("hardware-aware", skip="false").skip is False
    assert create_scheduler("hardware-aware", costs="true").costs is True
    with pytest.raises(ValueError, match="true or false"):
        create_scheduler("hardware-aware", skip="maybe")


class _Counting(Drafter):
    """Proposes a fixed token block with confidences 0.9 and counts its propose calls."""

    name = "d"

    @dataclass(frozen=True)
    class Config:
        pass

    def __init__(self, config, target):
        super().__init__(config, target)
        self.calls = 0

    def propose(self, ctx):
        self.calls += 1
        rows, k = len(ctx.slots), ctx.block_size
        return Proposal(torch.full((rows, k), 5, dtype=torch.long), torch.full((rows,), k), None,
                        torch.full((rows, k), 0.9))


def _run(target, drafter, scheduler, temperature: float = 1.0, concurrency: int = 3) -> dict:
    reqs = [Request(i, tuple(p), 70 + i) for i, p in enumerate(random_prompts(6, seed=4))]
    out = []
    RoundLoop(target, drafter, EngineConfig(16, temperature, 4, concurrency), scheduler).run(reqs, out.append)
    assert all(r.status == "ok" for r in out)
    return {r.request.request_id: r for r in out}


def test_a_skipped_drafter_decodes_exactly_as_vanilla(tiny):
    """Drafts that never pay: the drafter never runs and every token is the one `none` draws (same keys)."""
    drafter = _Counting(_Counting.Config(), tiny)
    skipped = _run(tiny, drafter, HardwareAware(profile=_costed(50.0), layout="padded", adapt=False))
    vanilla = _run(tiny, drafters.create("none", tiny), None)
    assert drafter.calls == 0
    assert {i: r.output_ids for i, r in skipped.items()} == {i: r.output_ids for i, r in vanilla.items()}
    assert all(x.proposed == 0 and x.verified == 0 for r in skipped.values() for x in r.rounds)


def test_plan_drafts_while_it_pays_and_stops_once_drafts_fail(tiny):
    """Drafting costs 0.2 s, a verify 1 s + 0.06 s per extra token at R = 3: under the prior (0.5 per position)
    drafting pays, so the first round drafts; the drafter's fixed token is rejected, and from then on the
    rounds decode as vanilla. (adapt=false: this table's seconds are not the tiny target's.)"""
    drafter = _Counting(_Counting.Config(), tiny)
    out = _run(tiny, drafter, HardwareAware(profile=_costed(0.2, per_token=0.02), layout="padded", adapt=False))
    rounds = [x for r in out.values() for x in r.rounds]
    assert any(x.proposed == 0 for x in rounds) and any(x.proposed > 0 for x in rounds)
    assert 0 < drafter.calls < max(len(r.rounds) for r in out.values())


def test_greedy_output_is_unchanged_by_the_skip(tiny):
    drafter = _Counting(_Counting.Config(), tiny)
    mixed = _run(tiny, drafter, HardwareAware(profile=_costed(0.2, per_token=0.02), layout="padded"), 0.0)
    vanilla = _run(tiny, drafters.create("none", tiny), None, 0.0)
    assert {i: r.output_ids for i, r in mixed.items()} == {i: r.output_ids for i, r in vanilla.items()}


# ---- simulation with round costs --------------------------------------------------------------------------------
def test_simulation_charges_the_drafter_only_when_it_runs():
    from dspark_bench.studies.simulate import RoundFit, SimSpec, Trace, simulate

    traces = [Trace((4,) * 20, (0,) * 20, ((0.9,) * 4,) * 20, 40, 10) for _ in range(4)]
    fit = RoundFit(draft=(2.0, 0.0), other=(0.0, 0.0))
    profile = _costed(2.0)
    fixed = simulate(traces, SimSpec("fixed", 2, layout="padded", drafter="d"), profile, fit)
    skip = simulate(traces, SimSpec("hardware-aware", 2, {"layout": "padded"}, "padded", 4, drafter="d"),
                    profile, fit)
    assert fixed["tau"] == pytest.approx(1.0) and skip["tau"] == pytest.approx(1.0)
    assert fixed["aggregate_tokens_per_s"] == pytest.approx(2 / 3.0)  # 2 tokens per 1 s verify + 2 s draft
    assert skip["aggregate_tokens_per_s"] > 1.9 * fixed["aggregate_tokens_per_s"]  # the 2 s draft never pays


def test_gpu_scheduling_script_runs_on_cpu_at_tiny_settings(tmp_path):
    """recipes/gpu_scheduling.sh in its CPU smoke mode: the real embedded target and CLI, every stage."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from dspark_bench.target.model import default_cache_dir

    if not (default_cache_dir() / "smollm2-135m-instruct" / "model.safetensors").exists():
        pytest.skip("the embedded target's converted checkpoint is not in the cache (run any smollm2 command once)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "BIN": str(Path(sys.executable).parent), "PYTHONPATH": str(root)}
    done = subprocess.run(["bash", str(root / "recipes" / "gpu_scheduling.sh"), str(tmp_path / "out"), "smoke"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text()[-1500:] for p in sorted((tmp_path / "out").glob("*.log")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs
    profile = load_profile(tmp_path / "out" / "profile.json")
    assert profile.verify is not None and set(profile.draft) == {"dspark"} and profile.overhead is not None
    for name, levels in (("sweep-low", {1}), ("sweep-high", {2})):
        rows = json.loads((tmp_path / "out" / name / "sweep.json").read_text())["rows"]
        assert {r["concurrency"] for r in rows} == levels
        assert {r["label"] for r in rows} >= {"fixed", "hardware-aware[layout=padded]", "fixed[length=1]"}
    sim = json.loads((tmp_path / "out" / "simulate.json").read_text())
    assert sim["simulated"] and max(r["concurrency"] for r in sim["rows"]) == 512 and sim["validation"]["rows"]


def test_the_battery_samples_both_paths_of_the_drafter_skip():
    """The battery's engine case (concurrency 16, its SPS table): under the default prior drafts do not pay and
    every round runs as vanilla; the variant with an optimistic prior (0.8) drafts until the measured
    acceptance says otherwise, then skips, so the sampled lossless checks cover rounds of both kinds within one
    run; the skip=false variant covers the length decisions in every round."""
    from dspark_bench.lossless import battery, cases, checks

    case = cases.engine_case()
    target = case.target()

    def rounds(item):
        out = []
        engine = RoundLoop(target, case.drafter(target), EngineConfig(checks.WINDOW + 1, 1.0, case.block_size,
                                                                     case.concurrency),
                        checks.scheduler_for(item, case.sps))
        engine.run([Request(i, case.prompt, s) for i, s in enumerate(checks.seeds(0, "paths", 200))], out.append)
        return [x for r in out for x in r.rounds]

    assert all(x.proposed == 0 for x in rounds("hardware-aware"))
    mixed = rounds("hardware-aware[prior=0.8]")
    assert any(x.proposed == 0 for x in mixed) and any(x.proposed > 0 for x in mixed)
    assert all(x.proposed > 0 for x in rounds("hardware-aware[skip=false]"))
    assert {"hardware-aware[skip=false]", "hardware-aware[prior=0.8]"} <= set(battery.VARIANTS)


# ---- adapt: prices corrected by what the engine measures ------------------------------------------------------------
def _timing(index: int, rows: int, drafts: int, verify_s: float, draft_s: float = 0.0, other_s: float = 0.0):
    from dspark_bench.drafters.base import RoundTiming

    return RoundTiming(index, rows, (1 + drafts,) * rows, 10.0, drafts > 0, draft_s, verify_s, other_s)


def test_adapt_stops_drafting_once_drafted_rounds_cost_more_than_priced():
    """The profile prices a verify at 1 s whatever its width and a propose at 0.3 s: under the prior, drafting
    pays at R = 2. The engine measures a vanilla step at its price, then a drafted round's verify at 3 s: with
    adapt the scheduler prices the next drafted rounds at that and skips the drafter; without, it keeps
    drafting."""
    for adapt in (True, False):
        sched = HardwareAware(profile=_costed(0.3), layout="padded", adapt=adapt)
        ctx = _ctx(2)
        assert sched.plan(ctx)
        for i in range(HardwareAware.PLAIN_FIRST):
            ctx.last_round = _timing(i + 1, 2, 0, verify_s=1.0)
            assert sched.plan(ctx) is (not adapt or i == HardwareAware.PLAIN_FIRST - 1)
        ctx.last_round = _timing(9, 2, 4, verify_s=3.0, draft_s=0.3)
        assert sched.plan(ctx) is not adapt
        assert sched.correction(2, "multi") == pytest.approx(3.0 if adapt else 1.0)
        assert sched.correction(2, "plain") == pytest.approx(1.0) and sched.correction(2, "draft") == pytest.approx(1.0)
        assert sched.correction(4, "multi") == pytest.approx(3.0 if adapt else 1.0)  # borrowed by an unmeasured R


def test_adapt_does_not_draft_because_only_vanilla_steps_were_found_dear():
    """The sweep of 2026-12-03 14:15 UTC (commit fa3be12) lost at R = 32: vanilla steps measured at 1.43x their price, drafted rounds never measured.
    Correcting the plain price alone made drafting look cheap; the unmeasured kind takes the measured one's."""
    sched = HardwareAware(profile=_costed(0.3, per_token=0.5), layout="padded")
    ctx = _ctx(2)
    assert not sched.plan(ctx)  # by the profile, drafting does not pay at R = 2 here
    ctx.last_round = _timing(1, 2, 0, verify_s=10.0)  # vanilla steps 10x their price
    assert not sched.plan(ctx)
    assert sched.correction(2, "multi") == pytest.approx(10.0)


def test_adapt_takes_the_median_of_the_last_rounds_and_learns_each_round_once():
    sched = HardwareAware(profile=_costed(0.3), layout="padded")
    ctx = _ctx(2)
    ctx.last_round = _timing(1, 2, 0, verify_s=2.0, other_s=0.1)
    sched.plan(ctx)
    sched.plan(ctx)  # the same round again: not counted twice
    assert list(sched._ratios[(2, "plain")]) == pytest.approx([np.log(2.0)])
    for i, v in enumerate([0.5] * 3 + [100.0] + [1.5] * 20):  # an outlier does not move a median
        ctx.last_round = _timing(i + 2, 2, 0, verify_s=v)
        sched.plan(ctx)
        if i == 3:
            assert sched.correction(2, "plain") == pytest.approx(0.5)  # median of 2, 0.5 x 3 and 100
    assert len(sched._ratios[(2, "plain")]) == HardwareAware.ADAPT_WINDOW
    assert sched.correction(2, "plain") == pytest.approx(1.5)
    assert (2, "other/plain") not in sched._ratios  # the profile prices no overhead: nothing to correct


def test_a_slow_stretch_while_drafting_is_read_as_the_machines_speed_and_not_counted_twice():
    """The sweep of 2026-12-04 11:36 UTC (commit 4984501), R = 2: a long drafted stretch learnt the machine's slowdown into the multi-token ratio,
    against a vanilla correction from the first round; once vanilla steps measured the slowdown too, drafts were
    priced at both. Here the machine slows by 1.3x after the window's first drafted rounds: the drafted rounds
    beyond the window move the speed (the vanilla correction) and leave the ratio, so a drafted round costs
    1.3x its price before and after the vanilla step that confirms it, not 1.3 x 1.3."""
    sched = HardwareAware(profile=_costed(0.3), layout="padded")
    ctx = _ctx(2)
    index = 1
    for verify_s, drafts in [(1.0, 0)] + [(1.0, 4)] * HardwareAware.ADAPT_WINDOW + [(1.3, 4)] * 40 + [(1.3, 0)] * 3:
        ctx.last_round = _timing(index, 2, drafts, verify_s=verify_s, draft_s=0.3 if drafts else 0.0)
        sched.plan(ctx)
        index += 1
        if index == 2 + HardwareAware.ADAPT_WINDOW + 40:  # the drafted stretch's end, before any vanilla step
            assert sched.correction(2, "plain") == pytest.approx(1.3)
            assert sched.correction(2, "multi") == pytest.approx(1.3)
    assert sched._factors[(2, "multi")] == pytest.approx(1.0)  # the ratio learnt while the speed was measured
    assert sched.correction(2, "plain") == pytest.approx(1.3) and sched.correction(2, "multi") == pytest.approx(1.3)
    assert sched.correction(2, "draft") == pytest.approx(1.0)  # the propose did not slow: its own price, 0.3 s
    # within the window after a vanilla step, drafted rounds still teach the ratio (a real change of shape cost)
    fresh = HardwareAware(profile=_costed(0.3), layout="padded")
    fresh_ctx = _ctx(2)
    for i, (verify_s, drafts) in enumerate([(1.0, 0)] + [(2.0, 4)] * 5):
        fresh_ctx.last_round = _timing(i + 1, 2, drafts, verify_s=verify_s, draft_s=0.3 if drafts else 0.0)
        fresh.plan(fresh_ctx)
    assert fresh.correction(2, "plain") == pytest.approx(1.0) and fresh.correction(2, "multi") == pytest.approx(2.0)


def test_the_engine_reports_each_round_to_the_scheduler(tiny):
    """ctx.last_round after each round: its index, rows, the tokens each row verified, the drafter's run and
    seconds > 0, as the records have them."""
    from dspark_bench.scheduling.schedulers import Fixed

    seen = []

    class Watching(Fixed):
        def plan(self, ctx):
            seen.append(ctx.last_round)
            return super().plan(ctx)

    drafter = _Counting(_Counting.Config(), tiny)
    out = _run(tiny, drafter, Watching(), concurrency=3)
    reported = [t for t in seen if t is not None]
    assert [t.index for t in reported] == list(range(1, len(reported) + 1))
    first = next(r for r in out.values() if r.request.request_id == 0).rounds[0]
    assert reported[0].rows == 3 and reported[0].drafted
    assert reported[0].tokens[0] == 1 + first.verified and reported[0].verify_s == pytest.approx(first.verify_s)
    assert all(t.verify_s > 0 and t.draft_s > 0 for t in reported)


def test_the_simulation_reports_its_rounds_so_an_adapting_scheduler_learns_its_clock():
    """Every draft accepted and a propose priced at 0.3 s: drafting looks worth it. The simulated drafter costs
    30 s a round: adapt learns that from the first drafted round and decodes as vanilla from then on."""
    from dspark_bench.studies.simulate import RoundFit, SimSpec, Trace, simulate

    traces = [Trace((4,) * 20, (4,) * 20, ((0.9,) * 4,) * 20, 100, 10) for _ in range(4)]
    fit = RoundFit(draft=(30.0, 0.0), other=(0.0, 0.0))
    rows = {adapt: simulate(traces, SimSpec("hardware-aware", 2, {"layout": "padded", "adapt": adapt}, "padded", 4,
                                            drafter="d"), _costed(0.3), fit) for adapt in (True, False)}
    assert rows[True]["aggregate_tokens_per_s"] > 5 * rows[False]["aggregate_tokens_per_s"]
    assert rows[True]["mean_verify_budget"] < 1.1 < rows[False]["mean_verify_budget"]


# ---- what the plan weighs --------------------------------------------------------------------------------------
def test_online_calibration_learns_an_overconfident_head_although_only_confident_drafts_are_tested():
    """Drafts whose confidence c survive with probability c - 0.15, and a scheduler that verifies a draft only
    when c >= 0.5 (the selection a confident scheduler makes). Binning on c keeps the learnt rates right."""
    from dspark_bench.scheduling.schedulers import OnlineCalibration

    cal, rng = OnlineCalibration(), np.random.default_rng(0)
    assert cal.map(np.array([0.3, 0.7])) == pytest.approx([0.3, 0.7])  # the identity before any evidence
    for _ in range(400):
        c = rng.uniform(0.0, 1.0, (8, 1))
        survived = rng.uniform(size=8) < (c[:, 0] - 0.15).clip(0, 1)
        verified = (c[:, 0] >= 0.5).astype(int)
        cal.add(c, verified, (survived & (verified > 0)).astype(int))
    mapped = cal.map(np.array([0.55, 0.65, 0.75, 0.85, 0.95]))
    assert mapped == pytest.approx([0.40, 0.50, 0.60, 0.70, 0.80], abs=0.05)
    assert np.all(np.diff(cal.map(np.linspace(0, 1, 101))) >= 0)  # order kept
    assert cal.tested[:5].sum() == 0  # nothing below 0.5 was tested, so nothing there was learnt


def test_a_correction_borrowed_from_the_sibling_kind_only_ever_favours_not_drafting():
    sched = HardwareAware(profile=_costed(0.3), layout="padded")
    sched._factors.update({(2, "multi"): 0.8, (4, "multi"): 1.3, (8, "plain"): 1.4, (16, "plain"): 0.7})
    assert sched.correction(2, "plain") == 0.8 and sched.correction(4, "plain") == 1.0  # vanilla never dearer
    assert sched.correction(2, "multi") == 0.8  # a measured kind keeps its own
    assert sched.correction(8, "draft") == 1.4 and sched.correction(16, "draft") == 1.0  # drafts never cheaper
    assert sched.correction(16, "other/multi") == 1.0


def test_drafted_rounds_are_priced_relative_to_the_vanilla_steps_and_borrowed_by_the_nearest_r():
    """The sweep of 2026-12-03 18:56 UTC (commit 1ca18ec): while a scheduler skips, only vanilla steps are measured. A drafted round measured at 1.5x
    its price when vanilla steps ran at 1.0x is 1.5x a vanilla step's correction, so when the machine slows
    (vanilla steps at 2.0x) drafts are priced at 3.0x, not left at 1.5x to look cheap. R = 8 and 3, never
    drafted, borrow the ratio of the nearest R that drafted (in log2 R: R = 4 for 8, 2 for 3 of 2 and 4 the
    dearer), on top of their own vanilla correction."""
    sched = HardwareAware(profile=_costed(0.3), layout="padded")
    ctx = _ctx(4)
    steps = [(0, 1.0, 0.0), (4, 1.5, 0.3)] + [(0, 2.0, 0.0)] * 3  # (drafts, verify_s, draft_s) of rounds at R = 4
    for i, (drafts, verify_s, draft_s) in enumerate(steps):
        ctx.last_round = _timing(i + 1, 4, drafts, verify_s=verify_s, draft_s=draft_s)
        sched.plan(ctx)
    assert sched.correction(4, "plain") == pytest.approx(2.0)  # median of 1, 2, 2, 2
    assert sched.correction(4, "multi") == pytest.approx(3.0) and sched.correction(4, "draft") == pytest.approx(2.0)
    sched._factors[(2, "multi")] = 1.2  # a ratio learnt at R = 2
    for r in (8, 3):
        sched._factors[(r, "plain")] = 0.5
    assert sched.correction(8, "multi") == pytest.approx(0.5 * 1.5)  # R = 4's ratio
    assert sched.correction(3, "multi") == pytest.approx(0.5 * 1.5)  # R = 2 and 4 equally near: the dearer
    assert sched.correction(1, "multi") == pytest.approx(1.2)  # R = 2's, and no vanilla step measured at R = 1


def test_vanilla_steps_are_measured_first_at_each_concurrency_when_the_engine_reports_rounds():
    """Three of them, and their median is the speed drafts are weighed against: in the sweep of 2026-12-04
    12:38 UTC (commit 4e4b6cf) one slow first step (1.19x the steps after it) made drafts that lost look worth 18 rounds at R = 8."""
    sched = HardwareAware(profile=_costed(0.01), layout="padded")
    ctx = _ctx(2)
    assert sched.plan(ctx)  # no round reported yet: the model alone (drafts nearly free)
    ctx.last_round = _timing(1, 2, 4, verify_s=1.0, draft_s=0.01)
    assert not sched.plan(ctx)  # R = 2 has no vanilla step measured: take one
    for i, verify_s in enumerate((1.5, 1.0, 1.1)):  # a slow first step, then two at the usual speed
        ctx.last_round = _timing(2 + i, 2, 0, verify_s=verify_s)
        assert sched.plan(ctx) is (i == 2)  # drafts are weighed once three were measured
    assert sched.correction(2, "plain") == pytest.approx(1.1)  # their median, not the slow one
    three = _ctx(3)
    three.last_round = _timing(5, 2, 4, verify_s=1.0)
    assert not sched.plan(three)  # R = 3: none measured there yet
    first = _ctx(2)
    first.reports_rounds = True  # an engine that will report its rounds: its first round is measured too
    assert not HardwareAware(profile=_costed(0.01), layout="padded").plan(first)
    fixed_prices = HardwareAware(profile=_costed(0.01), layout="padded", adapt=False)
    assert fixed_prices.plan(three)  # adapt=false decides from the profile alone


def test_kappa_scales_the_survivals_by_what_drafted_rounds_delivered():
    """Confidences promise 0.9 per position (3.1 tokens a request over 4 drafts); the rounds accept none. kappa
    falls and the plan stops drafting where the raw confidences said it pays (a propose costs 30% of a step);
    without measure it keeps drafting."""
    runs = {}
    for measure in (True, False):
        sched = HardwareAware(profile=_costed(0.3), layout="padded", adapt=False, recalibrate=False,
                              measure=measure)
        ctx, drafted = _ctx(2), 0
        for _ in range(40):
            if sched.plan(ctx):
                drafted += 1
                lengths = sched.decide(Proposal(torch.zeros(2, 4, dtype=torch.long), torch.full((2,), 4), None,
                                                torch.full((2, 4), 0.9)), ctx)
                sched.observe(ctx, lengths.tolist(), [0, 0])
        runs[measure] = (sched.kappa(), drafted)
    assert runs[True][0] < 0.11 and runs[False][0] == 1.0
    assert 10 < runs[True][1] < 20 and runs[False][1] == 40


def test_a_vanilla_step_reclaims_the_dead_columns_that_rejected_drafts_left(tiny):
    """Greedy decoding. Round 1 drafts the target's own continuation for the shortest request (all accepted) and a
    rejected token for the others, so the cache ends columns beyond its longest row; round 2 skips the drafter and
    must attend over no dead column."""

    class DraftOnce(Scheduler):
        def __init__(self):
            self.planned = 0

        def decide(self, proposal, ctx):
            return proposal.lengths.clone()

        def plan(self, ctx):
            self.planned += 1
            return self.planned == 1

    class RightForTheShortest(_Counting):
        def propose(self, ctx):
            out = super().propose(ctx)
            r = min(range(len(ctx.slots)), key=lambda i: len(ctx.slots[i].tokens))
            tokens = list(ctx.slots[r].tokens)
            for j in range(ctx.block_size):
                tokens.append(int(tiny.model(torch.tensor([tokens])).logits[0, -1].argmax()))
                out.tokens[r, j] = tokens[-1]
            return out

    reqs = [Request(i, tuple(p), 70 + i) for i, p in enumerate(random_prompts(3, seed=4))]
    drafter = RightForTheShortest(RightForTheShortest.Config(), tiny)
    session = RoundLoop(tiny, drafter, EngineConfig(16, 0.0, 4, 3), DraftOnce()).session(reqs, [].append)
    session.step()  # admission and the drafted round
    dead = session.batch.columns - max(session.batch.lens)
    session.step()  # the vanilla step
    assert dead > 0 and session.batch.columns == max(session.batch.lens)


def test_the_engine_tells_a_scheduler_before_its_first_round_that_it_will_report_rounds(tiny):
    """So that hardware-aware measures vanilla steps before its first drafted round (commit 545f65a)."""

    class Seen(Scheduler):
        def __init__(self):
            self.flags = []

        def decide(self, proposal, ctx):
            return proposal.lengths.clone()

        def plan(self, ctx):
            self.flags.append((ctx.reports_rounds, ctx.last_round is not None))
            return False

    seen = Seen()
    reqs = [Request(i, tuple(p), 70 + i) for i, p in enumerate(random_prompts(2, seed=4))]
    session = RoundLoop(tiny, _Counting(_Counting.Config(), tiny), EngineConfig(16, 0.0, 4, 3), seen).session(
        reqs, [].append)
    session.step()
    session.step()
    assert seen.flags == [(True, False), (True, True)]


def test_the_simulation_prices_a_vanilla_steps_own_time_apart_from_a_drafted_rounds():
    """A sweep's fixed and `none` cells at R = 8 (fixtures/studies/sweep-r8: a cut of the sweep of 2026-12-03
    16:32 UTC, commit bcbf1fb): acceptance over a 7-draft block costs more than a vanilla step's; the fit from the
    fixed cell plus the `none` cell gives each kind its own line."""
    from dspark_bench.studies.simulate import fit_overhead
    from dspark_bench.studies.sweep import read_cell

    cells = FIXTURES / "studies" / "sweep-r8" / "cells"
    fixed, none = read_cell(cells / "dspark__fixed__c8"), read_cell(cells / "none__fixed__c8")
    fit = fit_overhead(fixed, none)
    vanilla_other = np.mean([t[2] for r in none for t, b in zip(r.timings, r.batch, strict=True) if b == 8])
    assert fit.seconds(8, False, width=0) == pytest.approx(vanilla_other, rel=0.1)
    assert fit.seconds(8, False, width=7) > 1.5 * fit.seconds(8, False, width=0)
    assert fit_overhead(none).plain is None  # a none cell alone: its one kind of round is `other`


def test_a_scheduler_that_skips_redrafts_now_and_then_only_where_drafting_is_close():
    """R = 2, a verify 1 s at any width, the prior's 0.94 expected drafts a request: a propose of 1.04 s puts
    drafting at 0.95 of a vanilla step (close: one drafted round after 20 skipped, then 40, 80: each retry
    after which the model still skips doubles the wait), one of 5 s at 0.32 (never). Without adapt nothing
    re-measures, so it never retries."""
    close = HardwareAware(profile=_costed(1.04), layout="padded")
    assert [i for i in range(1, 150) if close.plan(_ctx(2))] == [20, 60, 140]
    far = HardwareAware(profile=_costed(5.0), layout="padded")
    assert not any(far.plan(_ctx(2)) for _ in range(45))
    fixed_prices = HardwareAware(profile=_costed(1.04), layout="padded", adapt=False)
    assert not any(fixed_prices.plan(_ctx(2)) for _ in range(45))


def test_hardware_aware_without_a_profile_measures_one_before_the_run_and_decodes(tiny):
    """A run given no profile measures a small one before any timed round (with_profile); a scheduler left
    without one is an error in its first round, never a profile measured inside a round."""
    from dspark_bench.scheduling.schedulers import with_profile

    sched = with_profile(HardwareAware(layout="padded"), tiny)
    assert sched._table is not None
    out = _run(tiny, _Counting(_Counting.Config(), tiny), sched)
    assert all(len(r.output_ids) == 16 or r.finish == "eos" for r in out.values())
    reqs = [Request(0, tuple(random_prompts(1, seed=4)[0]), 70)]
    failed = []
    RoundLoop(tiny, _Counting(_Counting.Config(), tiny), EngineConfig(16, 1.0, 4, 1),
              HardwareAware(layout="padded")).run(reqs, failed.append)
    assert failed[0].status == "error" and "no profile to price a round" in failed[0].error


def test_after_a_long_skip_the_rows_of_a_retry_outweigh_the_stale_ones(monkeypatch):
    """The sweep of 2026-12-03 18:56 UTC (commit 1ca18ec), R = 1: drafting stopped on prompts whose drafts lost, and one retry's row among 64 stale
    ones could not show that the new prompts' drafts pay. 64 rounds of confidences 0.2 (skip: a propose costs
    30% of a step, drafting is at 0.96 of a vanilla step), then a retry whose confidences are 0.95: the next
    round drafts. With equal weights (an
    infinite half-life) the stale rows outvote it and the scheduler keeps skipping."""

    def proposal(c: float) -> Proposal:
        return Proposal(torch.zeros(1, 4, dtype=torch.long), torch.full((1,), 4), None, torch.full((1, 4), c))

    for half_life, resumes in ((HardwareAware.HALF_LIFE, True), (float("inf"), False)):
        monkeypatch.setattr(HardwareAware, "HALF_LIFE", half_life)
        sched = HardwareAware(profile=_costed(0.3), layout="padded", recalibrate=False, measure=False)
        ctx = _ctx(1)
        for _ in range(64):
            sched.plan(ctx)
            sched.decide(proposal(0.2), ctx)
        waited = next(i for i in range(200) if sched.plan(ctx))  # skips until the retry
        sched.decide(proposal(0.95), ctx)
        assert waited > 20 and sched.plan(ctx) is resumes


def test_a_new_request_expects_the_runs_mean_survival_not_the_rows_of_the_requests_it_replaced():
    """The sweep of 2026-12-03 22:30 UTC (commit 69e88aa) at R = 2: the second repeat began on the rows of the first repeat's last, hard
    requests, and the scheduler skipped 65 rounds of new requests whose drafts paid. Here two requests draft 30
    rounds with confidences 0.9, then 40 rounds with 0.1 (drafting stops: a propose costs 60% of a step), then a
    new repeat admits new requests under the same ids (their positions start over): they expect the run's mean
    survival, and drafting resumes at once. A request that stays in the batch keeps its own rows."""

    def proposal(c: float) -> Proposal:
        return Proposal(torch.zeros(2, 4, dtype=torch.long), torch.full((2,), 4), None, torch.full((2, 4), c))

    sched = HardwareAware(profile=_costed(0.6), layout="padded", recalibrate=False, measure=False)
    plans = []
    for n, c in enumerate([0.9] * 30 + [0.1] * 40):
        ctx = DraftContext(None, 1.0, 4, [_Slot(0, 20 + n), _Slot(1, 20 + n)], drafter="d")
        plans.append(sched.plan(ctx))
        if plans[-1]:
            sched.decide(proposal(c), ctx)
            sched.observe(ctx, [4, 4], [0, 0])
    assert all(plans[:30]) and not any(plans[-5:])  # it drafted the confident stretch, then stopped
    stale = sched._expected_survival(DraftContext(None, 1.0, 4, [_Slot(0, 90), _Slot(1, 90)], drafter="d"))
    one_new = DraftContext(None, 1.0, 4, [_Slot(0, 91), _Slot(7, 12)], drafter="d")  # request 0 stays
    mixed = sched._expected_survival(one_new)[0]
    new = DraftContext(None, 1.0, 4, [_Slot(0, 12), _Slot(1, 12)], drafter="d")  # the next repeat: ids reused
    fresh = sched._expected_survival(new)
    held = np.array([np.cumprod([c] * 4) for c in [0.9] * 30 * 2 + [0.1] * 2 * sum(plans[30:])])
    assert fresh[0] == pytest.approx(held.mean(axis=0))  # the mean of every row the run proposed
    assert fresh[0, 0] > 2 * stale[0, 0]
    assert stale[0, 0] < mixed[0] < fresh[0, 0]
    assert sched.plan(new)


def test_the_simulation_prices_vanilla_steps_by_the_none_cells_own_clock():
    """A sweep at R = 32 (fixtures/studies/sweep-r32: a cut of the sweep of 2026-12-03 20:37 UTC, commit b77c353):
    the `none` cell's steps ran further off the profile's price than the fixed cell's verifies. `hardware-aware`
    never drafted there, so it ran the `none` cell's steps: a replay that priced them by the fixed cell's scale ran
    10% or more fast; priced by the `none` cell's, it lands on the `none` cell's throughput. (The measured
    `hardware-aware` cell ran 5% above `none`, the spread of two cells doing the same work.)"""
    import json

    from dspark_bench.scheduling.profile import load_profile
    from dspark_bench.studies.simulate import (
        SimSpec,
        clock_scales,
        fit_overhead,
        simulate,
        traces_from_records,
    )
    from dspark_bench.studies.sweep import read_cell

    sweep = FIXTURES / "studies" / "sweep-r32"
    profile = load_profile(sweep / "profile.json")
    fixed, none = read_cell(sweep / "cells" / "dspark__fixed__c32"), read_cell(sweep / "cells" / "none__fixed__c32")
    drafted, plain = clock_scales(fixed, profile, "padded", none)
    assert plain > 1.15 * drafted
    assert clock_scales(fixed, profile, "padded")[1] == pytest.approx(drafted)  # no plain rounds of its own
    rows = [r for r in json.loads((sweep / "sweep.json").read_text())["rows"] if r["concurrency"] == 32]
    row = next(r for r in rows if r["label"].startswith("hardware-aware"))
    assert row["mean_verify_budget"] == 1.0  # it never drafted
    measured = next(r for r in rows if r["drafter"] == "none")["aggregate_tokens_per_s"]
    traces, fit = traces_from_records(fixed), fit_overhead(fixed, none)

    def replay(plain_scale):
        spec = SimSpec(row["scheduler"], 32, dict(row["options"]), "padded", 7, drafted, plain_scale, profile,
                       drafter="dspark")
        return simulate(traces, spec, profile, fit)["aggregate_tokens_per_s"]

    assert replay(None) > 1.1 * measured
    assert replay(plain) == pytest.approx(measured, rel=0.03)
