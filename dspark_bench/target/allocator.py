"""The host allocator's policy for runs on the CPU: keep freed memory in the process.

glibc's malloc serves a block above its mmap threshold (adaptive, at most 32 MiB on 64-bit Linux) with a fresh
``mmap`` and unmaps it when freed; below it, it trims the heap's free top back to the OS. A decode round on the
CPU allocates and frees tensors of tens of MiB (the target's [R, k+1, V] logits and law, a drafter's [R, G, V] q,
the KV cache's concatenations), so under the default policy every round faults the same pages in again and the
engine measures the kernel's page zeroing. Measured on the 2-vCPU development machine (AVX-512, fp32
SmolLM2-135M, the shipped DSpark at concurrency 32, one thread, under load from another job): one session of 32
prompts took 2.0M minor page faults under the default policy and 0.46M under this one; interleaved round by round
with ``none``, as the engine bench runs them, DSpark's overhead share went from 5.4% to 2.7% (2.5% for DSpark
alone under the default policy: two sessions' churn is worse than one's). tcmalloc and jemalloc behave like the
policy set here, which is why PyTorch's CPU performance guide recommends them.

:func:`host_allocator` turns glibc's mmap off for this process (``M_MMAP_MAX`` = 0: every block comes from the
heap) and raises its trim threshold to 1 GiB (freed memory stays for the next round), once per process. Raising
``M_MMAP_THRESHOLD`` instead is not enough: glibc 2.36 accepts a value above 32 MiB and ignores it, so a 64 MiB
tensor still faulted 16k pages at every reuse (measured: 163,850 faults in 10 reuses, 1,024 with this policy).
Elsewhere (another C library, no ``mallopt``) it changes nothing and says so. The cost: the process keeps its peak
heap until it exits, which a benchmark process may. :meth:`dspark_bench.target.model.Target.load` applies it for a
target on the CPU, before any timing, and every manifest records it (``machine.allocator``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt parameter numbers from glibc's malloc.h, and the values set
_PARAMS = {"M_TRIM_THRESHOLD": (-1, 1 << 30), "M_MMAP_MAX": (-4, 0)}


@functools.cache
def host_allocator() -> dict[str, int] | None:
    """Apply the policy for this process (idempotent) and return the parameters set, or None where the C library
    has no glibc ``mallopt``."""
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt if name else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = {key: value for key, (param, value) in _PARAMS.items() if mallopt(param, value) == 1}
    return done or None
