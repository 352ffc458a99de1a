"""The host allocator policy (allocator.py): applied once, recorded, and it keeps freed memory in the process."""

import platform
import resource

import pytest
import torch

from dspark_bench.evaluation.runs import environment
from dspark_bench.target.allocator import host_allocator


def test_policy_is_applied_once_and_recorded():
    first = host_allocator()
    assert host_allocator() is first  # once per process
    assert environment()["machine"]["allocator"] == first


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0].startswith("glibc"),
                    reason="the policy is glibc's mallopt; other C libraries keep their own")
def test_a_freed_large_tensor_is_reused_without_faulting_its_pages_again():
    """A 64 MiB tensor allocated, written and freed ten times: under glibc's default policy each one maps fresh
    pages (16,384 minor faults each, measured); with the policy, once the heap has settled (a few allocations, while
    other objects still land between), each one reuses freed memory (0 faults measured)."""
    assert host_allocator() == {"M_TRIM_THRESHOLD": 1 << 30, "M_MMAP_MAX": 0}
    n = 16 << 20  # float32 elements: 64 MiB
    for _ in range(10):  # the heap settles
        torch.empty(n).fill_(1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        torch.empty(n).fill_(1.0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 16384 // 4, f"{faults} minor page faults for 10 reuses of a 64 MiB block (one mapping is 16384)"


def test_bf16_on_a_cpu_without_native_bf16_warns_and_nothing_else_does(monkeypatch):
    from dspark_bench.target import model as target

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert isinstance(target.cpu_has_native_bf16(), bool)
    monkeypatch.setattr(target, "cpu_has_native_bf16", lambda: False)
    note = target.slow_dtype_note("bf16", cpu)
    assert note and "--dtype fp32" in note and torch.backends.cpu.get_cpu_capability() in note
    assert target.slow_dtype_note("fp32", cpu) is None and target.slow_dtype_note("fp16", cpu) is None
    assert target.slow_dtype_note("bf16", cuda) is None
    monkeypatch.setattr(target, "cpu_has_native_bf16", lambda: True)
    assert target.slow_dtype_note("bf16", cpu) is None
