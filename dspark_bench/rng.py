"""Counter-based randomness: a draw is a function of (request seed, position, purpose), never a state.

``uniforms(seeds, positions, purpose)`` hashes each key with SplitMix64's finaliser (Steele et al. 2014; the
mixer of Java's SplittableRandom) computed with torch int64 ops on whatever device the tensors live on, and
maps the top 53 bits to a float64 in [0, 1). Nothing is carried between calls, so a request's draws do not
depend on which other requests share its batch, on the concurrency, on admission order or on the device.

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

import torch

DRAFT, ACCEPT, TARGET = 1, 2, 3
PURPOSES = (DRAFT, ACCEPT, TARGET)


def _signed(x: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser on int64 tensors (wrapping arithmetic), elementwise."""
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, purpose: int | Sequence[int]) -> torch.Tensor:
    """Float64 uniforms in [0, 1), one per key: seeds [R] (int64) broadcast against positions [R, ...] (int64),
    ``purpose`` one of ``PURPOSES`` or a list of them along the last dimension of ``positions``.

    The key is hashed in two chained rounds, the seed first, then (position, purpose) packed into one word
    (4 position + purpose), so equal seeds with different positions or purposes give unrelated values."""
    purposes = [purpose] if isinstance(purpose, int) else list(purpose)
    if any(p not in PURPOSES for p in purposes):
        raise ValueError(f"unknown purpose in {purposes}; accepted: DRAFT={DRAFT}, ACCEPT={ACCEPT}, TARGET={TARGET}")
    tag = purposes[0] if len(purposes) == 1 else torch.tensor(purposes, dtype=torch.int64, device=positions.device)
    shape = (-1,) + (1,) * (positions.dim() - 1)
    h = mix(seeds.to(torch.int64)).reshape(shape)
    return _shr(mix(h ^ (positions.to(torch.int64) * 4 + tag)), 11).double() * (1.0 / (1 << 53))
