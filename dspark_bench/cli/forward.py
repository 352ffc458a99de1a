"""``dspark-bench bench-forward``: the target's fast forward path against transformers' own (or against itself
without packed weights), interleaved."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from rich.table import Table

from dspark_bench.cli.common import DTYPE_OPTION, console, friendly, stdout
from dspark_bench.cli.run import check_out_folder

FORWARD_JSON = "forward_ab.json"


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise click.BadParameter(f"{option} must be a comma list of positive integers, got {text!r}")
    return values


@click.command(name="bench-forward")
@click.option("--target", default="smollm2-135m", show_default=True)
@DTYPE_OPTION
@click.option("--threads", default=None, type=click.IntRange(min=1), help="torch threads (default: torch's choice).")
@click.option("--rows", default="1,8", show_default=True, help="Comma list of batch sizes R of the timed steps.")
@click.option("--widths", default="1,8", show_default=True,
              help="Comma list of block widths L (1: a decode step; k + 1: a verify block).")
@click.option("--context", default=256, show_default=True, type=click.IntRange(min=1),
              help="Cached columns under every timed step.")
@click.option("--pairs", default=30, show_default=True, type=click.IntRange(min=1), help="Timed pairs per step shape.")
@click.option("--suite", default="all", show_default=True, help="Prompts of the generation measurement.")
@click.option("--limit", default=4, show_default=True, type=click.IntRange(min=1), help="Prompts per dataset.")
@click.option("--concurrency", default="1,8", show_default=True, help="Comma list of generation concurrencies.")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--generate-pairs", default=3, show_default=True, type=click.IntRange(min=1),
              help="Timed pairs of each generation.")
@click.option("--against", default="hf", show_default=True,
              type=click.Choice(["hf", "fast-unpacked", "fast-grouped", "fast-sdpa"]),
              help="The path the fast path is timed against: transformers' forward, the fast path without its "
                   "packed weights (what the packing alone is worth), with padded, length-grouped prefills (what "
                   "the prefill end to end is worth), or with SDPA in decode steps instead of our CPU attention "
                   "kernel (what the kernel is worth).")
@click.option("--out", required=True, type=click.Path(path_type=Path), help=f"Folder for {FORWARD_JSON}.")
@friendly
def bench_forward(target, dtype, threads, rows, widths, context, pairs, suite, limit, concurrency, max_new_tokens,
                  generate_pairs, against, out):
    """The fast forward path against the HF path (or --against fast-unpacked / fast-grouped / fast-sdpa) on one set
    of weights, alternated in pairs (fast then other, then other then fast, ...): target steps at each R x L, the
    prefill of the first C prompts at each generation concurrency C > 1, and greedy `none` generation. Ratios
    fast / other (< 1: fast is faster) are medians of per-pair ratios, so they hold on a loaded machine; absolute
    times do not."""
    import torch

    from dspark_bench.engines.native.runner import build_requests
    from dspark_bench.evaluation.runs import environment
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.studies.forward_ab import ForwardSpec, measure
    from dspark_bench.target.model import Target, resolve_dtype

    check_out_folder(out)
    if (Path(out) / FORWARD_JSON).exists():
        raise click.BadParameter(f"{out} already holds a {FORWARD_JSON}; choose another --out")
    spec = ForwardSpec(_ints(rows, "--rows"), _ints(widths, "--widths"), context, pairs,
                       _ints(concurrency, "--concurrency"), max_new_tokens, generate_pairs)
    prompts = load_suite(suite, limit)
    if threads:
        torch.set_num_threads(threads)
    dtype = resolve_dtype(dtype)
    tgt = Target.load(target, dtype=dtype, forward_path="hf")
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result = measure(tgt, build_requests(tgt, prompts, 980406), spec, log=console.print, against=against)
    result.update(target={"name": target, "dtype": dtype, "device": str(tgt.device)},
                  threads=torch.get_num_threads(), started=started, environment=environment())
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / FORWARD_JSON).write_text(json.dumps(result, indent=2) + "\n")
    table = Table(title=f"fast / {against} forward, {target} {dtype}, {torch.get_num_threads()} threads (medians "
                        "of pairs)")
    for col in ("measurement", "fast ms", f"{against} ms", f"fast / {against}"):
        table.add_column(col, justify="right")
    for s in result["steps"]:
        table.add_row(f"step R={s['rows']} L={s['width']} C={s['context']}", f"{s['fast_median_ms']:.1f}",
                      f"{s['other_median_ms']:.1f}", f"{s['ratio_fast_over_other']:.3f}")
    for f in result["prefill"]:
        table.add_row(f"prefill of {f['prompts']} prompts ({f['tokens']} tokens)", f"{f['fast_median_ms']:.0f}",
                      f"{f['other_median_ms']:.0f}", f"{f['ratio_fast_over_other']:.3f}")
    for g in result["generate"]:
        table.add_row(f"none x{g['requests']} c={g['concurrency']} ({'same' if g['same_tokens'] else 'other'} tokens)",
                      f"{g['fast_median_ms']:.0f}", f"{g['other_median_ms']:.0f}", f"{g['ratio_fast_over_other']:.3f}")
    stdout.print(table)
    stdout.print(f"written to {Path(out) / FORWARD_JSON}")
