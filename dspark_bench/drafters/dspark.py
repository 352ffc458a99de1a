"""``dspark``: DSpark, the block backbone plus a sequential Markov head and a confidence head (reference 1.4-1.6).

* **Markov head** (``vanilla``): ``logits_k = U_k + E[x_{k-1}] P`` with ``E`` = ``markov_w1`` [V, r] and ``P`` =
  ``markov_w2`` (Linear r -> V, no bias); ``x_0`` is the anchor. At inference the block is sampled left to right:
  ``q_k = to_probs(logits_k, sampling)`` (temperature and filters) and ``x_k ~ q_k`` for all requests at once with the engine's sampler and
  the requests' draft uniforms, and exactly that ``q_k`` goes to the verifier. In training ``x_{k-1}`` is the ground-truth token (teacher forcing, fully parallel).
  Variants (``markov_head_type``): ``gated``, ``beta = P (sigmoid(W_g [h_k; e]) * e)``; ``rnn`` (paper eq. 6),
  ``s_k = sigmoid(g) s_{k-1} + (1 - sigmoid(g)) tanh(c)``, ``beta = P tanh(o)``, with ``(g, c, o)`` a linear map
  of ``[s_{k-1}; e; h_k]`` and ``s_0 = 0``. Here ``e = E[x_{k-1}]``.
* **Confidence head**: ``c_k = sigmoid(w [h_k; E[x_{k-1}]] + b)``, the predicted probability that draft token k
  survives given that 1..k-1 did; reported in ``Proposal.confidence``.
* **Loss**: ``0.1 CE + 0.9 ||q - pi||_1 + 1.0 BCE(c_k, alpha*_k)``, each a weighted mean (see ``blockloss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from dspark_bench.core.timing import Timer
from dspark_bench.core.verify import Sampling
from dspark_bench.drafters.base import DraftContext, Proposal
from dspark_bench.drafters.blockdraft import MARKOV_HEAD_TYPES, Arch, BlockDraftModel
from dspark_bench.drafters.blockdrafter import BlockConfig, BlockDrafter
from dspark_bench.drafters.blockloss import (
    acceptance_by_position,
    analytic_acceptance,
    cross_entropy,
    position_weights,
    tv_l1,
    weighted_mean,
)
from dspark_bench.drafters.registry import DrafterError, register
from dspark_bench.drafters.types import LossOutput
from dspark_bench.drafters.vocab import DraftHead, RowLinear
from dspark_bench.target.model import to_device

if TYPE_CHECKING:
    from dspark_bench.drafters.types import TrainBatch
    from dspark_bench.target.model import Target

ALPHA_CE, ALPHA_L1, ALPHA_CONF = 0.1, 0.9, 1.0  # the paper's and the released configs' loss weights


def dspark_loss_terms(logits: torch.Tensor, labels: torch.Tensor, pi: torch.Tensor, conf_logit: torch.Tensor | None,
                      weights: torch.Tensor, ce_weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Weighted-mean CE, L1 and confidence BCE for Markov-corrected logits [..., V], labels [...], target laws
    pi [..., V], confidence logits [...] (None: no head) and weights [...]; also ``alpha`` [...] (alpha*).
    ``ce_weights`` [...]: the CE's own weights (default ``weights``; 0 where a label cannot be drafted)."""
    ce = cross_entropy(logits, labels)
    l1 = tv_l1(torch.softmax(logits.float(), dim=-1), pi)
    alpha = analytic_acceptance(l1)
    ce_w = weights if ce_weights is None else ce_weights
    terms = {"ce": weighted_mean(ce, ce_w), "l1": weighted_mean(l1, weights), "alpha": alpha}
    if conf_logit is not None:
        bce = F.binary_cross_entropy_with_logits(conf_logit.float(), alpha, reduction="none")
        terms["conf"] = weighted_mean(bce, weights)
    return terms


def dspark_total(terms: dict[str, torch.Tensor]) -> torch.Tensor:
    """0.1 CE + 0.9 L1 + 1.0 BCE."""
    total = ALPHA_CE * terms["ce"] + ALPHA_L1 * terms["l1"]
    return total + ALPHA_CONF * terms["conf"] if "conf" in terms else total


class MarkovHead(nn.Module):
    def __init__(self, kind: str, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.kind = kind
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = RowLinear(rank, vocab, bias=False)  # over the draft vocabulary's rows (vocab.py)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def step(self, h: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None, compact: bool = False):
        """Bias [..., V] (fp32; 0 outside the draft vocabulary, or [..., N] over it with ``compact``) for slot
        outputs h [..., d] and previous tokens prev [...]; state [..., r] (rnn)."""
        e = self.markov_w1(prev)
        if self.kind == "gated":
            e = torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e
        elif self.kind == "rnn":
            s = torch.zeros_like(e) if state is None else state
            gate, cand, out = self.joint_proj(torch.cat([s, e, h], dim=-1)).chunk(3, dim=-1)
            state = torch.sigmoid(gate) * s + (1 - torch.sigmoid(gate)) * torch.tanh(cand)
            e = torch.tanh(out)
        return self.markov_w2(e, compact).float(), state

    def teacher_forced(self, h: torch.Tensor, prev: torch.Tensor, compact: bool = False) -> torch.Tensor:
        """Bias [..., G, V] ([..., G, N] with ``compact``) for h [..., G, d] and ground-truth previous tokens
        prev [..., G]."""
        if self.kind != "rnn":
            return self.step(h, prev, None, compact)[0]
        state, out = None, []
        for k in range(prev.shape[-1]):  # the recurrence is unrolled over the block
            bias, state = self.step(h[..., k, :], prev[..., k], state, compact)
            out.append(bias)
        return torch.stack(out, dim=-2)


class ConfidenceHead(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., width] -> logits [...]
        return self.proj(x).squeeze(-1)


def sample_markov(base: torch.Tensor, h: torch.Tensor, anchors: torch.Tensor, head: MarkovHead | None,
                  sampling: Sampling | float, u: torch.Tensor, timer: Timer | None = None,
                  draft_head: DraftHead | None = None, scratch: dict | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-to-right sampling of R blocks, batched over requests and on the device. base [R, G, N] fp32 logits U
    in ``draft_head``'s head space (N = V for the full head, the default); h [R, G, d]; anchors [R]; u [R, G] the
    draft uniforms (float64); head None: no Markov term (each token from the backbone's logits alone, still sampled
    left to right). ``timer``: the head's compute is timed as "head", the draws (:meth:`DraftHead.draw`, the
    engine's one sampler over the draft vocabulary) as "sample".

    Returns tokens [R, G] (target ids), q [R, G, V] (the law each token was drawn from, in full space) and prev
    [R, G] (x_{k-1}), all on ``base``'s device. Token k depends on the backbone only through base[:, k] (and
    h[:, k] for gated/rnn) and on x_{k-1}. q is a [G, R, V] buffer seen as [R, G, V], so that each step writes
    contiguous memory (into a [:, k] slice a softmax was 20-30% slower at 8-32 rows on the CPU); ``scratch``
    (``DraftContext.scratch``) lets the buffer be reused round after round (:meth:`DraftHead.law_buffer`).
    """
    timer = timer or Timer(base.device)
    rows, size, _ = base.shape
    draft_head = draft_head or DraftHead.full_space(base.shape[-1])
    with timer.span("sample"):
        q = draft_head.law_buffer(size, rows, device=base.device, scratch=scratch)
    anchors = anchors.to(base.device)
    prev, drawn, state = anchors, [], None
    for k in range(size):
        logits = base[:, k]
        if head is not None:
            with timer.span("head"):
                bias, state = head.step(h[:, k], prev, state, compact=True)
                logits = logits + bias
        with timer.span("sample"):
            prev = draft_head.draw(logits, sampling, u[:, k], q[k])
        drawn.append(prev)
    tokens = torch.stack(drawn, dim=1)  # [R, G]
    return tokens, q.transpose(0, 1), torch.cat([anchors.unsqueeze(1), tokens[:, :-1]], dim=1)


class DSparkModel(BlockDraftModel):
    def __init__(self, arch: Arch, target: Target):
        super().__init__(arch, target)
        if arch.markov_rank < 1:
            raise DrafterError("DSpark needs markov_rank >= 1 (markov_rank 0 is DFlash)")
        r, d = arch.markov_rank, arch.hidden_size
        self.markov_head = MarkovHead(arch.markov_head_type, arch.vocab_size, r, d)
        if arch.confidence_head:
            self.confidence_head = ConfidenceHead(d + r if arch.confidence_with_markov else d)

    def confidence_logit(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """g_k [...] for h [..., d] and previous tokens prev [...]; None without a confidence head."""
        if not self.arch.confidence_head:
            return None
        x = torch.cat([h, self.markov_head.markov_w1(prev)], -1) if self.arch.confidence_with_markov else h
        return self.confidence_head(x)

    def loss(self, batch: TrainBatch, generator: torch.Generator, num_anchors: int, decay_gamma: float) -> LossOutput:
        """Teacher-forced DSpark loss over ``num_anchors`` random anchors per sequence (reference 1.6)."""
        view = self.train_view(batch, generator, num_anchors)
        t = view.targets
        # over the draft vocabulary (vocab.py: pi restricted and renormalised, CE drops labels outside it)
        logits = self.draft_head.sub_logits(view.h) + self.markov_head.teacher_forced(view.h, t.prev, compact=True)
        weights = position_weights(t.validity, decay_gamma)
        terms = dspark_loss_terms(logits, view.labels, view.pi, self.confidence_logit(view.h, t.prev), weights,
                                  weights * view.in_vocab)
        alpha = terms.pop("alpha")
        loss = dspark_total(terms)
        logged = {"loss": float(loss.detach()), **{k: float(v.detach()) for k, v in terms.items()}}
        return LossOutput(loss, logged, acceptance_by_position(alpha, t.validity))


@register("dspark")
class DSparkDrafter(BlockDrafter):
    @dataclass(frozen=True)
    class Config(BlockConfig):
        markov_rank: int = 64
        markov_head_type: str = "vanilla"  # vanilla | gated | rnn
        calibration: str | None = None  # STS calibration.json for confidence schedulers (default: next to checkpoint)
        markov: bool = True  # False: draft from the backbone's logits alone (ablation; a degraded-drafter control)

    Model = DSparkModel

    def arch_fields(self, config: Config, target: Target) -> dict[str, Any]:
        if config.markov_rank < 1 or config.markov_head_type not in MARKOV_HEAD_TYPES:
            raise DrafterError(f"dspark needs markov_rank >= 1 and markov_head_type in {MARKOV_HEAD_TYPES}, got "
                               f"{config.markov_rank}, {config.markov_head_type!r}")
        return {**super().arch_fields(config, target), "markov_rank": config.markov_rank,
                "markov_head_type": config.markov_head_type, "confidence_head": True}

    def draw(self, ctx: DraftContext, h: torch.Tensor) -> Proposal:
        """1. base logits U (parallel); 2. Markov sampling (sequential; head and draws timed apart); 3. confidences."""
        with ctx.timer.span("forward"):
            base = self.model.base_logits(h, compact=True)  # [R, G, N], head space
        anchors = to_device([s.tokens[-1] for s in ctx.slots], h.device)
        head = self.model.markov_head if self.config.markov else None
        u = ctx.draft_uniforms(base.shape[1], h.device)
        tokens, q, prev = sample_markov(base, h, anchors, head, ctx.sampling, u, ctx.timer, self.model.draft_head,
                                        ctx.scratch)
        with ctx.timer.span("forward"):
            logit = self.model.confidence_logit(h, prev)
            confidence = None if logit is None else torch.sigmoid(logit.float())
        lengths = torch.full((len(ctx.slots),), tokens.shape[1], dtype=torch.long)
        return Proposal(tokens, lengths, q, confidence)
