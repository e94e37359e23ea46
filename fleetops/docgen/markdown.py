"""The Markdown the reference pages share: table cells, code spans, GitHub's heading anchors and
the YAML of examples. The templates reach these as filters, so a page's layout lives in its
template while the escaping rules live once, here."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


def cell(value: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def code(value: Any) -> str:
    """A code span that survives a backtick inside the value."""
    text = str(value)
    if "`" in text:
        return f"`` {text} ``"
    return f"`{text}`"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces to hyphens)."""
    text = heading.strip().lower()
    text = re.sub(r"[^a-z0-9 _-]", "", text)
    return text.replace(" ", "-")


class Anchors:
    """GitHub's anchors for a page's headings: a repeated slug gets ``-1``, ``-2``, ..."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def __call__(self, heading: str) -> str:
        base = slug(heading)
        n = self.seen.get(base)
        self.seen[base] = 0 if n is None else n + 1
        return base if n is None else f"{base}-{n + 1}"


def finish(text: str) -> str:
    """One trailing newline and no run of blank lines, whatever the template's block tags left."""
    text = text.rstrip() + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


# Version-like strings are quoted, as the baseline asks ("Quote it so YAML keeps it as text").
_VERSIONISH = re.compile(r"^[0-9A-Za-z]+(\.[0-9A-Za-z]+)+$")


def _yaml_dumper() -> type:
    import yaml

    class _Dumper(yaml.SafeDumper):
        def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
            return super().increase_indent(flow, False)  # list items indented under their key

    def represent_str(dumper: Any, data: str) -> Any:
        style = '"' if _VERSIONISH.match(data) else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, represent_str)
    return _Dumper


def yaml_block(data: Any) -> str:
    """YAML as an operator would write it in a baseline file (block style, keys in order)."""
    import yaml

    text = yaml.dump(data, Dumper=_yaml_dumper(), sort_keys=False, default_flow_style=False, width=100)
    return str(text).rstrip()


def yaml_inline(value: Any) -> str:
    """One value as YAML on one line, for a table cell or a list of choices."""
    import yaml

    text = str(yaml.dump(value, Dumper=_yaml_dumper(), default_flow_style=True, width=10_000))
    text = text.strip()
    text = text.removesuffix("\n...")
    return text.removesuffix("...").strip()


def text(value: Any) -> str:
    """Plain text from the code (a help string) as Markdown shows it: a ``<name>`` placeholder
    would otherwise be read as an HTML tag and vanish from the rendered page."""
    return str(value).replace("<", "&lt;")


def wrap_words(words: Iterable[str], width: int = 100, indent: str = "    ") -> str:
    """Words joined by spaces into lines of at most ``width`` (a longer word stands alone);
    lines after the first are indented. A synopsis is wrapped between its arguments only, so
    ``[--format {table,json}]`` is never broken."""
    lines: list[str] = []
    line = ""
    for word in words:
        candidate = f"{line} {word}" if line else word
        if line and len(candidate) > width:
            lines.append(line)
            line = indent + word
        else:
            line = candidate
    if line:
        lines.append(line)
    return "\n".join(lines)
