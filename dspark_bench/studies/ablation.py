"""Tables (and a figure) of the offline ablations, paper Figures 3 and 4, from the runs of recipes/gpu_ablation.sh
(``dspark-bench study ablation-table ROOT [--pack OUT]``).

ROOT holds ``eval/<variant><G>/`` run folders (variant: dspark, dspark-rnn, dflash, dspark-1l; G: the block size)
and ``train/<variant><G>/`` training runs. A run stopped at a deadline keeps the records it wrote, but requests
that finished before the stop are the quick ones among those in flight, so only the records of the complete
prefix of the run's prompts are used (:func:`dspark_bench.evaluation.runs.complete_prompts`; for the runs of
2026-11-30, decoded in chunks of ``concurrency`` prompts, that prefix is their complete chunks), and all runs are
compared on the prompts that every run completed.

``--pack OUT`` writes the result set: OUT/eval/<name>/ (manifest.json, the complete prompts' records as
records.jsonl.gz, summary.json recomputed from them), OUT/train/<name>/ (train_config.json, train_log.jsonl.gz),
OUT/ablation.json and OUT/ablation.md; and OUT/figure4.png when a PNG exporter is installed.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

from dspark_bench.core.records import record_to_dict
from dspark_bench.evaluation.metrics import group_summary, summarize
from dspark_bench.evaluation.runs import complete_prompts, read_manifest, read_records, write_json
from dspark_bench.train.curves import read_log


class AblationError(ValueError):
    """An ablation root whose runs cannot be compared."""


VARIANTS = ("dspark", "dspark-rnn", "dflash", "dspark-1l")
LAST_STEPS = 40  # training acceptance: mean over the last 40 steps (32 anchors x 4 sequences each)


def split_name(name: str) -> tuple[str, int]:
    m = re.fullmatch(r"(.+?)(\d+)", name)
    if not m or m.group(1) not in VARIANTS:
        raise AblationError(f"run folder {name!r}: expected <variant><G> with variant in {', '.join(VARIANTS)}")
    return m.group(1), int(m.group(2))


def complete_records(folder: Path) -> tuple[list, int]:
    """The records of the run's complete prompts (:func:`dspark_bench.evaluation.runs.complete_prompts`), and how
    many records were left out."""
    manifest, records = read_manifest(folder), read_records(folder)
    keep = {(p["dataset"], p["prompt_id"]) for p in complete_prompts(manifest, records)}
    kept = [r for r in records if (r.dataset, r.prompt_id) in keep]
    return kept, len(records) - len(kept)


def training(folder: Path) -> dict | None:
    """The training run's steps, seconds and its acceptance over the last LAST_STEPS steps; None without a log."""
    if not (folder / "train_log.jsonl").is_file() and not (folder / "train_log.jsonl.gz").is_file():
        return None
    rows = read_log(folder)
    last = rows[-LAST_STEPS:]
    k = len(last[0]["acceptance"])
    return {"steps": rows[-1]["step"], "seconds": sum(r["seconds"] for r in rows),
            "tau": sum(r["tau"] for r in last) / len(last),
            "acceptance": [sum(r["acceptance"][i] for r in last) / len(last) for i in range(k)]}


def collect(root: Path) -> dict:
    """Every run of ROOT/eval with its training run, summarized on the prompts every run completed."""
    runs = {}
    for folder in sorted((root / "eval").iterdir()):
        if not (folder / "manifest.json").is_file():
            continue
        variant, g = split_name(folder.name)
        manifest = read_manifest(folder)
        if int(manifest["args"]["block_size"]) != g:
            raise AblationError(f"{folder}: block size {manifest['args']['block_size']} does not match its name")
        kept, dropped = complete_records(folder)
        runs[folder.name] = {"variant": variant, "G": g, "folder": folder, "records": kept, "dropped": dropped,
                             "train": training(root / "train" / folder.name)}
    common = set.intersection(*({(r.dataset, r.prompt_id) for r in v["records"]} for v in runs.values()))
    if not common:
        raise AblationError("no prompt was completed by every run")
    for v in runs.values():
        mine = [r for r in v["records"] if (r.dataset, r.prompt_id) in common]
        v["summary"] = group_summary(mine, v["G"])
    return {"runs": runs, "common": sorted(common)}


def _f(x, spec=".3f") -> str:
    return "–" if x is None else format(x, spec)


def markdown(data: dict) -> str:
    """The tables ``dspark-bench study ablation-table`` prints."""
    runs, common = data["runs"], data["common"]
    datasets = sorted({d for d, _ in common})
    out = [f"Evaluation prompts: the {len(common)} prompts every run completed ({', '.join(datasets)}).", ""]
    out += ["### Figure 4: τ against the block size G (draft length G + 1)", "",
            "| variant | G | eval τ | 95% CI | Δ vs dflash (eval) | training τ | Δ vs dflash (training) |",
            "|---|---:|---:|---|---:|---:|---:|"]
    for g in sorted({v["G"] for v in runs.values()}):
        base = runs.get(f"dflash{g}")
        for variant in VARIANTS:
            v = runs.get(f"{variant}{g}")
            if v is None:
                continue
            s, t = v["summary"], v["train"] or {}
            rel = (s["tau"] / base["summary"]["tau"] - 1) * 100 if base else None
            trel = (t["tau"] / base["train"]["tau"] - 1) * 100 if base and base["train"] and t else None
            ci = s["tau_ci95"]
            out.append(f"| {variant} | {g} | {_f(s['tau'])} | {_f(ci[0])}–{_f(ci[1])} | {_f(rel, '+.1f')}% | "
                       f"{_f(t.get('tau'))} | {_f(trel, '+.1f')}% |")
    out += ["", "### Conditional acceptance by position (evaluation; positions reached by fewer than 30 rounds: –)", "",
            "| run | n rounds | positions 1.. |", "|---|---:|---|"]
    for name, v in sorted(runs.items(), key=lambda kv: (kv[1]["G"], VARIANTS.index(kv[1]["variant"]))):
        s = v["summary"]
        pos = s["positions"]
        cond = [c if e >= 30 else None for c, e in zip(pos["conditional"], pos["examined"], strict=True)]
        out.append(f"| {name} | {s['rounds']} | {' '.join(_f(c, '.2f') for c in cond)} |")
    out += ["", "### Training acceptance by position (mean of the last 40 steps)", "",
            "| run | steps | s | positions 1.. |", "|---|---:|---:|---|"]
    for name, v in sorted(runs.items(), key=lambda kv: (kv[1]["G"], VARIANTS.index(kv[1]["variant"]))):
        t = v["train"]
        if t:
            out.append(f"| {name} | {t['steps']} | {t['seconds']:.0f} | {' '.join(f'{a:.2f}' for a in t['acceptance'])} |")
    dropped = ", ".join(f"{n} {v['dropped']}" for n, v in sorted(runs.items()) if v["dropped"])
    out += ["", f"Records left out (incomplete chunks): {dropped or 'none'}"]
    return "\n".join(out) + "\n"


def figure4(data: dict):
    """tau against the draft length G + 1 per variant, evaluation (with its interval) and training: a plotly
    figure, unstyled."""
    import plotly.graph_objects as go

    fig = go.Figure()
    colours = {"dspark": "#1f77b4", "dspark-rnn": "#9467bd", "dflash": "#ff7f0e"}
    for variant, colour in colours.items():
        pts = sorted(((v["G"], v) for v in data["runs"].values() if v["variant"] == variant), key=lambda p: p[0])
        if not pts:
            continue
        tau = [v["summary"]["tau"] for _, v in pts]
        ci = [v["summary"]["tau_ci95"] for _, v in pts]
        fig.add_trace(go.Scatter(x=[g + 1 for g, _ in pts], y=tau, name=f"{variant} (eval)", mode="lines+markers",
                                 line={"color": colour},
                                 error_y={"type": "data", "symmetric": False, "thickness": 1,
                                          "array": [c[1] - t for c, t in zip(ci, tau, strict=True)],
                                          "arrayminus": [t - c[0] for c, t in zip(ci, tau, strict=True)]}))
        fig.add_trace(go.Scatter(x=[g + 1 for g, _ in pts], y=[v["train"]["tau"] for _, v in pts],
                                 name=f"{variant} (training)", mode="lines+markers", line={"color": colour, "dash": "dot"}))
    fig.update_xaxes(title_text="draft length G + 1", tickvals=sorted({v["G"] + 1 for v in data["runs"].values()}))
    fig.update_yaxes(title_text="τ (tokens per round)")
    return fig


FIGURE4_TITLE = "τ against draft length (paper Figure 4), SmolLM2-135M, 480 training steps"


def pack(data: dict, out: Path) -> None:
    """Write the result set (module docstring) but the figure (:func:`figure4`, styled and exported by the
    command)."""
    for name, v in data["runs"].items():
        dest = out / "eval" / name
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(v["folder"] / "manifest.json", dest / "manifest.json")
        lines = "".join(json.dumps(record_to_dict(r)) + "\n" for r in v["records"])
        (dest / "records.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
        write_json(dest / "summary.json", summarize(v["records"], v["G"]))
        src = v["folder"].parent.parent / "train" / name
        if (src / "train_config.json").is_file():
            (out / "train" / name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / "train_config.json", out / "train" / name / "train_config.json")
            packed = out / "train" / name / "train_log.jsonl.gz"
            if (src / "train_log.jsonl").is_file():
                packed.write_bytes(gzip.compress((src / "train_log.jsonl").read_bytes(), mtime=0))
            else:  # ROOT is itself a packed result set
                shutil.copyfile(src / "train_log.jsonl.gz", packed)
    table = {name: {"variant": v["variant"], "G": v["G"], "eval": {k: v["summary"][k] for k in
                    ("n_requests", "rounds", "tau", "tau_ci95", "positions", "histogram", "markov_head_share")},
                    "train": v["train"], "dropped_records": v["dropped"]} for name, v in data["runs"].items()}
    write_json(out / "ablation.json", {"common_prompts": [list(p) for p in data["common"]], "runs": table})
    (out / "ablation.md").write_text(markdown(data))
