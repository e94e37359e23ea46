"""A finding's observed and expected values as an operator reads them: the one renderer that the
terminal report, the JUnit report and the TUI print, so a value never reaches a person as a
Python repr (``[{'code': 48, ... 'escalated': None}]``).

Rules: an XID finding (``xid.recent``) reads per code as "XID 48 x2 on GPU 3 (0000:18:00.0),
last 03:12:05 UTC (2m00s ago), escalated: no"; an XID storm as "XID 48 x5"; a dict as
``key=value`` pairs; a list as its items joined; a bare number carries the unit its check's spec
gives (``CheckSpec.unit``: "91 C", "700 W"); true/false read yes/no; nothing reads "none".
The JSON report keeps the raw values: programs read those.
"""

from __future__ import annotations

import time
from typing import Any

from fleetops import model
from fleetops.xid import policy as xid_policy


def unit_of(check: str) -> str | None:
    """The unit the check's spec gives its values, if any (imported late: the registry imports
    every check family)."""
    from fleetops.checks import REGISTRY

    spec = REGISTRY.get(check)
    return spec.unit if spec is not None else None


def value_text(value: Any, unit: str | None = None) -> str:
    """Any observed or expected value as text; ``unit`` follows a bare number."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        number = f"{value:g}" if isinstance(value, float) else str(value)
        if not unit:
            return number
        return f"{number}{unit}" if unit.startswith("/") else f"{number} {unit}"  # "1200/h", "91 C"
    if isinstance(value, dict):
        if not value:
            return "none"
        return ", ".join(f"{k}={_inner(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        if not value:
            return "none"
        return "; ".join(value_text(v) for v in value) if any(isinstance(v, dict) for v in value) else ", ".join(
            value_text(v) for v in value
        )
    return str(value)


def _inner(value: Any) -> str:
    """A value inside a ``key=value`` pair: lists joined without spaces, dicts in parentheses, so
    the pairs stay apart."""
    if isinstance(value, dict):
        return f"({value_text(value)})" if value else "none"
    if isinstance(value, list | tuple):
        return ",".join(_inner(v) for v in value) if value else "none"
    return value_text(value)


def clock_text(epoch: float, reference: float | None = None) -> str:
    """``03:12:05 UTC`` on the reference's UTC day, ``2025-01-14 23:58:01 UTC`` on another."""
    day = time.strftime("%Y-%m-%d", time.gmtime(epoch))
    if reference is not None and day == time.strftime("%Y-%m-%d", time.gmtime(reference)):
        return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def age_text(seconds: float | None) -> str:
    """``45s``, ``2m05s``, ``3h04m``, ``2d01h``: the TUI's ages."""
    if seconds is None:
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def escalation_text(escalated: dict[str, Any] | None, code: Any) -> str:
    """What the repeat policy made of one XID code: fired (with the count that fired it), short
    of it, or no policy for the code."""
    if not escalated:
        return "no (no repeat policy)"
    span = xid_policy.span_text(escalated["within_s"])
    if escalated.get("fired"):
        return f"yes, {escalated['peak']} x XID {code} within {span} (policy: {escalated['count']})"
    return f"no, {escalated['peak']} of {escalated['count']} within {span}"


def _where(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return ""
    bus = f" ({gpu['bus_id']})" if gpu.get("bus_id") else ""
    return f" on GPU {gpu.get('index', '?')}{bus}"


def _xid_code_text(c: dict[str, Any], gpu: dict[str, Any] | None, at: float | None) -> str:
    kind = "SXid" if c.get("sxid") else "XID"
    text = f"{kind} {c.get('code')} x{c.get('count')}"
    if c.get("new"):
        text += f" ({c['new']} new)"
    text += _where(gpu)
    age = c.get("last_age_s")
    if age is not None:
        text += f", last {clock_text(at - age, at)} ({age_text(age)} ago)" if at else f", last {age_text(age)} ago"
    return text + f", escalated: {escalation_text(c.get('escalated'), c.get('code'))}"


def observed_text(f: model.Finding, at: float | None = None) -> str:
    """``f.observed`` as text. ``at``: when the finding was made (the snapshot's collection time),
    which turns an XID's age into a UTC clock time."""
    obs = f.observed
    if f.check == "xid.recent" and isinstance(obs, list) and all(isinstance(c, dict) and "code" in c for c in obs):
        return "; ".join(_xid_code_text(c, f.gpu, at) for c in obs) or "none"
    if f.check == "xid.storm" and isinstance(obs, dict):
        return "; ".join(f"XID {code} x{n}" for code, n in obs.items()) or "none"
    return value_text(obs, unit_of(f.check))


def expected_text(f: model.Finding) -> str:
    return value_text(f.expected, unit_of(f.check))


def values_text(f: model.Finding, at: float | None = None) -> str | None:
    """``observed X; expected Y`` (either part alone when the other is None), or None when the
    finding has neither."""
    parts = []
    if f.observed is not None:
        parts.append(f"observed {observed_text(f, at)}")
    if f.expected is not None:
        parts.append(f"expected {expected_text(f)}")
    return "; ".join(parts) or None


def jobs_text(f: model.Finding) -> str | None:
    """``jobs 1234,1240``: the jobs a finding hits, compactly; None where it names none (no job
    records, no job on the GPU), so a report line is unchanged then."""
    if not f.jobs:
        return None
    return "jobs " + ",".join(f.jobs)
