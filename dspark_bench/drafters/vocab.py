"""Reduced draft vocabulary: draft over the N most frequent target tokens, verify over all V.

Terms:

* **draft vocabulary** ``S``: a sorted LongTensor of N target token ids, the N most frequent tokens of the
  training data's responses (:func:`build_vocab`), with every EOS id and the chat template's special tokens
  always included. Ties are broken by the smaller id, so the list is a pure function of the data and N.
* **head space**: coordinates over ``S`` (``[..., N]``); **full space**: over the target vocabulary (``[..., V]``).
* :class:`DraftHead`: the target's frozen LM head restricted to the rows of ``S``. Its logits cost one matmul
  with N rows instead of V (the saving: SmolLM2's head is 28M of the ~40M multiply-adds of a drafted token).
  ``logits`` returns them in full space with ``-inf`` outside ``S``, so ``verify.to_probs`` gives the draft law
  ``q`` with exact zeros outside ``S`` (softmax over ``S`` at the sampling temperature, after any top-k /
  top-p / min-p filter; argmax over ``S`` at T = 0). ``q`` is exactly the law the token is drawn from, the target verifies over all V tokens, and
  speculative sampling stays lossless for any ``S`` (tested by enumeration).

Training over ``S`` (used by every trainable drafter's loss):

* draft logits are computed in head space (:meth:`DraftHead.sub_logits`);
* the target law is **restricted to S and renormalised** (:meth:`DraftHead.target_law`, the softmax of the
  target's logits over ``S``): the KL/soft-CE and L1 losses pull ``q`` towards ``p(. | S)``. Among the laws
  supported on ``S``, ``p(. | S)`` is the one these losses have as unique minimiser and it attains the best
  possible acceptance ``sum_v min(q_v, p_v) = p(S)``. It needs only the N target rows, so training is cheaper too;
  the price is that the logged analytic acceptance (and DSpark's confidence target) is the acceptance
  conditional on the target's token being in ``S`` (an overestimate by a factor of at most ``1 / p(S)``);
* hard-label cross-entropy **drops** the slots whose label is outside ``S`` (weight 0): such a token can never
  be drafted, there is no row to score it with, and the population minimiser of the CE over the kept slots is
  again ``p(. | S)``, consistent with the soft losses. Later slots of the same block keep their weight
  (teacher forcing feeds them the true tokens).

Held-out scoring (:func:`exact_target_law`): inside that context :meth:`DraftHead.target_law` returns the target's
own probabilities of S's tokens, not renormalised (they sum to ``p(S)``), and the losses' analytic acceptance counts
the missing mass ``1 - p(S)`` as distance (:func:`missing_mass`), so it is ``sum_v min(q_v, p_v)`` over all V
tokens: the acceptance of speculative sampling, not the one conditional on S. It costs the full head's matmul, so
training never uses it; with the full head it changes nothing.

The list ships with the checkpoint as the ``draft_vocab`` tensor of ``model.safetensors`` (a persistent buffer of
the drafter model, absent for the full head); :func:`write_vocab` / :func:`read_vocab` store a list on its own as
JSON (``dspark-bench data vocab``), to apply it to any checkpoint with ``--drafter-opt NAME.draft_vocab=FILE``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from dspark_bench.core.verify import Sampling, sample, to_probs
from dspark_bench.target.fast import Linear, onednn_packs

if TYPE_CHECKING:
    from dspark_bench.target.model import Target

STATE_KEY = "draft_vocab"  # the buffer's name, and its key in model.safetensors
FORMAT = "dspark-bench-draft-vocab/1"
FULL = "full"  # drafter option value: use the full head even when the checkpoint ships a list
_exact = False  # inside exact_target_law(): target laws over S are the target's own probabilities (held-out scoring)


@contextmanager
def exact_target_law() -> Iterator[None]:
    """Within: :meth:`DraftHead.target_law` gives ``p_v`` for v in S without renormalising, and the analytic
    acceptance of every drafter's loss is exact over the full vocabulary (:func:`missing_mass`). For scoring only:
    the loss values themselves are not those of training. Not thread-safe (a module flag)."""
    global _exact
    before, _exact = _exact, True
    try:
        yield
    finally:
        _exact = before


def missing_mass(pi: torch.Tensor) -> torch.Tensor | float:
    """The target's mass outside the draft vocabulary, ``1 - sum(pi)`` [...], inside :func:`exact_target_law`
    (where ``pi`` is not renormalised); 0 outside it. A draft law is zero there, so this mass adds to
    ``||q - pi||_1`` over S to give the full vocabulary's L1 distance."""
    if not _exact:
        return 0.0
    return (1.0 - pi.float().sum(-1)).clamp_min(0.0)


class VocabError(ValueError):
    """A draft vocabulary that is malformed or does not fit the target."""


# ---- building the list -----------------------------------------------------------------------------------------
def token_counts(sequences: Iterable[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in ``sequences``: LongTensor [V]."""
    parts = [torch.as_tensor(seq, dtype=torch.long) for seq in sequences]
    ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise VocabError(f"token ids must lie in 0..{vocab_size - 1}, got {int(ids.min())}..{int(ids.max())}")
    return torch.bincount(ids, minlength=vocab_size)


def build_vocab(counts: torch.Tensor, size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The draft vocabulary: ``always`` plus the most frequent other ids (by count, then smaller id) up to
    ``size`` ids in all; counts [V] -> sorted LongTensor [size]."""
    vocab = counts.shape[0]
    keep = sorted(set(int(t) for t in always))
    if not len(keep) <= size <= vocab:
        raise VocabError(f"draft vocabulary size {size} must lie within {len(keep)} (the always-kept ids) "
                         f"and {vocab} (the target vocabulary)")
    if keep and not 0 <= keep[0] <= keep[-1] < vocab:
        raise VocabError(f"always-kept ids {keep} outside the target vocabulary 0..{vocab - 1}")
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[keep] = False  # already chosen: leave them out of the ranking
    ids = torch.arange(vocab)[rest]  # ascending, so a stable sort by count keeps the smaller id first on ties
    order = ids[torch.sort(-counts.to(torch.long)[rest], stable=True).indices]
    chosen = keep + order[: size - len(keep)].tolist()
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Share of the counted tokens that lie in ``ids`` (counts [V], ids [N])."""
    total = int(counts.sum())
    return float(counts[ids].sum()) / total if total else 0.0


def special_ids(target: Target) -> frozenset[int]:
    """EOS ids and the tokenizer's special / added-special tokens (the chat template's markers)."""
    out = set(target.eos_ids)
    tok = getattr(target, "tokenizer", None)
    if tok is not None:
        out |= set(getattr(tok, "all_special_ids", ()) or ())
        for i, added in (getattr(tok, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                out.add(int(i))
    return frozenset(t for t in out if 0 <= t < target.vocab_size)


def response_tokens(sequences: Iterable[Any]) -> Iterable[tuple[int, ...]]:
    """The loss part (response, end-of-turn token included) of each ``TrainSequence``."""
    return (s.input_ids[s.loss_start :] for s in sequences)


def vocab_for(target: Target, sequences: Sequence[Any], size: int) -> torch.Tensor:
    """The draft vocabulary of ``size`` ids for training ``sequences`` (TrainSequence) on ``target``."""
    counts = token_counts(response_tokens(sequences), target.vocab_size)
    return build_vocab(counts, size, special_ids(target))


def check_ids(ids: torch.Tensor, vocab_size: int, required: Iterable[int] = ()) -> torch.Tensor:
    """``ids`` as a CPU LongTensor [N] after checking it is strictly increasing, within the vocabulary and holds
    ``required`` (the EOS ids)."""
    ids = torch.as_tensor(ids).detach().cpu()
    if ids.dtype != torch.long or ids.dim() != 1 or ids.numel() == 0:
        raise VocabError(f"a draft vocabulary is a non-empty 1-D int64 tensor, got {ids.dtype} {tuple(ids.shape)}")
    if bool((ids[1:] <= ids[:-1]).any()) or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise VocabError(f"draft vocabulary ids must be strictly increasing within 0..{vocab_size - 1}")
    missing = sorted(set(int(t) for t in required) - set(ids.tolist()))
    if missing:
        raise VocabError(f"draft vocabulary lacks the EOS ids {missing}: drafts could never end a request")
    return ids


def write_vocab(path: str | Path, ids: torch.Tensor, info: dict[str, Any]) -> Path:
    """Store a list as JSON: {"format", "size", "ids", "info"} (``info``: provenance, coverage)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"format": FORMAT, "size": int(ids.numel()), "ids": ids.tolist(), "info": info}) + "\n")
    return out


def read_vocab(path: str | Path) -> torch.Tensor:
    """The ids of a list written by :func:`write_vocab`."""
    p = Path(path)
    if not p.is_file():
        raise VocabError(f"draft vocabulary {p} not found (accepted: {FULL!r}, or a file from `dspark-bench data vocab`)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # both ValueErrors; the message names no file
        raise VocabError(f"{p}: not a {FORMAT} file (not readable JSON: {exc}); write one with "
                         "`dspark-bench data vocab`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or len(data.get("ids", ())) != data.get("size"):
        raise VocabError(f"{p}: not a {FORMAT} file; write one with `dspark-bench data vocab`")
    return torch.tensor(data["ids"], dtype=torch.long)


# ---- the restricted head -------------------------------------------------------------------------------------
def expand(x: torch.Tensor, ids: torch.Tensor, vocab_size: int, fill: float) -> torch.Tensor:
    """Head-space x [..., N] placed at columns ``ids`` of a full-space tensor [..., V] filled with ``fill``."""
    out = x.new_full((*x.shape[:-1], vocab_size), fill)
    return out.index_copy_(-1, ids.to(x.device), x)


class DraftHead:
    """The frozen LM head weight [V, d] (bias [V] or None; optional Gemma soft-capping) over rows ``ids``
    [N] (None: all V rows, exactly the target's own head)."""

    def __init__(self, weight: torch.Tensor, ids: torch.Tensor | None, bias: torch.Tensor | None = None,
                 softcap: float | None = None):
        self.vocab_size, self.softcap = int(weight.shape[0]), softcap
        self.ids = None if ids is None else ids.to(weight.device)
        self._full = (weight.detach(), None if bias is None else bias.detach())  # a view, for exact_target_law
        with torch.no_grad():  # frozen: a copy of the N rows, made once
            self.weight = weight.detach() if ids is None else weight.detach().index_select(0, self.ids)
            self.bias = None if bias is None else (bias.detach() if ids is None else bias.detach()[self.ids])
        self._linear: Linear | None = None  # the product over these rows, made by the first sub_logits

    @staticmethod
    def of(target: Target, ids: torch.Tensor | None) -> DraftHead:
        head = target.model.get_output_embeddings()
        return DraftHead(head.weight, ids, getattr(head, "bias", None), getattr(target, "_softcap", None))

    @staticmethod
    def full_space(vocab_size: int) -> DraftHead:
        """No list and no weight: :meth:`law_buffer` and :meth:`draw` over all ``vocab_size`` columns, for logits
        computed elsewhere (its logit methods are not for use)."""
        return DraftHead(torch.empty(vocab_size, 0), None)

    @property
    def size(self) -> int:
        """N, the number of draftable tokens."""
        return self.vocab_size if self.ids is None else int(self.ids.numel())

    def sub_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Head-space logits [..., N] (float32) of hidden states h [..., d] (cast to the head's dtype). The product
        is the target's :class:`~dspark_bench.target.fast.Linear` over the N rows: on the CPU it reads them packed
        once (made at the first call) where that is the faster kernel, and ``F.linear`` under autograd."""
        if self._linear is None:
            self._linear = Linear(self.weight, self.bias, onednn_packs(self.weight.dtype, self.weight.device))
        logits = self._linear(h.to(self.weight.dtype))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Full-space logits [..., V] (float32), -inf outside the draft vocabulary: ``to_probs`` of them is the
        softmax over S at temperature T (argmax over S at T = 0) with exact zeros elsewhere."""
        return self.to_full(self.sub_logits(h), float("-inf"))

    def law_buffer(self, *shape: int, device: torch.device | str | None = None, scratch: dict | None = None
                   ) -> torch.Tensor:
        """A float32 buffer [*shape, V] for draft laws in full space, to be filled by :meth:`draw`: zero outside the
        draft vocabulary (draw writes only its N columns), uninitialised for the full head (draw writes all V).

        ``scratch``: the engine's :attr:`DraftContext.scratch`. The buffer is then made once per head and handed out
        again at every round, as a view of its first elements: the columns outside the vocabulary stay zero (no
        draw writes them, whatever the view's shape, since each element keeps its column), so nothing is zeroed
        per round. A [G, R, V] law is 12.6 MB at R = 8 (50 MB at 32), which a fresh buffer zeroed at every round
        (``Scratch`` in ``engines/native/loop.py`` has what reuse gained). A buffer so taken is valid until the
        head's next call."""
        make = torch.empty if self.ids is None else torch.zeros
        if scratch is None:
            return make(*shape, self.vocab_size, dtype=torch.float32, device=device)
        n = math.prod(shape) * self.vocab_size
        head, flat = scratch.get("draft laws", (None, None))
        if head is not self or flat.numel() < n or flat.device != torch.device(device or "cpu"):
            flat = make(n, dtype=torch.float32, device=device)
            scratch["draft laws"] = (self, flat)
        return flat[:n].view(*shape, self.vocab_size)

    def draw(self, logits: torch.Tensor, sampling: Sampling | float, u: torch.Tensor, out: torch.Tensor
             ) -> torch.Tensor:
        """Draft tokens [...] (target ids) from head-space logits [..., N] (:meth:`sub_logits`, plus any head-space
        bias) under ``sampling`` (``DraftContext.sampling``, or a bare temperature) with uniforms u [...] (float64),
        writing the law they were drawn from into ``out`` [..., V] (from :meth:`law_buffer`).

        With a list, the softmax and the inverse-CDF search run over the N columns, and the law the token is drawn
        from goes to S's columns of ``out``: the law of drawing over the full logits with -inf outside S (up to the
        float32 rounding of a softmax summed over N values instead of V), at N/V of the cost. The ids ascend, so the
        head-space CDF is the full CDF without its zero steps.

        The filters then see only S's logits, as they would see the full logits with -inf outside S: a token outside
        S is never among the top-k (when fewer than k are in S no filter cuts, and it has no mass anyway), adds no
        mass to top-p's sum and stays below min-p's floor."""
        if self.ids is None:
            return sample(to_probs(logits, sampling, out=out), u)
        probs = to_probs(logits, sampling)  # [..., N]
        ids = self.ids.to(probs.device)
        out.scatter_(-1, ids.expand_as(probs), probs)
        return ids[sample(probs, u)]

    def to_full(self, x: torch.Tensor, fill: float) -> torch.Tensor:  # [..., N] -> [..., V]
        return x if self.ids is None else expand(x, self.ids, self.vocab_size, fill)

    def restrict(self, x: torch.Tensor) -> torch.Tensor:  # [..., V] -> [..., N]
        return x if self.ids is None else x.index_select(-1, self.ids.to(x.device))

    def target_law(self, z: torch.Tensor) -> torch.Tensor:
        """The target's law at final hidden states z [..., d], restricted to S and renormalised: [..., N] fp32
        (inside :func:`exact_target_law`: the target's probabilities of S's tokens, summing to p(S))."""
        with torch.no_grad():
            if not _exact or self.ids is None:
                return torch.softmax(self.sub_logits(z), dim=-1)
            weight, bias = self._full
            logits = F.linear(z.to(weight.dtype), weight, bias)
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            return torch.log_softmax(logits.float(), dim=-1).index_select(-1, self.ids.to(logits.device)).exp()

    def labels(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids y [...] as head-space indices [...] (0 where outside S) and inside [...] bool."""
        if self.ids is None:
            return y, torch.ones_like(y, dtype=torch.bool)
        ids = self.ids.to(y.device)
        pos = torch.searchsorted(ids, y).clamp_max(ids.numel() - 1)
        inside = ids[pos] == y
        return torch.where(inside, pos, 0), inside


class HeadCache:
    """The :class:`DraftHead` of a drafter model, rebuilt only when its ``draft_vocab`` buffer changes (set
    again, loaded, moved). Plain object on the model (not a Module): the frozen rows are never saved."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._head: DraftHead | None = None

    def get(self, target: Target, ids: torch.Tensor | None) -> DraftHead:
        weight = target.model.get_output_embeddings().weight
        key = (weight.data_ptr(), weight.device, None if ids is None else (ids.data_ptr(), ids.device, ids.numel()))
        if key != self._key or self._head is None:
            self._head, self._key = DraftHead.of(target, ids), key
        return self._head

    def clear(self) -> None:
        self._key, self._head = None, None


class RowLinear(torch.nn.Linear):
    """A trained ``Linear(in -> V)`` (e.g. DSpark's Markov output ``markov_w2``) evaluated over the draft
    vocabulary's rows only; ``rows`` (not saved) follows the model's ``draft_vocab`` (see :func:`install`).

    Under autograd (training) the rows are selected at every call, so gradients reach the full weight. Without it
    (decoding: DSpark's Markov head runs once per draft position) the selected rows are kept, with the target's
    :class:`~dspark_bench.target.fast.Linear` over them, until the weight or the rows change: selecting 8,192 of
    49,152 rows of rank 64 took about 20 times as long as the product itself at one row (2-vCPU AMD EPYC, fp32)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("rows", None, persistent=False)
        self._selected: tuple[tuple, Linear] | None = None  # (what it was made from, the product over the rows)

    def forward(self, x: torch.Tensor, compact: bool = False) -> torch.Tensor:
        """x [..., in] -> [..., V] (0 outside the rows), or head space [..., N] with ``compact``."""
        if self.rows is None:
            return super().forward(x)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            bias = None if self.bias is None else self.bias[self.rows]
            y = F.linear(x, self.weight.index_select(0, self.rows), bias)
        else:
            y = self._product()(x)
        return y if compact else expand(y, self.rows, self.out_features, 0.0)

    def _product(self) -> Linear:
        """The product over the selected rows, made again when the weight (an optimizer step, a load, a move)
        or the rows change. Tensors made under ``torch.inference_mode`` count no in-place changes: with such a
        weight the rows are selected at every call, as under autograd."""
        made_from = (*((t, t.data_ptr(), _version(t)) for t in (self.weight, self.bias) if t is not None),
                     (self.rows, self.rows.data_ptr(), 0))  # the rows are replaced (install's _sync), never changed
        if self._selected is not None and len(made_from) == len(self._selected[0]) and all(
                a[0] is b[0] and a[1:] == b[1:] for a, b in zip(made_from, self._selected[0], strict=True)):
            return self._selected[1]
        with torch.no_grad():
            weight = self.weight.detach().index_select(0, self.rows)
            bias = None if self.bias is None else self.bias.detach()[self.rows]
        product = Linear(weight, bias, onednn_packs(weight.dtype, weight.device))
        self._selected = None if any(stamp[2] is None for stamp in made_from) else (made_from, product)
        return product


def _version(t: torch.Tensor) -> int | None:
    """The in-place change counter of ``t``; None for an inference tensor, which keeps none."""
    try:
        return t._version
    except RuntimeError:
        return None


def install(model: torch.nn.Module) -> None:
    """Give a drafter model (``model.target`` set) the ``draft_vocab`` buffer (None: full head) and its head
    cache; after a state dict is loaded, the cache is dropped and the :class:`RowLinear` rows follow the buffer."""
    model.register_buffer(STATE_KEY, None)
    model._draft_heads = HeadCache()
    model.register_load_state_dict_post_hook(lambda module, _keys: _sync(module))


def _sync(model: torch.nn.Module) -> None:
    ids = getattr(model, STATE_KEY)
    for m in model.modules():
        if isinstance(m, RowLinear):
            m.rows = None if ids is None else ids.to(m.weight.device)
    model._draft_heads.clear()


def set_ids(model: torch.nn.Module, ids: torch.Tensor | None) -> None:
    """Set (or with None remove) the draft vocabulary of a model prepared by :func:`install`."""
    if ids is not None:
        ids = check_ids(ids, model.target.vocab_size, model.target.eos_ids)
        ids = ids.to(next((p.device for p in model.parameters()), ids.device))
    model.register_buffer(STATE_KEY, ids)
    _sync(model)


def head(model: torch.nn.Module) -> DraftHead:
    """The model's current :class:`DraftHead`."""
    return model._draft_heads.get(model.target, getattr(model, STATE_KEY))


def choose(model: torch.nn.Module, option: str | None) -> None:
    """Apply a drafter's ``draft_vocab`` option: None keeps the checkpoint's list (the full head when it ships
    none), ``"full"`` forces the full head, a path loads a list written by ``dspark-bench data vocab``."""
    if option is None:
        return
    set_ids(model, None if option == FULL else read_vocab(option))
