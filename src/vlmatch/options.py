"""Typed checks of configuration values, one line per problem, before any work starts.

Every option is a dataclass field (a model's ``Config``, the ``data`` and ``train`` sections), checked against its
annotation (int, float, bool, str, ``X | None``, ``Literal``, ``list[X]``) and :func:`option` metadata (range,
choices), so a new option needs nothing here. Types are strict (a quoted ``"32"`` or ``"false"`` is refused; an
integral float is an int). Without metadata, size-like ints (``*_dim``, ``*_size``, ``*layers``, ``*heads``) are
>= 1, other ints >= 0, floats finite. A ``__post_init__`` ``ValueError`` is reported like the others.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class Spec:
    """What a value may be. ``kind`` is int, float, bool, str, list, or None (anything)."""

    kind: type | None
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    nullable: bool = False
    item: Spec | None = None  # element spec of a list
    gt: bool = False  # min is exclusive


_KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list"}


def _show(value) -> str:
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def check(value, spec: Spec) -> tuple[Any, str | None]:
    """(normalised value, None) or (value, problem) for one value."""
    if value is None:
        return (None, None) if spec.nullable else (value, f"must be {_expected(spec)}, got null")
    kind = spec.kind
    if kind is None:
        return value, None
    if kind is bool:
        if not isinstance(value, bool):
            return value, f"must be true or false, got {_show(value)}"
    elif kind is int:
        if isinstance(value, float) and math.isfinite(value) and value == int(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            return value, f"must be {_expected(spec)}, got {_show(value)}"
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return value, f"must be {_expected(spec)}, got {_show(value)}"
        value = float(value)
        if not math.isfinite(value):
            return value, f"must be a finite number, got {value}"
    elif kind is str:
        if not isinstance(value, str):
            return value, f"must be {_expected(spec)}, got {_show(value)}"
    elif kind is list:
        if not isinstance(value, list | tuple):
            return value, f"must be a list, got {_show(value)}"
        out = []
        for i, v in enumerate(value):
            v, problem = check(v, spec.item or Spec(None))
            if problem:
                return value, f"item {i} {problem}"
            out.append(v)
        value = out
    if spec.choices is not None and value not in spec.choices:
        return value, f"must be one of {', '.join(map(str, spec.choices))}; got {_show(value)}"
    if spec.min is not None and (value < spec.min or (spec.gt and value == spec.min)):
        return value, f"must be {_range(spec)}, got {value}"
    if spec.max is not None and value > spec.max:
        return value, f"must be {_range(spec)}, got {value}"
    return value, None


def _expected(spec: Spec) -> str:
    if spec.choices is not None:
        return "one of " + ", ".join(map(str, spec.choices))
    word = _KIND_WORDS.get(spec.kind, "a value")
    rng = _range(spec)
    return f"{word}{' ' + rng if rng else ''}{' or null' if spec.nullable else ''}"


def _range(spec: Spec) -> str:
    parts = []
    if spec.min is not None:
        parts.append(f"{'>' if spec.gt else '>='} {spec.min:g}")
    if spec.max is not None:
        parts.append(f"<= {spec.max}")
    return " and ".join(parts)


def check_mapping(values: dict, specs: dict[str, Spec], where: str) -> tuple[dict, list[str]]:
    """Check every key of ``values`` that has a spec; returns (normalised copy, problems)."""
    out, problems = dict(values), []
    for key, value in values.items():
        if key in specs:
            out[key], problem = check(value, specs[key])
            if problem:
                problems.append(f"{where}.{key} {problem}")
    return out, problems


def raise_problems(problems: list[str], source: str | None = None) -> None:
    if not problems:
        return
    head = f"{source}: " if source else ""
    if len(problems) == 1:
        raise ConfigError(head + problems[0])
    raise ConfigError(f"{head}{len(problems)} problems in the config:\n  " + "\n  ".join(problems))


def option(default, *, min=None, max=None, gt: bool = False, choices=None, resumable: bool = False,  # noqa: A002
           doc: str = ""):
    """A dataclass field with a range (``gt``: ``min`` exclusive; on a list, for every number in it) or allowed
    values; ``resumable``: a resumed run may change it (it does not change what is computed)."""
    meta = {k: v for k, v in (("min", min), ("max", max), ("choices", choices), ("gt", gt or None),
                                ("resumable", resumable or None)) if v is not None}
    return dataclasses.field(default=default, metadata={**meta, "doc": doc})


def defaults(cls: type) -> dict:
    """The default of every field of the dataclass ``cls``, in declaration order."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def resumable(cls: type) -> set[str]:
    """The fields of ``cls`` declared ``resumable``."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("resumable")}


# --- specs from dataclass annotations ------------------------------------------------------------
_SIZE_NAME = re.compile(r"(_dim|_size|layers|heads)$")


def dataclass_specs(cls: type) -> dict[str, Spec]:
    """A :class:`Spec` per field of the dataclass ``cls`` from its annotations and field metadata."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        spec = _spec_of(hints.get(f.name, Any))
        meta = dict(f.metadata)
        if spec.kind is int and not {"min", "max"} & set(meta):
            meta.update({"min": 1, "max": 1 << 24} if _SIZE_NAME.search(f.name) else {"min": 0})
        bounds = {k: (tuple(v) if k == "choices" else v) for k, v in meta.items()
                  if k in ("min", "max", "choices", "nullable", "gt")}
        out[f.name] = _bounded(spec, bounds)
    return out


def _bounded(spec: Spec, bounds: dict) -> Spec:
    """``spec`` with ``bounds``; on a list the numeric bounds hold for the numbers inside it."""
    if spec.kind is list and spec.item is not None and {"min", "max", "gt"} & set(bounds):
        inner = {k: v for k, v in bounds.items() if k in ("min", "max", "gt")}
        outer = {k: v for k, v in bounds.items() if k not in inner}
        return dataclasses.replace(spec, item=_bounded(spec.item, inner), **outer)
    return dataclasses.replace(spec, **bounds)


def _spec_of(tp) -> Spec:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = _spec_of(rest[0]) if len(rest) == 1 else Spec(None)
        return dataclasses.replace(inner, nullable=type(None) in args)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        return Spec(kinds.pop() if len(kinds) == 1 else None, choices=tuple(args))
    if origin in (list, tuple):
        item = _spec_of(args[0]) if args else Spec(None)
        return Spec(list, item=item)
    if tp in (int, float, bool, str):
        return Spec(tp)
    return Spec(None)
