"""report/values.py: a finding's observed and expected values as operator text, the one
renderer behind the terminal report, the JUnit report and the TUI; never a Python repr."""

from __future__ import annotations

import calendar
import io

from rich.console import Console

from fleetops import model
from fleetops.docgen import generate
from fleetops.report import junit, table, values

AT = calendar.timegm((2025, 1, 15, 3, 14, 5))  # the snapshot's collection time
GPU3 = {"index": 3, "uuid": "GPU-3", "bus_id": "0000:18:00.0"}


def _xid(escalated: dict[str, object] | None, count: int = 2, new: int = 0) -> model.Finding:
    observed = [{"code": 48, "name": "Double-bit (uncorrectable) ECC error", "severity": "crit",
                 "action": "reset_gpu", "hold": "reset", "count": count, "new": new, "last_age_s": 120.0,
                 "sxid": False, "escalated": escalated}]  # fmt: skip
    return model.Finding("xid.recent", "crit", "n1", "m", gpu=GPU3, observed=observed, expected=[])


def test_an_xid_reads_code_count_gpu_bus_utc_clock_age_and_escalation() -> None:
    assert values.observed_text(_xid(None), AT) == (
        "XID 48 x2 on GPU 3 (0000:18:00.0), last 03:12:05 UTC (2m00s ago), escalated: no (no repeat policy)"
    )
    fired = {"peak": 3, "count": 3, "within_s": 3600, "fired": True}
    assert values.values_text(_xid(fired, count=3, new=1), AT) == (
        "observed XID 48 x3 (1 new) on GPU 3 (0000:18:00.0), last 03:12:05 UTC (2m00s ago), "
        "escalated: yes, 3 x XID 48 within 1 h (policy: 3); expected none"
    )
    short = {"peak": 2, "count": 3, "within_s": 600, "fired": False}
    assert values.observed_text(_xid(short), AT).endswith("escalated: no, 2 of 3 within 10 min")


def test_an_xid_on_another_utc_day_carries_the_date_and_without_a_clock_only_the_age() -> None:
    f = _xid(None)
    assert "last 2025-01-14 23:58:05 UTC (2m00s ago)" in values.observed_text(f, AT - 3 * 3600 - 14 * 60)
    assert "last 2m00s ago," in values.observed_text(f, None)


def test_generic_values_read_as_key_value_pairs_lists_and_units() -> None:
    def text(check: str, observed: object, expected: object) -> str | None:
        return values.values_text(model.Finding(check, "warn", "n1", "m", observed=observed, expected=expected))

    assert text("pcie.link_degraded", {"gen": 4, "width": 8}, {"gen": 5, "width": 16}) == (
        "observed gen=4, width=8; expected gen=5, width=16"
    )
    assert text("nvlink.links_down", {"up": 16, "down_links": [3, 7]}, {"up": 18}) == (
        "observed up=16, down_links=3,7; expected up=18"
    )
    assert text("thermal_power.temperature", 91.0, "< 84 C") == "observed 91 C; expected < 84 C"
    assert text("thermal_power.power_limit", 500.0, 700.0) == "observed 500 W; expected 700 W"
    assert text("memory.ecc_sbe_rate", 1250.5, None) == "observed 1250.5/h"
    assert text("memory.row_remap_pending", True, False) == "observed yes; expected no"
    assert text("thermal_power.throttle", ["hw_slowdown", "sw_thermal_slowdown"], []) == (
        "observed hw_slowdown, sw_thermal_slowdown; expected none"
    )
    assert text("config.gpu_missing", None, "GPU-1") == "expected GPU-1"
    assert text("config.processes", [{"pid": 7, "name": "python", "used_memory_mib": None}], []) == (
        "observed pid=7, name=python, used_memory_mib=none; expected none"
    )
    assert text("nvlink.rates", {"per_min": {"0": 1.5}}, None) == "observed per_min=(0=1.5)"
    assert text("xid.storm", {"48": 5, "13": 4}, "< 3 per code") == "observed XID 48 x5; XID 13 x4; expected < 3 per code"
    assert text("memory.retired_pages", None, None) is None


def test_the_terminal_and_junit_reports_print_no_repr() -> None:
    result, code = generate.example_audit()
    buffer = io.StringIO()
    table.render(result, code, Console(file=buffer, width=200))
    for out in (buffer.getvalue(), junit.render(result, code)):
        assert "{'" not in out and "[{" not in out and "None" not in out
        assert "XID 48 x1 on GPU 2 (0000:3a:00.0), last " in out
    assert "observed 500 W; expected 700 W" in buffer.getvalue()
