"""Pure scoring helpers of the offline lm-eval tasks: GSM8K answer extraction and HumanEval program assembly.

GSM8K (``dspark_gsm8k``, metric ``exact_match``):

* the **prediction** is the last number inside the last ``\\boxed{...}`` of the output when there is one
  (braces balanced), otherwise the last number of the whole output;
* numbers are normalised by dropping ``$``, thousands commas and a trailing period, then compared as
  decimals (``18``, ``18.0`` and ``18.00`` are equal); a boxed value that is not a number is compared as text;
* the **reference** is the text after ``####`` of the GSM8K answer (the suite keeps exactly that in
  ``Prompt.meta['answer']``).

HumanEval (``dspark_humaneval``, metric ``pass@1``): the model answers a chat prompt, usually with a fenced code
block. The **code** is the first fenced block that defines the entry point, else the first fenced block, else
the whole answer. The **program** is the problem's prompt (its imports and helper functions), the code, the
tests and ``check(entry_point)``; when the code does not define the entry point it is treated as the body that
completes the prompt.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_BOXED = "\\boxed{"
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces balanced), or None when there is none or it is open."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (``1,234.5`` counts as one number), or None."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def normalize_number(text: str) -> str:
    """``'$1,234.50.'`` -> ``'1234.50'``: drop dollars, thousands commas, spaces and a trailing period."""
    return text.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")


def extract_gsm8k(output: str) -> str | None:
    """The model's final answer: the last number of the last boxed value (or of the whole output when nothing
    is boxed); a boxed value without a number is returned as text; None when there is nothing."""
    boxed = last_boxed(output)
    number = last_number(output if boxed is None else boxed)
    return boxed if number is None else normalize_number(number)


def same_answer(predicted: str | None, reference: str) -> bool:
    """Equal as decimals when both parse as numbers, else equal as stripped text."""
    if predicted is None:
        return False
    ref = normalize_number(reference.strip())
    try:
        return Decimal(predicted) == Decimal(ref)
    except InvalidOperation:
        return predicted.strip() == ref


def gsm8k_correct(output: str, reference: str) -> bool:
    return same_answer(extract_gsm8k(output), reference)


def extract_code(output: str, entry_point: str) -> str:
    """The code of a chat answer: the first fenced block defining ``entry_point``, else the first, else all."""
    blocks = _FENCE.findall(output)
    defines = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    for block in blocks:
        if defines.search(block):
            return block
    return blocks[0] if blocks else output


def humaneval_program(output: str, prompt: str, test: str, entry_point: str) -> str:
    """The whole program that passes iff the answer solves the problem (see the module docstring)."""
    code = extract_code(output, entry_point)
    defines = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE)
    body = f"{prompt}\n\n{code}" if defines else prompt + code
    return f"{body}\n\n{test}\n\ncheck({entry_point})\n"
