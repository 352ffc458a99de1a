"""The paper's Table 1 as data (``dspark_bench/report/table1.json``): its benchmarks, drafters and tau per target."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.report.inputs import _obj

TABLE1_PATH = Path(__file__).resolve().parent / "table1.json"  # package data


@dataclass(frozen=True)
class PaperDataset:
    name: str
    label: str
    domain: str
    cap: int


@dataclass(frozen=True)
class PaperTarget:
    name: str
    aliases: tuple[str, ...]
    tau: Mapping[str, Mapping[str, float]]  # drafter -> dataset -> tau
    macro: Mapping[str, float]
    domain_means: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class PaperTable1:
    source: str
    datasets: tuple[PaperDataset, ...]
    drafters: Mapping[str, str]  # our drafter name -> the paper's
    targets: tuple[PaperTarget, ...]

    def match(self, target: str) -> PaperTarget | None:
        """The paper target a hub id or model folder names (case, '-', '_', '.' and the owner ignored)."""
        key = _norm(target)
        return next((t for t in self.targets if key in {_norm(a) for a in (t.name, *t.aliases)}), None)

    def domain_of(self, dataset: str) -> str | None:
        return next((d.domain for d in self.datasets if d.name == dataset), None)


def _norm(name: str) -> str:
    return re.sub(r"[-_. ]", "", str(name).rstrip("/").rsplit("/", 1)[-1].lower())


def load_table1(path: Path = TABLE1_PATH) -> PaperTable1:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    d = _obj(data, str(path), ("source", "metric", "derived", "settings", "datasets", "drafters", "targets"))
    targets = tuple(PaperTarget(t["name"], tuple(t["aliases"]), t["tau"], t["macro"], t["domain_means"])
                    for t in (_obj(t, str(path), ("name", "aliases", "tau", "macro", "domain_means"))
                              for t in d["targets"]))
    return PaperTable1(d["source"], tuple(PaperDataset(**x) for x in d["datasets"]), d["drafters"], targets)
