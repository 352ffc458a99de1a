"""The one trainer for every drafter: AdamW, warm-up + cosine, clipping, checkpoints, exact resume.

Recipe (reference section 1.7): AdamW with beta (0.9, 0.999), eps 1e-8, weight decay 0; the learning rate rises
linearly over the warm-up steps (default 4% of the steps) and then follows a cosine to 0 (:func:`lr_factor`);
gradients are clipped to global norm 1.0; fp32 master weights, with bf16 autocast on CUDA.

Determinism. The sequences of step s are a pure function of (seed, s) (:func:`batch_indices`: epoch e uses
``randperm(N, seed + e)``, cut into ``N // batch_size`` batches), and anchors come from one CPU
``torch.Generator`` seeded with ``seed``. A checkpoint stores the model (the drafter's own format, loadable by
the engine), the optimizer, scheduler and generator states and the step, so ``resume`` continues bit-exactly
where the last checkpoint left off (on the same device). ``resume=True`` needs such a checkpoint
(:func:`resume_point`); ``resume="if-any"`` (for scripts that are rerun until done) starts afresh without one.

Continued training: ``init_from`` starts a new run (fresh optimizer, warm-up and cosine) from a drafter
checkpoint's weights, e.g. a shipped drafter given a longer budget; the run records the checkpoint's sha256.

Output folder: ``train_config.json`` (checked on resume), ``train_log.jsonl`` (one line per step),
``checkpoints/step-NNNNNN/`` (``config.json``, ``model.safetensors``, ``training_state.pt``; the last
``keep_checkpoints`` are kept) and ``final/`` (the trained drafter).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dspark_bench.train.methods import Method, MethodOptions

if TYPE_CHECKING:
    from dspark_bench.drafters.types import TrainBatch
    from dspark_bench.target.model import Target
    from dspark_bench.train.data import TrainSequence

FeatureSource = Callable[[Sequence["TrainSequence"]], "TrainBatch"]


class Scorer(Protocol):
    """A held-out set the trainer scores now and then (:class:`dspark_bench.train.heldout.HeldOut`)."""

    def score(self, module: torch.nn.Module, loss_kwargs: dict[str, Any]) -> Any:  # returns .to_json()
        ...

STATE = "training_state.pt"


class TrainError(ValueError):
    """Bad training settings, or an output folder that does not fit them."""


@dataclass(frozen=True)
class TrainConfig:
    method: str
    steps: int = 1000
    batch_size: int = 8
    micro_batch: int | None = None  # sequences per forward (gradient accumulation); None = batch_size
    lr: float = 6e-4
    warmup: int | None = None  # warm-up steps; None = round(4% of steps)
    save_every: int = 500
    keep_checkpoints: int = 2
    seed: int = 42
    options: MethodOptions = field(default_factory=MethodOptions)
    data: dict[str, Any] = field(default_factory=dict)  # provenance: data folder, its manifest hash, features
    init_from: dict[str, str] | None = None  # start from a drafter checkpoint's weights: {folder, model_sha256}

    def __post_init__(self) -> None:
        counts = (self.steps, self.batch_size, self.save_every, self.keep_checkpoints)
        if min(counts) < 1 or not self.lr > 0:
            raise TrainError(f"steps, batch_size, save_every and keep_checkpoints must be >= 1 and lr > 0 "
                             f"(got {counts}, lr {self.lr})")
        if self.micro_batch is not None and not 1 <= self.micro_batch <= self.batch_size:
            raise TrainError(f"micro_batch must be within 1..batch_size, got {self.micro_batch}")
        if self.warmup is not None and not 0 <= self.warmup < self.steps:
            raise TrainError(f"warmup must be within 0..steps-1, got {self.warmup}")

    @property
    def warmup_steps(self) -> int:
        return round(0.04 * self.steps) if self.warmup is None else self.warmup


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step, as logged. acceptance: per-position analytic acceptance alpha*_k; tau: the
    expected accepted length 1 + sum_k prod_{j<=k} alpha*_j implied by it."""

    step: int  # steps done (1-based)
    lr: float
    loss: float
    terms: dict[str, float]
    acceptance: list[float]
    tau: float
    grad_norm: float
    tokens: int  # real tokens in the batch
    tokens_per_s: float
    seconds: float
    heldout: dict[str, Any] | None = None  # HeldOutScore.to_json() at this step, when the run scores a held-out set


# ---- pure parts ------------------------------------------------------------------------------------------------
def lr_factor(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak lr at 0-based optimizer step ``step``: (step+1)/warmup during warm-up, then a
    cosine from 1 at step ``warmup`` to 0 at step ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def batch_indices(step: int, n: int, batch_size: int, seed: int) -> list[int]:
    """Sequence indices of 0-based step ``step``: epoch e = step // (n // batch_size) reads randperm(n, seed+e)."""
    per_epoch = n // batch_size
    if per_epoch < 1:
        raise TrainError(f"batch size {batch_size} is larger than the {n} training sequences")
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    return order[k * batch_size : (k + 1) * batch_size].tolist()


def expected_length(acceptance: Sequence[float]) -> float:
    tau, survive = 1.0, 1.0
    for a in acceptance:
        survive *= a
        tau += survive
    return tau


# ---- the trainer -----------------------------------------------------------------------------------------------
class Trainer:
    """Trains ``method``'s module for ``target`` on ``sequences`` with features from ``features``."""

    def __init__(self, config: TrainConfig, method: Method, target, sequences: Sequence[TrainSequence],
                 features: FeatureSource, out: str | Path):
        self.config, self.method, self.target = config, method, target
        self.sequences, self.features, self.out = list(sequences), features, Path(out)
        self.device = target.device
        self.module = method.build(target, config.options)
        if config.options.draft_vocab:  # the list is a pure function of the sequences, N and the target
            from dspark_bench.drafters.vocab import vocab_for

            self.module.set_draft_vocab(vocab_for(target, self.sequences, config.options.draft_vocab))
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        warm = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, config.steps, warm))
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step = 0

    # ---- one step ----------------------------------------------------------------------------------------------
    def train_step(self) -> StepRecord:
        """1. the step's sequences; 2. per micro-batch: features, loss, backward; 3. clip, AdamW, schedule."""
        t0 = time.perf_counter()
        c = self.config
        seqs = [self.sequences[i] for i in batch_indices(self.step, len(self.sequences), c.batch_size, c.seed)]
        size = c.micro_batch or c.batch_size
        chunks = [seqs[i : i + size] for i in range(0, len(seqs), size)]
        outs, tokens = [], 0
        lr = self.optimizer.param_groups[0]["lr"]
        for chunk in chunks:
            batch = self.features(chunk)
            tokens += int(batch.attention.sum())
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
                out = self.module.loss(batch, self.generator, **self.method.loss_kwargs(c.options))
            (out.loss / len(chunks)).backward()
            outs.append(out)
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, 1.0))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        if self.device.type == "cuda":  # the step's kernels are asynchronous: count them in this step's time
            torch.cuda.synchronize(self.device)
        return self._record(outs, lr, norm, tokens, time.perf_counter() - t0)

    def _record(self, outs, lr: float, norm: float, tokens: int, seconds: float) -> StepRecord:
        terms = {k: sum(o.terms[k] for o in outs) / len(outs) for k in outs[0].terms}
        accept = torch.stack([o.acceptance.detach().float().cpu() for o in outs]).mean(0).tolist()
        loss = sum(float(o.loss.detach()) for o in outs) / len(outs)
        return StepRecord(self.step, lr, loss, terms, accept, expected_length(accept), norm, tokens,
                          tokens / max(seconds, 1e-9), seconds)

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> Path:
        return self.out / "checkpoints" / f"step-{step:06d}"

    def save_checkpoint(self) -> Path:
        """The drafter checkpoint, then ``training_state.pt`` (atomically: a folder without it is ignored)."""
        folder = self.method.save(self.module, self.checkpoint_dir(self.step))
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "generator": self.generator.get_state(),
                 "config": json.loads(config_json(self.config))}
        torch.save(state, folder / (STATE + ".tmp"))
        os.replace(folder / (STATE + ".tmp"), folder / STATE)
        for old in completed_checkpoints(self.out)[: -self.config.keep_checkpoints]:
            shutil.rmtree(old)
        return folder

    def initialise(self, source: dict[str, str]) -> None:
        """Start from the weights of the drafter checkpoint ``source`` (see :func:`init_source`) instead of fresh
        ones: same method, target, architecture and draft vocabulary size, or a :class:`TrainError` that names the
        difference; the run drafts over the checkpoint's list. The optimizer, schedule and data order start fresh:
        a new run, not a resume."""
        from dspark_bench.drafters.vocab import STATE_KEY

        folder = Path(source["folder"])
        if init_source(folder) != source:
            raise TrainError(f"{folder} changed since this run was started from it (model.safetensors' sha256 "
                             f"differs from the run's train_config.json)")
        meta, state = read_drafter(folder, self.target, (self.method.name,), "--init-from")
        have, want = _json(meta.get("config")), _json(_arch(self.module))
        diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
        if diff:
            raise TrainError(f"cannot start from {folder}: its architecture differs in {', '.join(diff)} "
                             f"(checkpoint {json.dumps({k: have.get(k) for k in diff})}, "
                             f"this run {json.dumps({k: want.get(k) for k in diff})})")
        mine, theirs = getattr(self.module, STATE_KEY, None), state.get(STATE_KEY)
        if (mine is None) != (theirs is None) or (mine is not None and len(mine) != len(theirs)):
            sizes = [f"{len(x)} tokens" if x is not None else "the full vocabulary" for x in (theirs, mine)]
            raise TrainError(f"cannot start from {folder}: it drafts over {sizes[0]}, this run over {sizes[1]} "
                             f"(--draft-vocab must be the size of the checkpoint's list, 0 for a full head)")
        # the checkpoint's list comes with its weights (its rows are what they learnt), even where this run's data
        # would rank other tokens among its N most frequent; the run's checkpoints and final drafter keep it
        load_weights(self.module, state, folder, self.device)

    def restore(self, folder: Path) -> None:
        from safetensors.torch import load_file

        state = torch.load(folder / STATE, map_location="cpu", weights_only=True)
        weights = load_file(str(folder / "model.safetensors"))
        self.module.load_state_dict({k: v.to(self.device) for k, v in weights.items()}, strict=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        self.step = int(state["step"])


def read_drafter(folder: str | Path, target: Target, methods: Sequence[str], use: str) -> tuple[dict, dict]:
    """The ``config.json`` and weights of the drafter checkpoint in ``folder``, after checking that it holds one of
    ``methods`` and was trained against ``target``; else a :class:`TrainError` that begins with ``use`` (what the
    checkpoint was given for, e.g. ``--init-from``)."""
    from dspark_bench.drafters import checkpoint

    try:
        meta, state = checkpoint.load(folder)
        checkpoint.check_target(meta, target)
    except checkpoint.CheckpointError as exc:
        raise TrainError(f"{use} {folder}: {exc}") from None
    if meta.get("method") not in methods:
        raise TrainError(f"{use} {folder}: it holds a {meta.get('method')!r} drafter; {use} needs "
                         f"{' or '.join(repr(m) for m in methods)}")
    return meta, state


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], folder: str | Path, device: torch.device,
                 dtype: torch.dtype | None = None) -> None:
    """Load a checkpoint's weights into ``module`` strictly (every key, every shape), on ``device``; floating-point
    tensors cast to ``dtype`` when given. A checkpoint that does not fit is a :class:`TrainError`."""
    def place(v: torch.Tensor) -> torch.Tensor:
        return v.to(device, dtype) if dtype is not None and v.is_floating_point() else v.to(device)

    try:
        module.load_state_dict({k: place(v) for k, v in state.items()}, strict=True)
    except RuntimeError as exc:
        raise TrainError(f"{folder} does not fit the architecture its config.json describes: {exc}") from None


def init_source(folder: str | Path) -> dict[str, str]:
    """What ``--init-from FOLDER`` records: the folder and the sha256 of its ``model.safetensors``."""
    import hashlib

    path = Path(folder)
    weights = path / "model.safetensors"
    if not (path / "config.json").is_file() or not weights.is_file():
        raise TrainError(f"--init-from {path}: not a drafter checkpoint (it needs config.json and model.safetensors)")
    digest = hashlib.sha256()
    with weights.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"folder": str(path), "model_sha256": digest.hexdigest()}


def _arch(module: torch.nn.Module) -> dict[str, Any]:
    """The architecture a module's checkpoint records (block drafters: ``arch.to_dict()``; chains: ``arch()``)."""
    arch = getattr(module, "arch", None)
    if arch is None:
        return {}
    return arch() if callable(arch) else arch.to_dict()


def _json(value: Any) -> dict[str, Any]:
    return json.loads(json.dumps(value or {}))


def config_json(config: TrainConfig) -> str:
    return json.dumps(asdict(config), sort_keys=True)


def completed_checkpoints(out: Path) -> list[Path]:
    """Checkpoint folders holding a training state, oldest first."""
    return sorted(p.parent for p in (Path(out) / "checkpoints").glob(f"step-*/{STATE}"))


RESUME_IF_ANY = "if-any"  # resume from the last checkpoint if there is one, else start afresh


def resume_point(out: str | Path) -> Path:
    """The last completed checkpoint of the training run in ``out``; a :class:`TrainError` that says how to start
    afresh where there is none (a resume must never silently be a fresh run)."""
    out = Path(out)
    if not (out / "train_config.json").exists():
        raise TrainError(f"--resume: {out} holds no training run to resume (no train_config.json); run without "
                         "--resume to start one there")
    done = completed_checkpoints(out)
    if not done:
        raise TrainError(f"--resume: {out} holds no completed checkpoint (checkpoints/step-*/{STATE}): the run "
                         f"stopped before its first save; to start it afresh, delete {out} (or choose a new --out) "
                         "and run without --resume")
    return done[-1]


def _prepare(out: Path, config: TrainConfig, resume: bool | str) -> Path | None:
    """Write (or, on resume, check) ``train_config.json``; returns the checkpoint to resume from, if any."""
    path, text = out / "train_config.json", config_json(config)
    if resume not in (False, True, RESUME_IF_ANY):
        raise TrainError(f"resume={resume!r}: accepted False, True or {RESUME_IF_ANY!r}")
    if path.exists() and not resume:
        raise TrainError(f"{out} already holds a training run; pass --resume to continue it, or use a new --out")
    if path.exists():
        have, want = _comparable(json.loads(path.read_text())), _comparable(json.loads(text))
        diff = sorted(k for k in want if have.get(k) != want[k])
        if diff:
            raise TrainError(f"cannot resume {out}: settings differ in {', '.join(diff)} "
                             f"(recorded {json.dumps({k: have.get(k) for k in diff})})")
    if resume is True:
        resume_point(out)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    done = completed_checkpoints(out)
    return done[-1] if done and resume else None


def _comparable(config: dict) -> dict:
    """The data provenance's paths normalised (``./data/x`` and ``data/x`` name the same folder on resume), and
    method options added since the run was recorded filled in with their defaults (what the run used)."""
    from dspark_bench.train.methods import MethodOptions

    if isinstance(config.get("options"), dict):
        config = {**config, "options": {**json.loads(json.dumps(asdict(MethodOptions()))), **config["options"]}}
    data = config.get("data")
    if not isinstance(data, dict):
        return config
    norm = {k: os.path.normpath(v) if k in ("folder", "features") and isinstance(v, str) and v != "online" else v
            for k, v in data.items()}
    init = config.get("init_from")
    if isinstance(init, dict) and isinstance(init.get("folder"), str):
        init = {**init, "folder": os.path.normpath(init["folder"])}
    return {**config, "data": norm, "init_from": init}


def _truncate_log(path: Path, step: int) -> None:
    """Keep the log lines of steps <= ``step`` (those after the resumed checkpoint are redone)."""
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        path.write_text("".join(line + "\n" for line in lines if json.loads(line)["step"] <= step))


def train(config: TrainConfig, method: Method, target, sequences: Sequence[TrainSequence], features: FeatureSource,
          out: str | Path, resume: bool | str = False, on_step: Callable[[StepRecord], None] | None = None,
          heldout: Scorer | None = None, heldout_every: int = 0) -> Path:
    """Run (or resume) training to ``config.steps``; returns the folder of the final drafter checkpoint.

    ``heldout``: score the module on that set every ``heldout_every`` steps and at the last step (the score goes
    into that step's log line as ``heldout``). Scoring does not touch the training's data order, anchors or
    weights, so it is not part of the run's settings: a resume may add, change or drop it."""
    if heldout is not None and heldout_every < 1:
        raise TrainError(f"heldout_every must be >= 1 when a held-out set is given, got {heldout_every}")
    out = Path(out)
    start = _prepare(out, config, resume)
    trainer = Trainer(config, method, target, sequences, features, out)
    if start is not None:
        trainer.restore(start)
    elif config.init_from is not None:
        trainer.initialise(config.init_from)
    _truncate_log(out / "train_log.jsonl", trainer.step)
    with (out / "train_log.jsonl").open("a") as log:
        while trainer.step < config.steps:
            record = trainer.train_step()
            if heldout is not None and (record.step % heldout_every == 0 or record.step == config.steps):
                score = heldout.score(trainer.module, method.loss_kwargs(config.options))
                record = replace(record, heldout=score.to_json())
            log.write(json.dumps(asdict(record)) + "\n")
            log.flush()
            if record.step % config.save_every == 0 or record.step == config.steps:
                trainer.save_checkpoint()
            if on_step:
                on_step(record)
    return method.save(trainer.module, out / "final")
