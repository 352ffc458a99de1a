"""The synthetic configurations the battery enumerates and samples, and its negative controls, as data.

A :class:`Case` is a Markov target, a (mismatched) Markov drafter with Markov-conditioned confidences, a block
size and an SPS table for schedulers that take a ``profile``. All are built from fixed generator seeds, so
the battery's structure never changes between runs; its ``seed`` only drives sampling.

Real cases (expected lossless with :func:`~dspark_bench.core.verify.speculative_accept` and every scheduler):

* ``markov-v3-k3``, ``markov-v4-k2-eos`` (token 3 is EOS), ``greedy-v5-k3`` (deterministic drafts, q = None),
  ``appendix-a`` (the paper's counterexample setting, with its SPS table): exact law of the first k + 1 tokens.
* ``engine-v4-k3-eos``: the case the engine-driven tests sample (``max_new_tokens`` 4, so the engine's
  budget cap also cuts the schedulers' choices); ``long-v4-k3``: the same chains without EOS, for long outputs.
* Under the sampling filters (:class:`~dspark_bench.core.verify.Sampling`; p and q processed alike, the output
  compared with the target's processed law): ``topk-v4-k2`` (T = 0.8, top-k 2) and ``topp-minp-v4-k2-eos``
  (top-p 0.8, min-p 0.1), enumerated; ``engine-v4-k3-eos+filters`` (top-k 3, top-p 0.9), sampled by the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from dspark_bench.core.verify import AcceptRule, Sampling, speculative_accept
from dspark_bench.lossless.controls import (
    APPENDIX_A_SPS,
    ArgmaxSoftmaxQ,
    Bf16Probs,
    Bf16Sampled,
    FiltersOnQOnly,
    Retrospective,
    appendix_a,
    bf16_sensitive_chain,
    exact_match_then_resample,
    resample_from_p,
)
from dspark_bench.lossless.synthetic import MarkovChain, SyntheticDrafter, SyntheticTarget
from dspark_bench.scheduling.schedulers import Scheduler

# SPS(B) = 1 / (1 + 0.25 (B - 1)): admissions then depend on the confidences at every batch size.
SMOOTH_SPS = {b: 1.0 / (1.0 + 0.25 * (b - 1)) for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)}


@dataclass(frozen=True)
class Case:
    name: str
    chain: MarkovChain  # the target
    draft: SyntheticDrafter.Config
    block_size: int
    eos_ids: tuple[int, ...] = ()
    sps: Mapping[int, float] = field(default_factory=lambda: dict(SMOOTH_SPS))
    drafter_cls: type[SyntheticDrafter] = SyntheticDrafter
    prompt: tuple[int, ...] = (0,)
    concurrency: int = 16  # engine requests in flight
    sampling: Sampling = Sampling(1.0)  # how the engine makes p and q from logits; the output must follow p's law

    def target(self) -> SyntheticTarget:
        return SyntheticTarget(self.chain, self.eos_ids, name=f"synthetic:{self.name}")

    def drafter(self, target: SyntheticTarget) -> SyntheticDrafter:
        return self.drafter_cls(self.draft, target)


@dataclass(frozen=True)
class Control:
    """A known bug injected through a seam: the acceptance rule, the drafter (in ``case``) or the scheduler."""

    name: str
    bug: str
    case: Case
    rule: AcceptRule = speculative_accept
    scheduler: Callable[[], Scheduler] | None = None  # None: the registered 'fixed'
    sampled: bool = True  # False: too small to sample at CI sizes; exact row plus its power statement only


def markov_case(name: str, vocab: int, block: int, seed: int, eos: tuple[int, ...] = (),
                deterministic: bool = False) -> Case:
    """Random target chain, a noisy copy as the draft chain, confidences uniform in [0.05, 0.95]."""
    gen = torch.Generator().manual_seed(seed)
    chain = MarkovChain.random(vocab, gen)
    if eos:
        logits = chain.logits.clone()
        logits[:, list(eos)] -= 1.0  # keep EOS rarer than the other tokens
        chain = MarkovChain(logits)
    confidence = torch.rand(vocab, block, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    draft = SyntheticDrafter.Config(chain.perturbed(gen), confidence, deterministic)
    return Case(name, chain, draft, block, eos)


def appendix_a_case() -> Case:
    """One request at a time (R = 1, as in the paper): in a batch, SPS at R + n tokens changes the trade-off."""
    target, draft = appendix_a()
    return Case("appendix-a", target, draft, 2, sps=dict(enumerate(APPENDIX_A_SPS, start=1)), concurrency=1)


def exact_cases() -> tuple[Case, ...]:
    return (
        markov_case("markov-v3-k3", 3, 3, seed=11),
        markov_case("markov-v4-k2-eos", 4, 2, seed=12, eos=(3,)),
        markov_case("greedy-v5-k3", 5, 3, seed=13, deterministic=True),
        appendix_a_case(),
        dataclasses.replace(markov_case("topk-v4-k2", 4, 2, seed=14), sampling=Sampling(0.8, top_k=2)),
        dataclasses.replace(markov_case("topp-minp-v4-k2-eos", 4, 2, seed=15, eos=(3,)),
                            sampling=Sampling(1.0, top_p=0.8, min_p=0.1)),
    )


def engine_case() -> Case:
    """Seed picked so that every sampled control needs fewer than 500 sequences for power 0.99."""
    return markov_case("engine-v4-k3-eos", 4, 3, seed=32, eos=(3,))


def filtered_engine_case() -> Case:
    """The engine case under top-k 3 and top-p 0.9: p and q both lose tokens (the engine's own processing,
    :func:`~dspark_bench.core.verify.to_probs`, against the battery's float64 twin)."""
    base = engine_case()
    return dataclasses.replace(base, name=f"{base.name}+filters", sampling=Sampling(1.0, top_p=0.9, top_k=3))


def long_case() -> Case:
    """The engine case without EOS: the long-output PIT runs many rounds per request (stateful schedulers)."""
    return markov_case("long-v4-k3", 4, 3, seed=32)


def bf16_case(magnitude: float) -> Case:
    """Draft chain = target chain (a perfect drafter), so every draft is accepted and the output law is the
    drafter's *sampled* law: the bf16-rounded one."""
    chain = bf16_sensitive_chain(3, torch.Generator().manual_seed(31), magnitude)
    confidence = torch.full((3, 2), 0.5, dtype=torch.float64)
    return Case(f"bf16-v3-k2-logits{magnitude:g}", chain, SyntheticDrafter.Config(chain, confidence), 2,
                drafter_cls=Bf16Sampled)


def controls() -> tuple[Control, ...]:
    base = engine_case()
    argmax = dataclasses.replace(base, name=f"{base.name}+argmax", drafter_cls=ArgmaxSoftmaxQ)
    bf16_probs = dataclasses.replace(base, name=f"{base.name}+bf16-probs", drafter_cls=Bf16Probs)
    return (
        Control("a-resample-from-p", "rejection redraws from p instead of the residual", base, resample_from_p),
        Control("b1-argmax-softmax-q", "argmax draft, softmax q passed to the ratio", argmax),
        Control("b2-bf16-sampled-fp32-q", "token drawn from a bf16-rounded softmax, fp32 q passed",
                bf16_case(150.0)),
        Control("b2-bf16-realistic", "as b2 at logits near 24 (bf16 spacing 0.125)", bf16_case(24.0), sampled=False),
        Control("b3-bf16-probs", "softmax rounded to bf16 probabilities before sampling, fp32 q passed", bf16_probs,
                sampled=False),
        Control("c-exact-match-resample", "exact match, then a fresh draw from p on mismatch", base,
                exact_match_then_resample),
        Control("d-retrospective", "Appendix A global search without early stop", appendix_a_case(),
                scheduler=Retrospective),
        Control("e-filters-on-q-only", "top-k/top-p applied to the q handed over, not to the law drawn from",
                dataclasses.replace(filtered_engine_case(), drafter_cls=FiltersOnQOnly)),
    )
