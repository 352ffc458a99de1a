"""Counter-based randomness: a draw is a function of (request seed, position, purpose), never a state.

``uniforms(seeds, positions, purpose)`` hashes each key with SplitMix64's finaliser (Steele et al. 2014; the
mixer of Java's SplittableRandom) and maps the top 53 bits to a float64 in [0, 1). Nothing is carried between
calls, so a request's draws do not depend on which other requests share its batch, on the concurrency, on
admission order or on the device.

The keys live on the host (every slot's seed and position are Python ints), so the hash runs there, in numpy's
wrapping uint64 arithmetic: a handful of vectorised operations on R x k keys, where the same hash as ~25 small
torch kernels cost 0.26 ms a call at R = 1 on the development CPU (twice a round). The uniforms then travel to
the device with the round's other small host values (:func:`dspark_bench.target.model.to_device`, which never
synchronises).

Positions are absolute token positions in the request's sequence (prompt + output). Purposes keep the
streams disjoint:

* ``DRAFT``: the draft token proposed at a position (a position drafted again in a later round reuses its
  uniform; that is lossless because a draft that was never examined by the verifier left no trace in the
  output, and schedulers are non-anticipating);
* ``ACCEPT``: the acceptance test of the draft token at a position (each position is examined at most once);
* ``TARGET``: the target's own token at a position (the first token, recovered and bonus tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

DRAFT, ACCEPT, TARGET = 1, 2, 3
PURPOSES = (DRAFT, ACCEPT, TARGET)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))


def mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (numpy's array arithmetic wraps modulo 2^64), elementwise."""
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def _words(values) -> np.ndarray:
    """Integers (a list, an array or a CPU tensor) as uint64 words with their int64 bit patterns, at least 1-D."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.atleast_1d(np.asarray(values, dtype=np.int64)).view(np.uint64)


def uniforms(seeds, positions, purpose: int | Sequence[int]) -> torch.Tensor:
    """Float64 uniforms in [0, 1), one per key, as a CPU tensor: seeds [R] (integers: a list, array or tensor)
    broadcast against positions [R, ...], ``purpose`` one of ``PURPOSES`` or a list of them along the last
    dimension of ``positions``.

    The key is hashed in two chained rounds, the seed first, then (position, purpose) packed into one word
    (4 position + purpose), so equal seeds with different positions or purposes give unrelated values."""
    purposes = [purpose] if isinstance(purpose, int) else list(purpose)
    if any(p not in PURPOSES for p in purposes):
        raise ValueError(f"unknown purpose in {purposes}; accepted: DRAFT={DRAFT}, ACCEPT={ACCEPT}, TARGET={TARGET}")
    tag = np.asarray(purposes, dtype=np.uint64)  # [1] or [n]: broadcast along the last dimension
    pos = _words(positions)
    h = mix(_words(seeds)).reshape((-1,) + (1,) * (pos.ndim - 1))
    bits = mix(h ^ (pos * np.uint64(4) + tag)) >> _S11
    return torch.from_numpy(bits.astype(np.float64) * (1.0 / (1 << 53)))
