"""``fleetops audit -o FILE`` replaces FILE in one rename, whatever the format: a reader sees
the old report or the new one, never a half-written one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetops.cli import audit as audit_cli
from fleetops.docgen import generate


@pytest.mark.parametrize("fmt", ["json", "junit", "prom", "table"])
def test_output_file_is_replaced_whole_by_a_rename_from_its_own_folder(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, code = generate.example_audit()
    out = tmp_path / f"report.{fmt}"
    out.write_text("old report\n")
    seen: list[tuple[str, str, str]] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        # at the moment of the rename the reader still sees the old report, whole
        seen.append((src, dst, out.read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    audit_cli._write_report(result, code, fmt, str(out))
    assert len(seen) == 1
    src, dst, before = seen[0]
    assert dst == str(out) and os.path.dirname(src) == str(tmp_path) and before == "old report\n"
    text = out.read_text()
    assert text != "old report\n" and "node003" in text
    assert sorted(os.listdir(tmp_path)) == [out.name]  # no temporary file left behind


def test_a_failed_write_leaves_the_old_report_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, code = generate.example_audit()
    out = tmp_path / "report.json"
    out.write_text("old report\n")

    def broken(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        audit_cli._write_report(result, code, "json", str(out))
    assert out.read_text() == "old report\n"
    assert sorted(os.listdir(tmp_path)) == [out.name]
