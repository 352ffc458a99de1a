"""dspark_bench.studies.claims and ``dspark-bench study claims`` / ``r1-table``: Table 1 with intervals, paired gains
and the decay along the block, and the single-request table, from run folders."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from dspark_bench.cli.study import claims as claims_command
from dspark_bench.cli.study import r1_table as r1_command
from dspark_bench.core.records import RequestRecord
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import SCHEMA_VERSION, RunWriter, read_manifest, read_records
from dspark_bench.studies import claims as study
from dspark_bench.studies.claims import ClaimsError

DATASETS = {"gsm8k": "math", "aime25": "math", "humaneval": "code", "chat": "chat"}


def _rec(drafter, dataset, pid, rounds, repeat=0):
    return RequestRecord(drafter=drafter, scheduler="fixed", dataset=dataset, domain=DATASETS[dataset],
                         prompt_id=pid, index=0, repeat=repeat, seed=1, concurrency=8, status="ok", finish="length",
                         prompt_len=4, output_ids=(1,) * (1 + sum(r[3] for r in rounds)),
                         rounds=tuple(tuple(r) for r in rounds), timings=((0.0, 0.0, 0.0, 0.0),) * len(rounds),
                         ttft_s=0.1, decode_s=1.0)


def _run(folder, drafters, n=6, gamma=3, repeats=1):
    """drafters: {name: f(dataset, prompt index) -> rounds}."""
    manifest = {"schema_version": SCHEMA_VERSION, "args": {"block_size": gamma}}
    with RunWriter(folder, manifest) as w:
        for rep in range(repeats):
            for ds in DATASETS:
                for i in range(n):
                    w.add(_rec("none", ds, f"p{i}", [[0, 0, 0, 1]] * 5, rep))
                    for name, f in drafters.items():
                        w.add(_rec(name, ds, f"p{i}", f(ds, i), rep))
    return folder


def _rounds(accepts, gamma=3):  # one round per entry: `a` of gamma drafts accepted, a + 1 tokens committed
    return [[gamma, gamma, a, a + 1] for a in accepts]


def test_tau_gains_and_pairing(tmp_path):
    # dflash: prompt i accepts a varying number of tokens; dspark: the same rounds with one more committed token in
    # every fourth round. tau differs a lot between prompts, so an unpaired interval would be wide; paired, every
    # resample gives nearly the same ratio.
    def dflash(ds, i):
        return _rounds([i % 4, 0, 1, (i * 3) % 4] * 2)

    def dspark(ds, i):
        base = dflash(ds, i)
        return [[g, v, min(a + 1, g), min(a + 1, g) + 1] if k % 4 == 0 and a < g else [g, v, a, c]
                for k, (g, v, a, c) in enumerate(base)]

    a = _run(tmp_path / "a", {"dspark": dspark, "dflash": dflash})
    b = _run(tmp_path / "b", {"eagle3": dflash})
    c = study.claims([a, b], n_boot=500)
    taus = {n: c["tau"][n]["macro"]["tau"] for n in c["drafters"]}
    committed = {n: sum(r[3] for ds in DATASETS for i in range(6) for r in f(ds, i)) for n, f in
                 (("dspark", dspark), ("dflash", dflash))}
    rounds = sum(len(dflash(ds, i)) for ds in DATASETS for i in range(6))
    assert taus["dspark"] == pytest.approx(committed["dspark"] / rounds)  # every dataset alike, so macro = pooled
    assert taus["dflash"] == pytest.approx(committed["dflash"] / rounds) == pytest.approx(taus["eagle3"])
    g = c["gains"]["dflash"]["macro"]
    assert g["gain"] == pytest.approx(taus["dspark"] / taus["dflash"] - 1)
    assert g["ci95"][0] <= g["gain"] <= g["ci95"][1] and g["share_above_0"] == 1.0
    width = g["ci95"][1] - g["ci95"][0]
    lo, hi = c["tau"]["dflash"]["macro"]["ci95"]
    # paired: the gain's interval is far narrower than either tau's own relative interval (here 0.05 against 0.20;
    # independent resamples would give about 0.20 x sqrt(2))
    assert width < 0.35 * (hi - lo) / taus["dflash"]
    assert c["gains"]["eagle3"]["math"]["gain"] == pytest.approx(g["gain"])
    assert set(c["gains"]) == {"dflash", "eagle3"} and "none" not in c["drafters"]
    md = study.markdown(c)
    assert "| `dspark` |" in md and "Decay along the block" in md


def test_decay_positions_and_small_counts(tmp_path):
    # flat: a position is accepted with the same rate whatever came before; decaying: position 2 half as often
    def flat(ds, i):
        return _rounds([0, 1, 2, 3] * 10)  # position 1 accepted 30/40, 2: 20/30, 3: 10/20

    def decaying(ds, i):
        return _rounds([0, 0, 1, 1, 1, 1, 2, 3] * 5)

    a = _run(tmp_path / "a", {"dspark": flat, "dflash": decaying}, n=2)
    c = study.claims([a], n_boot=200)
    pos = c["positions"]["dspark"]["math"]
    assert [p["rounds"] for p in pos] == [4 * 40, 4 * 30, 4 * 20]  # two prompts x two math datasets
    assert pos[0]["rate"] == pytest.approx(30 / 40) and pos[1]["rate"] == pytest.approx(20 / 30)
    lo, hi = pos[0]["wilson95"]
    assert lo < 0.75 < hi
    d = c["decay"]["dspark"]["math"]["k2/k1"]
    assert d["ratio"] == pytest.approx((20 / 30) / (30 / 40))
    dd = c["decay"]["dflash"]["math"]["k2/k1"]
    assert dd["ratio"] == pytest.approx((10 / 30) / (30 / 40))  # 6 of 8 rounds pass position 1, 2 of those 6 pass 2
    # chat has two prompts: its position 3 was tested 2 x 20 = 40 times for flat, enough; 2 x 10 = 20 for decaying
    assert "k3/k1" in c["decay"]["dspark"]["chat"] and "k3/k1" not in c["decay"]["dflash"]["chat"]


def test_refuses_runs_that_are_not_one_protocol(tmp_path):
    a = _run(tmp_path / "a", {"dspark": lambda ds, i: _rounds([1])})
    b = _run(tmp_path / "b", {"dspark": lambda ds, i: _rounds([1])})
    with pytest.raises(ClaimsError, match="more than one run"):
        study.claims([a, b])
    c = _run(tmp_path / "c", {"dflash": lambda ds, i: _rounds([1])}, n=5)
    with pytest.raises(ClaimsError, match="same prompts"):
        study.claims([a, c])
    d = _run(tmp_path / "d", {"eagle3": lambda ds, i: _rounds([1])}, gamma=7)
    with pytest.raises(ClaimsError, match="block sizes"):
        study.claims([a, d])
    with pytest.raises(ClaimsError, match="reference drafter"):
        study.claims([c])
    done = CliRunner().invoke(claims_command, [str(tmp_path / "nothing")])
    assert done.exit_code == 2 and "is not a run folder" in done.output


def test_before_compares_each_drafter_with_its_earlier_weights(tmp_path):
    # now: dspark accepts one more token in every other round than before; dflash is unchanged
    def was(ds, i):
        return _rounds([i % 3, 0, 1, 2] * 2)

    def better(ds, i):
        return [[g, v, a + 1, a + 2] if k % 2 == 0 and a < g else [g, v, a, c]
                for k, (g, v, a, c) in enumerate(was(ds, i))]

    old = _run(tmp_path / "old", {"dspark": was, "dflash": was, "mtp": was})
    new = _run(tmp_path / "new", {"dspark": better, "dflash": was})
    c = study.claims([new], n_boot=300, before=[old])
    ch = c["before"]["change"]
    assert set(ch) == {"dspark", "dflash"}  # only the drafters in both sets; mtp is not in the new runs
    rounds = sum(len(was(ds, i)) for ds in DATASETS for i in range(6))
    was_tau = sum(r[3] for ds in DATASETS for i in range(6) for r in was(ds, i)) / rounds
    now_tau = sum(r[3] for ds in DATASETS for i in range(6) for r in better(ds, i)) / rounds
    g = ch["dspark"]["macro"]
    assert g["before"] == pytest.approx(was_tau) and g["now"] == pytest.approx(now_tau)
    assert g["change"] == pytest.approx(now_tau / was_tau - 1) and g["ci95"][0] > 0 and g["share_above_0"] == 1.0
    same = ch["dflash"]["macro"]
    assert same["change"] == 0 and same["ci95"] == [0, 0] and same["share_above_0"] == 0
    assert "τ against the earlier runs" in study.markdown(c)
    assert "τ against" not in study.markdown(study.claims([new], n_boot=50))
    fewer = _run(tmp_path / "fewer", {"dspark": was}, n=5)
    with pytest.raises(ClaimsError, match="other prompts"):
        study.claims([new], n_boot=50, before=[fewer])
    other = _run(tmp_path / "other", {"eagle3": was})
    with pytest.raises(ClaimsError, match="none of these drafters"):
        study.claims([new], n_boot=50, before=[other])


def test_the_command_splits_runs_from_earlier_runs_at_before(tmp_path):
    """``dspark-bench study claims NEW ... --before OLD ...``: the runs after --before are the earlier weights; the
    markdown printed is the module's, and --json / --md write the numbers and the same markdown."""
    def was(ds, i):
        return _rounds([i % 3, 0, 1, 2] * 2)

    old = _run(tmp_path / "old", {"dspark": was, "dflash": was})
    new_a = _run(tmp_path / "new-a", {"dspark": lambda ds, i: _rounds([i % 3, 1, 1, 2] * 2)})
    new_b = _run(tmp_path / "new-b", {"dflash": was})
    out = tmp_path / "c.json"
    done = CliRunner().invoke(claims_command, [str(new_a), str(new_b), "--before", str(old), "--boot", "50",
                                               "--json", str(out), "--md", str(tmp_path / "c.md")])
    assert done.exit_code == 0, done.output
    want = study.claims([new_a, new_b], n_boot=50, before=[old])
    assert done.output == study.markdown(want) == (tmp_path / "c.md").read_text()
    assert json.loads(out.read_text())["before"]["runs"] == [str(old)]
    for args, message in (([str(new_a), "--before"], "--before needs"), ([str(new_a), "--bogus"], "no such option")):
        done = CliRunner().invoke(claims_command, args)
        assert done.exit_code == 2 and message in done.output


def test_wilson_interval_and_domain_order():
    lo, hi = study.wilson(30, 40)
    assert lo == pytest.approx(0.5980, abs=1e-4) and hi == pytest.approx(0.8581, abs=1e-4)
    assert study.wilson(0, 0) is None and study.wilson(0, 5)[0] == 0.0 and study.wilson(5, 5)[1] == 1.0
    assert sorted(["zeta", "custom", "chat", "code", "math", "alpha"], key=study.domain_sort_key) == \
        ["math", "code", "chat", "custom", "alpha", "zeta"]


R1 = FIXTURES / "studies" / "offline-r1"  # a cut of an offline protocol's r1 stage (fixtures/README.md)


def test_r1_table_gives_each_drafter_its_runs_summary_numbers(tmp_path):
    """``dspark-bench study r1-table`` on a single-request run: every drafter of its manifest but none, each tau and
    speedup what the run's summary (metrics.summarize of its records) holds for that drafter, the drafting cost
    a fraction of a vanilla step, the verify dearer than the drafting."""
    done = CliRunner().invoke(r1_command, [str(R1), "--json", str(tmp_path / "r1.json")])
    assert done.exit_code == 0, done.output
    rows = {r["drafter"]: r for r in json.loads((tmp_path / "r1.json").read_text())}
    assert sorted(rows) == ["dflash", "dspark", "eagle3", "mtp"]
    summary = summarize(read_records(R1), int(read_manifest(R1)["args"]["block_size"]))
    for name, row in rows.items():
        want = next(g for g in summary["groups"] if g["drafter"] == name and g["scope"] == "all")
        assert row["tau"] == pytest.approx(want["tau"])
        assert row["speedup_vs_none"] == pytest.approx(want["speedup_vs_none"])
        assert 0 < row["draft_over_vanilla_step"] < 1 and row["verify_s_per_round"] > row["draft_s_per_round"]
    assert "| dspark |" in done.output and done.output == study.r1_table(study.r1_rows(R1)) + "\n"


def test_run_summary_reads_one_drafter_of_a_run():
    """run_summary: the drafter's records against the same run's none; a drafter the run lacks is refused."""
    records = read_records(R1)
    s = study.run_summary(R1, "dspark")
    mine = [r for r in records if r.drafter == "dspark"]
    none = [r for r in records if r.drafter == "none"]
    rounds = [t for r in mine for t in r.timings]
    assert s["requests"] == len(mine) == 4 and s["rounds"] == len(rounds)
    assert s["draft_s_per_round"] == pytest.approx(sum(t[0] for t in rounds) / len(rounds))
    step = [sum(t[:3]) for r in none for t in r.timings]
    assert s["vanilla_step_s"] == pytest.approx(sum(step) / len(step))
    assert s["draft_over_vanilla_step"] == pytest.approx(s["draft_s_per_round"] / s["vanilla_step_s"])
    with pytest.raises(ClaimsError, match="no records of drafter 'ngram'"):
        study.run_summary(R1, "ngram")
