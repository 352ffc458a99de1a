"""The paper's offline claims, re-measured from committed run folders (issue 16, items 3 and 4).

    python scripts/offline_claims.py RUN [RUN ...] [--reference dspark] [--boot 2000] [--json OUT] [--md OUT]
        [--before RUN [RUN ...]]

RUN: run folders of the offline protocol (e.g. baselines/offline-smollm2-6k/a and .../b), which decoded the same
prompts with the same seeds; each drafter may appear in one run only. Acceptance is read from each drafter's first
repeat. It prints, as markdown:

* tau per dataset with its 95% per-prompt bootstrap interval, the domain means (unweighted over the domain's
  datasets) and the macro average (unweighted over datasets), as in the paper's Table 1;
* the reference drafter's relative gain over every other model drafter per domain and macro, with a 95% interval
  from a **paired, stratified** bootstrap: within each dataset the same resampled prompts are used for both drafters,
  so the interval reflects the prompt sample, not the difference between two independent samples;
* conditional acceptance at each draft position per domain, with 95% Wilson intervals over rounds; positions tested
  in fewer than MIN_ROUNDS rounds are shown as (rate, n) and are not used in the decay figure below;
* each drafter's decay along the block: conditional acceptance at positions 2-4 over position 1 (Figure 2's flat
  curve against a decaying one), with an interval from the same paired bootstrap over prompts;
* with --before: each drafter's tau against the same drafter in earlier runs of the protocol (other weights, the
  same prompts and seeds), per domain and macro, with the same paired bootstrap: did new weights help.

Nothing here is tuned: the bootstrap seed is fixed (0) and every number comes from the records.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dspark_bench.metrics import count_rounds
from dspark_bench.report.style import domain_sort_key
from dspark_bench.report.tables import MIN_ROUNDS, wilson
from dspark_bench.results import read_manifest, read_records

MODEL_DRAFTERS = ("dspark", "dflash", "eagle3", "mtp")


def load(runs: list[Path]) -> tuple[dict, dict, int]:
    """{drafter: {(dataset, prompt_id): record}} of first-repeat ok records, {dataset: domain}, gamma."""
    by_drafter: dict[str, dict] = {}
    domains: dict[str, str] = {}
    gammas = set()
    for run in runs:
        gammas.add(int(read_manifest(run)["args"]["block_size"]))
        records = read_records(run)
        first = min((r.repeat for r in records), default=0)
        here: dict[str, dict] = defaultdict(dict)
        for r in records:
            if r.repeat != first:
                continue
            if not r.ok:
                raise SystemExit(f"{run}: {r.drafter} {r.dataset}/{r.prompt_id} errored ({r.error}); "
                                 "the claims need every request")
            here[r.drafter][(r.dataset, r.prompt_id)] = r
            domains[r.dataset] = r.domain
        for name, recs in here.items():
            if name == "none":
                continue
            if name in by_drafter:
                raise SystemExit(f"drafter {name!r} appears in more than one run; pass each drafter once")
            by_drafter[name] = recs
    if len(gammas) != 1:
        raise SystemExit(f"the runs used different block sizes {sorted(gammas)}; they are not one protocol")
    keys = {name: set(recs) for name, recs in by_drafter.items()}
    common = set.intersection(*keys.values()) if keys else set()
    for name, k in keys.items():
        if k != common:
            raise SystemExit(f"drafter {name!r} decoded {len(k)} prompts, the others {len(common)} in common: "
                             "the runs must hold the same prompts")
    return by_drafter, domains, gammas.pop()


def per_prompt(recs: dict, keys: list, gamma: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[n, 2] (committed, rounds), [n, gamma] examined, [n, gamma] accepted per prompt, in the order of keys."""
    tau = np.zeros((len(keys), 2))
    exam = np.zeros((len(keys), gamma))
    acc = np.zeros((len(keys), gamma))
    for i, key in enumerate(keys):
        c = count_rounds(recs[key].rounds, gamma)
        tau[i] = (c.committed, c.rounds)
        exam[i] = c.examined_at
        acc[i] = c.accepted_at
    return tau, exam, acc


def claims(runs: list[Path], reference: str = "dspark", n_boot: int = 2000,
           before: list[Path] | None = None) -> dict:
    by_drafter, domains, gamma = load(runs)
    if reference not in by_drafter:
        raise SystemExit(f"reference drafter {reference!r} is not in the runs (drafters: {sorted(by_drafter)})")
    datasets = sorted({d for recs in by_drafter.values() for d, _ in recs},
                      key=lambda d: (domain_sort_key(domains[d]), d))
    doms = list(dict.fromkeys(domains[d] for d in datasets))
    names = [n for n in MODEL_DRAFTERS if n in by_drafter] + sorted(set(by_drafter) - set(MODEL_DRAFTERS))
    keys = {d: sorted(k for k in next(iter(by_drafter.values())) if k[0] == d) for d in datasets}
    data = {n: {d: per_prompt(by_drafter[n], keys[d], gamma) for d in datasets} for n in names}
    rng = np.random.default_rng(0)
    idx = {d: rng.integers(0, len(keys[d]), size=(n_boot, len(keys[d]))) for d in datasets}

    def taus(n: str, boot: bool) -> dict[str, np.ndarray]:  # per dataset: tau, or [n_boot] resampled taus
        out = {}
        for d in datasets:
            t = data[n][d][0]
            s = t[idx[d]].sum(1) if boot else t.sum(0)
            out[d] = s[..., 0] / np.maximum(s[..., 1], 1)
        return out

    def aggregate(t: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {dom: np.mean([t[d] for d in datasets if domains[d] == dom], axis=0) for dom in doms}
        out["macro"] = np.mean([t[d] for d in datasets], axis=0)
        return out

    def ci(x: np.ndarray) -> list[float]:
        return [float(v) for v in np.quantile(x, [0.025, 0.975])]

    point = {n: taus(n, False) for n in names}
    boot = {n: taus(n, True) for n in names}
    table = {}
    for n in names:
        agg, agg_b = aggregate(point[n]), aggregate(boot[n])
        table[n] = {
            "datasets": {d: {"tau": float(point[n][d]), "ci95": ci(boot[n][d]), "prompts": len(keys[d])}
                         for d in datasets},
            **{k: {"tau": float(agg[k]), "ci95": ci(agg_b[k])} for k in agg}}
    gains = {}
    ref_pt, ref_b = aggregate(point[reference]), aggregate(boot[reference])
    for n in names:
        if n == reference:
            continue
        o_pt, o_b = aggregate(point[n]), aggregate(boot[n])
        gains[n] = {k: {"gain": float(ref_pt[k] / o_pt[k] - 1), "ci95": ci(ref_b[k] / o_b[k] - 1),
                        "share_above_0": float(np.mean(ref_b[k] > o_b[k]))} for k in ref_pt}
    positions = {}
    decay = {}
    for n in names:
        positions[n] = {}
        decay[n] = {}
        for dom in doms:
            ds = [d for d in datasets if domains[d] == dom]
            exam = sum(data[n][d][1].sum(0) for d in ds)
            acc = sum(data[n][d][2].sum(0) for d in ds)
            positions[n][dom] = [{"rate": (a / e) if e else None, "rounds": int(e), "wilson95": wilson(int(a), int(e))}
                                 for a, e in zip(acc, exam, strict=True)]
            ex_b = sum(data[n][d][1][idx[d]].sum(1) for d in ds)  # [n_boot, gamma]
            ac_b = sum(data[n][d][2][idx[d]].sum(1) for d in ds)
            rows = {}
            for k in range(1, min(gamma, 4)):
                if exam[k] < MIN_ROUNDS or not exam[0] or not acc[0]:
                    continue
                r_pt = (acc[k] / exam[k]) / (acc[0] / exam[0])
                with np.errstate(divide="ignore", invalid="ignore"):
                    r_b = (ac_b[:, k] / ex_b[:, k]) / (ac_b[:, 0] / ex_b[:, 0])
                rows[f"k{k + 1}/k1"] = {"ratio": float(r_pt), "ci95": ci(r_b[np.isfinite(r_b)])}
            decay[n][dom] = rows
    out = {"runs": [str(r) for r in runs], "gamma": gamma, "reference": reference, "bootstrap": n_boot,
           "datasets": datasets, "domains": {d: domains[d] for d in datasets}, "drafters": names, "tau": table,
           "gains": gains, "positions": positions, "decay": decay, "min_rounds": MIN_ROUNDS}
    if before:
        old, _, old_gamma = load(before)
        if old_gamma != gamma:
            raise SystemExit(f"--before runs used block size {old_gamma}, these {gamma}: not one protocol")
        shared = [n for n in names if n in old]
        if not shared:
            raise SystemExit(f"--before runs hold none of these drafters ({', '.join(names)})")
        if set(next(iter(old.values()))) != set(next(iter(by_drafter.values()))):
            raise SystemExit("--before runs decoded other prompts than these runs; the comparison is paired over "
                             "prompts, so they must hold the same ones")
        for n in shared:
            data[f"before:{n}"] = {d: per_prompt(old[n], keys[d], gamma) for d in datasets}
        change = {}
        for n in shared:
            now_pt, now_b = aggregate(point[n]), aggregate(boot[n])
            was_pt, was_b = aggregate(taus(f"before:{n}", False)), aggregate(taus(f"before:{n}", True))
            change[n] = {k: {"before": float(was_pt[k]), "now": float(now_pt[k]),
                             "change": float(now_pt[k] / was_pt[k] - 1), "ci95": ci(now_b[k] / was_b[k] - 1),
                             "share_above_0": float(np.mean(now_b[k] > was_b[k]))}
                         for k in now_pt}
        out["before"] = {"runs": [str(r) for r in before], "change": change}
    return out


def _iv(x: list[float] | None, spec: str = ".2f") -> str:
    return "–" if x is None else f"[{x[0]:{spec}}, {x[1]:{spec}}]"


def markdown(c: dict) -> str:
    ds, doms = c["datasets"], list(dict.fromkeys(c["domains"].values()))
    out = [f"Runs: {', '.join(c['runs'])}; block {c['gamma']}; first repeat; bootstrap {c['bootstrap']} resamples "
           "of prompts (paired, within each dataset).", "", "**Accepted length τ (Table 1)**", "",
           "| drafter | " + " | ".join(f"{d} (n={c['tau'][c['drafters'][0]]['datasets'][d]['prompts']})" for d in ds)
           + " | " + " | ".join(f"{m} mean" for m in doms) + " | macro |",
           "|---|" + "---:|" * (len(ds) + len(doms) + 1)]
    for n in c["drafters"]:
        t = c["tau"][n]
        out.append(f"| `{n}` | " + " | ".join(f"{t['datasets'][d]['tau']:.3f} {_iv(t['datasets'][d]['ci95'])}"
                                             for d in ds)
                   + " | " + " | ".join(f"{t[m]['tau']:.3f}" for m in doms)
                   + f" | **{t['macro']['tau']:.3f}** {_iv(t['macro']['ci95'], '.3f')} |")
    out += ["", f"**`{c['reference']}`'s relative gain in τ** (95% paired bootstrap interval; share of resamples "
            "above 0)", "", "| over | " + " | ".join(doms) + " | macro |", "|---|" + "---:|" * (len(doms) + 1)]
    for n, g in c["gains"].items():
        out.append(f"| `{n}` | " + " | ".join(
            f"{g[k]['gain']:+.1%} [{g[k]['ci95'][0]:+.1%}, {g[k]['ci95'][1]:+.1%}] ({g[k]['share_above_0']:.2f})"
            for k in [*doms, "macro"]) + " |")
    gamma = c["gamma"]
    out += ["", "**Conditional acceptance per draft position (Figure 2)**, 95% Wilson interval over rounds; "
            f"(rate, n) where fewer than {c['min_rounds']} rounds tested the position", "",
            "| domain | drafter | " + " | ".join(f"k={k}" for k in range(1, gamma + 1)) + " |",
            "|---|---|" + "---:|" * gamma]
    for dom in doms:
        for n in c["drafters"]:
            cells = []
            for p in c["positions"][n][dom]:
                if not p["rounds"]:
                    cells.append("–")
                elif p["rounds"] < c["min_rounds"]:
                    cells.append(f"({p['rate']:.2f}, n={p['rounds']})")
                else:
                    cells.append(f"{p['rate']:.2f} {_iv(p['wilson95'])}")
            out.append(f"| {dom} | `{n}` | " + " | ".join(cells) + " |")
    out += ["", "**Decay along the block**: conditional acceptance at position k over position 1 (1.0 = flat), "
            "95% paired bootstrap interval over prompts", "", "| domain | drafter | k2/k1 | k3/k1 | k4/k1 |",
            "|---|---|---:|---:|---:|"]
    for dom in doms:
        for n in c["drafters"]:
            d = c["decay"][n][dom]
            if not d:
                continue
            out.append(f"| {dom} | `{n}` | " + " | ".join(
                f"{d[k]['ratio']:.2f} {_iv(d[k]['ci95'])}" if k in d else "–" for k in ("k2/k1", "k3/k1", "k4/k1"))
                + " |")
    if "before" in c:
        out += ["", f"**τ against the earlier runs** ({', '.join(c['before']['runs'])}): the same drafter with its "
                "earlier weights on the same prompts and seeds; before → now, change with a 95% paired bootstrap "
                "interval (share of resamples above 0)", "", "| drafter | " + " | ".join(doms) + " | macro |",
                "|---|" + "---:|" * (len(doms) + 1)]
        for n, g in c["before"]["change"].items():
            out.append(f"| `{n}` | " + " | ".join(
                f"{g[k]['before']:.3f} → {g[k]['now']:.3f}: {g[k]['change']:+.1%} "
                f"[{g[k]['ci95'][0]:+.1%}, {g[k]['ci95'][1]:+.1%}] ({g[k]['share_above_0']:.2f})"
                for k in [*doms, "macro"]) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--reference", default="dspark")
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    ap.add_argument("--before", type=Path, nargs="+", help="earlier runs of the same protocol to compare each "
                    "drafter with (its earlier weights)")
    a = ap.parse_args(argv)
    for r in [*a.runs, *(a.before or [])]:
        if not (r / "manifest.json").is_file():
            print(f"{r} is not a run folder (no manifest.json)", file=sys.stderr)
            return 2
    c = claims(a.runs, a.reference, a.boot, a.before)
    md = markdown(c)
    print(md, end="")
    if a.json:
        a.json.write_text(json.dumps(c, indent=1) + "\n")
    if a.md:
        a.md.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
