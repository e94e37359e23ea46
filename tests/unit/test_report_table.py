"""The audit table piped (stdout not a terminal) keeps each node's row and each finding on one
line, whatever the width, so ``grep node003`` finds the whole row; at a terminal it is drawn to
the terminal's width as before."""

from __future__ import annotations

import io
import re

from rich.console import Console

from fleetops.docgen import generate
from fleetops.report import table


def _render(**console: object) -> str:
    result, code = generate.example_audit()
    buffer = io.StringIO()
    table.render(result, code, Console(file=buffer, width=80, **console))  # type: ignore[arg-type]
    return buffer.getvalue()


def test_piped_at_80_columns_every_row_and_finding_is_one_line() -> None:
    result, _ = generate.example_audit()
    lines = _render().splitlines()
    for node in result.nodes:  # the summary row: the node, its health and its worst finding together
        (row,) = [ln for ln in lines if ln.startswith(f"│{node.name} ")]
        assert result.node_severity()[node.name].upper() in row
    findings = [f for f in result.findings if f.severity != "ok"]
    assert findings
    for f in findings:  # node, check and the whole message on one line; the whole action on the next
        at = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {f.node}") and f"[{f.check}] {f.message}" in ln)
        if f.action:
            assert f"-> {f.action}" in "\n".join(lines[at + 1 : at + 3])
    assert max(len(ln) for ln in lines) > 80  # not cut to fit either


def test_at_a_terminal_the_table_still_fits_the_terminals_width() -> None:
    lines = re.sub(r"\x1b\[[0-9;]*m", "", _render(force_terminal=True)).splitlines()  # styles aside
    assert lines[0].startswith("fleetops audit")
    assert all(len(ln) <= 80 for ln in lines)
    assert sum(ln.startswith("│node003 ") for ln in lines) == 1 and any(ln.startswith("│        ") for ln in lines)
