"""The offline protocol's claims, measured from its run folders: Table 1 with intervals, the paired gains, the
acceptance along the block (``dspark-bench study claims``), and the single-request table (``dspark-bench study r1-table``).

:func:`claims` reads run folders of the offline protocol (e.g. ``baselines/offline-smollm2-6k/a`` and ``.../b``),
which decoded the same prompts with the same seeds; each drafter may appear in one run only. Acceptance is read
from each drafter's first repeat. :func:`markdown` writes:

* tau per dataset with its 95% per-prompt bootstrap interval, the domain means (unweighted over the domain's
  datasets) and the macro average (unweighted over datasets), as in the paper's Table 1;
* the reference drafter's relative gain over every other model drafter per domain and macro, with a 95% interval
  from a **paired, stratified** bootstrap: within each dataset the same resampled prompts are used for both drafters,
  so the interval reflects the prompt sample, not the difference between two independent samples;
* conditional acceptance at each draft position per domain, with 95% Wilson intervals over rounds; positions tested
  in fewer than MIN_ROUNDS rounds are shown as (rate, n) and are not used in the decay figure below;
* each drafter's decay along the block: conditional acceptance at positions 2-4 over position 1 (Figure 2's flat
  curve against a decaying one), with an interval from the same paired bootstrap over prompts;
* with ``before``: each drafter's tau against the same drafter in earlier runs of the protocol (other weights, the
  same prompts and seeds), per domain and macro, with the same paired bootstrap: did new weights help.

Nothing here is tuned: the bootstrap seed is fixed (0) and every number comes from the records.

:func:`run_summary` reads one drafter of one run folder (tau, first-position acceptance, the drafting and verify
seconds per engine round, the drafting cost over a vanilla step, tokens/s and the speedup over ``none`` of the same
run); :func:`r1_rows` and :func:`r1_table` give every drafter of the single-request stage ``r1`` against ``none``.
Timings mean something only when the run had a quiet machine (see its manifest's load).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from dspark_bench.evaluation import suites
from dspark_bench.evaluation.metrics import MIN_ROUNDS, count_rounds, group_summary, wilson
from dspark_bench.evaluation.runs import MANIFEST, read_manifest, read_records


class ClaimsError(ValueError):
    """Run folders that cannot give the claims (not one protocol, a missing drafter, an errored request)."""




def domain_sort_key(domain: str) -> tuple[int, str]:
    """The suites' domain order (math, code, chat), then custom, then any other domain by name."""
    order = (*suites.domains(), suites.CUSTOM_DOMAIN)
    return (order.index(domain) if domain in order else len(order), domain)


def check_run_folders(folders: list[Path]) -> None:
    for folder in folders:
        if not (Path(folder) / MANIFEST).is_file():
            raise ClaimsError(f"{folder} is not a run folder (no {MANIFEST})")


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
                raise ClaimsError(f"{run}: {r.drafter} {r.dataset}/{r.prompt_id} errored ({r.error}); "
                                 "the claims need every request")
            here[r.drafter][(r.dataset, r.prompt_id)] = r
            domains[r.dataset] = r.domain
        for name, recs in here.items():
            if name == "none":
                continue
            if name in by_drafter:
                raise ClaimsError(f"drafter {name!r} appears in more than one run; pass each drafter once")
            by_drafter[name] = recs
    if len(gammas) != 1:
        raise ClaimsError(f"the runs used different block sizes {sorted(gammas)}; they are not one protocol")
    keys = {name: set(recs) for name, recs in by_drafter.items()}
    common = set.intersection(*keys.values()) if keys else set()
    for name, k in keys.items():
        if k != common:
            raise ClaimsError(f"drafter {name!r} decoded {len(k)} prompts, the others {len(common)} in common: "
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
    """The claims of the run folders ``runs`` (module docstring) as one JSON-ready dict; ``before``: earlier runs
    of the same protocol to compare each drafter with (its earlier weights)."""
    by_drafter, domains, gamma = load(runs)
    if reference not in by_drafter:
        raise ClaimsError(f"reference drafter {reference!r} is not in the runs (drafters: {sorted(by_drafter)})")
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
            raise ClaimsError(f"--before runs used block size {old_gamma}, these {gamma}: not one protocol")
        shared = [n for n in names if n in old]
        if not shared:
            raise ClaimsError(f"--before runs hold none of these drafters ({', '.join(names)})")
        if set(next(iter(old.values()))) != set(next(iter(by_drafter.values()))):
            raise ClaimsError("--before runs decoded other prompts than these runs; the comparison is paired over "
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


# ---- one drafter of one run, and the single-request stage -------------------------------------------------------
def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _round_means(records, column: int) -> float | None:
    """Mean over the engine rounds of one timing column (records of a batch share their rounds' times)."""
    return _mean([t[column] for r in records if r.ok for t in r.timings])


def run_summary(folder: Path, drafter: str) -> dict:
    """One drafter of one run folder, on all its prompts (first repeat for acceptance, every repeat for times):
    tau with its 95% bootstrap interval, the first-position acceptance (conditional acceptance at position 1) and
    the acceptance rate; the drafting cost per round, the mean ``draft_s`` of the engine rounds (drafter forward and
    sampling, one engine round of ``concurrency`` requests); the verify seconds per round; the vanilla step, the
    mean wall time of a ``none`` round of the same run; drafting cost / vanilla step; tokens/s and the speedup over
    ``none`` of the same run."""
    records = read_records(folder)
    manifest = read_manifest(folder)
    gamma = int(manifest["args"]["block_size"])
    mine = [r for r in records if r.drafter == drafter]
    none = [r for r in records if r.drafter == "none"]
    if not mine:
        raise ClaimsError(f"{folder} has no records of drafter {drafter!r} "
                          f"(drafters: {sorted({r.drafter for r in records})})")
    g = group_summary(mine, gamma, none)
    vanilla = _mean([sum(t[:3]) for r in none if r.ok for t in r.timings])
    draft = _round_means(mine, 0)
    return {
        "run": str(folder), "prompts": sorted({(r.dataset, r.prompt_id) for r in mine}), "requests": g["n_requests"],
        "errors": g["n_errors"], "rounds": g["rounds"], "tau": g["tau"], "tau_ci95": g["tau_ci95"],
        "first_position_acceptance": g["positions"]["conditional"][0], "acceptance_rate": g["acceptance_rate"],
        "draft_s_per_round": draft, "verify_s_per_round": _round_means(mine, 1), "vanilla_step_s": vanilla,
        "draft_over_vanilla_step": draft / vanilla if draft is not None and vanilla else None,
        "tokens_per_s": g["tokens_per_s"], "speedup_vs_none": g["speedup_vs_none"],
    }


def fmt(x, spec: str = ".3f") -> str:
    """A number, or a list of them in brackets; "-" for a missing one."""
    if x is None:
        return "-"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v, spec) for v in x) + "]"
    return format(x, spec)


def r1_rows(folder: Path) -> list[dict]:
    """:func:`run_summary` of every drafter of the run's manifest but ``none``, each with its ``drafter``."""
    drafters = [d for d in read_manifest(folder)["args"]["drafters"] if d != "none"]
    rows = [dict(run_summary(folder, d), drafter=d) for d in drafters]
    if not rows:
        raise ClaimsError(f"{folder} holds no drafter besides none")
    return rows


def r1_table(rows: list[dict]) -> str:
    lines = ["| drafter | tau [95%] | first-position acceptance | drafting ms / round | verify ms / round "
             "| drafting / vanilla step | tokens/s | speedup vs none |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = {k: None if r[k] is None else 1e3 * r[k] for k in ("draft_s_per_round", "verify_s_per_round")}
        lines.append(f"| {r['drafter']} | {fmt(r['tau'], '.3f')} {fmt(r['tau_ci95'], '.2f')} "
                     f"| {fmt(r['first_position_acceptance'], '.3f')} | {fmt(ms['draft_s_per_round'], '.1f')} "
                     f"| {fmt(ms['verify_s_per_round'], '.1f')} | {fmt(r['draft_over_vanilla_step'], '.3f')} "
                     f"| {fmt(r['tokens_per_s'], '.2f')} | {fmt(r['speedup_vs_none'], '.3f')} |")
    step = rows[0]["vanilla_step_s"] if rows else None
    lines.append(f"\nvanilla step (mean `none` round): {fmt(None if step is None else 1e3 * step, '.1f')} ms")
    return "\n".join(lines)
