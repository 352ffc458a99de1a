"""The vLLM fixes' pure parts (no vLLM needed): the expand contract, the option, the plugin's transport.
Against the installed CPU build (probe and the fix in vLLM's own registration): tests/engines/test_vllm_integration.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dspark_bench.engines.vllm import fixes as vllm_fixes
from dspark_bench.engines.vllm.fixes import (
    ENV,
    FixError,
    expand_tokens,
    expand_tokens_t2,
    facts,
    split_fixes,
    warnings_for,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_expand_tokens_writes_each_request_value_over_its_tokens(dtype):
    values, cu = torch.tensor([5, 0, 7, 2], dtype=dtype), torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    out = torch.full((6,), -1, dtype=dtype)
    expand_tokens(out, values, cu, 0, 1)  # request 1 has no token; 0 is read as 1 (vLLM's greedy temperature)
    assert out.tolist() == [5, 5, 7, 7, 7, 2]
    assert out.dtype == dtype


def test_expand_tokens_leaves_slots_past_the_last_request():
    out = torch.full((4,), -3.0)
    expand_tokens(out, torch.tensor([0.5]), torch.tensor([2]), 0, 1)
    assert out.tolist() == [0.5, 0.5, -3.0, -3.0]


def test_the_t2_fault_doubles_floating_values_and_leaves_integers():
    cu = torch.tensor([2, 2, 5, 6], dtype=torch.int32)
    out = torch.full((7,), -1.0)
    expand_tokens_t2(out, torch.tensor([1.0, 0.0, 0.5, 0.0]), cu, 0, 1)  # 0 read as 1 first, then doubled
    assert out.tolist() == [2.0, 2.0, 1.0, 1.0, 1.0, 2.0, -1.0]
    ints = torch.full((6,), -1, dtype=torch.int64)
    expand_tokens_t2(ints, torch.tensor([5, 0, 7, 2]), cu, 0, 1)
    assert ints.tolist() == [5, 5, 7, 7, 7, 2]


def test_fault_option_is_checked_and_refused_where_it_cannot_be_injected(monkeypatch):
    with pytest.raises(FixError, match="unknown fault verify-t3; known: verify-t2"):
        split_fixes({"fault": "verify-t3"})
    monkeypatch.setattr(vllm_fixes, "_cpu_utils", lambda: None)  # no vLLM CPU build: the control would do nothing
    with pytest.raises(FixError, match="verify-t2 replaces a kernel of vLLM's CPU build"):
        split_fixes({"fault": "verify-t2"})
    monkeypatch.setattr(vllm_fixes, "_cpu_utils", lambda: object())
    assert split_fixes({"fix": "cpu-expand", "fault": "verify-t2", "seed": 1}) == (("cpu-expand", "verify-t2"),
                                                                                 {"seed": 1})


def test_an_injected_fault_is_recorded_among_the_bugs_and_warned_about(monkeypatch):
    monkeypatch.setattr(vllm_fixes, "_cpu_utils", lambda: None)
    report = facts(("verify-t2",))
    assert report["verify-t2"] == {"present": True, "affects": vllm_fixes.FAULTS["verify-t2"].affects,
                                   "fixed": False, "injected": True}
    assert "verify-t2" not in facts(())  # a run without the fault does not list it
    lines = warnings_for(report, True)
    assert any("fault 'verify-t2' injected on purpose" in line for line in lines)
    # where the build has the bug, the fault's kernel replaced it: the bug says so and has no warning of its own
    monkeypatch.setitem(vllm_fixes.FIXES, "cpu-expand",
                        dataclasses.replace(vllm_fixes.FIXES["cpu-expand"], probe=lambda: True))
    report = facts(("verify-t2",))
    assert report["cpu-expand"]["present"] and report["cpu-expand"]["replaced_by"] == "verify-t2"
    assert not report["cpu-expand"]["fixed"]
    lines = warnings_for(report, True)
    assert len(lines) == 1 and "fault 'verify-t2'" in lines[0]
    assert "replaced_by" not in facts(())["cpu-expand"]
    assert len(warnings_for(facts(()), True)) == 1  # the bug alone warns


def test_fix_option_is_split_from_engine_options_and_checked():
    assert split_fixes({"fix": "cpu-expand", "max_num_seqs": 4}) == (("cpu-expand",), {"max_num_seqs": 4})
    assert split_fixes({"max_num_seqs": 4}) == ((), {"max_num_seqs": 4})
    with pytest.raises(FixError, match="unknown fix cpu-expnd; known: cpu-expand"):
        split_fixes({"fix": "cpu-expnd"})


def test_plugin_applies_only_the_fixes_named_in_its_environment(monkeypatch):
    applied = []
    monkeypatch.setattr(vllm_fixes, "FIXES", {"a": vllm_fixes.Fix("a", "x", lambda: True, lambda: applied.append("a")),
                                              "b": vllm_fixes.Fix("b", "y", lambda: True, lambda: applied.append("b"))})
    monkeypatch.delenv(ENV, raising=False)
    vllm_fixes.plugin()
    assert applied == []
    monkeypatch.setenv(ENV, "b")
    vllm_fixes.plugin()
    assert applied == ["b"]


def test_warnings_name_only_present_unfixed_bugs_of_speculative_sampled_runs():
    report = {"cpu-expand": {"present": True, "affects": "spec", "fixed": False},
              "other": {"present": False, "affects": "z", "fixed": False}}
    assert len(warnings_for(report, True)) == 1 and "cpu-expand" in warnings_for(report, True)[0]
    assert warnings_for(report, False) == []
    assert warnings_for({"cpu-expand": {**report["cpu-expand"], "fixed": True}}, True) == []
