"""Validation of a baseline mapping against ``SCHEMA``: types, ranges, choices, free keys
(GPU models, floor models), MIG layouts; each problem a ``BaselineError`` at its key's line."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NoReturn

from fleetops.baseline.schema import (
    T_BOOL,
    T_INT,
    T_INT_LIST,
    T_MAP,
    T_MAP_OF,
    T_MAP_OF_VERSION,
    T_MAP_OF_XID,
    T_NUM,
    T_STR,
    T_STR_LIST,
    SchemaKey,
    schema_children,
)
from fleetops.baseline.source import BaselineError, key_line, mapping_line
from fleetops.catalog import gpus as _gpus
from fleetops.catalog import mig as _mig_catalog
from fleetops.validation import floors as _floors  # plain data, cheap for the agent's cold path

# --- validation ------------------------------------------------------------------------

LINK_LAYERS = ("InfiniBand", "Ethernet")  # what sysfs writes in a port's link_layer


def fmt_path(parent: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}" if parent else key
    return f'{parent}["{key}"]'


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}".replace("True", "true").replace("False", "false")
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


class Validator:
    def __init__(self, source: str) -> None:
        self.source = source
        self.origins: dict[str, tuple[str, int | None]] = {}

    def fail(self, path: str, problem: str, line: int | None) -> NoReturn:
        raise BaselineError(self.source, path, problem, line)

    def mapping(self, data: Any, schema_parent: str, shown_parent: str, line: int | None) -> dict[str, Any]:
        """Validate one mapping level; returns a plain nested dict of the explicit keys."""
        if not isinstance(data, dict):
            self.fail(shown_parent or "(top level)", f"expected a mapping, got {type_name(data)}", line)
        for key, (dup_line, first) in (getattr(data, "duplicates", None) or {}).items():
            self.fail(fmt_path(shown_parent, str(key)), f"duplicate key (first at line {first})", dup_line)
        children = schema_children(schema_parent)
        out: dict[str, Any] = {}
        for key, value in data.items():
            kline = key_line(data, key)
            if schema_parent == "xid_policy":
                key = self.xid_code(key, shown_parent, kline)
            if not isinstance(key, str):
                self.fail(fmt_path(shown_parent, str(key)), f"keys are text, got {type_name(key)}", kline)
            spec: SchemaKey | None
            if "*" in children:
                spec = children["*"]
                shown = fmt_path(shown_parent, key)
                schema_path = f"{schema_parent}.*" if schema_parent else "*"
                free_key_problem = _FREE_KEY_CHECKS.get(schema_parent)
                problem = free_key_problem(key) if free_key_problem else None
                if problem:
                    self.fail(shown, problem, kline)
            else:
                spec = children.get(key)
                shown = fmt_path(shown_parent, key)
                schema_path = spec.path if spec else ""
                if spec is None:
                    known = sorted(children)
                    import difflib  # only on a bad key: the resident agent loads this module
                    close = difflib.get_close_matches(key, known, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    where = f" under {shown_parent}" if shown_parent else ""
                    self.fail(shown, f"unknown key{where}{hint}; known keys: {', '.join(known)}", kline)
            self.origins[shown] = (self.source, kline)
            out[key] = self.value(value, spec, schema_path, shown, kline)
        return out

    def xid_code(self, key: Any, shown_parent: str, line: int | None) -> str:
        """An ``xid_policy`` key: YAML reads ``31:`` as a number, a quoted ``"31":`` as text."""
        text = str(key).strip() if not isinstance(key, bool) else ""
        if not re.fullmatch(r"[1-9][0-9]{0,4}", text):
            self.fail(fmt_path(shown_parent, str(key)), "expected an XID code (a positive number)", line)
        return text

    def value(self, value: Any, spec: SchemaKey, schema_path: str, shown: str, line: int | None) -> Any:
        if value is None:
            if spec.nullable:
                return None
            self.fail(shown, f"expected {spec.type}, got null (this key cannot be unset)", line)
        t = spec.type
        if t in (T_MAP, T_MAP_OF, T_MAP_OF_XID, T_MAP_OF_VERSION):
            # gpu_models and packages (free keys), each model, mig, pcie, thresholds
            return self.mapping(value, schema_path, shown, mapping_line(value) or line)
        if t == T_STR:
            if not isinstance(value, str):
                hint = ""
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    hint = f": quote it (\"{value}\") so YAML keeps it as text"
                self.fail(shown, f"expected a string, got {type_name(value)}{hint}", line)
            value = str(value)
        elif t == T_INT:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(shown, f"expected an integer, got {type_name(value)}{_template_hint(value)}", line)
            value = int(value)
        elif t == T_NUM:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                self.fail(shown, f"expected a number, got {type_name(value)}{_template_hint(value)}", line)
            value = float(value)
        elif t == T_BOOL:
            if not isinstance(value, bool):
                self.fail(shown, f"expected true or false, got {type_name(value)}{_template_hint(value)}", line)
            value = bool(value)
        elif t == T_INT_LIST:
            if not isinstance(value, (list, tuple)) or not value:
                self.fail(shown, f"expected a non-empty list of integers, got {type_name(value)}", line)
            numbers = []
            for i, item in enumerate(value):
                if isinstance(item, bool) or not isinstance(item, int) or item < 1:
                    self.fail(f"{shown}[{i}]", f"expected a positive integer, got {type_name(item)}", line)
                numbers.append(int(item))
            return numbers
        elif t == T_STR_LIST:
            if not isinstance(value, (list, tuple)):
                self.fail(shown, f"expected a list of strings, got {type_name(value)}", line)
            items = []
            for i, item in enumerate(value):
                if not isinstance(item, str) or not item.strip():
                    self.fail(f"{shown}[{i}]", f"expected a non-empty string, got {type_name(item)}", line)
                items.append(str(item))
            if schema_path in ("fabric.exclude_link_layers", "gpu_models.*.fabric.exclude_link_layers"):
                for i, item in enumerate(items):
                    if item not in LINK_LAYERS:
                        self.fail(f"{shown}[{i}]", f"must be one of {', '.join(LINK_LAYERS)}; got {item!r}", line)
            if schema_path in ("mig.layout", "gpu_models.*.mig.layout"):
                if not items:
                    self.fail(shown, "expected at least one profile (mig.mode: false turns MIG off)", line)
                problem = _layout_problem(shown, items)
                if problem:
                    self.fail(shown, problem, line)
            return items
        problem = range_problem(spec, value)
        if problem is None and schema_path == "gpu_models.*.power_limit_w":
            problem = _model_power_problem(shown, value)
        if problem:
            self.fail(shown, problem, line)
        if spec.choices is not None and value not in spec.choices:
            self.fail(shown, f"must be one of {', '.join(map(str, spec.choices))}; got {value!r}", line)
        if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
            self.fail(shown, f"{value!r} does not match {spec.pattern}", line)
        return value


def range_problem(spec: SchemaKey, value: Any) -> str | None:
    """The key's range, stated whole (both ends, and its unit) whichever end is crossed."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    low, high = spec.minimum, spec.maximum
    below = low is not None and (value <= low if spec.exclusive_minimum else value < low)
    above = high is not None and value > high
    if not (below or above):
        return None
    unit = f" {spec.unit}" if spec.unit else ""
    if low is not None and high is not None:
        bound = f"between {low:g} and {high:g}{unit}" if not spec.exclusive_minimum else \
            f"above {low:g} and at most {high:g}{unit}"
    elif low is not None:
        bound = f"above {low:g}{unit}" if spec.exclusive_minimum else f"at least {low:g}{unit}"
    else:
        bound = f"at most {high:g}{unit}"
    return f"must be {bound}, got {value:g}"


def _model_power_problem(shown: str, value: float) -> str | None:
    """A model's power limit above the board's maximum: NVML refuses to set it."""
    m = re.match(r'gpu_models\["(.+?)"\]', shown)
    known = _gpus.known(m.group(1)) if m else None
    if known is None or value <= known.max_power_w:
        return None
    return f"must be at most {known.max_power_w:g} W, the maximum power limit of {known.name}; got {value:g}"


def _gpu_model_problem(name: str) -> str | None:
    """A ``gpu_models`` key must be a product name NVML reports for a model fleetops knows: any
    other key matches no GPU, and the checks it pins (firmware, power limit, MIG layout) would
    silently check nothing."""
    if _gpus.known(name) is not None:
        return None
    known = _gpus.names()
    import difflib  # only on a bad key: the resident agent loads this module
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown GPU model {name!r}{hint}: it would match no GPU, and its firmware and power "
            f"limit would not be checked; known models (the name NVML reports): {', '.join(known)}")


def _floor_model_problem(name: str) -> str | None:
    """A ``validation.floors`` key must name a model with shipped floors: an override for a
    model fleetops has no floors for would silently judge nothing."""
    if name in _floors.SHIPPED or _floors.model_key(name) is not None:
        return None
    import difflib  # only on a bad key: the resident agent loads this module
    close = difflib.get_close_matches(name, list(_floors.SHIPPED), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"no shipped floors for GPU model {name!r}{hint}; models with floors: "
            f"{', '.join(_floors.SHIPPED)} (or their NVML names, e.g. 'NVIDIA H200')")


# Free-key mappings whose keys are checked: schema parent -> problem with a key, or None.
_FREE_KEY_CHECKS: Mapping[str, Any] = MappingProxyType({
    "validation.floors": _floor_model_problem,
    "gpu_models": _gpu_model_problem,
})


def _template_hint(value: Any) -> str:
    if isinstance(value, str) and "{{" in value:
        return " (Jinja templates are not rendered in fleetops_baseline)"
    return ""


def _layout_problem(shown: str, items: list[str]) -> str | None:
    """A layout's profile names against the model's table (``gpu_models["NVIDIA H200"]``),
    or, for the group's layout, against every table fleetops has."""
    m = re.match(r'gpu_models\["(.+?)"\]', shown)
    table = _mig_catalog.table_for(m.group(1)) if m else None
    tables = [table] if table is not None else ([] if m else list(_mig_catalog.TABLES))
    if not tables:
        return None  # a model without a table: its GPU's own table judges the names
    for name in items:
        if not any(t.get(name) for t in tables):
            if table is not None:
                return _mig_catalog.unknown_profile_message(name, table)
            known = sorted({n for t in tables for n in t.names()})
            import difflib  # only on a bad key: the resident agent loads this module
            close = difflib.get_close_matches(_mig_catalog.normalize(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"unknown MIG profile {name!r}{hint}; known: {', '.join(known)}"
    return None
