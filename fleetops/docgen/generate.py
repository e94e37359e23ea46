"""The reference pages, rendered from the code they describe so that they cannot drift.

Each page is a Jinja2 template under ``templates/`` over one data function of ``data`` or
``example`` (plain dicts and lists read from the baseline ``SCHEMA``, the checks ``REGISTRY``,
the XID ``CATALOG``, the CLI parsers and an audit of simulated nodes at a fixed time). The
templates own the layout and the prose; the data functions own the facts. Markdown is not
HTML, so nothing is escaped for a browser; a field the template names and the data lacks
stops generation (``StrictUndefined``) instead of leaving a silent gap in a page.

``PAGES`` maps each page's path under ``docs/`` to its template and data; ``generate_all()``
renders them all; ``differing(docs_dir)`` names the committed pages that are missing or out
of date.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import jinja2

from fleetops.docgen import markdown
from fleetops.docgen.data import (  # noqa: F401 - the names tests and other modules use from here
    MISSING_COMMANDS_HEADING,
    baseline_page_data,
    checks_page_data,
    command_exists,
    commands_page_data,
    example_baseline,
    xid_page_data,
)
from fleetops.docgen.example import example_audit, outputs_page_data  # noqa: F401
from fleetops.docgen.markdown import Anchors as _Anchors  # noqa: F401 - the docs tests count anchors with it

TEMPLATES_PACKAGE = "fleetops.docgen"
TEMPLATES_FOLDER = "templates"


class Page(NamedTuple):
    template: str
    data: Callable[[], dict[str, Any]]


PAGES: dict[str, Page] = {
    "reference/baseline.md": Page("baseline.md.j2", baseline_page_data),
    "reference/checks.md": Page("checks.md.j2", checks_page_data),
    "reference/xid.md": Page("xid.md.j2", xid_page_data),
    "reference/outputs.md": Page("outputs.md.j2", outputs_page_data),
    "reference/commands.md": Page("commands.md.j2", commands_page_data),
}


def environment(templates_dir: str | None = None) -> jinja2.Environment:
    """The Jinja2 environment of the pages: the package's templates (so an installed wheel can
    run ``fleetops docs``), or another folder of them, which the tests use to show that a
    changed template makes ``--check`` fail."""
    loader: jinja2.BaseLoader
    if templates_dir is None:
        loader = jinja2.PackageLoader(TEMPLATES_PACKAGE, TEMPLATES_FOLDER)
    else:
        loader = jinja2.FileSystemLoader(templates_dir)
    env = jinja2.Environment(
        loader=loader,
        autoescape=False,  # Markdown: a `<` in a help text is text, not a tag to escape
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        cell=markdown.cell,
        code=markdown.code,
        yaml_block=markdown.yaml_block,
        yaml_inline=markdown.yaml_inline,
        json_block=lambda value: json.dumps(value, indent=2),
        text=markdown.text,
        wrap_words=markdown.wrap_words,
    )
    return env


def render(path: str, env: jinja2.Environment | None = None) -> str:
    """One page's Markdown. Raises ``jinja2.UndefinedError`` when its template names a field
    its data does not have."""
    page = PAGES[path]
    env = env or environment()
    return markdown.finish(env.get_template(page.template).render(**page.data()))


def generate_all(templates_dir: str | None = None) -> dict[str, str]:
    """Every generated page: path under ``docs/`` -> Markdown text."""
    env = environment(templates_dir)
    return {path: render(path, env) for path in PAGES}


def differing(docs_dir: str, pages: dict[str, str] | None = None) -> list[str]:
    """Paths (under ``docs_dir``) of the generated pages that are missing or differ."""
    pages = generate_all() if pages is None else pages
    out = []
    for path, text in sorted(pages.items()):
        target = os.path.join(docs_dir, path)
        try:
            with open(target, encoding="utf-8", newline="") as fh:
                if fh.read() == text:
                    continue
        except FileNotFoundError:
            pass
        out.append(path)
    return out


def write_all(docs_dir: str, pages: dict[str, str] | None = None) -> list[str]:
    """Write the pages that are missing or differ; returns their paths."""
    pages = generate_all() if pages is None else pages
    changed = differing(docs_dir, pages)
    for path in changed:
        target = os.path.join(docs_dir, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            fh.write(pages[path])
        os.replace(tmp, target)
    return changed
