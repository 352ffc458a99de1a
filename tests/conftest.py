"""Shared fixtures: tiny random-weight targets built from a config (no hub, no files), and FIXTURES, the folder of
small data files made for the tests (tests/fixtures/<package>/..., see its README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dspark_bench.target.model import Target

TINY_EOS = 2
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARPEN = 6.0


def tiny_target(arch: str = "llama", seed: int = 0, vocab: int = 96, layers: int = 6, dtype=torch.float32,
                forward_path: str = "auto") -> Target:
    """A random-weight Llama- or Qwen3-style causal LM (hidden 64, 4 heads, 2 KV heads) wrapped as a Target; both run
    the fast forward unless ``forward_path`` says ``hf``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, eos_token_id=TINY_EOS, bos_token_id=1,
        pad_token_id=0, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    else:
        raise ValueError(arch)
    # Sharpen the output head so continuations are input-dependent but not near-uniform (entropy ~2-3 nats).
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(SHARPEN)
    model.config._attn_implementation = "sdpa"
    return Target(model.to(dtype), tokenizer=None, name=f"tiny-{arch}-{seed}", forward_path=forward_path)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module, restored afterwards: tiny models gain nothing from intra-op threads, and a
    second OpenMP thread on a busy 2-core machine costs tens of times the work. Opt in per module with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> Target:
    return tiny_target("llama")


@pytest.fixture(scope="session")
def tiny_qwen() -> Target:
    return tiny_target("qwen3")


def random_prompts(n: int, vocab: int = 96, seed: int = 0, min_len: int = 5, max_len: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=g))
        out.append(torch.randint(3, vocab, (length,), generator=g).tolist())  # avoid special ids 0..2
    return out
