"""``dspark-bench data ...`` and ``dspark-bench train``: parse options, call the library, show progress.

Attach to the main CLI with ``main.add_command(data)`` and ``main.add_command(train)``; standalone:
``python -m dspark_bench.cli.train data generate ...``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dspark_bench.cli.common import console, stdout
from dspark_bench.cli.common import friendly as _friendly


def _progress(label: str) -> Progress:
    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}"), console=console)


def _device(name: str, threads: int | None = None):
    """Resolve --device; --threads sets torch's CPU threads (1 is much faster on a CPU shared with other jobs)."""
    import torch

    from dspark_bench.target.model import pick_device

    if threads:
        torch.set_num_threads(threads)

    device = pick_device() if name == "auto" else torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter(f"--device {name}: CUDA is not available here")
    return device


def _dtype(name: str, device) -> str:
    return ("bf16" if device.type == "cuda" else "fp32") if name == "auto" else name


def _load_target(name: str, dtype: str, device):
    from dspark_bench.target.model import Target

    console.print(f"loading target [bold]{name}[/] ({dtype}, {device}) ...")
    return Target.load(name, dtype=dtype, device=device)


_DEVICE = click.option("--device", default="auto", show_default=True, help="auto (cuda if present), cpu, cuda, cuda:N.")
_THREADS = click.option("--threads", default=None, type=int, help="CPU threads for torch. Default: torch's choice.")
_DTYPE = click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "bf16", "fp32", "fp16"]),
                      help="Target weights; auto = bf16 on CUDA, fp32 on CPU.")


def _eval_texts() -> list[str]:
    """Every evaluation prompt, to guard the training prompts against overlap (tests show the generated set is
    disjoint without the guard, so a dataset whose package is missing is skipped with a warning)."""
    from dspark_bench.evaluation.suites import SuiteError, datasets, load_dataset

    texts = []
    for name in datasets():
        try:
            texts += [p.text for p in load_dataset(name, limit=None)]
        except SuiteError as exc:
            console.print(f"[yellow]warning:[/] overlap guard skips dataset {name!r}: {exc}")
    return texts


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def data() -> None:
    """Training data: prompts, target-regenerated responses, cached target features."""


@data.command()
@click.option("--n", default=4000, show_default=True, type=int, help="Number of prompts.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", required=True, help="JSONL file to write ({id, domain, text} per line).")
@_friendly
def prompts(n, seed, out):
    """Write the generated training prompts (disjoint from every evaluation suite) for inspection."""
    from dspark_bench.train.prompts import build_prompts

    items = build_prompts(n, seed, _eval_texts())
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("".join(json.dumps({"id": p.id, "domain": p.domain, "text": p.text}) + "\n" for p in items))
    stdout.print(f"{len(items)} prompts written to [bold]{out}[/]")


@data.command()
@click.option("--target", default="smollm2-135m", show_default=True)
@click.option("--n", default=4000, show_default=True, type=int, help="Number of prompts.")
@click.option("--seed", default=0, show_default=True, type=int, help="Prompt set and sampling seed.")
@click.option("--out", required=True, help="Data folder (resumable: existing complete shards are kept).")
@click.option("--batch-size", default=32, show_default=True, type=int, help="Prompts per generate() call.")
@click.option("--shard-size", default=256, show_default=True, type=int, help="Prompts per flushed shard.")
@click.option("--max-new-tokens", default=384, show_default=True, type=int)
@click.option("--temperature", default=0.7, show_default=True, type=float)
@click.option("--top-p", default=0.8, show_default=True, type=float)
@click.option("--top-k", default=20, show_default=True, type=int)
@click.option("--max-shards", default=None, type=int, help="Stop after this many new shards (resume later).")
@_DEVICE
@_DTYPE
@_THREADS
@_friendly
def generate(target, n, seed, out, batch_size, shard_size, max_new_tokens, temperature, top_p, top_k, max_shards,
             device, dtype, threads):
    """Regenerate responses with the target (reference 7.2): T=0.7, top-p 0.8, top-k 20, single user turn."""
    from dspark_bench.train.data import GenerationSpec
    from dspark_bench.train.data import generate as run_generation
    from dspark_bench.train.prompts import build_prompts

    dev = _device(device, threads)
    spec = GenerationSpec(target, n, seed, temperature, top_p, top_k, max_new_tokens, batch_size, shard_size,
                          _dtype(dtype, dev))
    items = build_prompts(n, seed, _eval_texts())
    tgt = _load_target(target, spec.dtype, dev)
    stats = {"tokens": 0, "seconds": 0.0}
    with _progress("generating") as progress:
        task = progress.add_task("", total=n)

        def on_shard(report) -> None:
            stats["tokens"] += report.new_tokens
            stats["seconds"] += report.seconds
            rate = stats["tokens"] / max(stats["seconds"], 1e-9)
            progress.update(task, advance=report.rows, description=f"shard {report.index}  {rate:.0f} new tok/s")

        done = run_generation(tgt, items, out, spec, max_shards=max_shards, on_shard=on_shard)
        progress.update(task, completed=done)
    rate = stats["tokens"] / stats["seconds"] if stats["seconds"] else 0.0
    stdout.print(f"{done}/{n} rows in [bold]{out}[/]; this run: {stats['tokens']} tokens in "
                 f"{stats['seconds']:.1f} s ({rate:.1f} tok/s)")


@data.command()
@click.option("--data", "data_dir", required=True, help="Data folder from `data generate` (read only; a folder still "
              "being generated is read up to its last complete shard).")
@click.option("--size", default=8192, show_default=True, type=click.IntRange(min=1),
              help="N, the draft vocabulary size.")
@click.option("--out", default=None, help="Write the list here (JSON), for --drafter-opt NAME.draft_vocab=FILE.")
@click.option("--coverage", "sizes", default="4096,8192,16384,32768", show_default=True,
              help="Also report the share of response tokens covered by the top N for these N.")
@click.option("--max-length", default=2048, show_default=True, type=int)
@click.option("--target", default=None, help="Default: the target that generated the data.")
@_friendly
def vocab(data_dir, size, out, sizes, max_length, target):
    """Build the reduced draft vocabulary (the N most frequent response tokens) and report coverage."""
    from dspark_bench.drafters import vocab as dv
    from dspark_bench.train.data import complete_sequences

    sizes = _positive_ints(sizes, "--coverage")
    seqs, rows = complete_sequences(data_dir, max_length)
    tgt = _load_target(target or _data_target(data_dir), "fp32", _device("cpu"))  # only its vocabulary is read
    counts = dv.token_counts(dv.response_tokens(seqs), tgt.vocab_size)
    special = dv.special_ids(tgt)
    stdout.print(f"{len(seqs)} sequences from {rows} rows of complete shards, {int(counts.sum())} response tokens, "
                 f"{int((counts > 0).sum())} distinct; {len(special)} always-kept special ids")
    for n in sorted({*sizes, size}):
        if len(special) <= n <= tgt.vocab_size:
            stdout.print(f"  top {n:>6}: covers {dv.coverage(counts, dv.build_vocab(counts, n, special)):.4%}")
    if out:
        ids = dv.build_vocab(counts, size, special)
        info = {"data": str(data_dir), "data_manifest_sha256": _manifest_hash(data_dir), "rows": rows,
                "sequences": len(seqs), "target": tgt.name, "coverage": dv.coverage(counts, ids)}
        stdout.print(f"draft vocabulary of {size} ids written to [bold]{dv.write_vocab(out, ids, info)}[/]")


def _positive_ints(value: str, option: str) -> tuple[int, ...]:
    """A comma list of positive integers (empty: none)."""
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        out = (0,)
    if out and min(out) < 1:
        raise click.UsageError(f"{option} {value!r}: expected a comma list of positive integers, e.g. 4096,8192")
    return out


def _taps_option(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(t) for t in value.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"--taps {value!r}: expected layer ids like 1,8,15,21,28") from None


@data.command()
@click.option("--data", "data_dir", required=True, help="Data folder from `data generate`.")
@click.option("--out", default=None, help="Cache folder. Default: DATA/features.")
@click.option("--taps", default=None, help="Target layers to store, e.g. 1,8,15,21,28. Default: the drafters' default.")
@click.option("--batch-size", default=8, show_default=True, type=int)
@click.option("--max-length", default=2048, show_default=True, type=int)
@_DEVICE
@_DTYPE
@_THREADS
@_friendly
def features(data_dir, out, taps, batch_size, max_length, device, dtype, threads):
    """Cache target features (tapped layers + final hidden, bf16 safetensors shards) for training.

    Resumable: an interrupted run continues from its last complete shard when run again with the same options."""
    dev = _device(device, threads)
    tgt = _load_target(_data_target(data_dir), _dtype(dtype, dev), dev)
    manifest = _build_cache(tgt, data_dir, Path(out or Path(data_dir) / "features"), _taps_option(taps), batch_size,
                            max_length)
    stdout.print(f"{manifest['tokens']} tokens, {manifest['bytes'] / 1e9:.2f} GB "
                 f"({manifest['bytes'] / manifest['tokens']:.0f} B/token) in [bold]{out or Path(data_dir) / 'features'}[/]")


@data.command()
@click.option("--drafter", "drafters", required=True, multiple=True, metavar="FOLDER",
              help="A trained drafter checkpoint (repeat to score several on the same slots).")
@click.option("--data", "data_dir", required=True, help="Data folder from `data generate` whose sequences to score.")
@click.option("--n", default=128, show_default=True, type=click.IntRange(min=1),
              help="Score the first N usable sequences.")
@click.option("--exclude", "exclude_dirs", multiple=True, metavar="DATA",
              help="Drop sequences whose prompt is one of this (training) data folder's prompts, generated or still "
                   "to be; repeatable.")
@click.option("--num-anchors", default=64, show_default=True, type=click.IntRange(min=1),
              help="Scored positions per sequence (block drafters and Eagle3; MTP scores every position).")
@click.option("--seed", default=0, show_default=True, type=int, help="Anchor draws (the same for every drafter).")
@click.option("--max-length", default=2048, show_default=True, type=int)
@click.option("--draft-vocab", "draft_vocab", default=None, metavar="full|FILE",
              help="Score every drafter over this draft vocabulary instead of its checkpoint's list: 'full' (the "
                   "whole LM head) or a list from `dspark-bench data vocab`. Default: each checkpoint's own.")
@click.option("--json", "json_out", default=None, help="Also write the scores here (JSON).")
@_DEVICE
@_DTYPE
@_THREADS
@_friendly
def score(drafters, data_dir, n, exclude_dirs, num_anchors, seed, max_length, draft_vocab, json_out, device, dtype,
          threads):
    """Teacher-forced acceptance of trained drafters on held-out sequences: per draft position the exact
    probability (over the full vocabulary) that speculative sampling at T = 1 accepts it, and the tau it implies."""
    from dspark_bench.drafters import vocab
    from dspark_bench.train.features import OnlineFeatures
    from dspark_bench.train.heldout import HeldOut, load_module

    if draft_vocab is not None and draft_vocab != vocab.FULL:
        try:
            vocab.read_vocab(draft_vocab)
        except vocab.VocabError as exc:
            raise click.BadParameter(str(exc), param_hint="--draft-vocab") from None
    dev = _device(device, threads)
    seqs, dropped, _ = _heldout_seqs(data_dir, n, exclude_dirs, max_length, "--data")
    tgt = _load_target(_data_target(data_dir), _dtype(dtype, dev), dev)
    results, sets = {}, {}
    for folder in drafters:
        m, options, module = load_module(folder, tgt, num_anchors)
        vocab.choose(module, draft_vocab)
        taps = m.taps(tgt, options)
        if taps not in sets:  # features once per tap set
            sets[taps] = HeldOut(seqs, OnlineFeatures(tgt, taps), seed=seed)
        result = sets[taps].score(module, m.loss_kwargs(options))
        results[folder] = {"method": m.name, **result.to_json()}
        acc = " ".join(f"{a:.3f}" for a in result.acceptance)
        stdout.print(f"{folder}  ({m.name})  tau {result.tau:.3f}  acceptance [{acc}]  "
                     f"{result.sequences} sequences, {result.tokens} response tokens")
    if json_out:
        Path(json_out).write_text(json.dumps({"data": str(data_dir), "n": len(seqs), "dropped": dropped, "seed": seed,
                                              "num_anchors": num_anchors, "exclude": list(exclude_dirs),
                                              "draft_vocab": draft_vocab or "checkpoint",
                                              "scores": results}, indent=2) + "\n")


def _data_target(data_dir: str) -> str:
    from dspark_bench.train.data import read_manifest

    return read_manifest(data_dir)["spec"]["target"]


def _build_cache(tgt, data_dir, out: Path, taps, batch_size: int, max_length: int) -> dict:
    from dspark_bench.drafters.blockdraft import default_taps
    from dspark_bench.train.data import load_sequences
    from dspark_bench.train.features import write_cache

    seqs = load_sequences(data_dir, max_length)
    taps = taps or default_taps(tgt.num_layers)
    source = {"data": str(data_dir), "data_manifest_sha256": _manifest_hash(data_dir), "max_length": max_length}
    with _progress("target features") as progress:
        task = progress.add_task("", total=sum(len(s.input_ids) for s in seqs))
        return write_cache(tgt, seqs, taps, out, batch_size, source=source,
                           on_batch=lambda n: progress.update(task, advance=n))


def _manifest_hash(data_dir) -> str:
    return hashlib.sha256((Path(data_dir) / "manifest.json").read_bytes()).hexdigest()


def _feature_source(mode: str, tgt, data_dir: str, taps: tuple[int, ...], max_length: int):
    """``online``, a cache folder, or ``auto``: online on CUDA, else DATA/features (built once if missing)."""
    from dspark_bench.train.features import MANIFEST, FeatureCache, OnlineFeatures

    if mode == "online" or (mode == "auto" and tgt.device.type == "cuda"):
        return OnlineFeatures(tgt, taps), "online"
    folder = Path(data_dir) / "features" if mode == "auto" else Path(mode)
    if mode == "auto" and not (folder / MANIFEST).exists():
        console.print(f"no feature cache yet: computing it once in [bold]{folder}[/] (shared by every method)")
        _build_cache(tgt, data_dir, folder, None, 8, max_length)
    return FeatureCache(folder, tgt, taps), str(folder)


def _heldout_seqs(folder: str, n: int, exclude: tuple[str, ...], max_length: int, hint: str):
    """The first ``n`` usable sequences of ``folder`` whose prompt is no prompt of the data folders ``exclude``
    (each named once), how many rows were dropped for that, and the folders; a clear error when none is left."""
    from dspark_bench.train.heldout import heldout_sequences

    exclude = tuple(dict.fromkeys(exclude))
    seqs, dropped = heldout_sequences(folder, exclude, max_length)
    if not seqs:
        raise click.BadParameter(f"{folder}: no usable sequence ({dropped} rows dropped: their prompt is a prompt "
                                 f"of {', '.join(exclude)})", param_hint=hint)
    return seqs[:n], dropped, exclude


def _heldout(folder: str, n: int, max_length: int, exclude: tuple[str, ...], tgt, taps: tuple[int, ...]):
    """The held-out set of ``train --heldout``, with its features computed now (one target forward)."""
    from dspark_bench.train.features import OnlineFeatures
    from dspark_bench.train.heldout import HeldOut

    seqs, dropped, exclude = _heldout_seqs(folder, n, exclude, max_length, "--heldout")
    console.print(f"held-out set: {len(seqs)} sequences of {folder} ({dropped} rows dropped: their prompt "
                  f"is a prompt of {', '.join(exclude)})")
    return HeldOut(seqs, OnlineFeatures(tgt, taps))


@click.command()
@click.option("--method", required=True, type=click.Choice(["dspark", "dflash", "eagle3", "mtp"]))
@click.option("--data", "data_dir", required=True, help="Data folder from `data generate`.")
@click.option("--out", required=True, help="Run folder (checkpoints, train_log.jsonl, final/).")
@click.option("--features", "feature_mode", default="auto", show_default=True,
              help="online | a cache folder | auto (online on CUDA, DATA/features on CPU, built if missing).")
@click.option("--steps", default=1000, show_default=True, type=int)
@click.option("--batch-size", default=8, show_default=True, type=int, help="Sequences per optimizer step.")
@click.option("--micro-batch", default=None, type=int, help="Sequences per forward (gradient accumulation).")
@click.option("--lr", default=6e-4, show_default=True, type=float)
@click.option("--warmup", default=None, type=int, help="Warm-up steps. Default: 4% of --steps.")
@click.option("--num-anchors", default=64, show_default=True, type=int, help="dspark/dflash/eagle3: anchors (scored positions) per sequence.")
@click.option("--block-size", default=7, show_default=True, type=int, help="dspark/dflash: block size G.")
@click.option("--decay-gamma", default=4.0, show_default=True, type=float, help="dspark/dflash: gamma_w.")
@click.option("--num-layers", default=1, show_default=True, type=int, help="dspark/dflash: backbone layers.")
@click.option("--markov-rank", default=64, show_default=True, type=int, help="dspark: Markov head rank.")
@click.option("--markov-head", default="vanilla", show_default=True, type=click.Choice(["vanilla", "gated", "rnn"]),
              help="dspark: Markov head variant (rnn: Figure 4's RNN head).")
@click.option("--ttt-length", default=7, show_default=True, type=int, help="eagle3: training-time-test steps.")
@click.option("--taps", default=None, help="Target layers, e.g. 1,8,15,21,28. Default: evenly spaced.")
@click.option("--draft-vocab", default=0, show_default=True, type=click.IntRange(min=0),
              help="Draft over the N most frequent response tokens of the data (EOS and special tokens "
                   "always in); the list ships with the checkpoint. 0: the full vocabulary.")
@click.option("--seed", default=42, show_default=True, type=int)
@click.option("--save-every", default=500, show_default=True, type=int)
@click.option("--max-length", default=2048, show_default=True, type=int)
@click.option("--target", default=None, help="Default: the target that generated the data.")
@click.option("--resume", "resume", flag_value="yes",
              help="Continue from the last checkpoint in --out (refused when there is none).")
@click.option("--resume-if-any", "resume", flag_value="if-any",
              help="Continue from the last checkpoint in --out if there is one, else start a fresh run there (for "
                   "scripts that are rerun until done).")
@click.option("--heldout", "heldout_dir", default=None, metavar="DATA",
              help="Score the drafter on sequences of this data folder (`data generate`, e.g. another seed) every "
                   "--heldout-every steps: exact teacher-forced acceptance, logged as `heldout` (see `data score`).")
@click.option("--heldout-n", default=128, show_default=True, type=click.IntRange(min=1),
              help="Held-out sequences (the first N usable).")
@click.option("--heldout-exclude", multiple=True, metavar="DATA",
              help="Also drop held-out sequences whose prompt is a prompt of this data folder (always: --data's).")
@click.option("--heldout-every", default=400, show_default=True, type=click.IntRange(min=1))
@click.option("--init-from", default=None, metavar="FOLDER",
              help="Start from this drafter checkpoint's weights (same method, target, architecture and draft "
                   "vocabulary), e.g. a shipped drafter given more steps: a new run with its own warm-up and cosine.")
@_DEVICE
@_DTYPE
@_THREADS
@_friendly
def train(method, data_dir, out, feature_mode, steps, batch_size, micro_batch, lr, warmup, num_anchors, block_size,
          decay_gamma, num_layers, markov_rank, markov_head, ttt_length, taps, draft_vocab, seed, save_every, max_length,
          target, resume, heldout_dir, heldout_n, heldout_exclude, heldout_every, init_from, device, dtype, threads):
    """Train a drafter on target-regenerated data (AdamW, warm-up + cosine, exact resume)."""
    from dspark_bench.train.data import load_sequences
    from dspark_bench.train.methods import MethodOptions
    from dspark_bench.train.methods import method as get_method
    from dspark_bench.train.trainer import RESUME_IF_ANY, TrainConfig, init_source, resume_point
    from dspark_bench.train.trainer import train as run_training

    start = init_source(init_from) if init_from else None  # a bad folder fails before the target loads
    if resume == "yes":
        console.print(f"resuming from [bold]{resume_point(out)}[/]")  # nothing to resume fails here
    resume = True if resume == "yes" else RESUME_IF_ANY if resume == "if-any" else False
    m, dev = get_method(method), _device(device, threads)
    options = MethodOptions(num_layers, markov_rank, block_size, num_anchors, decay_gamma, ttt_length, seed,
                            _taps_option(taps), markov_head, draft_vocab)
    seqs = load_sequences(data_dir, max_length)
    tgt = _load_target(target or _data_target(data_dir), _dtype(dtype, dev), dev)
    source, where = _feature_source(feature_mode, tgt, data_dir, m.taps(tgt, options), max_length)
    provenance = {"folder": str(data_dir), "manifest_sha256": _manifest_hash(data_dir), "sequences": len(seqs),
                  "features": where, "max_length": max_length}
    config = TrainConfig(method, steps, batch_size, micro_batch, lr, warmup, save_every, seed=seed,
                         options=options, data=provenance, init_from=start)
    console.print(f"training [bold]{method}[/] on {len(seqs)} sequences ({where} features), "
                  f"{m.used(options)}, {steps} steps x {batch_size} sequences"
                  + (f", from the weights of {init_from}" if init_from else ""))
    held = (_heldout(heldout_dir, heldout_n, max_length, (data_dir, *heldout_exclude), tgt, m.taps(tgt, options))
            if heldout_dir else None)
    with _progress(f"training {method}") as progress:
        task = progress.add_task("", total=steps)
        last = ""

        def on_step(r) -> None:
            nonlocal last
            acc = " ".join(f"{a:.2f}" for a in r.acceptance[:7])
            if r.heldout:
                last = f"  held-out tau {r.heldout['tau']:.3f} (step {r.step})"
            progress.update(task, completed=r.step, description=f"loss {r.loss:.3f}  tau {r.tau:.2f}  "
                            f"alpha [{acc}]  {r.tokens_per_s:.0f} tok/s{last}")

        final = run_training(config, m, tgt, seqs, source, out, resume=resume, on_step=on_step, heldout=held,
                             heldout_every=heldout_every)
    stdout.print(f"drafter written to [bold]{final}[/] (load with --drafter-opt {method}.checkpoint={final})")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log progress details.")
def cli(verbose: bool) -> None:
    """Training commands of dspark-bench (standalone entry; the main CLI attaches `data` and `train`)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


cli.add_command(data)
cli.add_command(train)

if __name__ == "__main__":
    cli()
