"""dspark_bench.studies.ablation and ``dspark-bench study ablation-table``: the ablation runs compared on the prompts every
run completed, with their training runs' acceptance, and the packed result set."""

from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from dspark_bench.cli.study import ablation_table
from dspark_bench.core.records import RequestRecord
from dspark_bench.evaluation.runs import SCHEMA_VERSION, RunWriter, read_records
from dspark_bench.studies import ablation

PROMPTS = [{"dataset": "gsm8k", "domain": "math", "prompt_id": f"p{i}", "index": i} for i in range(6)]


def _eval(root, name, gamma, accept, stop_after=None, skip=None):
    """A run of ``name`` on PROMPTS, every round accepting ``accept`` drafts; ``stop_after``: only the first prompts
    have records (a run stopped at its deadline), ``skip``: a prompt whose request was still running then."""
    manifest = {"schema_version": SCHEMA_VERSION, "prompts": PROMPTS,
                "args": {"block_size": gamma, "drafters": ["dspark"], "repeats": 1, "concurrency": 2}}
    with RunWriter(root / "eval" / name, manifest) as w:
        for p in PROMPTS[:stop_after]:
            if p["prompt_id"] == skip:
                continue
            rounds = ((gamma, gamma, accept, accept + 1),) * 10
            w.add(RequestRecord("dspark", "fixed", "gsm8k", "math", p["prompt_id"], p["index"], 0, 1, 2, "ok",
                                "length", 4, (1,) * (1 + 10 * (accept + 1)), rounds, ((0.0, 0.01, 0.0, 0.0),) * 10,
                                0.1, 0.1))


def _train(root, name, taus):
    folder = root / "train" / name
    folder.mkdir(parents=True)
    lines = [json.dumps({"step": i + 1, "tau": t, "acceptance": [t - 1, 0.1], "seconds": 1.0})
             for i, t in enumerate(taus)]
    (folder / "train_log.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "train_config.json").write_text(json.dumps({"steps": len(taus)}))


def _root(tmp_path):
    _eval(tmp_path, "dspark3", 3, 2, skip="p3")  # p4 and p5 finished after a request still running: left out
    _eval(tmp_path, "dflash3", 3, 1, stop_after=5)
    _train(tmp_path, "dspark3", [1.0] * 10 + [2.0] * 40)
    _train(tmp_path, "dflash3", [1.5] * 50)
    return tmp_path


def test_runs_are_compared_on_the_prompts_every_run_completed(tmp_path):
    data = ablation.collect(_root(tmp_path))
    assert data["common"] == [("gsm8k", f"p{i}") for i in range(3)]
    dspark, dflash = data["runs"]["dspark3"], data["runs"]["dflash3"]
    assert dspark["dropped"] == 2 and dflash["dropped"] == 0  # dflash's prefix p0-p4 is complete, beyond dspark's
    assert dspark["summary"]["n_requests"] == 3 and dspark["summary"]["tau"] == pytest.approx(3.0)
    assert dflash["summary"]["tau"] == pytest.approx(2.0)
    assert dspark["train"]["tau"] == pytest.approx(2.0) and dspark["train"]["steps"] == 50  # the last 40 steps
    assert dspark["train"]["acceptance"] == pytest.approx([1.0, 0.1]) and dspark["train"]["seconds"] == 50
    md = ablation.markdown(data)
    assert "| dspark | 3 | 3.000 |" in md and "| +50.0% | 2.000 | +33.3% |" in md
    assert "Records left out (incomplete chunks): dspark3 2" in md


def test_pack_writes_the_result_set_and_the_command_prints_the_tables(tmp_path):
    root = _root(tmp_path / "root")
    done = CliRunner().invoke(ablation_table, [str(root), "--pack", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    assert done.output.startswith(ablation.markdown(ablation.collect(root)))
    assert (out / "ablation.md").read_text() == ablation.markdown(ablation.collect(root))
    table = json.loads((out / "ablation.json").read_text())
    assert table["runs"]["dspark3"]["dropped_records"] == 2 and len(table["common_prompts"]) == 3
    assert len(read_records(out / "eval" / "dspark3")) == 3  # the complete prompts' records
    log = gzip.decompress((out / "train" / "dspark3" / "train_log.jsonl.gz").read_bytes())
    assert log == (root / "train" / "dspark3" / "train_log.jsonl").read_bytes()
    again = CliRunner().invoke(ablation_table, [str(out), "--pack", str(tmp_path / "again")])  # a packed set packs
    assert again.exit_code == 0 and (tmp_path / "again" / "train" / "dflash3" / "train_log.jsonl.gz").is_file()


def test_run_folders_must_name_a_variant_and_its_block_size(tmp_path):
    _eval(tmp_path, "medusa3", 3, 1)
    with pytest.raises(ablation.AblationError, match="expected <variant><G>"):
        ablation.collect(tmp_path)
    (tmp_path / "eval" / "medusa3").rename(tmp_path / "eval" / "dspark7")
    done = CliRunner().invoke(ablation_table, [str(tmp_path)])
    assert done.exit_code == 2 and "does not match its name" in done.output
