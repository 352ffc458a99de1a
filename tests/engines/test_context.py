"""Prompts the target cannot take: refused before any decoding, or cut from the side ``--truncate`` names, with
the cut prompts listed in the manifest (our engine on a tiny target whose context is 48 positions)."""

from __future__ import annotations

import pytest
from conftest import tiny_target

from dspark_bench.engines.base import EngineError, RunSpec, context_of, fit_prompts
from dspark_bench.engines.native.runner import Run
from dspark_bench.evaluation.runs import read_manifest, read_records
from dspark_bench.evaluation.suites import Prompt

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT = 48


def _prompts(*lengths: int) -> tuple[list[Prompt], list[list[int]]]:
    prompts = [Prompt("ds", "custom", f"p{i}", i, "x" * n) for i, n in enumerate(lengths)]
    return prompts, [list(range(3, 3 + n)) for n in lengths]


@pytest.mark.parametrize("length, fits", [(40, True), (41, False)])
def test_a_prompt_fits_when_its_length_plus_the_new_tokens_is_within_the_context(length, fits):
    prompts, ids = _prompts(length)
    spec = RunSpec(max_new_tokens=8)
    if fits:
        assert fit_prompts(prompts, ids, spec, CONTEXT) == ([tuple(ids[0])], [])
        return
    with pytest.raises(EngineError, match=r"prompt p0 \(ds\) has 41 tokens: with --max-new-tokens 8 it needs 49 "
                                          r"positions, beyond the target's context \(max_position_embeddings\) of 48; "
                                          r"give --truncate left\|right"):
        fit_prompts(prompts, ids, spec, CONTEXT)


def test_truncation_cuts_the_named_side_and_lists_each_cut_prompt():
    prompts, ids = _prompts(10, 50, 45)
    left, cut = fit_prompts(prompts, ids, RunSpec(max_new_tokens=8, truncate="left"), CONTEXT)
    right, _ = fit_prompts(prompts, ids, RunSpec(max_new_tokens=8, truncate="right"), CONTEXT)
    assert left[0] == right[0] == tuple(ids[0])  # a prompt that fits is never cut
    assert left[1] == tuple(ids[1][-40:]) and right[1] == tuple(ids[1][:40])
    assert len(left[2]) == len(right[2]) == 40
    assert cut == [{"dataset": "ds", "prompt_id": "p1", "prompt_tokens": 50, "kept_tokens": 40},
                   {"dataset": "ds", "prompt_id": "p2", "prompt_tokens": 45, "kept_tokens": 40}]


def test_refusals_count_the_other_long_prompts_and_new_tokens_that_leave_no_room():
    prompts, ids = _prompts(10, 50, 45)
    with pytest.raises(EngineError, match=r"prompt p1 .* \(1 more prompts are too long\)"):
        fit_prompts(prompts, ids, RunSpec(max_new_tokens=8), CONTEXT)
    with pytest.raises(EngineError, match="--max-new-tokens leaves no room for a prompt"):
        fit_prompts(prompts, ids, RunSpec(max_new_tokens=CONTEXT, truncate="left"), CONTEXT)
    with pytest.raises(EngineError, match="truncate 'middle'"):
        fit_prompts(prompts, ids, RunSpec(truncate="middle"), CONTEXT)
    assert fit_prompts(prompts, ids, RunSpec(max_new_tokens=8), None)[1] == []  # no known limit: nothing checked


def test_the_context_comes_from_the_config_or_its_text_model():
    from types import SimpleNamespace

    assert context_of(SimpleNamespace(max_position_embeddings=8192)) == 8192
    assert context_of(SimpleNamespace(text_config=SimpleNamespace(max_position_embeddings=4096))) == 4096
    assert context_of(SimpleNamespace()) is None


@pytest.fixture
def short_target(monkeypatch):
    """A tiny target whose config says it takes 48 positions; a prompt's text of n characters renders as n ids."""
    target = tiny_target("llama")
    target.config.max_position_embeddings = CONTEXT
    monkeypatch.setattr(target, "render", lambda text: [3 + (ord(c) % 90) for c in text])
    return target


def test_the_run_refuses_a_long_prompt_before_writing_or_decoding_anything(short_target, tmp_path):
    prompts = [Prompt("ds", "custom", "short", 0, "abc"), Prompt("ds", "custom", "long", 1, "y" * 45)]
    spec = RunSpec(target="tiny", drafters=("none",), max_new_tokens=8, warmup=False)
    with pytest.raises(EngineError, match="prompt long .* 45 tokens.* of 48"):
        Run(spec, short_target, prompts, tmp_path / "run").execute()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_run_decodes_a_cut_prompt_and_its_manifest_says_so(short_target, tmp_path, side):
    prompts = [Prompt("ds", "custom", "short", 0, "abc"), Prompt("ds", "custom", "long", 1, "y" * 30 + "z" * 30)]
    spec = RunSpec(target="tiny", drafters=("none", "ngram"), max_new_tokens=8, warmup=False, truncate=side)
    Run(spec, short_target, prompts, tmp_path / "run").execute()
    records, manifest = read_records(tmp_path / "run"), read_manifest(tmp_path / "run")
    assert all(r.ok for r in records) and len(records) == 4
    assert {r.prompt_id: r.prompt_len for r in records} == {"short": 3, "long": 40}
    assert manifest["args"]["truncate"] == side
    assert manifest["truncated"] == [{"dataset": "ds", "prompt_id": "long", "prompt_tokens": 60, "kept_tokens": 40}]
