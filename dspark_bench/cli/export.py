"""``dspark-bench export``: a trained drafter in another engine's checkpoint layout."""

from __future__ import annotations

from pathlib import Path

import click

from dspark_bench.cli.common import friendly, stdout
from dspark_bench.cli.run import check_out_folder


@click.command(name="export")
@click.option("--format", "fmt", required=True, type=click.Choice(["vllm"]),
              help="vllm: the layout vLLM's llama_eagle3 loads (speculative method eagle3, model=OUT).")
@click.option("--drafter", default="eagle3", show_default=True, type=click.Choice(["eagle3"]))
@click.option("--target", default="smollm2-135m", show_default=True, help="The target the drafter was trained for.")
@click.option("--checkpoint", "source", default=None, type=click.Path(path_type=Path),
              help="Our checkpoint folder. Default: the shipped one for --target.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Folder to write.")
@friendly
def export(fmt, drafter, target, source, out):
    """Write a trained drafter in another engine's checkpoint layout."""
    from dspark_bench.drafters.checkpoint import shipped_folder
    from dspark_bench.engines.vllm.export import export_vllm
    from dspark_bench.target.model import resolve_target

    check_out_folder(out)
    source = source or shipped_folder(Path(target).name, drafter)
    if source is None:
        raise click.BadParameter(f"no shipped {drafter} checkpoint for {target}: give --checkpoint")
    folder = export_vllm(Path(source), Path(resolve_target(target)), out)
    stdout.print(f"{drafter} from {source} written to [bold]{folder}[/] (vLLM: --drafter {drafter} "
                 f"--drafter-opt {drafter}.model={folder})")
