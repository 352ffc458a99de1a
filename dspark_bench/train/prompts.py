"""Training prompts: an original, seeded, programmatically generated mix of math, code and chat requests.

There is no training split of our evaluation data on this machine, so the prompts are built from ingredients
written for dspark-bench in ``dspark_bench/evaluation/data/train/`` (provenance in its README): math word-problem templates plus
built-in exercise generators, a catalogue of 170 function specifications plus code-snippet patterns, and chat
topics x request types. The mix follows the reference's (section 7.1: chat 17.6%, math 39.4%, code 38.9%):
``MIX`` = math 40%, code 40%, chat 20%.

Determinism: each domain draws from its own ``random.Random(f"{seed}-{domain}")``; the final order is a seeded
shuffle, so any prefix of the list keeps the mix. Prompts are distinct, and a candidate that collides with an
evaluation prompt (see :class:`EvalGuard`) is skipped.
"""

from __future__ import annotations

import math
import random
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from dspark_bench.evaluation.suites import SUITES_DIR

SOURCE_DIR = SUITES_DIR / "train"
MIX = (("math", 0.4), ("code", 0.4), ("chat", 0.2))
HEAD_CHARS = 60  # no evaluation prompt's first 60 characters may appear inside a training prompt
_BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
_MATH_SUFFIXES = (_BOXED, _BOXED, _BOXED, "\nShow your reasoning step by step.", "\nExplain your solution briefly.",
                  "", " Give the final answer on the last line.", " Think it through carefully before answering.")


@dataclass(frozen=True)
class TrainPrompt:
    id: str  # "<domain>-<5 digits>", unique
    domain: str  # math | code | chat
    text: str  # the single user turn (before chat templating)


def normalise(text: str) -> str:
    """Lower-case alphanumeric words joined by single spaces (for near-duplicate checks)."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


class EvalGuard:
    """Rejects texts equal to an evaluation prompt (exactly or after :func:`normalise`) or containing the first
    ``HEAD_CHARS`` characters of one."""

    def __init__(self, eval_texts: Iterable[str]):
        texts = list(eval_texts)
        self.exact = set(texts)
        self.normal = {normalise(t) for t in texts}
        self.heads = sorted({t[:HEAD_CHARS] for t in texts if t.strip()})

    def collides(self, text: str) -> bool:
        return text in self.exact or normalise(text) in self.normal or any(h in text for h in self.heads)


def build_prompts(n: int = 4000, seed: int = 0, exclude: Iterable[str] = ()) -> list[TrainPrompt]:
    """``n`` distinct prompts in the ``MIX`` proportions, none colliding with ``exclude`` (evaluation texts)."""
    if n < 1:
        raise ValueError(f"the number of prompts must be >= 1, got {n}")
    guard, src = EvalGuard(exclude), _sources()
    quotas = _quotas(n)
    prompts = []
    for domain, count in quotas:
        rng = random.Random(f"{seed}-{domain}")
        texts = _distinct(lambda rng=rng, make=_MAKERS[domain]: make(rng, src), count, guard, domain)
        prompts += [TrainPrompt(f"{domain}-{i:05d}", domain, t) for i, t in enumerate(texts)]
    random.Random(f"{seed}-order").shuffle(prompts)
    return prompts


def _quotas(n: int) -> list[tuple[str, int]]:
    counts = [(d, math.floor(n * share)) for d, share in MIX]
    counts[0] = (counts[0][0], counts[0][1] + n - sum(c for _, c in counts))  # rounding goes to math
    return counts


def _distinct(make: Callable[[], str], count: int, guard: EvalGuard, domain: str) -> list[str]:
    seen: dict[str, None] = {}
    for _ in range(50 * count + 100):
        if len(seen) == count:
            break
        text = make().strip()
        if text not in seen and not guard.collides(text):
            seen[text] = None
    if len(seen) < count:
        raise ValueError(f"could only build {len(seen)} distinct {domain} prompts, {count} asked for")
    return list(seen)


# ---- sources ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sources:
    math: dict
    chat: dict
    tasks: tuple[tuple[str, str, str, str], ...]  # (name, parameters, return type, description)
    snippets: tuple[str, ...]


@cache
def _sources(folder: Path = SOURCE_DIR) -> Sources:
    with (folder / "math.toml").open("rb") as fh:
        math_src = tomllib.load(fh)
    with (folder / "chat.toml").open("rb") as fh:
        chat_src = tomllib.load(fh)
    tasks = []
    for line in (folder / "code_tasks.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            parts = tuple(p.strip() for p in line.split("|"))
            if len(parts) != 4:
                raise ValueError(f"code_tasks.txt: expected 4 '|'-separated fields in {line!r}")
            tasks.append(parts)
    text = (folder / "code_snippets.txt").read_text()
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    snippets = tuple(s.strip("\n") for s in body.split("\n---\n") if s.strip() and s.strip() != "---")
    return Sources(math_src, chat_src, tuple(tasks), snippets)


# ---- math ---------------------------------------------------------------------------------------------------
def _money(rng: random.Random, low: float, high: float) -> str:
    value = rng.uniform(low, high)
    return f"{value:.2f}" if rng.random() < 0.6 else str(max(1, round(value)))


def math_template(rng: random.Random, src: Sources) -> str:
    t = rng.choice(src.math["template"])
    names = rng.sample(src.math["names"], 3)
    values = {"name": names[0], "name2": names[1], "name3": names[2], "city": rng.choice(src.math["cities"]),
              "store": rng.choice(src.math["stores"])}
    values |= {k: str(rng.randint(lo, hi)) for k, (lo, hi) in t.get("ints", {}).items()}
    values |= {k: _money(rng, lo, hi) for k, (lo, hi) in t.get("money", {}).items()}
    values |= {k: rng.choice(pool) for k, pool in t.get("pools", {}).items()}
    return t["text"].format(**values)


def _expression(rng: random.Random, depth: int = 2) -> str:
    if depth == 0 or rng.random() < 0.3:
        return str(rng.randint(2, 60))
    op = rng.choice(["+", "-", "*", "/"] if depth == 1 else ["+", "-", "*"])
    left, right = _expression(rng, depth - 1), _expression(rng, depth - 1)
    return f"({left} {op} {right})" if depth < 2 else f"{left} {op} {right}"


def _exercise(rng: random.Random) -> str:
    """A short exercise from one of the built-in generators (numbers chosen so the answers are tidy)."""
    r, a, b, c = rng.randint, rng.randint(2, 12), rng.randint(2, 15), rng.randint(1, 9)
    x, y = r(-9, 12), r(-9, 12)
    word = rng.choice(["BANANA", "LETTER", "PUZZLE", "MISSISSIPPI", "GARDEN", "COFFEE", "BALLOON", "RIVER"])
    makers = [
        lambda: f"Solve for x: {a}x + {b} = {a * x + b}.",
        lambda: f"Solve the system of equations {a}x + {c}y = {a * x + c * y} and {b}x - y = {b * x - y}.",
        lambda: f"Evaluate {_expression(rng, 3)}.",
        lambda: f"What is {a}/{b} + {c}/{b + c} written as a fraction in lowest terms?",
        lambda: f"What is {r(3, 95)}% of {r(20, 2000)}?",
        lambda: f"{r(5, 90)} is what percent of {r(100, 400)}?",
        lambda: f"What is the next number in the sequence {', '.join(str(a + b * i) for i in range(5))}, ...?",
        lambda: f"What is the next term of the sequence {', '.join(str(c * a**i) for i in range(4))}, ...?",
        lambda: f"Find the greatest common divisor and the least common multiple of {a * b * c} and {a * r(2, 20)}.",
        lambda: f"A triangle has sides of {3 * c} cm, {4 * c} cm and {5 * c} cm. What is its area?",
        lambda: f"A cylinder has radius {a} cm and height {b} cm. What is its volume in terms of pi?",
        lambda: f"Two fair dice are rolled. What is the probability that the sum is {r(2, 12)}?",
        lambda: f"A bag has {a} red and {b} blue balls. Two are drawn without replacement. What is the probability "
                f"that both are {rng.choice(['red', 'blue'])}?",
        lambda: f"How many distinct arrangements are there of the letters of the word {word}?",
        lambda: f"In how many ways can {r(4, 8)} people sit in a row if two particular people must sit together?",
        lambda: f"What is the remainder when {a}^{r(10, 99)} is divided by {r(5, 13)}?",
        lambda: f"Convert {r(50, 5000)} from base 10 to base {rng.choice([2, 3, 5, 7, 8, 16])}.",
        lambda: f"Find the roots of x^2 {-(x + y):+d}x {x * y:+d} = 0.",
        lambda: f"How many positive integers less than {r(100, 1000)} are divisible by {a} or {b + 1}?",
        lambda: f"The average of {c + 3} numbers is {r(10, 60)}. After one number is removed, the average of the "
                f"rest is {r(10, 60)}. What number was removed?",
        lambda: f"A square has a diagonal of {a * 2} cm. What is its area?",
        lambda: f"If f(x) = {a}x^2 {-b:+d}x + {c}, what is f({x})?",
    ]
    return rng.choice(makers)()


def math_prompt(rng: random.Random, src: Sources) -> str:
    body = math_template(rng, src) if rng.random() < 0.6 else _exercise(rng)
    return body + rng.choice(_MATH_SUFFIXES)


# ---- code ---------------------------------------------------------------------------------------------------
_CONSTRAINTS = (
    "Do not import anything.", "Aim for O(n log n) time or better.", "Raise ValueError on invalid input.",
    "Add type hints.", "Keep it under 20 lines.", "Use recursion.", "Avoid recursion.", "Handle empty input gracefully.",
    "Explain the time complexity after the code.", "Only use the standard library.", "Write it in a functional style.",
    "Include a few example calls.", "Prefer readability over cleverness.", "Avoid mutating the arguments.",
)
_DOCSTRINGS = (
    "Use a Google-style docstring.", "Use a NumPy-style docstring.", "Use a reStructuredText docstring.",
    "Include doctest examples in the docstring.", "Write the docstring in French.", "Write the docstring in Spanish.",
    "Write the docstring in German.", "Write the docstring in Portuguese.", "Keep the docstring to one line.",
)
_LANGUAGES = ("JavaScript", "TypeScript", "Rust", "Go", "Java", "C++", "C#", "Ruby", "Kotlin", "Swift")
_IDENTIFIERS = {
    "f": ("process", "compute", "transform", "summarise", "pick", "score", "walk", "collect", "helper", "solve"),
    "g": ("combine", "reduce_all", "finish", "apply_all", "main_step"),
    "xs": ("values", "items", "numbers", "data", "records", "scores", "nums", "entries"),
    "ys": ("labels", "weights", "others", "keys", "targets"),
    "x": ("item", "value", "v", "n", "entry", "elem"), "y": ("target", "other", "w", "label", "needle"),
    "acc": ("total", "result", "out", "acc", "parts", "buffer"),
    "cls": ("Window", "Tracker", "RollingStats", "Buffer", "Recorder"),
    "word": ("pair", "num", "price", "score", "step"),
}


def _task_head(rng: random.Random, task: tuple[str, str, str, str]) -> str:
    name, args, ret, desc = task
    if ret == "class":
        ctor = "" if args == "-" else f" The constructor takes `{args}`."
        return rng.choice([f"Write {desc} in Python.{ctor}", f"Implement {desc} in Python.{ctor}",
                           f"Create {desc}, in Python.{ctor} Show a short usage example."])
    sig = f"{name}({args}) -> {ret}"
    return rng.choice([
        f"Write a Python function `{sig}` that will {desc}.",
        f"Implement `{name}` in Python. Signature: `def {sig}:`. It should {desc}.",
        f"I need a Python function called {name} that will {desc}. Use the signature `def {sig}:`.",
        f"Create a Python function to {desc}. Name it `{name}` and take `{args}` as parameters.",
        f"Can you help me write `{name}`? Given `{args}`, it should {desc}.",
    ])


def _task_stub(rng: random.Random, task: tuple[str, str, str, str]) -> str:
    name, args, ret, desc = task
    intro = rng.choice(["Complete the body of this Python function:", "Fill in the implementation below.",
                        "Finish this function so that it does what its docstring says.", "Implement this stub:"])
    doc = desc[0].upper() + desc[1:]
    return f'{intro}\n\n```python\ndef {name}({args}) -> {ret}:\n    """{doc}."""\n    ...\n```'


def _snippet(rng: random.Random, src: Sources) -> str:
    names = {k: rng.choice(v) for k, v in _IDENTIFIERS.items()}
    body = rng.choice(src.snippets).format(**names, k=rng.randint(2, 9), m=rng.randint(1, 3))
    ask = rng.choice([
        "Explain what this code does, line by line:", "What does this function return, and why?",
        "Review this code and point out any bugs or edge cases:", "Add type hints and a docstring to this code:",
        "Refactor this code to be more readable, and explain your changes:", "Write pytest tests for this code:",
        "Rewrite this code in JavaScript:", "What is the time complexity of this code?",
    ])
    return f"{ask}\n\n```python\n{body}\n```"


def code_prompt(rng: random.Random, src: Sources) -> str:
    task, roll = rng.choice(src.tasks), rng.random()
    if roll < 0.15:
        return _snippet(rng, src)
    if roll < 0.30 and task[2] != "class":
        return _task_stub(rng, task)
    if roll < 0.40:
        return f"Write a {rng.choice(_LANGUAGES)} function `{task[0]}` that will {task[3]}."
    if roll < 0.47 and task[2] != "class":
        return f"Write pytest unit tests for a function `{task[0]}({task[1]})` that will {task[3]}. Cover edge cases."
    extras = rng.sample(_CONSTRAINTS, rng.randint(0, 2))
    if rng.random() < 0.4:
        extras.append(rng.choice(_DOCSTRINGS))
    return " ".join([_task_head(rng, task), *extras])


# ---- chat ---------------------------------------------------------------------------------------------------
def _passage(rng: random.Random, src: Sources, values: dict[str, str]) -> str:
    patterns = src.chat["passage"]
    picks = sorted(rng.sample(range(len(patterns)), rng.randint(4, 7)))
    return " ".join(patterns[i].format(**values) for i in picks)


def chat_prompt(rng: random.Random, src: Sources) -> str:
    c = src.chat
    kind = rng.choice(sorted(c["requests"]))
    pair = rng.choice(c["pairs"])
    values = {"topic": rng.choice(c["topics"]), "audience": rng.choice(c["audiences"]), "form": rng.choice(c["forms"]),
              "tone": rng.choice(c["tones"]), "role": rng.choice(c["roles"]), "goal": rng.choice(c["goals"]),
              "a": pair[0], "b": pair[1], "n": str(rng.randint(3, 9)), "days": str(rng.choice([3, 5, 7, 10, 14, 30])),
              "name": rng.choice(src.math["names"]), "city": rng.choice(src.math["cities"]),
              "year": str(rng.randint(1995, 2023)), "pct": str(rng.randint(10, 70))}
    values["passage"] = _passage(rng, src, values)
    return rng.choice(c["requests"][kind]).format(**values)


_MAKERS: dict[str, Callable[[random.Random, Sources], str]] = {"math": math_prompt, "code": code_prompt,
                                                                "chat": chat_prompt}
