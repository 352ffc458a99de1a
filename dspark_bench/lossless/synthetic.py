"""Synthetic Markov target and drafter with exactly known laws, driven through the real engine.

* :class:`MarkovChain`: first-order chain over V tokens; ``logits[a]`` are the next-token logits after token a.
* :class:`SyntheticTarget`: the engine's target interface (``prefill / forward_block / keep / drop / merge /
  new_batch``, ``eos_ids``, ``vocab_size``, ``device``, ``name``) over a chain, so the target law of any
  output prefix is known in closed form. It keeps the per-row committed history like a KV cache would. Its
  "final hidden state" is the one-hot of the token at each position (the logits are a linear map of it);
  it has no decoder layers to tap.
* :class:`SyntheticDrafter`: a mismatched draft chain. Each draft token is produced as described by a
  :class:`DraftLaw` (sampled with :func:`~dspark_bench.core.verify.to_probs` + :func:`~dspark_bench.core.verify.sample`
  and the slots' draft uniforms) and comes with a Markov-conditioned confidence ``c_j = confidence[x_{j-1}, j-1]``,
  as a confidence head that reads the previous draft token would produce.

The drafter is not registered: the battery builds it directly, and controls subclass it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dspark_bench.core.verify import Sampling, to_probs
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal
from dspark_bench.target.model import Features, StepOutput


def exact_probs(logits: torch.Tensor, sampling: Sampling | float) -> torch.Tensor:
    """float64 twin of :func:`~dspark_bench.core.verify.to_probs` (``[..., V]``): softmax at T, one-hot argmax at 0,
    the filters of :class:`~dspark_bench.core.verify.Sampling` in its order, written apart from it (on probabilities
    where ``to_probs`` compares logits, by ascending CDF where it cuts a descending prefix), so that the battery
    checks the engine's processing against an independent one."""
    sampling = Sampling.of(sampling)
    if sampling.temperature == 0:
        out = torch.zeros(logits.shape, dtype=torch.float64)
        return out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(logits.double() / sampling.temperature, dim=-1)
    if not sampling.filtered:
        return probs
    keep = probs >= sampling.min_p * probs.amax(-1, keepdim=True)  # min-p on the tempered law
    if sampling.top_k:  # at least the k-th largest probability, ties included
        kth = probs.sort(-1).values[..., -min(sampling.top_k, probs.shape[-1])].unsqueeze(-1)
        keep &= probs >= kth
    if sampling.top_p < 1:  # over the survivors, renormalised: drop x when the strictly likelier hold >= top_p
        law = probs * keep / (probs * keep).sum(-1, keepdim=True)
        ascending = law.sort(-1).values
        at_most = torch.cumsum(ascending, -1)  # mass of the tokens at most as likely as each sorted position
        last = torch.searchsorted(ascending, law, right=True) - 1  # last sorted position with law <= law(x)
        above = 1.0 - at_most.gather(-1, last)
        keep &= above < sampling.top_p
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)


@dataclass(frozen=True)
class MarkovChain:
    """logits: [V, V] float64, row a = next-token logits after token a."""

    logits: torch.Tensor

    def __post_init__(self):
        if self.logits.dim() != 2 or self.logits.shape[0] != self.logits.shape[1]:
            raise ValueError(f"a Markov chain needs square [V, V] logits, got {tuple(self.logits.shape)}")

    @property
    def vocab(self) -> int:
        return int(self.logits.shape[0])

    def probs(self, sampling: Sampling | float) -> torch.Tensor:
        """[V, V] float64 transition matrix under ``sampling`` (or a bare temperature)."""
        return exact_probs(self.logits, sampling)

    @staticmethod
    def random(vocab: int, generator: torch.Generator, scale: float = 1.5) -> MarkovChain:
        return MarkovChain(torch.randn(vocab, vocab, generator=generator, dtype=torch.float64) * scale)

    def perturbed(self, generator: torch.Generator, scale: float = 1.0) -> MarkovChain:
        """A mismatched chain: these logits plus Gaussian noise of standard deviation ``scale``."""
        noise = torch.randn(self.logits.shape, generator=generator, dtype=torch.float64) * scale
        return MarkovChain(self.logits + noise)

    @staticmethod
    def iid(probs: Sequence[float]) -> MarkovChain:
        """Every row the same law ``probs`` (an i.i.d. sequence)."""
        row = torch.tensor(probs, dtype=torch.float64).log()
        return MarkovChain(row.expand(len(probs), len(probs)).clone())


@dataclass(eq=False)
class SyntheticBatch:
    """Rows of committed tokens (what a KV cache would hold) and the last verified block per row."""

    history: list[list[int]] = field(default_factory=list)
    blocks: list[list[int]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.history)


class SyntheticTarget:
    """A target whose next-token logits depend only on the last token (see module docstring)."""

    def __init__(self, chain: MarkovChain, eos_ids: Sequence[int] = (), name: str = "synthetic-markov"):
        self.chain, self.name = chain, name
        self.vocab_size = chain.vocab
        self.eos_ids = frozenset(eos_ids)
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.hidden_size = chain.vocab
        self._table = chain.logits.float()

    def new_batch(self) -> SyntheticBatch:
        return SyntheticBatch()

    def _logits(self, rows: list[list[int]], left_pad: bool) -> torch.Tensor:
        width = max(len(r) for r in rows)
        out = torch.zeros(len(rows), width, self.vocab_size)
        for i, toks in enumerate(rows):
            start = width - len(toks) if left_pad else 0
            out[i, start : start + len(toks)] = self._table[torch.tensor(toks, dtype=torch.long)]
        return out

    def _features(self, rows: list[list[int]]) -> list[Features]:
        """Per row: no tapped layers, final hidden state = one-hot of the row's tokens ([n, 0, V], [n, V])."""
        eye = torch.eye(self.vocab_size)
        return [Features(torch.zeros(len(r), 0, self.vocab_size), eye[torch.tensor(r, dtype=torch.long)]) for r in rows]

    def prefill(self, prompts: list[list[int]], taps: tuple[int, ...] = ()) -> tuple[SyntheticBatch, StepOutput]:
        self._no_taps(taps)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("prefill needs at least one prompt and no empty prompt")
        batch = SyntheticBatch([list(p) for p in prompts], [[] for _ in prompts])
        return batch, StepOutput(self._logits(prompts, left_pad=True), self._features(prompts))

    def forward_block(self, batch: SyntheticBatch, ids: torch.Tensor, lengths: list[int],
                      taps: tuple[int, ...] = ()) -> StepOutput:
        self._no_taps(taps)
        blocks = [row[:n] for row, n in zip(ids.tolist(), lengths, strict=True)]
        if len(blocks) != batch.rows or any(len(b) == 0 for b in blocks):
            raise ValueError(f"need one non-empty block per row ({batch.rows} rows), got {len(blocks)}")
        batch.blocks = [list(b) for b in blocks]
        return StepOutput(self._logits(blocks, left_pad=False), self._features(blocks))

    def keep(self, batch: SyntheticBatch, counts: list[int]) -> None:
        for r, n in enumerate(counts):
            if not 0 <= n <= len(batch.blocks[r]):
                raise ValueError(f"row {r} keeps {n} slots of a {len(batch.blocks[r])}-slot block")
            batch.history[r].extend(batch.blocks[r][:n])
        batch.blocks = [[] for _ in batch.history]

    def drop(self, batch: SyntheticBatch, rows: list[int]) -> None:
        gone = set(rows)
        batch.history = [h for r, h in enumerate(batch.history) if r not in gone]
        batch.blocks = [[] for _ in batch.history]

    def merge(self, batch: SyntheticBatch, new: SyntheticBatch) -> None:
        batch.history.extend(new.history)
        batch.blocks = [[] for _ in batch.history]

    def _no_taps(self, taps: tuple[int, ...]) -> None:
        if taps:
            raise ValueError(f"{self.name} has no hidden states; drafters that tap layers {taps} need a real model")


@dataclass(frozen=True)
class DraftLaw:
    """How a drafter makes a draft token after each previous token (row ``prev`` of every matrix): drawn from
    ``to_probs(sample_logits, sample_sampling)``; the verifier is handed ``to_probs(claim_logits,
    claim_sampling)``, or nothing (``claim_logits=None``: deterministic drafts, q = None). A correct drafter
    claims exactly what it samples from. Each sampling is a :class:`~dspark_bench.core.verify.Sampling` or a bare
    temperature."""

    sample_logits: torch.Tensor  # [V, V]
    sample_sampling: Sampling | float
    claim_logits: torch.Tensor | None  # [V, V]
    claim_sampling: Sampling | float

    def sampled(self, exact: bool = False) -> torch.Tensor:
        """[V, V] laws the tokens are drawn from: float32 as sampled, or the float64 twin (``exact``)."""
        if exact:
            return exact_probs(self.sample_logits, self.sample_sampling)
        return to_probs(self.sample_logits, self.sample_sampling)

    def claimed(self, exact: bool = False) -> torch.Tensor | None:
        if self.claim_logits is None:
            return None
        if exact:
            return exact_probs(self.claim_logits, self.claim_sampling)
        return to_probs(self.claim_logits, self.claim_sampling)


class SyntheticDrafter(Drafter):
    """A Markov draft chain with Markov-conditioned confidences; samples and claims the same law."""

    name = "synthetic"

    @dataclass(frozen=True)
    class Config:
        chain: MarkovChain
        confidence: torch.Tensor  # [V, gamma]: c_j = confidence[x_{j-1}, j-1]
        deterministic: bool = False  # greedy drafts with q = None (as n-gram / argmax drafters do)

    def __init__(self, config: Config, target):
        super().__init__(config, target)
        self._tables: dict[Sampling, tuple[torch.Tensor, torch.Tensor | None]] = {}  # per sampling, float32

    def law(self, sampling: Sampling) -> DraftLaw:
        """How this drafter drafts when the run samples with ``sampling`` (its q processed as the target's p)."""
        logits = self.config.chain.logits
        if self.config.deterministic:
            return DraftLaw(logits, 0.0, None, 0.0)
        return DraftLaw(logits, sampling, logits, sampling)

    def propose(self, ctx: DraftContext) -> Proposal:
        k, rows = ctx.block_size, len(ctx.slots)
        if k > self.config.confidence.shape[1]:
            raise ValueError(f"block size {k} exceeds the {self.config.confidence.shape[1]} confidence columns")
        if ctx.sampling not in self._tables:
            law = self.law(ctx.sampling)
            self._tables[ctx.sampling] = (law.sampled(), law.claimed())
        sampled, claimed = self._tables[ctx.sampling]
        prevs = torch.zeros(rows, k, dtype=torch.long)  # x_{j-1} for every draft position
        tokens = torch.zeros(rows, k, dtype=torch.long)
        u = ctx.draft_uniforms(k, "cpu")  # [R, k]
        prev = torch.tensor([slot.tokens[-1] for slot in ctx.slots], dtype=torch.long)
        for j in range(k):  # left to right, all rows at once
            prevs[:, j] = prev
            prev = tokens[:, j] = ctx.sample(sampled[prev], u[:, j])
        confidence = self.config.confidence.float()[prevs, torch.arange(k)]
        q = None if claimed is None else claimed[prevs]
        return Proposal(tokens, torch.full((rows,), k, dtype=torch.long), q, confidence)
