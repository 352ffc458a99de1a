"""The ``dspark`` model for lm-eval: generation through the one engine, likelihoods through the target.

``generate_until``: every request is decoded by :class:`~dspark_bench.engines.native.loop.RoundLoop` with the configured
drafter and scheduler, ``concurrency`` requests at a time (default: lm-eval's batch size). Requests are grouped
by their effective (temperature, max_gen_toks); each group is one engine run in lm-eval's order.

* **Prompt.** The task's context string is rendered with the target's chat template as ONE user turn with the
  generation prompt and no system prompt (:meth:`Target.render`), i.e. the semantics of lm-eval's
  ``--apply_chat_template`` for a single user message. Under ``--apply_chat_template`` lm-eval hands us its
  chat history; :meth:`DSparkLM.apply_chat_template` joins the message contents into that one user turn, so
  both paths give the same prompt. ``render=false`` tokenizes the context as plain text instead (base models).
* **Stop strings.** The engine stops only at EOS or ``max_gen_toks``. ``until`` is applied afterwards: the
  decoded text (EOS dropped, special tokens skipped) is cut before the earliest occurrence of any stop string,
  as lm-eval's HF model does. Tokens generated after a stop string are still generated, timed and counted: the
  acceptance records describe the whole generation, lm-eval scores the cut text.
* **Temperature.** ``temperature`` in a request's ``gen_kwargs`` wins; else ``do_sample: false`` means 0; else
  the model's ``temperature`` (default 0). ``max_gen_toks`` in ``gen_kwargs`` wins over the model's.
* **Seeds.** Request seed = ``seed + doc_id + repeat * 100000``: a task built from a suite gets the same
  seeds as ``dspark-bench run`` on the same prompts.
* **Records.** Every generation becomes a :class:`~dspark_bench.core.records.RequestRecord` (dataset = task name),
  kept in :attr:`DSparkLM.records` and, with ``records_dir``, appended to ``records.jsonl`` next to a
  ``manifest.json``; ``summary.json`` (:func:`dspark_bench.evaluation.metrics.summarize`) is rewritten after every batch
  of requests. lm-eval's results get a compact per-task acceptance summary under ``config.dspark``. With
  lm-eval's ``use_cache``, generations served from its cache are not decoded again and have no record.

``loglikelihood`` / ``loglikelihood_rolling``: teacher-forced target forwards in batches of ``concurrency``
(right-padded, sorted by length). The context is rendered like a generation prompt (unless ``render=false``)
and the continuation is tokenized on its own; rolling likelihoods use plain text with lm-eval's disjoint
rolling windows of ``max_length`` tokens behind a prefix token (BOS, else EOS).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from dspark_bench import drafters as drafter_registry
from dspark_bench.core.records import RequestRecord, record_from_result
from dspark_bench.drafters.registry import make_config
from dspark_bench.engines.native.loop import EngineConfig, Request, RequestResult, RoundLoop
from dspark_bench.engines.native.runner import resolve_scheduler_options
from dspark_bench.evaluation.metrics import summarize
from dspark_bench.evaluation.runs import SCHEMA_VERSION, SUMMARY, RunWriter, environment, write_json
from dspark_bench.evaluation.suites import DEFAULT_SEED
from dspark_bench.scheduling.schedulers import create_scheduler, with_profile
from dspark_bench.target.model import DTYPES, EMBEDDED, Target

log = logging.getLogger(__name__)

REPEAT_STRIDE = 100_000  # seed offset between repeats of one document
_DOMAIN = "lm-eval"
GEN_KEYS = frozenset({"until", "max_gen_toks", "temperature", "do_sample"})  # gen_kwargs the model reads


@dataclass(frozen=True)
class DSparkLMConfig:
    """``--model_args`` of the ``dspark`` model. Keys ``drafter.NAME=V`` / ``scheduler.NAME=V`` are options of
    the drafter / scheduler; lm-eval's ``batch_size`` sets ``concurrency`` unless that is given."""

    target: str = EMBEDDED
    drafter: str = "none"
    scheduler: str = "fixed"
    dtype: str = "bf16"
    temperature: float = 0.0
    block_size: int = 7
    max_gen_toks: int = 256
    concurrency: int = 1
    seed: int = DEFAULT_SEED
    render: bool = True
    max_length: int | None = None  # context window for likelihoods; default: the model's position limit
    records_dir: str | None = None
    device: str | None = None
    cache_dir: str | None = None


def parse_model_args(args: Mapping[str, Any]) -> tuple[DSparkLMConfig, dict, dict]:
    """(config, drafter options, scheduler options) from lm-eval's model args; unknown keys are errors."""
    fields = {f.name: f for f in dataclasses.fields(DSparkLMConfig)}
    plain, drafter_opts, scheduler_opts = {}, {}, {}
    for key, value in args.items():
        head, dot, name = key.partition(".")
        if dot and head in ("drafter", "scheduler") and name:
            (drafter_opts if head == "drafter" else scheduler_opts)[name] = value
        elif key in fields:
            plain[key] = _cast(key, value, str(fields[key].type))
        elif key not in ("batch_size", "max_batch_size"):
            raise ValueError(f"dspark model has no argument {key!r}; accepted: {', '.join(fields)}, "
                             "drafter.OPTION, scheduler.OPTION, batch_size")
    if "concurrency" not in plain and args.get("batch_size") is not None:
        plain["concurrency"] = _batch_size(args["batch_size"])
    return DSparkLMConfig(**plain), drafter_opts, scheduler_opts


def check_model_args(config: DSparkLMConfig, drafter_opts: Mapping[str, Any], scheduler_opts: Mapping[str, Any]
                     ) -> None:
    """Fail on settings that cannot run (dtype, engine limits, drafter or scheduler name and options) before the
    target loads; :class:`ValueError` says what is accepted."""
    if config.dtype not in DTYPES:
        raise ValueError(f"dspark model argument dtype={config.dtype!r}: accepted {', '.join(DTYPES)}")
    for key in ("max_gen_toks", "block_size", "concurrency", "max_length"):
        value = getattr(config, key)
        if value is not None and value < 1:
            raise ValueError(f"dspark model argument {key}={value}: give an integer >= 1")
    if config.temperature < 0:
        raise ValueError(f"dspark model argument temperature={config.temperature}: give a number >= 0")
    make_config(config.drafter, drafter_opts)  # an unknown drafter or option
    create_scheduler(config.scheduler, **{k: v for k, v in scheduler_opts.items() if k != "calibration"})


def _cast(key: str, value: Any, kind: str) -> Any:
    if value is None:  # lm-eval parses the text "none" (e.g. drafter=none) as None
        if "None" in kind:
            return None
        if kind.startswith("str"):
            return "none"
        raise ValueError(f"dspark model argument {key} needs a {kind}, got None")
    try:
        if kind.startswith("bool"):
            if isinstance(value, str) and value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return value if isinstance(value, bool) else str(value).lower() in ("true", "1")
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
    except ValueError:
        raise ValueError(f"dspark model argument {key}={value!r} is not a valid {kind}") from None
    return str(value)


def _batch_size(value: Any) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"batch_size {value!r} is not supported by the dspark model; give an integer "
                         "(it is the engine's concurrency)") from None


@dataclass(frozen=True)
class _Gen:
    """One generation request of lm-eval, parsed."""

    context: str
    until: tuple[str, ...]
    max_tokens: int
    temperature: float
    task: str
    doc_id: int
    repeat: int
    prompt_id: str


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """``text`` up to (excluding) the earliest occurrence of any non-empty stop string."""
    hits = [text.find(s) for s in until if s and s in text]
    return text[: min(hits)] if hits else text


@register_model("dspark")
class DSparkLM(LM):
    """lm-eval model running our engine (see the module docstring)."""

    def __init__(self, target: str | Target = EMBEDDED, **model_args: Any):
        super().__init__()
        name = target.name if isinstance(target, Target) else target
        self.config, drafter_opts, scheduler_opts = parse_model_args({"target": name, **model_args})
        cfg = self.config
        check_model_args(cfg, drafter_opts, scheduler_opts)  # before loading the target
        self.target = target if isinstance(target, Target) else Target.load(
            cfg.target, cfg.dtype, cache_dir=cfg.cache_dir and Path(cfg.cache_dir),
            device=cfg.device and torch.device(cfg.device))
        self.drafter = drafter_registry.create(cfg.drafter, self.target, drafter_opts)
        # as in runs: the drafter's calibration (and no profile: lm-eval passes one as scheduler.profile=...)
        scheduler_opts = resolve_scheduler_options(cfg.scheduler, scheduler_opts, None, self.drafter)
        self.scheduler = with_profile(create_scheduler(cfg.scheduler, **scheduler_opts), self.target)
        self.max_length = cfg.max_length or int(getattr(self.target.config, "max_position_embeddings", 2048))
        self.records: list[RequestRecord] = []
        self._writer = RunWriter(cfg.records_dir, self._manifest(drafter_opts, scheduler_opts)) \
            if cfg.records_dir else None

    # ---- generation ------------------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        gens = self._parse(requests)
        texts: list[str | None] = [None] * len(gens)
        groups: dict[tuple[float, int], list[int]] = {}
        for i, g in enumerate(gens):
            groups.setdefault((g.temperature, g.max_tokens), []).append(i)
        for (temperature, max_tokens), members in groups.items():
            log.info("dspark: %d requests, drafter %s, T=%g, max_gen_toks %d, concurrency %d", len(members),
                     self.config.drafter, temperature, max_tokens, self.config.concurrency)
            for i, result in self._run_group([gens[i] for i in members], members, temperature, max_tokens):
                texts[i] = self._finish(gens[i], result)
        self._write_summary()
        out = [t if t is not None else "" for t in texts]
        for req, text in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)  # lm-eval's --use_cache (no-op otherwise)
        return out

    def _parse(self, requests) -> list[_Gen]:
        seen: dict[tuple[str, int], int] = {}
        out = []
        for req in requests:
            context, kwargs = req.args
            unknown = sorted(set(kwargs) - GEN_KEYS)
            if unknown:
                raise ValueError(f"dspark model: unsupported gen_kwargs {unknown}; accepted: {sorted(GEN_KEYS)}")
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            key = (req.task_name or "", req.doc_id or 0)
            seen[key] = seen.get(key, -1) + 1  # lm-eval repeats an instance `repeats` times in a row
            doc = req.doc if isinstance(req.doc, Mapping) else {}
            prompt_id = str(doc.get("prompt_id") or doc.get("task_id") or f"{key[0]}-{key[1]:04d}")
            out.append(_Gen(context, tuple(until), int(kwargs.get("max_gen_toks", self.config.max_gen_toks)),
                            self._temperature(kwargs), key[0], key[1], seen[key], prompt_id))
        return out

    def _temperature(self, kwargs: Mapping[str, Any]) -> float:
        if "temperature" in kwargs:
            return float(kwargs["temperature"])
        return 0.0 if kwargs.get("do_sample") is False else self.config.temperature

    def _run_group(self, gens: list[_Gen], ids: list[int], temperature: float, max_tokens: int):
        cfg = self.config
        engine = RoundLoop(self.target, self.drafter,
                        EngineConfig(max_tokens, temperature, cfg.block_size, cfg.concurrency), self.scheduler)
        budget = self.max_length - max_tokens
        requests = []
        for i, g in zip(ids, gens, strict=True):
            prompt = self._context_ids(g.context)
            if len(prompt) > budget > 0:
                log.warning("dspark: prompt of %s is %d tokens; keeping the last %d", g.prompt_id, len(prompt), budget)
                prompt = prompt[-budget:]
            seed = cfg.seed + g.doc_id + g.repeat * REPEAT_STRIDE
            requests.append(Request(i, tuple(prompt), seed, g.task, _DOMAIN, g.prompt_id))
        results: list[RequestResult] = []
        engine.run(requests, results.append)
        return [(r.request.request_id, r) for r in results]

    def _finish(self, g: _Gen, result: RequestResult) -> str:
        rec = record_from_result(result, self.config.drafter, self.config.scheduler, g.doc_id, g.repeat,
                                 self.config.concurrency)
        self.records.append(rec)
        if self._writer is not None:
            self._writer.add(rec)
        if result.status != "ok":
            log.error("dspark: request %s failed (%s); lm-eval gets an empty answer", g.prompt_id, result.error)
            return ""
        ids = list(result.output_ids)
        while ids and ids[-1] in self.target.eos_ids:
            ids.pop()
        text = self.target.tokenizer.decode(ids, skip_special_tokens=True)
        return cut_at_stop(text, g.until)

    # ---- prompts ---------------------------------------------------------------------------------------------
    def _tokens(self, text: str) -> list[int]:
        return list(self.target.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _context_ids(self, context: str) -> list[int]:
        return list(self.target.render(context)) if self.config.render else self._tokens(context)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """lm-eval's chat history as the text of ONE user turn (contents joined); rendering happens later."""
        return "\n\n".join(m["content"] for m in chat_history if m.get("content"))

    @property
    def tokenizer_name(self) -> str:
        return self.target.name.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.target.tokenizer, "chat_template", None) or ""

    # ---- likelihoods -----------------------------------------------------------------------------------------
    @property
    def prefix_token(self) -> int:
        bos = getattr(self.target.tokenizer, "bos_token_id", None)
        return bos if bos is not None else min(self.target.eos_ids)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        if self.config.render:
            return self._context_ids(context), self._tokens(continuation)
        if not context:
            return [self.prefix_token], self._tokens(continuation)
        spaces = len(context) - len(context.rstrip())  # lm-eval: trailing spaces belong to the continuation
        context, continuation = context[: len(context) - spaces], context[len(context) - spaces :] + continuation
        whole, head = self._tokens(context + continuation), self._tokens(context)
        return head, whole[len(head) :]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = self.score([self._encode_pair(*req.args) for req in requests])
        for req, value in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, value)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        owners, windows = [], []
        for n, req in enumerate(requests):
            tokens = self._tokens(req.args[0])
            for w in get_rolling_token_windows(tokens, self.prefix_token, self.max_length, 1):
                owners.append(n)
                windows.append(make_disjoint_window(w))
        totals = [0.0] * len(requests)
        for owner, (logp, _) in zip(owners, self.score(windows), strict=True):
            totals[owner] += logp
        return totals

    def score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(log p(continuation | context), continuation is greedy) per (context ids, continuation ids) pair."""
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        size = self.config.concurrency
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            for i, value in zip(chunk, self._score_batch([pairs[i] for i in chunk]), strict=True):
                out[i] = value
        return out  # type: ignore[return-value]

    def _score_batch(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """One right-padded teacher-forced forward; logits only at the continuation positions."""
        for _, cont in pairs:
            if len(cont) > self.max_length:
                raise ValueError(f"continuation of {len(cont)} tokens exceeds max_length {self.max_length}")
        inputs = [(ctx + cont)[-(self.max_length + 1) :][:-1] for ctx, cont in pairs]
        width = max(len(x) for x in inputs)
        device = self.target.device
        ids = torch.zeros(len(inputs), width, dtype=torch.long, device=device)
        mask = torch.zeros(len(inputs), width, dtype=torch.long, device=device)
        for r, x in enumerate(inputs):
            ids[r, : len(x)] = torch.tensor(x, device=device)
            mask[r, : len(x)] = 1
        with torch.inference_mode():
            hidden = self.target.model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            out = []
            for r, (_, cont) in enumerate(pairs):
                if not cont:
                    out.append((0.0, True))
                    continue
                n = len(inputs[r])
                logp = torch.log_softmax(self.target.lm_head(hidden[r, n - len(cont) : n]).float(), dim=-1)  # [k, V]
                target = torch.tensor(cont, device=device)
                out.append((float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())))
        return out

    # ---- records ---------------------------------------------------------------------------------------------
    @property
    def records_dir(self) -> Path | None:
        return None if self._writer is None else self._writer.folder

    def close(self) -> None:
        """Close the records file (every record is already flushed; this only releases the handle)."""
        if self._writer is not None:
            self._writer.close()

    def acceptance_summary(self) -> dict:
        """:func:`dspark_bench.evaluation.metrics.summarize` over every generation so far."""
        return summarize(self.records, self.config.block_size)

    def _write_summary(self) -> None:
        if self._writer is not None:
            write_json(self._writer.folder / SUMMARY, self.acceptance_summary())

    def get_model_info(self) -> dict:
        """Added by lm-eval to ``results['config']``: the setup and a per-task acceptance digest."""
        digest = {g["name"]: {k: g[k] for k in ("n_requests", "n_errors", "rounds", "tau", "acceptance_rate")}
                  for g in self.acceptance_summary()["groups"] if g["scope"] in ("dataset", "all")}
        return {"dspark": {**dataclasses.asdict(self.config), "acceptance": digest,
                           "records_dir": self.records_dir and str(self.records_dir)}}

    def _manifest(self, drafter_opts: dict, scheduler_opts: dict) -> dict:
        t = self.target
        return {
            "schema_version": SCHEMA_VERSION, "source": "lm-eval",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "args": {**dataclasses.asdict(self.config), "drafter_options": drafter_opts,
                     "scheduler_options": scheduler_opts},
            "target": {"name": t.name, "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device),
                       "vocab_size": t.vocab_size, "num_layers": t.num_layers, "hidden_size": t.hidden_size},
            "drafters": {self.config.drafter: {"config": dataclasses.asdict(self.drafter.config)}},
            "seeds": {"base": self.config.seed, "per_request": "base + doc_id + repeat * 100000"},
            **environment(),
        }
