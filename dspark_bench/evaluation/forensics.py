"""Divergence forensics: why two runs that should give the same tokens did not, from recorded rounds and laws.

Two runs of the same request with the same seed consume the same uniforms (:mod:`dspark_bench.core.rng` keys each
draw by (seed, position, purpose)), so their tokens differ only where the *laws* they drew from differ. In exact
arithmetic they would not; in floating point a target (or drafter) computed in another batch shape or another
forward shape (a one-token decode against a k+1 verify block) rounds differently. A divergence is then innocent
exactly when the draw that made it sat within that rounding of a decision boundary. This module holds the pure
half of that argument (no model, no I/O): which draw of the loop produced an output token, how far a uniform lies
from the boundary of its decision, how far two laws are apart, and the verdict.

Terms (notation of :mod:`dspark_bench.core.verify`: ``p`` target, ``q`` draft):

* **draw site** of output token i (:func:`draw_sites`, from a record's ``[proposed, verified, accepted,
  committed]`` rows): ``first`` (the first token, drawn from p at the prompt's last position with key
  (seed, prompt_len - 1, TARGET)); ``draft`` (draft x_{j+1} of a round whose current token sits at position c,
  tested with (seed, c + j + 1, ACCEPT) and, for a drafter that samples, drawn with (seed, c + j + 1, DRAFT));
  ``recovered`` (the residual draw after the first rejection), ``bonus`` (after a fully accepted block) and
  ``decode`` (a round that verified nothing), all with (seed, c, TARGET).
* **margin** of a decision: the signed distance of its uniform to the decision's boundary under a law. For a
  token drawn by inverse CDF (:func:`token_margin`): positive when u lies inside the token's CDF interval (the
  distance to the nearer cut), negative when it lies outside (how far it misses). For an acceptance test
  (:func:`accept_margin`): ``alpha - u`` when the test passed, ``u - alpha`` when it failed, with
  ``alpha = min(1, p(x)/q(x))``. At temperature 0 (:func:`logit_margin`): the token's logit minus the best other
  logit (the top-2 gap when the token is the argmax).
* **law difference** of a decision: how far the boundary can move between the two runs' laws: the largest gap of
  the two CDFs (:func:`cdf_gap`) for a token draw, ``|alpha_a - alpha_b|`` for a test, twice the largest logit
  difference at temperature 0 (a pairwise logit gap moves by at most that much).
* **verdict** (:func:`classify`): ``floating-point`` when some run's margin is within the law difference and no
  run's law misses its own token by more than it (the draw sat where the measured rounding flips it);
  ``unexplained`` otherwise (a bug until shown otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dspark_bench.core import rng
from dspark_bench.core.records import ResultsError
from dspark_bench.evaluation.runs import UNRECORDED

FIRST, DRAFT, RECOVERED, BONUS, DECODE = "first", "draft", "recovered", "bonus", "decode"
TARGET_DRAWS = (FIRST, RECOVERED, BONUS, DECODE)  # tokens drawn by the target with key (seed, anchor, TARGET)
FLOATING, UNEXPLAINED, UNEXAMINED = "floating-point", "unexplained", "unexamined"
PURPOSE_NAMES = {rng.DRAFT: "DRAFT", rng.ACCEPT: "ACCEPT", rng.TARGET: "TARGET"}


@dataclass(frozen=True)
class DrawSite:
    """Which draw of the loop produced one output token (see the module docstring).

    round: index of the record's round (-1 for the first token); slot: the token's offset among the round's
    committed tokens (j; 0 for the first token); verified / accepted: the round's l and A; anchor: absolute
    position of the round's current token (prompt_len - 1 for the first token)."""

    kind: str
    round: int
    slot: int
    verified: int
    accepted: int
    anchor: int

    @property
    def position(self) -> int:
        """Absolute position of the token this site produced."""
        return self.anchor + self.slot + 1

    def to_dict(self) -> dict:
        return {"kind": self.kind, "round": self.round, "slot": self.slot, "verified": self.verified,
                "accepted": self.accepted, "anchor": self.anchor}


def draw_sites(prompt_len: int, rounds, n_output: int) -> list[DrawSite]:
    """The draw site of every output token of a record: ``rounds`` rows are ``[proposed, verified, accepted,
    committed]``. A round commits its A accepted drafts, then the target's token unless an accepted EOS ended the
    request (committed = A). Raises :class:`ResultsError` when the rounds do not add up to ``n_output`` tokens."""
    sites = [DrawSite(FIRST, -1, 0, 0, 0, prompt_len - 1)] if n_output else []
    for r, (_, verified, accepted, committed) in enumerate(rounds):
        if committed not in (accepted, accepted + 1) or accepted > verified:
            raise ResultsError(f"round {r} [.., verified {verified}, accepted {accepted}, committed {committed}] "
                               f"is not a round of our loop (committed must be A or A + 1, A <= verified)")
        anchor = prompt_len + len(sites) - 1
        for j in range(committed):
            sites.append(DrawSite(_kind(j, verified, accepted), r, j, verified, accepted, anchor))
    if len(sites) != n_output:
        raise ResultsError(f"the rounds commit {len(sites)} tokens (first token included), the record holds "
                           f"{n_output}")
    return sites


def _kind(j: int, verified: int, accepted: int) -> str:
    if j < accepted:
        return DRAFT
    if verified == 0:
        return DECODE
    return RECOVERED if accepted < verified else BONUS


def parting(a: list[DrawSite], b: list[DrawSite], index: int) -> int | None:
    """Where two runs' rounds parted before their tokens did: when the draws that made output token ``index``
    belong to rounds starting at different positions (``a`` and ``b`` are the two records' :func:`draw_sites`,
    equal tokens up to ``index``), the first output token whose draw site differs between them, else None.

    Up to that token both runs made their tokens by the same kinds of draw with the same uniforms; at it one run
    accepted a draft where the other rejected one and drew the same token anew (or, where a scheduler verified
    other lengths, one drew a bonus token where the other tested a draft), so from there on each consumed other
    uniforms at the same positions and its tokens were free to part. That decision, not the one at ``index``, is
    what has to be judged."""
    if index >= min(len(a), len(b)) or a[index].anchor == b[index].anchor:
        return None
    return next((i for i in range(index) if (a[i].kind, a[i].anchor) != (b[i].kind, b[i].anchor)), None)


def first_divergence(a, b) -> int | None:
    """Index of the first output token where ``a`` and ``b`` differ (the shorter one's length when one is a
    prefix of the other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# Settings two runs must share for their tokens to be comparable at all: the same model, uniforms (seed) and law
# (temperature and the sampling filters), on the same prompts. At temperature > 0 also what shapes the rounds (a
# block size, scheduler or drafter option of its own draws other uniforms, or from another q: other tokens, the
# same law). The dtype, the concurrency, the engine's forward path and the drafters may differ: they are what a
# divergence check compares.
SAME_ALWAYS = ("target", "seed", "temperature", "top_p", "top_k", "min_p")
SAME_SAMPLED = ("block_size", "scheduler", "scheduler_options")


def incomparable(a: dict, b: dict) -> list[str]:
    """What differs between two run manifests in what makes their tokens comparable (empty: comparable), one
    entry per setting, e.g. ``"seed 0 vs 11"``. Reads ``args``, ``prompts`` and each common drafter's options."""
    args_a, args_b = a.get("args", {}), b.get("args", {})
    names = SAME_ALWAYS + (SAME_SAMPLED if (args_a.get("temperature") or 0) > 0 else ())
    a_of, b_of = ({k: args.get(k, UNRECORDED.get(k)) for k in names} for args in (args_a, args_b))
    out = [f"{k} {a_of[k]!r} vs {b_of[k]!r}" for k in names if a_of[k] != b_of[k]]
    items_a = [(p["dataset"], p["prompt_id"]) for p in a.get("prompts", [])]
    items_b = [(p["dataset"], p["prompt_id"]) for p in b.get("prompts", [])]
    if sorted(items_a) != sorted(items_b):
        only_a, only_b = sorted(set(items_a) - set(items_b)), sorted(set(items_b) - set(items_a))
        out.append(f"suite items ({len(items_a)} vs {len(items_b)} prompts; first only in A: "
                   f"{only_a[0][1] if only_a else '-'}, first only in B: {only_b[0][1] if only_b else '-'})")
    if (args_a.get("temperature") or 0) > 0:
        opts_a, opts_b = args_a.get("drafter_options") or {}, args_b.get("drafter_options") or {}
        common = set(args_a.get("drafters") or ()) & set(args_b.get("drafters") or ())
        out += [f"drafter options of {d} {opts_a.get(d, {})} vs {opts_b.get(d, {})}" for d in sorted(common)
                if opts_a.get(d, {}) != opts_b.get(d, {})]
    return out


# ---- decisions and their margins ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    """The draw whose outcome differs between the two runs: ``kind`` one of ``token`` (a target draw, key
    (seed, anchor, TARGET)), ``test`` (the acceptance test of the draft at ``position``), ``draft`` (the draft
    draw at ``position``), ``greedy`` (temperature 0: the argmax at ``position``), or None with ``why`` when the
    two runs' rounds differ in structure (then no single draw decides)."""

    kind: str | None
    purpose: int | None = None
    position: int | None = None
    why: str = ""

    def uniform(self, seed: int) -> float | None:
        """The uniform this decision consumed, recomputed from its key."""
        if self.purpose is None:
            return None
        return float(rng.uniforms([seed], [self.position], self.purpose)[0])


def decision(a: DrawSite, b: DrawSite, token_a: int, token_b: int, greedy: bool,
             rejected_b: int | None = None, rejected_a: int | None = None) -> Decision:
    """Which draw decided a divergence whose output token came from site ``a`` in one run and ``b`` in the other.
    ``rejected_a`` / ``rejected_b``: the draft a run rejected at the slot where the other accepted ``token_*``
    (known from a replay; None when unknown). ``greedy``: temperature 0, where every token is the argmax of the
    target's logits at its position, whatever drew it."""
    if greedy:
        return Decision("greedy", None, a.position)
    if a.anchor != b.anchor:
        return Decision(None, why=f"the rounds that made the token start at positions {a.anchor} and {b.anchor}")
    position = a.position
    if a.kind in TARGET_DRAWS and b.kind in TARGET_DRAWS:
        if a.kind != b.kind:
            return Decision(None, why=f"{a.kind} against {b.kind}: the rounds verified {a.verified} and "
                                      f"{b.verified} drafts")
        return Decision("token", rng.TARGET, a.anchor)
    if a.kind == DRAFT and b.kind == DRAFT:  # both accepted a draft there: the drafts themselves differ
        return Decision("draft", rng.DRAFT, position)
    drafted, other, rejected = (a, b, rejected_b) if a.kind == DRAFT else (b, a, rejected_a)
    token = token_a if a.kind == DRAFT else token_b
    if other.kind != RECOVERED:
        return Decision(None, why=f"draft against {other.kind}: the rounds verified {drafted.verified} and "
                                  f"{other.verified} drafts")
    if rejected is not None and rejected != token:  # the rejected draft was another token: the drafts differ
        return Decision("draft", rng.DRAFT, position)
    return Decision("test", rng.ACCEPT, position)


def token_margin(weights: torch.Tensor, u: float, token: int) -> float:
    """Signed margin of the inverse-CDF draw of ``token`` with uniform ``u`` from ``weights`` ([V], need not be
    normalised, as :func:`dspark_bench.core.verify.sample` takes them): the distance of u to the nearer cut of
    the token's CDF interval when u lies inside it, minus the distance to the interval when it lies outside."""
    w = weights.double().flatten()
    cdf = torch.cumsum(w, 0) / w.sum()
    hi = float(cdf[token])
    lo = float(cdf[token - 1]) if token > 0 else 0.0
    if lo <= u < hi:
        return min(u - lo, hi - u)
    return -(lo - u) if u < lo else -(u - hi)


def accept_margin(u: float, alpha: float, passed: bool) -> float:
    """Signed margin of an acceptance test ``u < alpha``: positive when its outcome is ``passed``."""
    return alpha - u if passed else u - alpha


def alpha_of(p: torch.Tensor, q: torch.Tensor | None, token: int) -> float:
    """``min(1, p(x)/q(x))`` for draft ``token`` under target law ``p`` and draft law ``q`` ([V] each; q None:
    a deterministic draft, q(x) = 1)."""
    px = float(p.double().flatten()[token])
    qx = 1.0 if q is None else float(q.double().flatten()[token])
    return 1.0 if px >= qx else px / qx


def logit_margin(logits: torch.Tensor, token: int) -> float:
    """``logits[token]`` minus the largest other logit ([V]): the top-2 gap when ``token`` is the argmax,
    negative (how far it trails) when it is not."""
    x = logits.double().flatten()
    others = torch.cat([x[:token], x[token + 1 :]])
    return float(x[token] - others.max())


def cdf_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest gap between the CDFs of two laws ([V] weights each, normalised here): the most any cut of an
    inverse-CDF draw moves from one law to the other."""
    fa = torch.cumsum(a.double().flatten(), 0)
    fb = torch.cumsum(b.double().flatten(), 0)
    return float((fa / fa[-1] - fb / fb[-1]).abs().max())


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over matching entries, in float64."""
    return float((a.double() - b.double()).abs().max())


def classify(margins: list[float], difference: float) -> str:
    """``floating-point`` when some margin is within ``difference`` (the measured law difference of the
    decision) and no margin is below ``-difference`` (no law misses its own run's token by more than the laws
    differ); ``unexplained`` otherwise. ``margins``: each run's own token's margin under that run's law."""
    if not margins:
        raise ValueError("classify needs at least one margin")
    if any(m < -difference for m in margins):
        return UNEXPLAINED
    return FLOATING if min(abs(m) for m in margins) <= difference else UNEXPLAINED


# ---- judging one divergence from the laws each run computed ------------------------------------------------
@dataclass(frozen=True)
class Laws:
    """What one run computed at the divergent position (recomputed by a replay of that run).

    logits / p: the target's logits and processed law ([V]) at the slot that predicts the token; q: the draft law
    ([V]) of the draft at that position (None: no draft there, or a deterministic drafter); draft: that draft
    token (None: none verified there); weights: what the target's own token there was drawn from, the residual
    ``max(0, p - q)`` or ``p`` (None where the slot's token was an accepted draft); u_accept / u_token: the
    uniforms the loop consumed there; token: the replay's token at the position; prefix_equal: the replay's
    earlier tokens equal the record's; rows / width: the batch rows and block width of that forward (width 0: the
    prefill of the first token)."""

    logits: torch.Tensor
    p: torch.Tensor
    q: torch.Tensor | None
    draft: int | None
    weights: torch.Tensor | None
    u_accept: float | None
    u_token: float
    token: int
    prefix_equal: bool
    rows: int
    width: int


@dataclass(frozen=True)
class Judgement:
    """The verdict on one divergence: the decision's recomputed uniform, each run's margin, the law difference
    of the decision, plain distances of the laws (max |p_a - p_b|, of the logits, of q where both have one), the
    verdict and what the reader must know (notes)."""

    u: float | None
    margins: tuple[float, float] | None
    difference: float | None
    p_diff: float | None
    logit_diff: float | None
    q_diff: float | None
    verdict: str
    notes: tuple[str, ...] = ()

    @staticmethod
    def unexamined(why: str) -> Judgement:
        """No laws to judge from (a run without the token, a replay that never reached it)."""
        return Judgement(None, None, None, None, None, None, UNEXAMINED, (why,))

    def to_dict(self) -> dict:
        return {"u": self.u, "margins": list(self.margins) if self.margins else None,
                "law_difference": self.difference, "max_abs_p": self.p_diff, "max_abs_logits": self.logit_diff,
                "max_abs_q": self.q_diff, "verdict": self.verdict, "notes": list(self.notes)}


def judge(dec: Decision, seed: int, tokens: tuple[int, int], sites: tuple[DrawSite, DrawSite],
          laws: tuple[Laws, Laws]) -> Judgement:
    """Margins, law difference and verdict of a divergence (module docstring) from the laws both runs computed.

    Steps: (1) plain distances of the two laws; (2) notes where a replay did not reproduce its run (its laws
    then approximate the run's); (3) the decision's margins and law difference; (4) the verdict, ``unexplained``
    also when a run consumed a uniform other than the one its key gives, ``unexamined`` when no single draw
    decided (rounds of different structure) or a replay drew the token another way."""
    la, lb = laws
    q_diff = max_abs(la.q, lb.q) if la.q is not None and lb.q is not None else None
    plain = {"p_diff": max_abs(la.p, lb.p), "logit_diff": max_abs(la.logits, lb.logits), "q_diff": q_diff}  # 1.
    notes = [f"the replay of run {name} drew token {law.token} there, not the recorded {tok}: its laws "
             "approximate the run's" for name, law, tok in zip("AB", laws, tokens, strict=True)
             if law.token != tok]  # 2.
    notes += [f"the replay of run {name} did not reproduce the tokens before it"
              for name, law in zip("AB", laws, strict=True) if not law.prefix_equal]
    if dec.kind is None:
        return Judgement(None, None, None, **plain, verdict=UNEXAMINED, notes=(dec.why, *notes))
    u = dec.uniform(seed)
    measured = _margins(dec, u, tokens, sites, laws)  # 3.
    if isinstance(measured, str):
        return Judgement(u, None, None, **plain, verdict=UNEXAMINED, notes=(measured, *notes))
    margins, difference, consumed = measured
    verdict = classify(list(margins), difference)  # 4.
    if any(c is not None and c != u for c in consumed):
        verdict = UNEXPLAINED
        notes.append(f"the loop consumed uniforms {consumed}, not rng(seed {seed}, position {dec.position}, "
                     f"{PURPOSE_NAMES[dec.purpose]}) = {u}")
    return Judgement(u, margins, difference, **plain, verdict=verdict, notes=tuple(notes))


def _margins(dec: Decision, u: float | None, tokens, sites, laws):
    """(margins, law difference, uniforms consumed) of ``dec``, or a note saying why they cannot be had."""
    la, lb = laws
    if dec.kind == "greedy":
        margins = tuple(logit_margin(law.logits, tok) for law, tok in zip(laws, tokens, strict=True))
        return margins, 2 * max_abs(la.logits, lb.logits), (None, None)
    if dec.kind == "token":
        if la.weights is None or lb.weights is None:
            return "a replay accepted a draft where its run drew the target's token: no common law to compare"
        margins = tuple(token_margin(law.weights, u, tok) for law, tok in zip(laws, tokens, strict=True))
        return margins, cdf_gap(la.weights, lb.weights), (la.u_token, lb.u_token)
    if dec.kind == "test":
        drafted = tokens[0] if sites[0].kind == DRAFT else tokens[1]
        alphas = [alpha_of(law.p, law.q, drafted) for law in laws]
        margins = tuple(accept_margin(u, a, site.kind == DRAFT) for a, site in zip(alphas, sites, strict=True))
        return margins, abs(alphas[0] - alphas[1]), (la.u_accept, lb.u_accept)
    drafts = [tok if site.kind == DRAFT else law.draft for tok, site, law in zip(tokens, sites, laws, strict=True)]
    if la.q is None or lb.q is None or None in drafts:  # dec.kind == "draft"
        return ("the drafts differ after the same tokens, and a deterministic drafter (no draft law) cannot "
                "propose two drafts there: no rounding explains it")
    margins = tuple(token_margin(law.q, u, d) for law, d in zip(laws, drafts, strict=True))
    return margins, cdf_gap(la.q, lb.q), (None, None)
