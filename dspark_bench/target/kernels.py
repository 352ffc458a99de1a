"""Our own CPU kernel for the attention of decode steps (``cpu_attention.cpp``), built once per machine at first use.

torch's SDPA is the fastest attention torch offers on the CPU at these shapes, and in a decode step it still spends
most of its time on overhead: at 16 rows of SmolLM2-135M it took 2.7x the time of vLLM's CPU attention kernel, more
than the whole difference between the two engines' decode steps (``baselines/kernels-vs-vllm/``). The kernel here
runs a decode step's attention (one query per row, its G packed query heads per KV head) in one pass over K and
one over V; :func:`~dspark_bench.target.fast.attention` uses it there and SDPA everywhere else.

It is compiled with the machine's own instruction set (``-march=native``) by torch's extension builder, under the
cache folder in a directory named after this source, the flags, the CPU's model and flags, Python and torch, so a
cache shared by machines of different CPUs never loads a binary built for another; it needs a C++ compiler (g++)
and ninja (a dependency of the package). Where it cannot be built (no compiler, a failed build) or is turned off
(``DSPARK_BENCH_CPU_ATTENTION=0``), :func:`decode_attention` returns None with the reason in
:func:`unavailable_reason`, and SDPA runs: the manifest's ``attention_kernel`` says which ran.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
NAME = "dspark_cpu_attention"  # the extension's module name
FLAGS = ("-O3", "-march=native", "-fopenmp")
ENV = "DSPARK_BENCH_CPU_ATTENTION"
_reason: str | None = None
VECTOR, MAX_HEAD = 16, 128  # cpu_attention.cpp's W and MAX_DIM: the head sizes it takes are multiples of VECTOR


def applies(device, dtype, head_dim: int) -> bool:
    """Whether the kernel takes a target on ``device`` in ``dtype`` with heads of ``head_dim`` (its own checks, in
    ``cpu_attention.cpp``, refuse anything else): asked before building it, so no other target waits for a build."""
    import torch

    return (torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and head_dim % VECTOR == 0 and head_dim <= MAX_HEAD)


def _cpu() -> str:
    """The CPU's model name and feature flags (what -march=native compiles for), from /proc/cpuinfo."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line.split(":", 1)[1].strip() for line in lines if line.startswith(("model name", "flags"))]
    return "\n".join(wanted[:2])


def build_dir(cache_dir: Path) -> Path:
    """Where the kernel of this source, these flags, this CPU, Python and torch is built."""
    import torch

    digest = hashlib.sha256(b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), _cpu().encode(),
                                        sys.version.encode(), torch.__version__.encode()])).hexdigest()[:16]
    return cache_dir / "kernels" / f"cpu_attention-{digest}"


@functools.cache
def decode_attention(cache_dir: Path) -> Callable | None:
    """The kernel's ``decode_attention(q, k, v, bias, scale)`` (shapes in ``cpu_attention.cpp``), built under
    ``cache_dir`` (:func:`build_dir`) at the first call of a process that needs it (about 40 s, once per machine), or
    None where it cannot run."""
    global _reason
    if os.environ.get(ENV, "1") == "0":
        _reason = f"turned off by {ENV}=0"
        return None
    if platform.machine() not in ("x86_64", "AMD64"):
        _reason = f"built for x86-64 only, this machine is {platform.machine()}"
        return None
    folder = build_dir(Path(cache_dir))
    try:
        from torch.utils.cpp_extension import load

        folder.mkdir(parents=True, exist_ok=True)
        scripts = str(Path(sys.executable).parent)  # the venv's ninja (a dependency), found though not activated
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), scripts])
        if not any(folder.glob("*.so")):
            print("building dspark-bench's CPU attention kernel for this machine (once) ...", file=sys.stderr)
        module = load(NAME, sources=[str(SOURCE)], extra_cflags=list(FLAGS),
                      extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
    except Exception as exc:  # noqa: BLE001 - any failure to build leaves SDPA in place, with the reason kept
        _reason = f"could not be built: {type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc) else ''}"
        print(f"dspark-bench's CPU attention kernel {_reason}; torch's SDPA runs instead", file=sys.stderr)
        return None
    return module.decode_attention


def unavailable_reason() -> str | None:
    """Why :func:`decode_attention` returned None in this process (None if it did not, or was not called)."""
    return _reason
