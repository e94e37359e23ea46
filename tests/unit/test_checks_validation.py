"""The validation checks over results read back from a real history database: missing,
expired, failed (crit below a floor, warn as a straggler), and silence when the baseline does
not ask or the caller has no history."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetops import baseline, checks, model
from fleetops.checks import REGISTRY, checks_run
from fleetops.fleet.store.database import Store

DAY = 86400.0


def _validation(gpu: model.Gpu, node: str, level: str, status: str, started: float) -> dict[str, Any]:
    findings = [] if status == "ok" else [
        {"metric": "h2d_gbps", "status": status, "reason": "44.2 below the H200 SXM floor 48.0"}]
    return {"node": node, "uuid": gpu.uuid, "bus_id": gpu.bus_id, "index": gpu.index, "model": "H200 SXM",
            "level": level, "status": status, "started_at": started,
            "expires": started + (7 if level == "quick" else 30) * DAY,
            "result": {"findings": findings, "provenance": {"backend": "sim"}}}


def _store_and_read(tmp_path: Path, runs: list[tuple[str, list[dict[str, Any]]]], node: str) -> dict[str, Any]:
    """Record the runs in a real store and read back what the audit would hand the checks."""
    with Store(str(tmp_path / "h.db")) as store:
        for level, gpus in runs:
            store.record_validation({"started_at": min(g["started_at"] for g in gpus), "duration_s": 1.0,
                                     "level": level, "status": "ok", "exit_code": 0, "summary": {}}, gpus)
        return store.validations_for_audit([node])[node]


def _found(node: model.Node, base: baseline.Baseline | None, vals: dict[str, Any] | None) -> dict[int, tuple[str, str]]:
    out = {}
    for f in checks.run_node_checks(node, base, None, vals):
        if f.check.startswith("validation."):
            assert f.gpu is not None
            assert f.gpu["index"] not in out, f"two validation findings on GPU {f.gpu['index']}"
            out[f.gpu["index"]] = (f.check, f.severity)
    return out


REQUIRE_QUICK = baseline.from_mapping({"validation": {"require": "quick"}}, "t")


def test_missing_expired_failed_and_current(tmp_path: Path, sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1")
    now = float(node.collected_at or 0)
    g = node.gpus
    vals = _store_and_read(tmp_path, [
        # GPU 2: a full validation 40 days ago (past its 30-day expiry); GPU 5 failed 20 days ago
        ("full", [_validation(g[2], "n1", "full", "ok", now - 40 * DAY),
                  _validation(g[5], "n1", "full", "crit", now - 20 * DAY)]),
        ("quick", [_validation(g[i], "n1", "quick", "ok", now - DAY) for i in (0, 1)]
         + [_validation(g[3], "n1", "quick", "warn", now - DAY),
            _validation(g[4], "n1", "quick", "crit", now - DAY),
            _validation(g[6], "n1", "quick", "ok", now - 8 * DAY)]),
    ], "n1")
    found = _found(node, REQUIRE_QUICK, vals)
    assert found == {
        2: ("validation.expired", "warn"),
        3: ("validation.failed", "warn"),
        4: ("validation.failed", "crit"),
        5: ("validation.failed", "crit"),   # a failure stays until a newer result says otherwise
        6: ("validation.expired", "warn"),  # quick results last 7 days
        7: ("validation.missing", "warn"),
    }


def test_findings_name_the_gpu_date_and_expiry(tmp_path: Path, sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1")
    now = float(node.collected_at or 0)
    started = 1_764_000_000.0  # 2025-11-24 16:00 UTC
    vals = _store_and_read(tmp_path, [("quick", [_validation(node.gpus[0], "n1", "quick", "ok", started),
                                                 _validation(node.gpus[1], "n1", "quick", "crit", now - 60)])], "n1")
    by_check = {f.check: f for f in checks.run_node_checks(node, REQUIRE_QUICK, None, vals)
                if f.check.startswith("validation.") and f.gpu and f.gpu["index"] in (0, 1)}
    expired, failed = by_check["validation.expired"], by_check["validation.failed"]
    assert expired.gpu is not None and expired.gpu["uuid"] == node.gpus[0].uuid
    assert "measured 2025-11-24 16:00 UTC, expired 2025-12-01 16:00 UTC" in expired.message
    assert expired.observed["expires"] == "2025-12-01 16:00 UTC"
    assert failed.severity == "crit" and "h2d_gbps: 44.2 below the H200 SXM floor 48.0" in failed.message
    assert "fleetops validate -i INVENTORY --limit n1 --level quick" in (failed.action or "")


def test_max_age_days_overrides_the_results_expiry(tmp_path: Path, sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1")
    now = float(node.collected_at or 0)
    vals = _store_and_read(tmp_path, [("quick", [_validation(gp, "n1", "quick", "ok", now - 2 * DAY)
                                                 for gp in node.gpus])], "n1")
    assert _found(node, REQUIRE_QUICK, vals) == {}
    strict = baseline.from_mapping({"validation": {"require": "quick", "max_age_days": 1}}, "t")
    assert _found(node, strict, vals) == {i: ("validation.expired", "warn") for i in range(8)}


def test_full_requirement_is_not_met_by_a_quick_result(tmp_path: Path, sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1")
    now = float(node.collected_at or 0)
    vals = _store_and_read(tmp_path, [("quick", [_validation(node.gpus[0], "n1", "quick", "ok", now - 60)]),
                                      ("full", [_validation(node.gpus[1], "n1", "full", "ok", now - 60)])], "n1")
    full = baseline.from_mapping({"validation": {"require": "full"}}, "t")
    found = _found(node, full, vals)
    assert found[0] == ("validation.missing", "warn") and 1 not in found
    # a full result does satisfy a quick requirement
    assert 1 not in _found(node, REQUIRE_QUICK, vals)


@pytest.mark.parametrize("base", [None, baseline.from_mapping({"driver_version": "580.159.04"}, "t")])
def test_silent_when_the_baseline_does_not_ask(base: baseline.Baseline | None,
                                              sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1")
    assert _found(node, base, {}) == {}
    assert not any(i.startswith("validation.") and not i.endswith(".unreadable") for i in checks_run(node, base))


def test_silent_without_a_history(sim_node: Callable[..., model.Node]) -> None:
    node = sim_node("n1")
    assert _found(node, REQUIRE_QUICK, None) == {}
    assert _found(node, REQUIRE_QUICK, {}) == {i: ("validation.missing", "warn") for i in range(8)}


def test_registered_like_the_other_families(sim_node: Callable[..., model.Node]) -> None:
    assert {i for i in REGISTRY if i.startswith("validation.")} == {
        "validation.missing", "validation.expired", "validation.failed", "validation.unreadable"}
    assert REGISTRY["validation.failed"].severities == ("warn", "crit")
    ran = checks_run(sim_node("n1"), REQUIRE_QUICK)
    assert {"validation.missing", "validation.expired", "validation.failed"} <= set(ran)
