"""Chain drafting, shared by Eagle3 and MTP: one decoder layer over (target feature, token) pairs, drafting a
block token by token from its own output hidden states (reference sections 2.2 and 5).

Inference is **chain drafting** (:class:`ChainDrafter`): a per-request draft KV cache holds
pairs (context hidden of position t, token y_{t+1}) at RoPE position t. Prefill fills it with the prompt's
pairs; a round samples x_1 from the output hidden of the last cached position, then feeds (own output hidden,
x_j) at the next position to get x_{j+1}, ``ctx.block_size`` times (all rows in step; a row that drew an EOS
keeps drafting, the verifier stops at an accepted EOS). Those proposal
entries live only in a batch-local copy of the caches, so "crop back to the pre-proposal length" is free;
commit then extends the per-request cache with the pairs of the newly committed positions (target features from
``slot.new_features``, tokens from ``slot.tokens``) in one causal forward. ``q`` is the exact ``to_probs``
row each token was drawn from with ``verify.sample`` and the requests' draft uniforms.

:class:`Eagle3Model` (the Eagle3 layer, see :mod:`dspark_bench.drafters.eagle3`) lives here beside
:class:`ChainModel` because DeepSeek's Eagle3 format (:mod:`dspark_bench.drafters.deepseek_eagle3`) loads into it.
Training: :meth:`Eagle3Model.loss`, the training-time test (TTT) over ``ttt_length`` steps (see there).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from dspark_bench.drafters import checkpoint, vocab
from dspark_bench.drafters.base import DraftContext, Drafter, Proposal
from dspark_bench.drafters.layers import (
    KV,
    DecoderLayer,
    LayerSpec,
    Linear,
    RMSNorm,
    attention_mask,
    init_weights,
    stack_left,
)
from dspark_bench.drafters.registry import DrafterError
from dspark_bench.target.model import to_device

if TYPE_CHECKING:
    from dspark_bench.drafters.base import Slot
    from dspark_bench.drafters.types import LossOutput, TrainBatch
    from dspark_bench.target.model import Target

log = logging.getLogger(__name__)


# ---- pure loss math ----------------------------------------------------------------------------------------
def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """H(target, softmax(logits)) = -sum_v target_v log softmax(logits)_v; [..., V] each -> [...]."""
    return -(target * torch.log_softmax(logits.float(), dim=-1)).sum(-1)


def tv_acceptance(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Analytic acceptance alpha* = 1 - 1/2 ||q - p||_1 = sum_v min(q_v, p_v); [..., V] each -> [...] (inside
    ``vocab.exact_target_law`` the target's mass outside the draft vocabulary counts in the distance)."""
    return 1.0 - 0.5 * ((q.float() - p.float()).abs().sum(-1) + vocab.missing_mass(p))


def shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """out[:, t] = x[:, t + k] (zero / False past the end); x: [B, n, ...]."""
    out = torch.zeros_like(x)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over ``mask`` (same shape); 0 when nothing is valid."""
    return (x * mask).sum() / mask.sum().clamp_min(1)


def ttt_mask(attention: torch.Tensor, step: int) -> torch.Tensor:
    """Training-time-test mask [B, n, (step+1) n] over keys ordered [step 0 | step 1 | ... | step].

    Query (t, step) sees step-0 keys at real positions s <= t (its own position always, so no row is empty)
    and the key at the same position t of each later step 1..step (the diagonal links). attention: [B, n] bool.
    """
    n = attention.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=attention.device)
    first = torch.ones(n, n, dtype=torch.bool, device=attention.device).tril() & (attention.unsqueeze(1) | eye)
    return torch.cat([first, *[eye.expand_as(first)] * step], dim=-1)


# ---- models ------------------------------------------------------------------------------------------------
class ChainModel(nn.Module):
    """A single-layer drafter run over pairs (context hidden, next token), with the frozen target embedding
    and LM head. Subclasses define ``context`` (target features -> first hidden) and ``forward``."""

    method: ClassVar[str]

    def __init__(self, spec: LayerSpec, target: Target):
        super().__init__()
        self.spec = spec
        self.target = target  # a plain attribute: the target's weights are not part of this module
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        vocab.install(self)  # draft_vocab buffer: None = the full head (see vocab.py)

    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Draft over the token ids [N] only (None: the full vocabulary); see ``vocab.py``."""
        vocab.set_ids(self, ids)

    @property
    def draft_head(self) -> vocab.DraftHead:
        return vocab.head(self)

    def context(self, layers: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        """First-step hidden from target features (layers: [..., n_taps, d], final: [..., d]) -> [..., d]."""
        raise NotImplementedError

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, L] -> [B, L, d]
        return self.target.model.get_input_embeddings()(tokens).to(self.norm.weight.dtype)

    def logits(self, hidden: torch.Tensor, compact: bool = False) -> torch.Tensor:
        """[..., d] -> [..., V] float32, -inf outside the draft vocabulary ([..., N] over it with ``compact``)."""
        head = self.draft_head
        return head.sub_logits(self.norm(hidden)) if compact else head.logits(self.norm(hidden))

    def target_probs(self, final: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., N]
        """pi = softmax(W_out final) in fp32, without gradient (the distillation target), over the draft
        vocabulary and renormalised there (all V tokens for the full head)."""
        return self.draft_head.target_law(final)

    def arch(self) -> dict[str, Any]:
        return {"layer": asdict(self.spec)}

    @classmethod
    def from_arch(cls, arch: dict[str, Any], target: Target) -> ChainModel:
        return cls(LayerSpec(**arch["layer"]), target)

    def save(self, folder: str | Path) -> Path:
        """Our checkpoint format: trained weights only + the target's fingerprint."""
        fingerprint = checkpoint.TargetFingerprint.of(self.target)
        return checkpoint.save(folder, self.method, self.arch(), self.state_dict(), fingerprint)

    @classmethod
    def load(cls, folder: str | Path, target: Target) -> ChainModel:
        """Load one of our checkpoints bit-exactly (in the dtype it was saved in)."""
        meta, state = checkpoint.load(folder)
        if meta.get("method") != cls.method:
            raise checkpoint.CheckpointError(f"{folder} holds a {meta.get('method')!r} drafter, not {cls.method!r}")
        checkpoint.check_target(meta, target)
        try:
            model = cls.from_arch(meta["config"], target)
        except (KeyError, TypeError) as exc:
            raise checkpoint.CheckpointError(f"{folder}: bad architecture in config.json ({exc})") from None
        model.to(next(v.dtype for v in state.values() if v.is_floating_point()))
        model.set_draft_vocab(state.get(vocab.STATE_KEY))  # a checkpoint's list sizes the buffer
        model.load_state_dict(state)
        return model


class Eagle3Model(ChainModel):
    method = "eagle3"

    def __init__(self, spec: LayerSpec, taps: tuple[int, ...], target: Target):
        super().__init__(spec, target)
        self.taps = tuple(taps)
        self.fc = Linear(len(self.taps) * spec.hidden_size, spec.hidden_size, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(spec, fused=True)])

    def arch(self) -> dict[str, Any]:
        return {**super().arch(), "taps": list(self.taps)}

    @classmethod
    def from_arch(cls, arch: dict[str, Any], target: Target) -> Eagle3Model:
        return cls(LayerSpec(**arch["layer"]), tuple(arch["taps"]), target)

    def context(self, layers: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
        return self.fc(layers.flatten(-2).to(self.fc.weight.dtype))  # g0 = W_fc [a^l1; ...; a^l5]

    def forward(
        self,
        hidden: torch.Tensor,  # [B, L, d] g (g0 from features, or the draft's own output hidden)
        tokens: torch.Tensor,  # [B, L] the token paired with each hidden (y_{t+1})
        positions: torch.Tensor,  # [B, L] RoPE positions
        past: KV | None,  # [B, n_kv, C, hd] each
        mask: torch.Tensor,  # [B, L, C+L] bool
    ) -> tuple[torch.Tensor, KV]:
        return self.layers[0](self.embed(tokens), hidden, positions, past, mask)

    def ttt_hiddens(self, batch: TrainBatch, ttt_length: int, where: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Output hidden of each training-time-test step k = 0..K-1, [B, n, d] each ([B, N, d] at ``where``).

        Step k at position t: input (h_k,t, y_{t+1+k}) at RoPE position t+k, with h_0 = g0_t and h_k the
        step-(k-1) output at t; keys per :func:`ttt_mask`. This is exactly what chain drafting computes from the
        cache of positions <= t with teacher-forced tokens (tested).

        ``where`` [B, N] (positions per row): only those positions' hiddens are wanted. Step 0 still runs over
        every position (its keys are every later step's context), but steps 1..K-1 run over the N positions
        alone: position t's chain reads only step-0 keys and its own earlier steps (the diagonal of
        :func:`ttt_mask`), so the values are the same as the full computation's at ``where`` (tested), at N/n of
        its cost.
        """
        b, n = batch.input_ids.shape
        positions = torch.arange(n, device=batch.input_ids.device).expand(b, n)
        where = positions if where is None else where  # every position: the rows of ttt_mask in order
        first = ttt_mask(batch.attention, 0)  # [B, n, n]: step-0 keys each query sees
        hidden, past = self(self.context(batch.layers, batch.final), shift_left(batch.input_ids, 1), positions, None,
                            first)
        width = where.shape[1]
        h = hidden.gather(1, where.unsqueeze(-1).expand(b, width, hidden.shape[-1]))
        out = [h]
        seen = first.gather(1, where.unsqueeze(-1).expand(b, width, n))  # [B, N, n]
        eye = torch.eye(width, dtype=torch.bool, device=where.device).expand(b, width, width)
        for k in range(1, ttt_length):
            tokens = shift_left(batch.input_ids, 1 + k).gather(1, where)
            h, kv = self(h, tokens, where + k, past, torch.cat([seen, *[eye] * k], dim=-1))
            past = (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2))
            out.append(h)
        return out

    def loss(self, batch: TrainBatch, generator: torch.Generator | None = None, ttt_length: int = 7,
             step_decay: float = 0.8, num_anchors: int | None = None) -> LossOutput:
        """TTT loss (SpecForge/DeepSpec ``compute_eagle3_loss``).

        Step k at position t is scored against pi_{t+1+k} (the target law of y_{t+2+k}) and counts when
        y_{t+2+k} is a response token: L = sum_k step_decay^k * sum_valid H(pi, q) / (B n), DeepSpec's
        normaliser (all scored slots). Step weights are the reference's 0.8^k, not DSpark's exp(-(k-1)/4).

        ``num_anchors`` (our addition for CPU budgets): score only that many positions per sequence, drawn with
        ``generator`` uniformly among those whose step-0 token is a response token, and normalise by B N. TTT
        step 0 still runs over every position (its keys are the context of every later step); steps 1..K-1, the
        LM head, the target law and the loss run at the drawn positions alone (:meth:`ttt_hiddens` with
        ``where``). A position t then plays the role of a block drafter's anchor t+1: it supervises the next
        ``ttt_length`` tokens, so with equal ``num_anchors`` Eagle3 and the block drafters score the same number
        of predictions per sequence.
        None scores every position (deterministic; ``generator`` unused).
        """
        from dspark_bench.drafters.types import LossOutput

        b, n = batch.input_ids.shape
        device = batch.input_ids.device
        if num_anchors is None:
            where = torch.arange(n, device=device).expand(b, n)
            keep = torch.ones(b, n, dtype=torch.bool, device=device)
        else:
            from dspark_bench.drafters.blockloss import sample_positions

            if generator is None:
                raise ValueError("eagle3 loss with num_anchors needs a generator")
            first = shift_left(batch.loss_mask.bool() & batch.attention.bool(), 2)
            where, keep = sample_positions(first.cpu(), num_anchors, generator, device)
        width = where.shape[1]

        def at(x: torch.Tensor, offset: int) -> torch.Tensor:  # x [B, n, ...] at where + offset (clamped)
            idx = (where + offset).clamp_max(n - 1)
            if x.dim() == 2:
                return x.gather(1, idx)
            return x.gather(1, idx.unsqueeze(-1).expand(*idx.shape, x.shape[-1]))

        total, terms, accept = batch.final.new_zeros((), dtype=torch.float32), {}, []
        for k, hidden in enumerate(self.ttt_hiddens(batch, ttt_length, where)):  # hidden [B, N, d] at where
            logits = self.logits(hidden, compact=True)  # over the draft vocabulary, like the target law
            target = self.target_probs(at(batch.final, 1 + k))
            valid = (keep & (where + 2 + k < n) & at(batch.loss_mask.bool(), 2 + k)).float()
            ce = soft_cross_entropy(logits, target)  # [B, N]
            total = total + step_decay**k * (ce * valid).sum() / (b * width)
            terms[f"ce{k}"] = float(masked_mean(ce.detach(), valid))
            accept.append(masked_mean(tv_acceptance(torch.softmax(logits.detach(), -1), target), valid))
        terms["loss"] = float(total.detach())
        return LossOutput(total, terms, torch.stack(accept))


# ---- inference ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class ChainState:
    """Per-request draft cache: ``length`` pairs at positions 0..length-1; ``hidden`` [d] is the output at
    the last one (its logits give the first draft token). kv: [n_kv, length, hd] each."""

    kv: KV | None = None
    hidden: torch.Tensor | None = None
    length: int = 0


class ChainDrafter(Drafter):
    """Chain drafting with a :class:`ChainModel`, batched over the active slots (left-padded caches)."""

    model: ChainModel

    def max_steps(self, ctx: DraftContext) -> int:
        return ctx.block_size

    def begin(self, ctx: DraftContext, slots: list[Slot]) -> None:
        for slot in slots:
            slot.state = ChainState()
        with ctx.timer.span("forward"):
            self._extend(slots)

    def commit(self, ctx: DraftContext, slots: list[Slot], verdicts) -> None:
        with ctx.timer.span("forward"):
            self._extend(slots)  # the proposal's entries were never stored: the cache is already "cropped"

    def end(self, ctx: DraftContext, slots: list[Slot]) -> None:
        for slot in slots:
            slot.state = None

    def _empty_kv(self) -> torch.Tensor:  # [n_kv, 0, hd]
        s, w = self.model.spec, self.model.norm.weight
        return w.new_zeros(s.num_kv_heads, 0, s.head_dim)

    @torch.inference_mode()
    def _extend(self, slots: list[Slot]) -> None:
        """Append the pairs (context of position t, y_{t+1}) of every committed position not yet cached."""
        rows = [(slot, self._pairs(slot)) for slot in slots]
        rows = [(slot, m) for slot, m in rows if m > 0]
        if not rows:
            return
        width, device = max(m for _, m in rows), self.model.norm.weight.device
        past, valid = stack_left([slot.state.kv for slot, _ in rows], self._empty_kv())
        hidden = self.model.norm.weight.new_zeros(len(rows), width, self.model.spec.hidden_size)
        for r, (slot, m) in enumerate(rows):
            f = slot.new_features.head(m)
            hidden[r, :m] = self.model.context(f.layers, f.final)
        tokens = to_device([slot.tokens[slot.state.length + 1 : slot.state.length + 1 + m] + [0] * (width - m)
                            for slot, m in rows], device)  # [rows, width], right-padded
        starts = to_device([slot.state.length for slot, _ in rows], device)
        positions = starts.unsqueeze(1) + torch.arange(width, device=device)
        out, (k, v) = self.model(hidden, tokens, positions, past, attention_mask(valid, width))
        for r, (slot, m) in enumerate(rows):
            old = slot.state.kv or (self._empty_kv(), self._empty_kv())
            slot.state.kv = (torch.cat([old[0], k[r, :, :m]], 1), torch.cat([old[1], v[r, :, :m]], 1))
            slot.state.hidden, slot.state.length = out[r, m - 1], slot.state.length + m

    def _pairs(self, slot: Slot) -> int:
        """How many new pairs ``slot`` has: one per committed position with a known next token."""
        if slot.new_features is None:
            raise DrafterError(f"{self.name} needs target features in slot.new_features (engine taps)")
        todo = len(slot.tokens) - 1 - slot.state.length
        if todo > len(slot.new_features):
            raise DrafterError(f"{self.name}: {todo} positions to cache but features for {len(slot.new_features)}")
        return todo

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> Proposal:
        """Chain drafting, batched over requests: each step one forward and one batched draw for all R rows.
        Rows keep drafting past an EOS (no host sync to find it): the verifier stops at an accepted EOS, so the
        tokens after it are never examined."""
        slots, steps = ctx.slots, self.max_steps(ctx)
        if not slots or steps < 1:
            return Proposal.empty(len(slots))
        device, timer = self.model.norm.weight.device, ctx.timer
        (keys, values), valid = stack_left([s.state.kv for s in slots], self._empty_kv())
        hidden = torch.stack([s.state.hidden for s in slots]).unsqueeze(1)  # [R, 1, d]
        starts = to_device([s.state.length for s in slots], device).unsqueeze(1)
        u = ctx.draft_uniforms(steps, device)  # [R, steps]
        tokens = torch.zeros(len(slots), steps, dtype=torch.long, device=device)
        head = self.model.draft_head
        with timer.span("sample"):  # [steps, R, V]: each step writes contiguous memory (see dspark.sample_markov)
            q = head.law_buffer(steps, len(slots), device=device, scratch=ctx.scratch)  # as [R, steps, V]
        for j in range(steps):
            with timer.span("forward"):
                logits = self.model.logits(hidden[:, -1], compact=True)  # [R, N], head space
            with timer.span("sample"):
                tokens[:, j] = head.draw(logits, ctx.sampling, u[:, j], q[j])  # q[j]: [R, V]
            if j == steps - 1:
                break
            with timer.span("forward"):
                step_mask = attention_mask(valid, 1)
                hidden, (k, v) = self.model(hidden, tokens[:, j : j + 1], starts + j, (keys, values), step_mask)
                keys, values = torch.cat([keys, k], 2), torch.cat([values, v], 2)
                valid = torch.cat([valid, valid.new_ones(len(slots), 1)], 1)
        return Proposal(tokens, torch.full((len(slots),), steps, dtype=torch.long), q.transpose(0, 1))


def check_taps(taps: tuple[int, ...], num_layers: int) -> None:
    """Taps must be distinct, increasing: -1 (the embedding output) or decoder layers 0..L-2 (the last layer's HF
    state is post-norm)."""
    if not taps or list(taps) != sorted(set(taps)) or not all(-1 <= t <= num_layers - 2 for t in taps):
        raise DrafterError(f"taps {tuple(taps)} invalid for a {num_layers}-layer target: need strictly "
                           f"increasing layer ids in -1 (the embedding output) and 0..{num_layers - 2} "
                           f"(the last layer is never tapped)")


def checkpoint_folder(spec: str | None, target: Target, method: str) -> Path | None:
    """The folder to load: the configured one (folder or hub id, as for DSpark), else the reference shipped in
    ``dspark_bench/drafters/shipped/<target>/<method>/``, else None (random weights)."""
    from dspark_bench.drafters.blockdraft import shipped
    from dspark_bench.drafters.blockdrafter import resolve_checkpoint

    return resolve_checkpoint(spec) if spec else shipped(method, target)


def fresh(model: ChainModel, seed: int, method: str) -> ChainModel:
    """Seeded random initialisation, with the warning that no trained weights are used."""
    log.warning("%s: no checkpoint given or shipped for target %r; using random weights (seed %d)",
                method, model.target.name, seed)
    init_weights(model, seed)
    return model
