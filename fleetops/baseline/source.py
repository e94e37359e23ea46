"""Reading a baseline's text: YAML whose mappings remember the line of each key, and
``BaselineError``, which names the file, the key path and that line."""

from __future__ import annotations

from typing import Any


class BaselineError(ValueError):
    """A baseline that does not validate. ``source``, ``path`` and ``line`` say where."""

    def __init__(self, source: str, path: str, problem: str, line: int | None = None) -> None:
        self.source = source
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {path}: {problem}" if path else f"{where}: {problem}")


# --- YAML with line numbers ------------------------------------------------------------


class _LineDict(dict[Any, Any]):
    """A mapping from YAML that remembers the line (1-based) of each of its keys."""

    __slots__ = ("duplicates", "key_lines", "line")

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: dict[Any, int] = {}
        self.line: int | None = None
        self.duplicates: dict[Any, tuple[int, int]] = {}  # key -> (its line, first line)


def _make_loader(source: str) -> type:
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def construct_map(loader: Any, node: Any) -> Any:
        loader.flatten_mapping(node)
        data = _LineDict()
        data.line = node.start_mark.line + 1
        yield data
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:
                raise BaselineError(source, "", f"a mapping key must be a plain value, got {key!r}", line) from None
            if key in data.key_lines:  # reported by the validator, which knows the key path
                data.duplicates.setdefault(key, (line, data.key_lines[key]))
                continue
            data[key] = loader.construct_object(value_node, deep=False)
            data.key_lines[key] = line

    _Loader.add_constructor("tag:yaml.org,2002:map", construct_map)
    return _Loader


def read_yaml(text: str, source: str) -> Any:
    """``text`` as YAML (PyYAML's safe loader), every mapping remembering the line of each of its
    keys: what the validator reads to say where a bad key is. ``source`` names the text in the
    error for a key that is not a plain value. Raises PyYAML's errors for text that is not YAML."""
    import yaml

    return yaml.load(text, Loader=_make_loader(source))  # a SafeLoader subclass


def key_line(mapping: Any, key: Any) -> int | None:
    """Line of ``key`` in ``mapping``, where the mapping came from ``read_yaml`` (PyYAML's start
    marks); None for a mapping from anywhere else."""
    lines = getattr(mapping, "key_lines", None)
    if lines and key in lines:
        return int(lines[key])
    return None


def mapping_line(mapping: Any) -> int | None:
    line = getattr(mapping, "line", None)
    return line if isinstance(line, int) else None
