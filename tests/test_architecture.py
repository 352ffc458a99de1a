"""The package's floors: each top-level package imports only from its own floor or the floors below it, and no
module imports itself back through others (no import circle, function-local imports included).

Floors, lowest first: core (decoding math, round types) < target < drafters < scheduling < evaluation (suites,
records, metrics, gate) < engines < lossless < train < studies < report < lmeval < cli. The test reads the source with
:mod:`ast`, so an import hidden inside a function or under ``TYPE_CHECKING`` counts like any other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dspark_bench"
FLOORS = ("core", "target", "drafters", "scheduling", "evaluation", "engines", "lossless", "train", "studies",
          "report", "lmeval", "cli")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, wherever in the file the import stands."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
    return {m for m in out if m in known and m != name and m != "dspark_bench"}


def floor(name: str) -> int | None:
    parts = name.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


def test_every_subpackage_has_a_floor():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(FLOORS)
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside the floors: {loose}"


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_no_import_from_a_higher_floor(name):
    own = floor(name)
    above = sorted(m for m in GRAPH[name] if own is not None and (floor(m) or 0) > own)
    assert not above, f"{name} (floor {FLOORS[own]}) imports from higher floors: {above}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_circle():
    assert cycles(GRAPH) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
