"""Evaluation suites: which prompts a run sends, in which order, and what each one carries along.

Terms:

* **dataset**: one list of rows from one source: ``gsm8k``, ``aime25``, ``humaneval``, ``chat`` (defined in
  ``dspark_bench/evaluation/data/suites.toml``) or a user ``.jsonl`` / ``.jsonl.gz`` file (domain ``custom``; DeepSpec's
  ``eval_datasets`` files, recognised by name, get their paper domain: :data:`DEEPSPEC_FILES`).
* **domain**: a named group of datasets (``math``, ``code``, ``chat``), in the order of ``suites.toml``;
  ``all`` means every domain.
* **cap**: the default number of prompts of a dataset. A ``limit`` can only lower it:
  ``effective cap = min(limit, cap)``.
* **subsampling** (the reference evaluators' protocol): only when a dataset has more rows than its effective
  cap, ``random.Random(seed).shuffle(rows); rows = rows[:cap]``; otherwise the file order is kept.
* **index**: a prompt's position within its own dataset's selection (0..n-1). The per-request sampling seed
  is ``base seed + index``, so a dataset's requests get the same seeds whichever suite they run in.

Row files are data, not config: extra keys of a ``turns`` row are kept in ``Prompt.meta``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
import tomllib
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

SUITES_DIR = Path(__file__).resolve().parent / "data"  # package data: the suites we ship
DEFAULT_SEED = 980406
ALL = "all"
CUSTOM_DOMAIN = "custom"

_MATH_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_CODE_PREFIX = (
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
)
_CODE_SUFFIX = "\n```"
_TURNS_HINT = 'each line must be a JSON object like {"turns": ["first user turn", ...]}'
_SPEC_KEYS = frozenset({"domain", "description", "source", "files", "format", "cap", "pip"})

T = TypeVar("T")

# DeepSpec's eval_datasets/<name>.jsonl files: the paper's domain and the reference evaluator's sample count
# (TASKS; None: every row), looked up by the file's name with '-' and '_' dropped. Any other file is ``custom``.
DEEPSPEC_FILES: Mapping[str, tuple[str, int | None]] = MappingProxyType({
    "gsm8k": ("math", 500), "math500": ("math", 500), "aime24": ("math", None), "aime25": ("math", 30),
    "humaneval": ("code", 164), "mbpp": ("code", 256), "livecodebench": ("code", 500), "lbpp": ("code", None),
    "mtbench": ("chat", 80), "alpaca": ("chat", 500), "arenahardv2": ("chat", 500), "arenahard": ("chat", 500),
})
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


class SuiteError(ValueError):
    """A suite spec, dataset definition or prompt file is invalid."""


def _freeze(value: Any) -> Any:
    """Deep read-only copy of JSON-like data: dicts become mappingproxies, lists become tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class Prompt:
    """One request of a suite: the user turn before chat templating, and what grading needs (``meta``)."""

    dataset: str
    domain: str
    prompt_id: str  # stable across runs: "gsm8k-0042" (row in the source), a task_id, or a chat id
    index: int  # position within its dataset's selection; per-request seed = base seed + index
    text: str
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "meta", _freeze(self.meta))


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset as defined in ``dspark_bench/evaluation/data/suites.toml``."""

    name: str
    domain: str
    source: str  # import name of the package holding the files, or "suites" for files in this package's data/
    cap: int | None  # default number of prompts; None keeps every row
    description: str
    files: tuple[str, ...] = ()
    format: str = "turns"  # a key of _FORMATS
    pip: str | None = None  # requirement that installs `source`


# ---------------------------------------------------------------------------------------------------------
# Row formats: (dataset name, row position, row, "file:line") -> (prompt_id, text, meta). Pure functions.


def _str_field(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise SuiteError(f"{where}: expected a string field {key!r}, got {type(value).__name__}")
    return value


def _boxed_math(name: str, pos: int, row: Mapping[str, Any], where: str) -> tuple[str, str, dict]:
    """GSM8K/AIME: question + boxed-answer instruction; ``answer`` is the text after '#### ' if present."""
    question = _str_field(row, "question", where)
    answer = str(row.get("answer", "")).rpartition("#### ")[2].strip()
    return f"{name}-{pos:04d}", question + _MATH_SUFFIX, {"answer": answer}


def _humaneval(name: str, pos: int, row: Mapping[str, Any], where: str) -> tuple[str, str, dict]:
    """HumanEval: the problem in a python code block; meta keeps what the functional check needs."""
    meta = {key: _str_field(row, key, where) for key in ("task_id", "prompt", "test", "entry_point")}
    return meta["task_id"], _CODE_PREFIX + meta["prompt"] + _CODE_SUFFIX, meta


def _turns(name: str, pos: int, row: Mapping[str, Any], where: str) -> tuple[str, str, dict]:
    """DeepSpec/MT-Bench rows: the first of ``turns``; every other key goes to meta, ``id`` names the prompt."""
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
        got = "no such key" if "turns" not in row else f"{type(turns).__name__} {turns!r:.40}"
        raise SuiteError(f'{where}: no non-empty "turns" list ({got}); {_TURNS_HINT}')
    first = turns[0]
    if not isinstance(first, str) or not first.strip():
        raise SuiteError(f"{where}: the first turn must be a non-empty string, got {first!r:.40}")
    prompt_id = str(row["id"]) if "id" in row else f"{name}-{pos:04d}"
    return prompt_id, first, {k: v for k, v in row.items() if k != "turns"}


_FORMATS: Mapping[str, Callable[[str, int, Mapping[str, Any], str], tuple[str, str, dict]]] = (
    MappingProxyType({"boxed_math": _boxed_math, "humaneval": _humaneval, "turns": _turns})
)


# ---------------------------------------------------------------------------------------------------------
# Suite definitions.


def _parse_cap(name: str, cap: Any) -> int | None:
    if cap == "all":
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise SuiteError(
            f"suites.toml: dataset {name!r} has cap {cap!r}; accepted: a positive integer or 'all'"
        )
    return cap


def _parse_spec(name: str, table: Mapping[str, Any]) -> DatasetSpec:
    """Parse one ``[datasets.NAME]`` table; unknown or missing keys are errors."""
    keys = set(table)
    required = _SPEC_KEYS - {"pip"}
    if keys - _SPEC_KEYS or required - keys:
        raise SuiteError(
            f"suites.toml: dataset {name!r} has keys {sorted(keys)}; "
            f"required: {sorted(required)}, optional: ['pip']"
        )
    if table["format"] not in _FORMATS:
        raise SuiteError(
            f"suites.toml: dataset {name!r} has format {table['format']!r}; known: {sorted(_FORMATS)}"
        )
    files = table["files"]
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise SuiteError(
            f"suites.toml: dataset {name!r} needs 'files', a non-empty list of paths; got {files!r}"
        )
    if table["source"] != "suites" and "pip" not in table:
        raise SuiteError(
            f"suites.toml: dataset {name!r} reads package {table['source']!r} but names no 'pip'"
        )
    return DatasetSpec(
        name=name,
        domain=table["domain"],
        source=table["source"],
        cap=_parse_cap(name, table["cap"]),
        description=table["description"],
        files=tuple(files),
        format=table["format"],
        pip=table.get("pip"),
    )


def datasets() -> dict[str, DatasetSpec]:
    """Dataset name -> spec, in the order of ``dspark_bench/evaluation/data/suites.toml``."""
    with (SUITES_DIR / "suites.toml").open("rb") as fh:
        tables = tomllib.load(fh).get("datasets", {})
    return {name: _parse_spec(name, table) for name, table in tables.items()}


def _group(specs: Mapping[str, DatasetSpec]) -> dict[str, tuple[str, ...]]:
    groups: dict[str, list[str]] = {}
    for spec in specs.values():
        groups.setdefault(spec.domain, []).append(spec.name)
    return {domain: tuple(names) for domain, names in groups.items()}


def domains() -> dict[str, tuple[str, ...]]:
    """Domain -> its dataset names, both in the order of ``dspark_bench/evaluation/data/suites.toml``."""
    return _group(datasets())


# ---------------------------------------------------------------------------------------------------------
# Reading and selecting rows.


def _read_rows(path: Path) -> list[tuple[str, Mapping[str, Any]]]:
    """Non-blank lines of a JSONL (or gzip JSONL) file as ("file, line N", object) pairs. The file is read as
    bytes and each line decoded on its own, so a byte that is not UTF-8 is reported with its line."""
    if not path.is_file():
        raise SuiteError(f"prompt file not found: {path}")
    gzipped = path.suffix == ".gz"
    rows = []
    try:
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if raw.strip():
                    where = f"{path}, line {lineno}"
                    rows.append((where, _parse_row(raw, where)))
    except (OSError, EOFError, zlib.error) as exc:  # gzip: not gzip (OSError), truncated (EOFError), corrupt
        what = "not a readable gzip file (not gzip, truncated or corrupt: " if gzipped else "cannot be read ("
        raise SuiteError(f"{path}: {what}{exc}); accepted: a UTF-8 .jsonl file or a gzip-compressed .jsonl.gz, "
                         f"{_TURNS_HINT}") from None
    return rows


def _parse_row(raw: bytes, where: str) -> Mapping[str, Any]:
    """One line of a prompt file: a UTF-8 JSON object."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        packed = " (it looks gzip-compressed: name it .jsonl.gz)" if raw.startswith(b"\x1f\x8b") else ""
        raise SuiteError(f"{where}: not UTF-8 text (byte {raw[exc.start]:#04x} at position {exc.start + 1}){packed}; "
                         f"prompt files are UTF-8, {_TURNS_HINT}") from None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SuiteError(f"{where}: not valid JSON ({exc.msg}); {_TURNS_HINT}") from None
    if not isinstance(row, dict):
        raise SuiteError(f"{where}: expected a JSON object, got {type(row).__name__}; {_TURNS_HINT}")
    return row


def _subsample(rows: Sequence[T], cap: int | None, seed: int) -> list[T]:
    """Reference protocol: shuffle with ``random.Random(seed)`` and keep ``cap`` rows, only if there are more."""
    rows = list(rows)
    if cap is None or len(rows) <= cap:
        return rows
    random.Random(seed).shuffle(rows)
    return rows[:cap]


def _effective_cap(cap: int | None, limit: int | None) -> int | None:
    if limit is None:
        return cap
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise SuiteError(f"limit must be a positive integer or None, got {limit!r}")
    return limit if cap is None else min(limit, cap)


def _build(
    paths: Sequence[Path], *, dataset: str, domain: str, fmt: str, cap: int | None, seed: int
) -> list[Prompt]:
    """Read, format and validate every row (so errors never depend on the seed), then subsample."""
    # 1. rows of all files, in order; the row position is the prompt's stable number
    rows = [item for path in paths for item in _read_rows(path)]
    if not rows:
        raise SuiteError(
            f"{', '.join(map(str, paths))}: no prompts (empty or only blank lines); {_TURNS_HINT}"
        )
    # 2. format every row; prompt ids must be unique
    items = [_FORMATS[fmt](dataset, pos, row, where) for pos, (where, row) in enumerate(rows)]
    seen: dict[str, str] = {}
    for (where, _), (prompt_id, _, _) in zip(rows, items, strict=True):
        if prompt_id in seen:
            raise SuiteError(
                f"{where}: duplicate id {prompt_id!r} (first at {seen[prompt_id]}); ids must be unique"
            )
        seen[prompt_id] = where
    # 3. select and number
    chosen = _subsample(items, cap, seed)
    return [Prompt(dataset, domain, pid, i, text, meta) for i, (pid, text, meta) in enumerate(chosen)]


def _source_dir(spec: DatasetSpec) -> Path:
    if spec.source == "suites":
        return SUITES_DIR
    found = importlib.util.find_spec(spec.source)
    if found is None or not found.submodule_search_locations:
        raise SuiteError(
            f"dataset {spec.name!r} needs the Python package {spec.source!r}, which is not installed; "
            f"install it with: pip install {spec.pip}"
        )
    return Path(found.submodule_search_locations[0])


# ---------------------------------------------------------------------------------------------------------
# Public loaders.


def load_dataset(name: str, limit: int | None = None, seed: int = DEFAULT_SEED) -> list[Prompt]:
    """Prompts of a dataset defined in ``suites.toml``, capped at ``min(limit, cap)``."""
    specs = datasets()
    if name not in specs:
        raise SuiteError(
            f"unknown dataset {name!r}; known datasets: {', '.join(specs)} (for a .jsonl file use load_jsonl)"
        )
    spec = specs[name]
    root = _source_dir(spec)
    return _build(
        [root / file for file in spec.files],
        dataset=spec.name,
        domain=spec.domain,
        fmt=spec.format,
        cap=_effective_cap(spec.cap, limit),
        seed=seed,
    )


def file_dataset(path: str | Path) -> str:
    """A prompt file's dataset name: its name without ``.jsonl`` or ``.jsonl.gz``."""
    name = Path(path).name
    return next((name[: -len(sfx)] for sfx in sorted(JSONL_SUFFIXES, key=len, reverse=True) if name.endswith(sfx)),
                Path(path).stem)


def file_domain(path: str | Path) -> tuple[str, int | None]:
    """(domain, default cap) of a prompt file: a DeepSpec eval_datasets file's paper domain and sample count
    (:data:`DEEPSPEC_FILES`), else (``custom``, every row)."""
    key = file_dataset(path).lower().replace("-", "").replace("_", "")
    return DEEPSPEC_FILES.get(key, (CUSTOM_DOMAIN, None))


def load_jsonl(
    path: str | Path,
    limit: int | None = None,
    seed: int = DEFAULT_SEED,
    dataset: str | None = None,
    domain: str | None = None,
) -> list[Prompt]:
    """Prompts of a ``{"turns": [...]}`` JSONL (or gzip JSONL) file, first turn only. The dataset name defaults to
    the file name; the domain (and default cap) to a DeepSpec file's (:func:`file_domain`), else ``custom``."""
    path = Path(path)
    name = dataset if dataset is not None else file_dataset(path)
    known, cap = file_domain(path)
    return _build(
        [path], dataset=name, domain=domain or known, fmt="turns", cap=_effective_cap(cap, limit), seed=seed
    )


def _unknown_item(
    item: str, spec: str, groups: Mapping[str, Sequence[str]], names: Sequence[str]
) -> SuiteError:
    return SuiteError(
        f"unknown suite item {item!r} in {spec!r}; known domains: {', '.join(groups)} (or {ALL!r} for every "
        f"domain); known datasets: {', '.join(names)}; a path to a .jsonl or .jsonl.gz file is also accepted"
    )


def _expand(spec: str, specs: Mapping[str, DatasetSpec]) -> list[str | Path]:
    """Suite spec -> dataset names and .jsonl paths, in order; each dataset may be selected once."""
    groups = _group(specs)
    chosen: dict[str, tuple[str | Path, str]] = {}  # dataset name -> (what to load, the item that chose it)
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            raise SuiteError(
                f"empty item in suite spec {spec!r}; expected a comma list of domains, datasets or .jsonl paths"
            )
        if item == ALL:
            targets: list[str | Path] = [name for names in groups.values() for name in names]
        elif item in groups:
            targets = list(groups[item])
        elif item in specs:
            targets = [item]
        elif item.endswith(JSONL_SUFFIXES):
            targets = [Path(item)]
        else:
            raise _unknown_item(item, spec, groups, list(specs))
        for target in targets:
            name = file_dataset(target) if isinstance(target, Path) else target
            if name in chosen:
                raise SuiteError(
                    f"suite spec {spec!r} selects dataset {name!r} twice (by {chosen[name][1]!r} and {item!r}); "
                    "each dataset may appear once"
                )
            chosen[name] = (target, item)
    return [target for target, _ in chosen.values()]


def load_suite(spec: str, limit: int | None = None, seed: int = DEFAULT_SEED, skip: int = 0) -> list[Prompt]:
    """Prompts of a comma list of domains, datasets, ``all`` and .jsonl paths, in order.

    ``limit`` caps each dataset separately, and ``Prompt.index`` counts within each dataset. ``skip`` leaves out
    the prompts that ``limit=skip`` selects, so ``limit=100, skip=32`` decodes what ``limit=100`` adds to
    ``limit=32``, with disjoint prompts. A prompt keeps its index in this list (its seed). That is its index in
    the ``limit=skip`` list too when the dataset is subsampled at both limits (more rows than either); a dataset
    of at most ``limit`` rows keeps its file order, so there the indices (and seeds) can differ.
    """
    if skip < 0:
        raise SuiteError(f"skip must be >= 0, got {skip}")
    prompts: list[Prompt] = []
    for target in _expand(spec, datasets()):
        if isinstance(target, Path):
            prompts += load_jsonl(target, limit=limit, seed=seed)
        else:
            prompts += load_dataset(target, limit=limit, seed=seed)
    if not skip:
        return prompts
    first = {(p.dataset, p.prompt_id) for p in load_suite(spec, skip, seed)}
    return [p for p in prompts if (p.dataset, p.prompt_id) not in first]
