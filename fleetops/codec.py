"""Typed JSON to dataclasses: converters built once per type from the type hints.

The snapshot's dataclasses live in ``fleetops.model``; this module knows nothing of them but
their hints, so any dataclass tree (a node snapshot, a finding) is parsed the same way: a
``None`` where the hint allows it, ``float`` taking an ``int``, lists and mappings of the hinted
item type, and an error naming the field path for anything else. Standard library only: the
agent's hot path imports it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


class SchemaError(ValueError):
    """A snapshot document does not match the schema; the message names the field path."""


# A converter per type, built once from the dataclasses' type hints: the controller parses
# hundreds of snapshots per audit, so the per-value work is a dict lookup and a call.
Converter = typing.Callable[[Any, str], Any]
_CONVERTERS: dict[Any, Converter] = {}


def _scalar(tp: type, label: str) -> Converter:
    def convert(value: Any, path: str) -> Any:
        if type(value) is tp:
            return value
        if tp is float and type(value) is int:
            return float(value)
        raise SchemaError(f"{path}: expected {label}, got {value!r}")

    return convert


def converter(tp: Any) -> Converter:
    found = _CONVERTERS.get(tp)
    if found is None:
        found = _make_converter(tp)
        _CONVERTERS[tp] = found
    return found


def _make_converter(tp: Any) -> Converter:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        options = [converter(a) for a in args if a is not type(None)]

        def union(value: Any, path: str) -> Any:
            if value is None:
                if nullable:
                    return None
                raise SchemaError(f"{path}: null where a value is required")
            if len(options) == 1:
                return options[0](value, path)
            for option in options:
                try:
                    return option(value, path)
                except SchemaError:
                    continue
            raise SchemaError(f"{path}: unexpected value {value!r}")

        return union
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        item = converter(item_tp)

        def as_list(value: Any, path: str) -> Any:
            if type(value) is not list:
                raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
            return [item(v, f"{path}[{i}]") for i, v in enumerate(value)]

        return as_list
    if origin is dict:
        _, value_tp = typing.get_args(tp)
        conv = converter(value_tp)

        def as_dict(value: Any, path: str) -> Any:
            if type(value) is not dict:
                raise SchemaError(f"{path}: expected a mapping, got {type(value).__name__}")
            return {str(k): conv(v, f"{path}.{k}") for k, v in value.items()}

        return as_dict
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)
    if tp is Any:
        return lambda value, path: value
    labels = {float: "a number", int: "an integer", bool: "true/false", str: "a string"}
    if tp in labels:
        return _scalar(tp, labels[tp])
    return lambda value, path: value


# A dataclass's plan (its fields' converters) is made on its first conversion. Threads
# convert at once from the first snapshot a process sees (the daemon's nodes, an audit's
# pool, the TUI's readers), so a plan is made whole in a local and only then published: a
# thread that finds none makes its own (the same), never reads one half made. A plan filled
# in place was read half made: a snapshot parsed as a node without GPUs, or with GPUs whose
# later fields were missing (None, so "could not read" findings).


def _dataclass_converter(cls: type) -> Converter:
    hints = typing.get_type_hints(cls)
    published: tuple[tuple[str, Converter, bool], ...] | None = None

    def make_plan() -> tuple[tuple[str, Converter, bool], ...]:
        return tuple(
            (f.name, converter(hints[f.name]),
             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls)
        )  # fmt: skip

    def build(value: Any, path: str) -> Any:
        nonlocal published
        plan = published
        if plan is None:
            plan = published = make_plan()
        if type(value) is not dict:
            raise SchemaError(f"{path}: expected an object, got {type(value).__name__}")
        kwargs = {}
        for name, conv, required in plan:
            if name in value:
                kwargs[name] = conv(value[name], f"{path}.{name}")
            elif required:
                raise SchemaError(f"{path}.{name}: missing")
        return cls(**kwargs)

    return build


# The same conversion without paths: building a path string for every field of every GPU and
# link was most of a snapshot's parse (a TUI streaming from a thousand daemons parses a hundred
# snapshots a second). A value the fast converter refuses is converted again by the path-keeping
# one above, which words the error; the two accept exactly the same values.
FastConverter = typing.Callable[[Any], Any]
_FAST: dict[Any, FastConverter] = {}


class Refused(Exception):
    """A fast converter met a value it does not take (the path-keeping one says where)."""


def fast(tp: Any) -> FastConverter:
    found = _FAST.get(tp)
    if found is None:
        found = _make_fast(tp)
        _FAST[tp] = found
    return found


def _make_fast(tp: Any) -> FastConverter:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        nullable = type(None) in args
        options = [fast(a) for a in args if a is not type(None)]
        if len(options) == 1:
            (only,) = options

            def one(value: Any) -> Any:
                if value is None:
                    if nullable:
                        return None
                    raise Refused
                return only(value)

            return one

        def union(value: Any) -> Any:
            if value is None:
                if nullable:
                    return None
                raise Refused
            for option in options:
                try:
                    return option(value)
                except Refused:
                    continue
            raise Refused

        return union
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        item = fast(item_tp)

        def as_list(value: Any) -> Any:
            if type(value) is not list:
                raise Refused
            return [item(v) for v in value]

        return as_list
    if origin is dict:
        _, value_tp = typing.get_args(tp)
        conv = fast(value_tp)

        def as_dict(value: Any) -> Any:
            if type(value) is not dict:
                raise Refused
            return {str(k): conv(v) for k, v in value.items()}

        return as_dict
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _fast_dataclass(tp)
    if tp in (float, int, bool, str):
        return _fast_scalar(tp)
    return lambda value: value


def _fast_scalar(tp: type) -> FastConverter:
    if tp is float:
        def number(value: Any) -> Any:
            kind = type(value)
            if kind is float:
                return value
            if kind is int:
                return float(value)
            raise Refused

        return number

    def exact(value: Any) -> Any:
        if type(value) is tp:
            return value
        raise Refused

    return exact


_SCALARS = (float, int, bool, str)


def _scalar_of(tp: Any) -> tuple[type, bool] | None:
    """(the scalar type, whether None is allowed) of ``X`` or ``X | None``, else None."""
    if tp in _SCALARS:
        return tp, False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and args[0] in _SCALARS and len(typing.get_args(tp)) == 2:
            return args[0], True
    return None


_FastPlan = tuple[tuple[str, bool, "type | None", bool, "FastConverter | None"], ...]


def _fast_dataclass(cls: type) -> FastConverter:
    """Scalar fields (most of a GPU's and a link's) are checked inline, the rest converted."""
    hints = typing.get_type_hints(cls)
    # (name, required, scalar type or None, None allowed, converter for the rest); published
    # whole, as ``_dataclass_converter``'s plan
    published: _FastPlan | None = None
    missing = object()

    def make_plan() -> _FastPlan:
        plan: list[tuple[str, bool, type | None, bool, FastConverter | None]] = []
        for f in dataclasses.fields(cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            found = _scalar_of(hints[f.name])
            if found is not None:
                plan.append((f.name, required, found[0], found[1], None))
            else:
                plan.append((f.name, required, None, False, fast(hints[f.name])))
        return tuple(plan)

    def build(value: Any) -> Any:
        nonlocal published
        plan = published
        if plan is None:
            plan = published = make_plan()
        if type(value) is not dict:
            raise Refused
        kwargs = {}
        get = value.get
        for name, required, scalar, nullable, conv in plan:
            v = get(name, missing)
            if v is missing:
                if required:
                    raise Refused
                continue
            if scalar is None:
                kwargs[name] = conv(v)  # type: ignore[misc]
            elif type(v) is scalar or (v is None and nullable):
                kwargs[name] = v
            elif scalar is float and type(v) is int:
                kwargs[name] = float(v)
            else:
                raise Refused
        return cls(**kwargs)

    return build


def build(tp: Any, value: Any, path: str) -> Any:
    try:
        return fast(tp)(value)
    except Refused:
        return converter(tp)(value, path)  # raises SchemaError naming the field
