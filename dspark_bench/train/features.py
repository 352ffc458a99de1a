"""Target features for training (reference section 7.3): computed on the fly, or cached on disk in shards.

Both sources turn a list of :class:`~dspark_bench.train.data.TrainSequence` into a right-padded
:class:`~dspark_bench.drafters.types.TrainBatch` on the target's device, with ``layers`` holding exactly the taps a
drafter asked for, in its order.

* :class:`OnlineFeatures`: one batched, right-padded forward of the frozen target per training batch
  (outputs of the tapped decoder layers = HF ``hidden_states[l + 1]``, and the final normed hidden state).
* :class:`FeatureCache`: safetensors shards written once by :func:`write_cache` (``dspark-bench data
  features``) with a ``manifest.json`` (format, target name + :class:`TargetFingerprint`, taps, hidden size,
  dtype, per-sample shard/offset/length). Writing resumes: after each shard ``progress.json`` says what is done,
  and a write interrupted (a stopped job, a crash) continues from its last shard when run again with the same
  settings, with the bytes of an uninterrupted run. Reading checks the manifest against the target and the drafter's
  taps, and each sample's cached token ids against the sequence's, and fails with the reason.

Disk cost per token: ``(n_taps + 1) * d * 2`` bytes of bf16 features + 4 bytes of int32 token id; SmolLM2-135M
(d = 576, 5 taps): 6,912 + 4 = 6,916 B/token.

Default (``--features auto`` in ``dspark-bench train``): on CUDA, online; on CPU, the cache. On a GPU the target
forward of a 135M model costs a few percent of a drafter step, while 4,000 sequences of ~450 tokens need ~12 GB of
cache to write and read back. On CPU the same forward is a large share of a step and is repeated for every epoch
and every one of the four methods trained on the same data; the cache computes it once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dspark_bench.drafters.types import TrainBatch

if TYPE_CHECKING:
    from dspark_bench.target.model import Target
    from dspark_bench.train.data import TrainSequence

FORMAT = "dspark-bench-features/1"
MANIFEST = "manifest.json"
CACHE_DTYPE = torch.bfloat16


class FeatureCacheError(ValueError):
    """A feature cache that is missing, malformed, or does not fit the target / drafter."""


def bytes_per_token(n_taps: int, hidden_size: int) -> int:
    return (n_taps + 1) * hidden_size * 2 + 4


def check_taps(taps: Sequence[int], num_layers: int) -> None:
    bad = [t for t in taps if not 0 <= t <= num_layers - 2]
    if bad:
        raise FeatureCacheError(f"taps {list(taps)}: {bad} outside the decoder layers 0..{num_layers - 2} "
                                "(the last layer is never tapped)")


def pad_batch(seqs: Sequence[TrainSequence], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids [B, n] (padding 0), loss_mask [B, n] bool and attention [B, n] bool, right-padded."""
    width = max(len(s.input_ids) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    loss = torch.zeros(len(seqs), width, dtype=torch.bool)
    real = torch.zeros(len(seqs), width, dtype=torch.bool)
    for r, s in enumerate(seqs):
        ids[r, : len(s.input_ids)] = torch.tensor(s.input_ids)
        loss[r, s.loss_start : len(s.input_ids)] = True
        real[r, : len(s.input_ids)] = True
    return ids.to(device), loss.to(device), real.to(device)


def target_features(target: Target, input_ids: torch.Tensor, attention: torch.Tensor,
                    taps: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """layers [B, n, len(taps), d] and final [B, n, d] of a right-padded batch (garbage on padding).

    no_grad rather than inference_mode: the results are inputs of the drafter's backward pass.
    """
    check_taps(taps, target.num_layers)
    with torch.no_grad():
        out = target.model.model(input_ids=input_ids, attention_mask=attention.long(),
                                 output_hidden_states=bool(taps), use_cache=False)
    final = out.last_hidden_state
    if not taps:
        return final.new_zeros(*final.shape[:2], 0, final.shape[-1]), final
    return torch.stack([out.hidden_states[t + 1] for t in taps], dim=2), final


class OnlineFeatures:
    """Features from a target forward per batch."""

    def __init__(self, target: Target, taps: Sequence[int]):
        check_taps(taps, target.num_layers)
        self.target, self.taps = target, tuple(taps)

    def __call__(self, seqs: Sequence[TrainSequence]) -> TrainBatch:
        ids, loss, real = pad_batch(seqs, self.target.device)
        layers, final = target_features(self.target, ids, real, self.taps)
        return TrainBatch(ids, loss, real, layers, final)


# ---- the cache ------------------------------------------------------------------------------------------------
class _ShardWriter:
    """Collects samples and writes them as safetensors shards of at least ``shard_tokens`` tokens.

    ``flush`` is called between batches only, so every shard ends at a batch boundary and a resumed run forms the
    same batches as an uninterrupted one. After each shard, :data:`PROGRESS` records the shards and samples
    written so far and where the next batch starts (atomically, after the shard file is complete).
    """

    def __init__(self, folder: Path, shard_tokens: int, key: dict, done: dict | None = None):
        self.folder, self.shard_tokens, self.key = folder, shard_tokens, key
        self.samples: dict[str, list[int]] = dict(done["samples"]) if done else {}  # id -> [shard, offset, length]
        self.shards: list[str] = list(done["shards"]) if done else []
        self.pending: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, sid: str, ids: torch.Tensor, layers: torch.Tensor, final: torch.Tensor) -> None:
        self.pending.append((sid, ids.int().cpu(), layers.to(CACHE_DTYPE).cpu(), final.to(CACHE_DTYPE).cpu()))

    def full(self) -> bool:
        return sum(len(p[1]) for p in self.pending) >= self.shard_tokens

    def flush(self, next_start: int) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        offset = 0
        for sid, ids, _, _ in self.pending:
            self.samples[sid] = [len(self.shards), offset, len(ids)]
            offset += len(ids)
        keys = ((1, "input_ids"), (2, "layers"), (3, "final"))
        tensors = {key: torch.cat([p[i] for p in self.pending]).contiguous() for i, key in keys}
        name = f"shard-{len(self.shards):05d}.safetensors"
        save_file(tensors, str(self.folder / (name + ".tmp")))
        os.replace(self.folder / (name + ".tmp"), self.folder / name)
        self.shards.append(name)
        self.pending.clear()
        _write_json(self.folder / PROGRESS, {"key": self.key, "next": next_start, "shards": self.shards,
                                             "samples": self.samples})


PROGRESS = "progress.json"  # a cache being written: what is done, and the settings it must be resumed with


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj) + "\n")
    os.replace(tmp, path)


def _resume_point(folder: Path, key: dict) -> dict | None:
    """The progress of an interrupted write with the same settings, or None (then stale files are removed)."""
    path = folder / PROGRESS
    done = None
    if path.is_file():
        try:
            done = json.loads(path.read_text())
        except ValueError:
            done = None
        if not (isinstance(done, dict) and done.get("key") == key
                and all((folder / s).is_file() for s in done.get("shards", []))):
            done = None
    keep = set(done["shards"]) if done else set()
    for stale in folder.glob("shard-*.safetensors*"):
        if stale.name not in keep:
            stale.unlink()
    if done is None:
        path.unlink(missing_ok=True)
    return done


def _complete(folder: Path, key: dict) -> dict | None:
    """The manifest of a complete cache in ``folder`` written with settings ``key``, else None."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    ok = (isinstance(manifest, dict) and manifest.get("written_with") == key
          and all((folder / s).is_file() for s in manifest.get("shards", [])))
    return manifest if ok else None


def _order_digest(seqs: Sequence[TrainSequence], order: Sequence[int]) -> str:
    """A digest of the sequences (ids and tokens) in the order the cache writes them."""
    h = hashlib.sha256()
    for i in order:
        h.update(f"{seqs[i].id}:{','.join(map(str, seqs[i].input_ids))};".encode())
    return h.hexdigest()


def write_cache(target: Target, seqs: Sequence[TrainSequence], taps: Sequence[int], folder: str | Path,
                batch_size: int = 8, shard_tokens: int = 1 << 16, source: dict | None = None,
                on_batch: Callable[[int], None] | None = None) -> dict:
    """Compute and store the features of ``seqs`` in ``folder``; returns the manifest (written last, atomically).

    Shards hold ``input_ids`` int32 [N], ``layers`` bf16 [N, n_taps, d] and ``final`` bf16 [N, d] for the
    concatenated samples; ``on_batch(tokens)`` reports progress (a resumed run first reports the tokens already
    cached). An interrupted write resumes at its last complete shard when called again with the same target,
    sequences, taps, batch size, shard size and source; anything else starts over. The batches, and so the bytes,
    are those of an uninterrupted run. A complete cache written with the same settings is returned as it is.
    """
    from dspark_bench.drafters.checkpoint import TargetFingerprint

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].input_ids))  # less padding per batch
    key = {"format": FORMAT, "target": asdict(TargetFingerprint.of(target)), "taps": list(taps),
           "batch_size": batch_size, "shard_tokens": shard_tokens, "source": source or {},
           "sequences": _order_digest(seqs, order)}
    complete = _complete(folder, key)
    if complete is not None:
        if on_batch:
            on_batch(complete["tokens"])
        return complete
    (folder / MANIFEST).unlink(missing_ok=True)  # a cache without its manifest is never read
    done = _resume_point(folder, key)
    writer = _ShardWriter(folder, shard_tokens, key, done)
    first = done["next"] if done else 0
    if first and on_batch:
        on_batch(sum(v[2] for v in writer.samples.values()))
    for start in range(first, len(order), batch_size):
        chunk = [seqs[i] for i in order[start : start + batch_size]]
        ids, _, real = pad_batch(chunk, target.device)
        layers, final = target_features(target, ids, real, taps)
        for r, s in enumerate(chunk):
            n = len(s.input_ids)
            writer.add(s.id, ids[r, :n], layers[r, :n], final[r, :n])
        if writer.full():
            writer.flush(start + batch_size)
        if on_batch:
            on_batch(int(real.sum()))
    writer.flush(len(order))
    manifest = {"format": FORMAT, "target": key["target"], "taps": list(taps),
                "hidden_size": target.hidden_size, "dtype": "bf16",
                "tokens": sum(v[2] for v in writer.samples.values()),
                "bytes_per_token": bytes_per_token(len(taps), target.hidden_size),
                "bytes": sum((folder / s).stat().st_size for s in writer.shards), "source": source or {},
                "shards": writer.shards, "samples": writer.samples, "written_with": key}
    _write_json(folder / MANIFEST, manifest)
    (folder / PROGRESS).unlink(missing_ok=True)
    return manifest


def read_cache_manifest(folder: str | Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise FeatureCacheError(f"{folder} is not a feature cache (no {MANIFEST}; make one with: "
                                "dspark-bench data features)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise FeatureCacheError(f"{path}: unknown format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def check_cache(manifest: dict, target: Target, taps: Sequence[int]) -> list[int]:
    """Fail unless the cache was made by ``target`` and holds every tap in ``taps``; returns their indices."""
    from dspark_bench.drafters.checkpoint import TargetFingerprint

    have = asdict(TargetFingerprint.of(target))
    want = manifest["target"]
    diff = [k for k in have if want.get(k) != have[k]]
    if diff:
        detail = ", ".join(f"{k}: cache {want.get(k)!r} vs target {have[k]!r}" for k in diff)
        raise FeatureCacheError(f"feature cache was made with target {want.get('name')!r}, not {target.name!r} "
                                f"({detail})")
    if manifest["hidden_size"] != target.hidden_size:
        raise FeatureCacheError(f"feature cache hidden size {manifest['hidden_size']} != target's {target.hidden_size}")
    cached = list(manifest["taps"])
    missing = [t for t in taps if t not in cached]
    if missing:
        raise FeatureCacheError(f"the drafter needs target layers {list(taps)} but the cache holds {cached} "
                                f"(missing {missing}); rebuild it with: dspark-bench data features --taps ...")
    return [cached.index(t) for t in taps]


class FeatureCache:
    """Cached features for a drafter tapping ``taps`` of ``target`` (checked at construction)."""

    def __init__(self, folder: str | Path, target: Target, taps: Sequence[int]):
        self.folder, self.target = Path(folder), target
        self.manifest = read_cache_manifest(folder)
        self.select = check_cache(self.manifest, target, taps)
        self._handles: dict[int, object] = {}

    def _slice(self, shard: int, key: str, start: int, n: int) -> torch.Tensor:
        from safetensors import safe_open

        if shard not in self._handles:
            name = self.manifest["shards"][shard]
            self._handles[shard] = safe_open(str(self.folder / name), framework="pt", device="cpu")
        return self._handles[shard].get_slice(key)[start : start + n]

    def sample(self, seq: TrainSequence) -> tuple[torch.Tensor, torch.Tensor]:
        """layers [n, len(taps), d] and final [n, d] of one sequence (bf16, CPU)."""
        where = self.manifest["samples"].get(seq.id)
        if where is None:
            raise FeatureCacheError(f"sequence {seq.id!r} is not in the feature cache {self.folder}")
        shard, start, n = where
        ids = self._slice(shard, "input_ids", start, n)
        if n != len(seq.input_ids) or ids.tolist() != list(seq.input_ids):
            raise FeatureCacheError(f"sequence {seq.id!r}: the cached token ids differ from the data's "
                                    "(stale cache, or another max length); rebuild the cache")
        return self._slice(shard, "layers", start, n)[:, self.select], self._slice(shard, "final", start, n)

    def __call__(self, seqs: Sequence[TrainSequence]) -> TrainBatch:
        device = self.target.device
        ids, loss, real = pad_batch(seqs, device)
        parts = [self.sample(s) for s in seqs]
        layers = torch.zeros(*ids.shape, len(self.select), self.manifest["hidden_size"], dtype=CACHE_DTYPE)
        final = torch.zeros(*ids.shape, self.manifest["hidden_size"], dtype=CACHE_DTYPE)
        for r, (lay, fin) in enumerate(parts):
            layers[r, : len(fin)], final[r, : len(fin)] = lay, fin
        return TrainBatch(ids, loss, real, layers.to(device), final.to(device))
