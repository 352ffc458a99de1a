"""Our drafter checkpoint format: a folder with ``config.json`` and ``model.safetensors``.

Only trained weights are stored. The frozen copies of the target's embedding and LM head are rebuilt from the
target at load time, and the target is checked against the fingerprint recorded when the drafter was trained
(``config.json["target"]``): name, vocab size, hidden size, layer count and a SHA-256 of the bf16 embedding and
LM-head weights. DeepSeek's released checkpoints have their own format (see ``deepseek.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from dspark_bench.target.model import Target

FORMAT = "dspark-bench-drafter/1"
# Shipped reference checkpoints: SHIPPED_ROOT/<target name>/<drafter name>/ (config.json + model.safetensors).
SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped"  # package data: found by an installed package too


def shipped_folder(target_name: str, method: str, root: Path | None = None) -> Path | None:
    """The reference checkpoint shipped for ``method`` on the target named ``target_name``, if there is one."""
    folder = (root or SHIPPED_ROOT) / target_name / method
    return folder if (folder / "config.json").is_file() else None


def trained_proposal_length(folder: str | Path) -> int | None:
    """How many draft tokens the checkpoint in ``folder`` was trained to propose: its block size (DSpark,
    DFlash) or TTT length (DeepSpec Eagle3); None when its config.json does not say (MTP, our Eagle3). This is
    the first read of a checkpoint a run makes, before the target loads, so it checks the weight files too
    (:func:`check_weight_files`): a damaged checkpoint fails here, not after the model has loaded."""
    file = Path(folder) / "config.json"
    check_weight_files(folder)
    if not file.is_file():
        return None
    meta = read_json(file)
    if "architectures" in meta:  # DeepSpec's format: the draft keys sit beside the target's config
        value = meta.get("block_size", meta.get("ttt_length"))
    else:
        value = (meta.get("config") or {}).get("block_size")
    return None if value is None else int(value)


def local_checkpoint(spec: str | None, target_name: str, method: str) -> Path | None:
    """The folder a drafter's ``checkpoint`` option (or, without one, the shipped checkpoint) names, found without
    downloading anything: a local folder, a hub id already in the local hub cache, or None."""
    if not spec:
        return shipped_folder(target_name, method)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(cached).parent if isinstance(cached, str) else None


class CheckpointError(ValueError):
    """A checkpoint that is missing, malformed, or does not fit the target."""


def read_json(file: str | Path) -> dict[str, Any]:
    """A checkpoint's JSON file (``config.json``, a shard index) as a dict; a file that is not a UTF-8 JSON
    object raises :class:`CheckpointError` naming it."""
    accepted = f"a checkpoint's {Path(file).name} holds one JSON object"
    try:
        data = json.loads(Path(file).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{file} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
                              f"{accepted}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file} is not valid JSON ({exc.msg}: line {exc.lineno} column {exc.colno}); "
                              f"{accepted}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} holds a JSON {type(data).__name__}; {accepted}")
    return data


def _unreadable(file: str | Path, exc: Exception) -> CheckpointError:
    return CheckpointError(f"{file} is not a readable safetensors file (truncated, or not safetensors: {exc}); a "
                           "checkpoint's weights are complete safetensors files: copy or download it again")


def read_tensors(file: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of one safetensors file; a damaged file raises :class:`CheckpointError` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except SafetensorError as exc:
        raise _unreadable(file, exc) from None


def check_weight_files(folder: str | Path) -> None:
    """Read the header of every ``*.safetensors`` file in ``folder`` (milliseconds: no tensor is read), which is
    enough to find a truncated file or one that is not safetensors."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except SafetensorError as exc:
            raise _unreadable(file, exc) from None


@dataclass(frozen=True)
class TargetFingerprint:
    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    weights_sha256: str

    @staticmethod
    def of(target: Target) -> TargetFingerprint:
        h = hashlib.sha256()
        for w in (target.model.get_input_embeddings().weight, target.model.get_output_embeddings().weight):
            h.update(w.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().tobytes())
        return TargetFingerprint(target.name, target.vocab_size, target.hidden_size, target.num_layers, h.hexdigest())


def save(folder: str | Path, method: str, config: dict[str, Any], state: dict[str, torch.Tensor],
         target: TargetFingerprint, extra: dict[str, Any] | None = None) -> Path:
    """Write ``state`` (trained weights only) and the config; atomic via a temporary folder."""
    from safetensors.torch import save_file

    out = Path(folder)
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp / "model.safetensors"))
    meta = {"format": FORMAT, "method": method, "config": config, "target": asdict(target), **(extra or {})}
    (tmp / "config.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if out.exists():
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    tmp.rename(out)
    return out


def load(folder: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read a checkpoint folder: (config.json as a dict, state dict)."""
    path = Path(folder)
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise CheckpointError(f"{path} is not a drafter checkpoint: it needs config.json and model.safetensors")
    return read_json(path / "config.json"), read_tensors(path / "model.safetensors")


def check_target(meta: dict[str, Any], target: Target) -> None:
    """Fail clearly when a checkpoint was trained against a different target."""
    want = meta.get("target")
    if not want:
        raise CheckpointError("checkpoint has no target fingerprint")
    have = asdict(TargetFingerprint.of(target))
    diff = [k for k in ("vocab_size", "hidden_size", "num_layers", "weights_sha256") if want.get(k) != have[k]]
    if diff == ["weights_sha256"] and target.dtype == torch.float16:
        raise CheckpointError("cannot check this drafter against an fp16 target: its fingerprint hashes the "
                              "target's weights in bf16, and fp16 weights round to other bf16 values; load the "
                              "target in bf16 or fp32 (--dtype bf16 / fp32)")
    if diff:
        detail = ", ".join(f"{k}: checkpoint {want.get(k)!r} vs target {have[k]!r}" for k in diff)
        raise CheckpointError(f"drafter was trained for target {want.get('name')!r}, not {target.name!r} ({detail})")
