"""Exact output laws, in float64, by enumeration: no sampling anywhere.

Three nested enumerations give the law of the first ``m`` emitted tokens of a synthetic configuration
(Markov target, Markov drafter, scheduler, acceptance rule):

1. **uniforms** (:func:`verdict_law`): the batched acceptance rule is called as a black box on one request,
   its k + 1 uniforms (:class:`~dspark_bench.core.verify.Draws`: k acceptance tests, then the recovered/bonus draw)
   served from a script; any other randomness is refused (a ``TorchFunctionMode``). Each draw's interval
   [0, 1) is cut at every point where a
   rule built from threshold tests ``u < p/q`` and inverse-CDF draws from ``p``, ``q`` or the residual can
   change its mind: the ratios ``p_{j-1}(x_j) / q_j(x_j)`` (and inverses) and the CDFs of every ``p`` row,
   ``q`` row and residual. The rule runs once per cell (at its midpoint, later draws at a fixed filler);
   neighbouring cells with the same verdict are merged and the next draw is enumerated inside each merged
   cell. The weight of a branch is the product of its cell widths, so the accept/reject tree and the
   recovered/bonus tokens are integrated exactly (up to float64 rounding of the cut points).
2. **drafts** (:func:`round_law`): every draft block ``x_1..x_k`` from a context token, weighted by the law the
   drafter really samples from; the scheduler chooses the verified length from the block's proposal (tokens,
   claimed q and confidences), and the rule's verdict law on the verified prefix gives the emitted tokens.
3. **rounds** (:func:`sequence_law`): rounds continue from the last emitted token until ``m`` tokens are out
   or an EOS ends the sequence.

A scheduler is deep-copied from its initial state for every decision, so a stateful scheduler is enumerated
per round; its behaviour across rounds is covered by the engine-driven tests.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable, Collection, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from dspark_bench.core.verify import AcceptRule, Draws, Sampling, Verdict, one_hot, residual
from dspark_bench.drafters.base import DraftContext, Proposal, Slot
from dspark_bench.lossless.synthetic import SyntheticDrafter, SyntheticTarget
from dspark_bench.scheduling.schedulers import Scheduler

_FILL = 0.6180339887498949  # value served for draws beyond the script (an arbitrary point, away from 0.5)
_RANDOM = frozenset(
    "rand_like randn randn_like randint randint_like randperm multinomial bernoulli normal poisson uniform_ "
    "normal_ exponential_ geometric_ cauchy_ log_normal_ random_".split()
)
Law = dict[tuple[int, ...], float]


class ExactError(RuntimeError):
    """The rule used randomness the enumeration cannot script."""


class _NoRandom(TorchFunctionMode):
    """Refuses every torch randomness: a rule's only randomness is the uniforms it is handed."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "generator" in kwargs or getattr(func, "__name__", "") in _RANDOM or func is torch.rand:
            raise ExactError(f"exact enumeration scripts the rule's Draws only; the rule called {func.__name__}")
        return func(*args, **kwargs)


def cut_points(p: torch.Tensor, draft: torch.Tensor, q: torch.Tensor | None) -> tuple[float, ...]:
    """Where a threshold/inverse-CDF rule on (p [k+1, V], draft [k], q [k, V] or None) can switch, in (0, 1)."""
    k, vocab = int(draft.shape[0]), p.shape[-1]
    qq = one_hot(draft, vocab).double() if q is None else q.double()
    rows = [*p.double(), *qq, *(residual(p[j], qq[j]) for j in range(k))]
    cuts = set()
    for row in rows:
        cuts.update((torch.cumsum(row, 0) / row.sum())[:-1].tolist())
    idx = draft.long().unsqueeze(-1)
    px, qx = p[:k].double().gather(-1, idx).squeeze(-1), qq.gather(-1, idx).squeeze(-1)
    for a, b in zip(px.tolist(), qx.tolist(), strict=True):
        cuts.update(x for x in (a / b if b > 0 else 1.0, b / a if a > 0 else 1.0))
    return tuple(sorted(c for c in cuts if 0.0 < c < 1.0))


def verdict_law(
    rule: AcceptRule,
    p: torch.Tensor,  # [k+1, V] float64
    draft: torch.Tensor,  # [k]
    q: torch.Tensor | None,  # [k, V] float64, or None
    eos_ids: Collection[int] = (),
) -> dict[Verdict, float]:
    """Exact law of ``rule``'s verdict over its uniforms (see the module docstring, step 1), through the batched
    rule with one request."""
    k, cuts = int(draft.shape[0]), cut_points(p, draft, q)
    args = (p.unsqueeze(0), draft.long().unsqueeze(0), None if q is None else q.unsqueeze(0), torch.tensor([k]))
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long)

    def run(script: Sequence[float]) -> tuple[Verdict, int]:
        u = [*script, *[_FILL] * (k + 1 - len(script))]
        draws = Draws(torch.tensor([u[:k]], dtype=torch.float64), torch.tensor([u[k]], dtype=torch.float64))
        with _NoRandom():
            verdict = rule(*args, draws, eos).to_host()[0]
        return verdict, k + 1

    return _explore(run, (), (0.0, *cuts, 1.0))


def _explore(run, script: tuple[float, ...], edges: tuple[float, ...]) -> dict[Verdict, float]:
    verdict, used = run(script)
    if used <= len(script):
        return {verdict: 1.0}
    merged: list[list] = []  # [lo, hi, verdict, representative]: runs of cells with one verdict
    for lo, hi in itertools.pairwise(edges):
        mid = (lo + hi) / 2  # inside a cell, never on a cut
        seen = run((*script, mid))[0]
        if merged and merged[-1][2] == seen:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi, seen, mid])
    law: dict[Verdict, float] = {}
    for lo, hi, _, mid in merged:
        for v, w in _explore(run, (*script, mid), edges).items():
            law[v] = law.get(v, 0.0) + (hi - lo) * w
    return law


@dataclass(frozen=True)
class Block:
    """One enumerated draft block from a context: tokens, probability of being drafted, and its proposal."""

    tokens: tuple[int, ...]
    weight: float
    q: torch.Tensor | None  # [k, V] float64 claimed laws, None for deterministic drafts
    confidence: tuple[float, ...]


def draft_blocks(drafter: SyntheticDrafter, context: int, k: int, sampling: Sampling) -> list[Block]:
    """Every block of ``k`` drafts after ``context`` with positive probability under the sampled law."""
    law = drafter.law(sampling)
    sampled, claimed = law.sampled(exact=True), law.claimed(exact=True)
    confidence = drafter.config.confidence.tolist()
    blocks = [Block((), 1.0, None, ())]
    for j in range(k):
        grown = []
        for b in blocks:
            prev = b.tokens[-1] if b.tokens else context
            for x, w in enumerate(sampled[prev].tolist()):
                if w > 0:
                    grown.append(Block((*b.tokens, x), b.weight * w, None, (*b.confidence, confidence[prev][j])))
        blocks = grown
    if claimed is None:
        return blocks
    return [dataclasses.replace(b, q=claimed[[context, *b.tokens[:-1]]]) for b in blocks]


@dataclass(frozen=True)
class Setting:
    """Everything the exact law of a synthetic configuration depends on."""

    target: SyntheticTarget
    drafter: SyntheticDrafter
    scheduler: Scheduler
    rule: AcceptRule
    block_size: int
    sampling: Sampling = Sampling(1.0)  # temperature and filters, for the target's p and the drafter's q alike

    @property
    def probs(self) -> torch.Tensor:
        """[V, V] float64 target transition matrix, processed as the run samples (``sampling``)."""
        return self.target.chain.probs(self.sampling)


def _decide(setting: Setting, ctx: DraftContext, block: Block) -> int:
    """Verified length the scheduler (a fresh copy) picks for ``block``."""
    k = len(block.tokens)
    proposal = Proposal(
        torch.tensor([block.tokens], dtype=torch.long),
        torch.tensor([k], dtype=torch.long),
        None if block.q is None else block.q.float().unsqueeze(0),
        torch.tensor([block.confidence], dtype=torch.float32),
    )
    chosen = int(copy.deepcopy(setting.scheduler).decide(proposal, ctx)[0])
    if not 0 <= chosen <= k:
        raise ValueError(f"scheduler {type(setting.scheduler).__name__} chose {chosen} of {k} draft tokens")
    return chosen


def round_law(setting: Setting, context: int, cap: int, cache: dict[Hashable, dict[Verdict, float]]) -> Law:
    """Law of the tokens one round emits after ``context`` with at most ``cap`` verified drafts (step 2).

    ``cache`` memoises verdict laws by (context, verified drafts); share it only between settings with the
    same target, drafter and rule.
    """
    slot = Slot(0, [context], 0, 0)
    ctx = DraftContext(setting.target, setting.sampling, setting.block_size, [slot])
    eos_ids = setting.target.eos_ids
    out: Law = {}
    for block in draft_blocks(setting.drafter, context, setting.block_size, setting.sampling):
        n = min(_decide(setting, ctx, block), cap)
        key = (context, block.tokens[:n])
        if key not in cache:
            p = setting.probs[[context, *block.tokens[:n]]]
            q = None if block.q is None else block.q[:n]
            cache[key] = verdict_law(setting.rule, p, torch.tensor(block.tokens[:n], dtype=torch.long), q, eos_ids)
        for v, w in cache[key].items():
            emitted = (*block.tokens[: v.accepted], *(() if v.token is None else (v.token,)))
            out[emitted] = out.get(emitted, 0.0) + block.weight * w
    return out


def sequence_law(next_law: Callable[[int, int], Law], context: int, m: int, eos_ids: Collection[int]) -> Law:
    """Law of the first ``m`` tokens after ``context`` when each step emits ``next_law(last token, tokens left)``
    (step 3). A sequence that reaches an EOS ends there (shorter key)."""
    memo: dict[tuple[int, int], Law] = {}

    def law(c: int, left: int) -> Law:
        if (c, left) not in memo:
            out: Law = {}
            for emitted, w in next_law(c, left).items():
                head = _until_eos(emitted, eos_ids)
                if len(head) >= left or head[-1] in eos_ids:
                    out[head[:left]] = out.get(head[:left], 0.0) + w
                    continue
                for tail, w2 in law(head[-1], left - len(head)).items():
                    out[head + tail] = out.get(head + tail, 0.0) + w * w2
            memo[(c, left)] = out
        return memo[(c, left)]

    return law(context, m)


def spec_law(setting: Setting, context: int, m: int, capped: bool, cache: dict) -> Law:
    """Exact law of the first ``m`` tokens the configuration emits after ``context``. ``capped``: the engine's
    budget rule for a request with exactly ``m`` tokens left (at most ``left - 1`` verified drafts)."""
    rounds: dict[tuple[int, int], Law] = {}

    def next_law(c: int, left: int) -> Law:
        cap = left - 1 if capped else setting.block_size
        if (c, cap) not in rounds:
            rounds[(c, cap)] = round_law(setting, c, cap, cache)
        return rounds[(c, cap)]

    return sequence_law(next_law, context, m, setting.target.eos_ids)


def _until_eos(tokens: tuple[int, ...], eos_ids: Collection[int]) -> tuple[int, ...]:
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


def markov_law(probs: torch.Tensor, context: int, m: int, eos_ids: Collection[int]) -> Law:
    """Target law of the first ``m`` tokens of the chain ``probs`` ([V, V]) after ``context``."""
    rows = [{(x,): w for x, w in enumerate(row) if w > 0} for row in probs.tolist()]
    return sequence_law(lambda c, _left: rows[c], context, m, eos_ids)


def after_first(first: torch.Tensor, rest: Callable[[int], Law], eos_ids: Collection[int]) -> Law:
    """Law of what follows a first token drawn from ``first`` ([V]): ``rest(y1)``, or () when y1 is EOS."""
    out: Law = {}
    for y1, w in enumerate(first.tolist()):
        if w <= 0:
            continue
        for seq, w2 in ({(): 1.0} if y1 in eos_ids else rest(y1)).items():
            out[seq] = out.get(seq, 0.0) + w * w2
    return out


def max_abs_error(a: Law, b: Law) -> float:
    return max((abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b)), default=0.0)
