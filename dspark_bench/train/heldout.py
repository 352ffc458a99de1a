"""Held-out scoring of a drafter: teacher-forced acceptance on sequences it was not trained on.

The training log's acceptance is measured on the step's own training sequences and, with a reduced draft
vocabulary, conditional on the target's token being in the list (``drafters/vocab.py``). Neither is what decoding
sees. :class:`HeldOut` scores a drafter module on a fixed set of other sequences with the loss's own teacher-forced
machinery, under :func:`vocab.exact_target_law`: per draft position k the mean over scored slots of
``alpha*_k = sum_v min(q_k(v), p_k(v))`` over all V tokens, the probability that speculative sampling at
temperature 1 accepts position k's draft given the earlier draft tokens were the sequence's own. ``tau`` is
``1 + sum_k prod_{j<=k} alpha*_j`` of those means (the training log's definition, :func:`trainer.expected_length`).

Fixed: the sequences, their target features (one forward, kept in memory), the anchors (a generator seeded with
``seed`` at every scoring) and the batches, so two checkpoints, or two steps of one run, are scored on identical
slots. The acceptance is the mean of the batches' means (batches of ``batch_size`` sequences), as in the log.

Decoding's first-position acceptance is lower than this by a selection effect: a round starts where the previous
one was rejected, and rejections happen more often where drafting is hard, so rounds over-sample hard positions;
this score weights every response position alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dspark_bench.drafters import vocab
from dspark_bench.train.trainer import FeatureSource, TrainError, expected_length, load_weights, read_drafter

if TYPE_CHECKING:
    from torch import nn

    from dspark_bench.target.model import Target
    from dspark_bench.train.data import TrainSequence
    from dspark_bench.train.methods import Method, MethodOptions


@dataclass(frozen=True)
class HeldOutScore:
    acceptance: list[float]  # per draft position, exact over the full vocabulary
    tau: float
    sequences: int
    tokens: int  # response (loss) tokens of the sequences

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def planned_prompts(folder: str | Path) -> set[str]:
    """Every prompt text a data folder holds or will hold once generated: its manifest's prompt set, rebuilt from
    the spec's n and seed and checked against the recorded sha256 (a folder still being generated included)."""
    from dspark_bench.train.data import DataError, prompt_hash, read_manifest
    from dspark_bench.train.prompts import build_prompts

    manifest = read_manifest(folder)
    spec = manifest["spec"]
    items = build_prompts(spec["n"], spec["seed"])
    if prompt_hash(items) != manifest["prompts"]["sha256"]:
        raise DataError(f"{folder}: its prompts are not build_prompts(n={spec['n']}, seed={spec['seed']}) (sha256 "
                        f"differs from its manifest), so the prompts it will hold cannot be listed")
    return {p.text for p in items}


def heldout_sequences(folder: str | Path, exclude: Iterable[str | Path] = (),
                      max_length: int = 2048) -> tuple[list[TrainSequence], int]:
    """The sequences of the complete rows of ``folder`` (file order) whose prompt is none of the prompts of the
    data folders ``exclude`` (:func:`planned_prompts`), and how many were dropped for that."""
    from dspark_bench.train.data import MIN_LOSS_TOKENS, complete_rows, training_sequence

    taken = set().union(*(planned_prompts(d) for d in exclude)) if exclude else set()
    rows = complete_rows(folder)
    kept = [r for r in rows if r["prompt"] not in taken]
    seqs = [training_sequence(r, max_length) for r in kept]
    return [s for s in seqs if s.loss_tokens >= MIN_LOSS_TOKENS], len(rows) - len(kept)


class HeldOut:
    """A fixed held-out set with its features computed once (``features``: a trainer feature source)."""

    def __init__(self, sequences: Sequence[TrainSequence], features: FeatureSource, batch_size: int = 4,
                 seed: int = 0):
        if not sequences:
            raise TrainError("the held-out set is empty (after dropping sequences whose prompt is a training prompt)")
        seqs = sorted(sequences, key=lambda s: (len(s.input_ids), s.id))  # similar lengths share a batch: less padding
        self.seed, self.sequences = seed, len(seqs)
        self.tokens = sum(s.loss_tokens for s in seqs)
        self.batches = [features(seqs[i : i + batch_size]) for i in range(0, len(seqs), batch_size)]

    def score(self, module: nn.Module, loss_kwargs: dict[str, Any]) -> HeldOutScore:
        was_training = module.training
        module.eval()
        generator = torch.Generator().manual_seed(self.seed)
        try:
            with torch.no_grad(), vocab.exact_target_law():
                means = [module.loss(b, generator, **loss_kwargs).acceptance.float().cpu() for b in self.batches]
        finally:
            module.train(was_training)
        acceptance = torch.stack(means).mean(0).tolist()
        return HeldOutScore(acceptance, expected_length(acceptance), self.sequences, self.tokens)


def options_of(meta: dict[str, Any], num_anchors: int) -> MethodOptions:
    """The method options that rebuild a saved drafter's architecture (its ``config.json``)."""
    from dspark_bench.train.methods import MethodOptions

    cfg = meta.get("config") or {}
    taps = tuple(cfg["taps"]) if cfg.get("taps") is not None else None
    if meta.get("method") in ("dspark", "dflash"):
        return MethodOptions(num_layers=cfg["num_layers"], markov_rank=cfg.get("markov_rank") or 64,
                             block_size=cfg["block_size"], num_anchors=num_anchors, taps=taps,
                             markov_head=cfg.get("markov_head_type") or "vanilla")
    return MethodOptions(num_anchors=num_anchors, taps=taps)


def load_module(folder: str | Path, target: Target, num_anchors: int = 64,
                ttt_length: int = 7) -> tuple[Method, MethodOptions, nn.Module]:
    """A trainable module holding the drafter checkpoint in ``folder`` (fp32), with its draft-token list."""
    from dspark_bench.train.methods import METHODS

    meta, state = read_drafter(folder, target, tuple(METHODS), "--drafter")
    m, options = METHODS[meta["method"]], replace(options_of(meta, num_anchors), ttt_length=ttt_length)
    module = m.build(target, options)
    if vocab.STATE_KEY in state:
        module.set_draft_vocab(state[vocab.STATE_KEY].long())
    load_weights(module, state, folder, target.device, torch.float32)
    return m, options, module
