"""dspark_bench.studies.gate_spread and ``dspark-bench study gate-tstat-spread``: the gate's tau statistic of unchanged
drafters, log(tau ratio) over the standard error measured across the baseline's seeds, per domain and pooled."""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner

from dspark_bench.cli.study import gate_tstat_spread
from dspark_bench.core.records import RequestRecord
from dspark_bench.evaluation.gate import snapshot
from dspark_bench.evaluation.runs import SCHEMA_VERSION, RunWriter
from dspark_bench.studies.gate_spread import spread, statistics

DOMAINS = {"gsm8k": "math", "humaneval": "code"}
DRAFTERS = {"dspark": 0.6, "dflash": 0.4}  # each round's chance to accept every draft


def _run(folder, seed: int, n: int = 5) -> dict:
    """A sampled run of none and the drafters (random acceptance by seed): {(drafter, domain, prompt): [committed,
    rounds]} of what it wrote."""
    rng = np.random.default_rng(seed)
    counts = {}
    manifest = {"schema_version": SCHEMA_VERSION, "args": {"block_size": 3, "temperature": 1.0, "seed": seed}}
    with RunWriter(folder, manifest) as w:
        for ds, dom in DOMAINS.items():
            for i in range(n):
                for name, p in {"none": None, **DRAFTERS}.items():
                    k = 6 + i  # rounds; prompts differ in length
                    accepted = [0] * k if p is None else list(rng.binomial(3, p * (1 + 0.1 * i), k))
                    rounds = tuple((0, 0, 0, 1) if p is None else (3, 3, int(a), int(a) + 1) for a in accepted)
                    counts[(name, dom, f"{ds}/p{i}")] = [sum(r[3] for r in rounds), len(rounds)]
                    w.add(RequestRecord(name, "fixed", ds, dom, f"p{i}", i, 0, seed, 1, "ok", "length", 4,
                                        (1,) * (1 + sum(r[3] for r in rounds)), rounds,
                                        ((0.0, 0.01, 0.0, 0.0),) * k, 0.1, 0.01 * k))
    return counts


def _statistic(bases: list[dict], fresh: dict, name: str, domains: set[str]) -> float:
    """log(tau_new / tau_base) / se, the variance of the baseline's per-prompt (committed / mean committed -
    rounds / mean rounds) across its K seeds, times 1 + 1/K (the baseline's mean is itself estimated)."""
    keys = sorted({p for (d, dom, p) in bases[0] if d == name and dom in domains})
    k = len(bases)
    c = np.array([[b[(name, dom, p)][0] for p in keys for dom in domains if (name, dom, p) in b] for b in bases])
    r = np.array([[b[(name, dom, p)][1] for p in keys for dom in domains if (name, dom, p) in b] for b in bases])
    c1, r1 = c.sum() / k, r.sum() / k
    var = (c / c1 - r / r1).var(axis=0, ddof=1).sum() * (1 + 1 / k)
    new_c = sum(fresh[(name, dom, p)][0] for p in keys for dom in domains if (name, dom, p) in fresh)
    new_r = sum(fresh[(name, dom, p)][1] for p in keys for dom in domains if (name, dom, p) in fresh)
    return math.log((new_c / new_r) / (c1 / r1)) / math.sqrt(var)


def test_statistics_of_fresh_runs_against_the_baselines_seeds(tmp_path, monkeypatch):
    base_counts = [_run(tmp_path / "base" / f"s{k}" / "t1", 10 + k) for k in range(4)]
    fresh_counts = [_run(tmp_path / "fresh" / f"same-{j}" / "t1", 100 + j) for j in range(3)]
    bases = [snapshot([tmp_path / "base" / f"s{k}" / "t1"]) for k in range(4)]
    fresh = [snapshot([tmp_path / "fresh" / f"same-{j}" / "t1"]) for j in range(3)]
    z = statistics(bases, fresh)
    # per drafter (not none), per domain then pooled, per fresh run, in that order
    want_domains = [_statistic(base_counts, f, name, {dom}) for name in sorted(DRAFTERS)
                    for dom in sorted(DOMAINS.values()) for f in fresh_counts]
    want_all = [_statistic(base_counts, f, name, set(DOMAINS.values())) for name in sorted(DRAFTERS)
                for f in fresh_counts]
    assert z["domains"] == pytest.approx(want_domains) and z["all"] == pytest.approx(want_all)
    assert len(z["domains"]) == 2 * 2 * 3 and len(z["all"]) == 2 * 3
    # the command: the runs matched by the globs under the current folder; the mean, spread and share below -2
    text = spread("base/*/t1", "fresh/same-*/t1", root=tmp_path)
    lines = text.splitlines()
    d = np.array(want_domains)
    assert lines[0] == "4 baseline seeds, 3 fresh runs"
    assert lines[1] == (f"domains: 12 statistics, mean {d.mean():.2f}, spread (sd) {d.std(ddof=1):.2f}, "
                        f"below -2: {(d < -2).mean():.3f}")
    assert lines[2].startswith("all: 6 statistics, mean ")
    monkeypatch.chdir(tmp_path)  # the command's globs: relative to the current folder, or absolute
    for args in (["base/*/t1", "fresh/same-*/t1"], [str(tmp_path / "base/*/t1"), str(tmp_path / "fresh/same-*/t1")]):
        done = CliRunner().invoke(gate_tstat_spread, args)
        assert done.exit_code == 0 and done.output == text
    done = CliRunner().invoke(gate_tstat_spread, ["base/*/t1"])  # the default fresh runs: none here
    assert done.exit_code == 2 and "no run folder matches" in done.output
