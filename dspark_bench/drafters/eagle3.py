"""``eagle3``: the Eagle3 drafter as DeepSpec implements it (reference section 2.2).

Model (one decoder layer, width d = target hidden size):

* fused feature ``g0_t = W_fc f_t`` with ``f_t`` the concatenated outputs of the tapped target layers
  (Linear(n_taps*d -> d), no bias, no norm);
* layer input ``u = [RMSNorm_in(Emb(token)); RMSNorm_hid(g)]`` (width 2d) for Q/K/V, residual = raw ``g``,
  then post-attention RMSNorm + SwiGLU MLP residual (Qwen3 targets add per-head q/k norm);
* logits ``W_out RMSNorm_final(g')`` with a learned final norm; ``Emb`` and ``W_out`` are the frozen target's
  (``target.model.get_input_embeddings()``, ``target.lm_head``), never copied into our checkpoints.

Inference is **chain drafting** (:mod:`dspark_bench.drafters.chain`, shared with MTP): one token at a time from
the layer's own output hidden states, over a per-request draft KV cache of (context hidden, token) pairs.
The model class (:class:`~dspark_bench.drafters.chain.Eagle3Model`) lives in that module, beside the loader of
DeepSeek's format (:mod:`dspark_bench.drafters.deepseek_eagle3`) that builds it; this module is the registered
drafter, which picks the weights.

Training: :meth:`~dspark_bench.drafters.chain.Eagle3Model.loss`, the training-time test (TTT) over ``ttt_length`` steps (see there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dspark_bench.drafters import deepseek_eagle3, vocab
from dspark_bench.drafters.blockdraft import default_taps
from dspark_bench.drafters.chain import ChainDrafter, Eagle3Model, check_taps, checkpoint_folder, fresh
from dspark_bench.drafters.layers import LayerSpec
from dspark_bench.drafters.registry import DrafterError, register

if TYPE_CHECKING:
    from dspark_bench.target.model import Target


@register("eagle3")
class Eagle3Drafter(ChainDrafter):
    @dataclass(frozen=True)
    class Config:
        checkpoint: str | None = None  # our format or DeepSeek's (``Qwen3Eagle3Model``); None: shipped or random
        taps: tuple[int, ...] | str | None = None  # random init only; None: default_taps; "1,9,17,25,33" ok
        intermediate_size: int | None = None  # random init only; None: the target's
        seed: int = 0  # random init only
        draft_vocab: str | None = None  # None: the checkpoint's list (full head without one); "full"; a `data vocab` file

    def __init__(self, config: Config, target: Target):
        super().__init__(config, target)
        taps = config.taps
        if isinstance(taps, str):
            taps = tuple(int(t) for t in taps.split(",") if t.strip())
        folder = checkpoint_folder(config.checkpoint, target, self.name)
        if folder is not None:
            model = _load_eagle3(folder, target)
            if taps is not None and tuple(taps) != model.taps:
                raise DrafterError(f"eagle3: taps {tuple(taps)} conflict with the checkpoint's {model.taps}")
        else:
            spec = LayerSpec.from_target(target, config.intermediate_size)
            taps = tuple(taps) if taps is not None else default_taps(target.num_layers)
            model = fresh(Eagle3Model(spec, taps, target), config.seed, self.name)
        check_taps(model.taps, target.num_layers)
        vocab.choose(model, config.draft_vocab)
        self.model = model.to(device=target.device, dtype=target.dtype).eval()

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.model.taps


def _load_eagle3(folder: Path, target: Target) -> Eagle3Model:
    if deepseek_eagle3.is_deepseek_eagle3(folder):
        return deepseek_eagle3.load(folder, target)
    return Eagle3Model.load(folder, target)

