"""One decorator, one source of truth for drafter names.

Drafter modules register themselves at import; :mod:`dspark_bench.drafters` imports them all (cheaply: heavy
imports happen inside constructors). Options reach a drafter only through its own ``Config`` dataclass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dspark_bench.drafters.base import Drafter
    from dspark_bench.target.model import Target

_DRAFTERS: dict[str, type[Drafter]] = {}  # filled by @register at import time only


class DrafterError(ValueError):
    """Unknown drafter or bad drafter options."""


def register(name: str):
    """Class decorator: make a drafter available under ``name``."""

    def wrap(cls):
        if name in _DRAFTERS:
            raise DrafterError(f"drafter name {name!r} registered twice")
        if not dataclasses.is_dataclass(getattr(cls, "Config", None)):
            raise DrafterError(f"drafter {name!r} needs a nested Config dataclass")
        cls.name = name
        _DRAFTERS[name] = cls
        return cls

    return wrap


def names() -> tuple[str, ...]:
    return tuple(sorted(_DRAFTERS))


def drafter_class(name: str) -> type[Drafter]:
    if name not in _DRAFTERS:
        raise DrafterError(f"unknown drafter {name!r}; known drafters: {', '.join(names())}")
    return _DRAFTERS[name]


def make_config(name: str, options: Mapping[str, Any] | None = None):
    """Build drafter ``name``'s Config from ``options``; unknown keys are errors."""
    cls = drafter_class(name).Config
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options or {}) - set(fields))
    if unknown:
        known = ", ".join(fields) or "(none)"
        raise DrafterError(f"drafter {name!r} has no option(s) {', '.join(unknown)}; its options: {known}")
    return cls(**{k: _coerce(v, fields[k]) for k, v in (options or {}).items()})


def _coerce(value: Any, f: dataclasses.Field) -> Any:
    """Options from the CLI arrive as strings; convert them to the field's declared scalar type."""
    if not isinstance(value, str):
        return value
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    try:
        if kind.startswith("int"):
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("bool"):
            if value.lower() not in {"true", "false", "1", "0"}:
                raise ValueError(value)
            return value.lower() in {"true", "1"}
    except ValueError:
        raise DrafterError(f"option {f.name}={value!r} is not a valid {kind}") from None
    return value


def create(name: str, target: Target, options: Mapping[str, Any] | None = None) -> Drafter:
    """Instantiate a registered drafter for ``target``."""
    return drafter_class(name)(make_config(name, options), target)
