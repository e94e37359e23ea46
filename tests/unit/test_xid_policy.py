"""The XID policy: each code the references disagree on is decided (severity, action, escalation
by count within a span on one GPU), a baseline overrides a code through the real loader, and a
volatile DBE on a real daemon holds until a simulated reset."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleetops import baseline, model
from fleetops.checks import run_node_checks
from fleetops.xid import policy as xid_policy

# The decisions, written out by hand: code -> (severity, action, escalation or None), escalation
# as (count, within_s, severity, action). A change to DEFAULT_POLICY must change this table too.
DECIDED: dict[int, tuple[str, str, tuple[int, float, str, str] | None]] = {
    13: ("warn", "restart_app", (3, 600.0, "crit", "drain_and_inspect")),
    31: ("warn", "restart_app", (3, 600.0, "crit", "drain_and_inspect")),
    63: ("warn", "reset_gpu", None),
    68: ("warn", "restart_app", (3, 3600.0, "crit", "reset_gpu")),
    92: ("warn", "none", None),
    109: ("warn", "reset_gpu", (2, 3600.0, "crit", "reset_gpu")),
}
GPU = 3


def _events(node: model.Node, code: int, offsets: list[float], gpu: int = GPU) -> list[model.XidEvent]:
    """One event of ``code`` on ``gpu`` at each offset (seconds) before the newest, which is a
    minute old."""
    g = node.gpus[gpu]
    out = []
    for i, off in enumerate(offsets):
        stamp = node.collected_at - 60.0 - off
        out.append(model.XidEvent(code=code, bus_id=g.bus_id, gpu_uuid=g.uuid, gpu_index=gpu, timestamp=stamp,
                                  message="test", source="kernel", raw=f"{stamp:.3f} {code} {gpu} {i}"))
    return out


def _recent(node: model.Node, b: baseline.Baseline | None = None) -> model.Finding:
    [f] = [f for f in run_node_checks(node, b, None) if f.check == "xid.recent"]
    return f


def test_the_decided_codes_are_exactly_the_shipped_policy():
    assert set(xid_policy.DEFAULT_POLICY) == set(DECIDED)
    for code, policy in xid_policy.DEFAULT_POLICY.items():
        assert policy.decision.strip(), f"XID {code} has no reason written down"


@pytest.mark.parametrize("code", sorted(DECIDED))
def test_decided_code(sim_node, code):
    severity, action, escalate = DECIDED[code]
    node = sim_node()
    node.xids = _events(node, code, [0.0])
    f = _recent(node)
    assert (f.severity, f.observed[0]["severity"], f.observed[0]["action"]) == (severity, severity, action)
    assert f.gpu["index"] == GPU and f.observed[0]["hold"] == xid_policy.hold_for(action)
    if escalate is None:
        assert f.observed[0]["escalated"] is None
        node.xids = _events(node, code, [float(i) for i in range(12)])  # repeats do not escalate it
        assert _recent(node).severity == severity
        return
    count, within_s, esc_severity, esc_action = escalate
    # count - 1 events inside the span: not escalated
    node.xids = _events(node, code, [within_s * i / (count - 1) for i in range(count - 1)])
    f = _recent(node)
    assert f.severity == severity and f.observed[0]["escalated"] == {
        "peak": count - 1, "count": count, "within_s": within_s, "fired": False}
    # count events spread over exactly the span: escalated
    node.xids = _events(node, code, [within_s * i / (count - 1) for i in range(count)])
    f = _recent(node)
    assert (f.severity, f.observed[0]["action"]) == (esc_severity, esc_action)
    assert f.observed[0]["hold"] == xid_policy.hold_for(esc_action)
    span = xid_policy.span_text(within_s)
    assert f"{count} x XID {code} within {span} (policy: {count})" in f.message
    assert f.action.startswith(f"{count} x XID {code} within {span} (policy: {count}): ")
    # count events, the first one second outside the span: not escalated
    offsets = [within_s * i / (count - 1) for i in range(count - 1)] + [within_s + 1.0 + within_s * (count - 2) / (count - 1)]
    node.xids = _events(node, code, offsets)
    f = _recent(node)
    assert f.severity == severity and f.observed[0]["escalated"]["peak"] == count - 1
    # count events inside the span but split over two GPUs: escalation is per GPU
    node.xids = _events(node, code, [0.0] * (count - 1)) + _events(node, code, [1.0], gpu=GPU + 1)
    assert {f.gpu["index"]: f.severity for f in run_node_checks(node, None, None) if f.check == "xid.recent"} == {
        GPU: severity, GPU + 1: severity}


def test_escalation_message_names_the_span_as_people_write_it():
    assert [xid_policy.span_text(s) for s in (600.0, 3600.0, 90.0, 5400.0, 7200.0, 30.0)] == [
        "10 min", "1 h", "90 s", "90 min", "2 h", "30 s"]


def test_escalated_68_holds_until_the_reset_it_asks_for(sim_node):
    node = sim_node()
    node.xids = _events(node, 68, [0.0, 60.0, 120.0])
    assert _recent(node).severity == "crit"
    node.collected_at += 2 * 86400  # two days later, past the 24 h window: still held
    node.uptime_s = (node.uptime_s or 0.0) + 2 * 86400
    f = _recent(node)
    assert (f.severity, f.observed[0]["hold"]) == ("crit", "reset")
    node.gpus[GPU].last_reset_at = node.collected_at - 86400  # reset after the events
    assert [f for f in run_node_checks(node, None, None) if f.check == "xid.recent"] == []


def test_a_code_without_a_decision_keeps_the_catalog_entry(sim_node):
    node = sim_node()
    node.xids = _events(node, 48, [0.0, 1.0, 2.0, 3.0])
    f = _recent(node)
    assert (f.severity, f.observed[0]["action"], f.observed[0]["escalated"]) == ("crit", "reset_gpu", None)


# --- baseline overrides, through the loader -----------------------------------------------------


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "group_vars" / "all.yml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def test_baseline_override_changes_one_code_and_leaves_the_others(tmp_path, sim_node):
    b = baseline.load_file(_write(tmp_path, """
        ansible_user: admin
        fleetops_baseline:
          xid_policy:
            92:
              severity: crit
              action: drain_and_inspect
            "31":
              escalate: {count: 2, within_s: 60, action: reset_gpu}
    """))
    node = sim_node()
    node.xids = _events(node, 92, [0.0])
    f = _recent(node, b)
    assert (f.severity, f.observed[0]["action"]) == ("crit", "drain_and_inspect")
    assert _recent(node).severity == "warn"  # without the baseline: the shipped decision
    # 31: two within a minute now escalate (the shipped rule needs three within 10 min)
    node.xids = _events(node, 31, [0.0, 50.0])
    f = _recent(node, b)
    assert (f.severity, f.observed[0]["action"]) == ("crit", "reset_gpu")
    assert "2 x XID 31 within 1 min (policy: 2)" in f.message
    assert _recent(node).severity == "warn"
    node.xids = _events(node, 31, [0.0, 120.0, 240.0])  # three within 10 min, none two within 1 min
    assert _recent(node, b).severity == "warn" and _recent(node).severity == "crit"
    # 13 is not overridden: the shipped escalation still applies under this baseline
    node.xids = _events(node, 13, [0.0, 60.0, 120.0])
    assert _recent(node, b).severity == "crit"


@pytest.mark.parametrize("body,line,path,words", [
    ("xid_policy:\n  31:\n    severity: warn\n  abc:\n    severity: crit\n", 4, "xid_policy.abc",
     "expected an XID code"),
    ("xid_policy:\n  0:\n    severity: warn\n", 2, 'xid_policy["0"]', "expected an XID code"),
    ("xid_policy:\n  31:\n    severity: fatal\n", 3, 'xid_policy["31"].severity', "must be one of info, warn, crit"),
    ("xid_policy:\n  31:\n    action: panic\n", 3, 'xid_policy["31"].action', "must be one of"),
    ("xid_policy:\n  31:\n    escalate:\n      within_s: 60\n", 3, 'xid_policy["31"].escalate', "needs count"),
    ("xid_policy:\n  31:\n    escalate: {count: 1, within_s: 60}\n", 3, 'xid_policy["31"].escalate.count',
     "at least 2"),
])
def test_a_bad_policy_names_the_file_line_and_key(tmp_path, body, line, path, words):
    file = _write(tmp_path, body)
    with pytest.raises(baseline.BaselineError) as info:
        baseline.load_file(file)
    err = info.value
    assert (err.path, err.line) == (path, line), str(err)
    assert str(err).startswith(f"{file}:{line}: ") and words in str(err), str(err)


# --- a volatile DBE on a real daemon: held across samples, cleared by a reset -------------------


def test_volatile_dbe_holds_across_daemon_samples_until_a_simulated_reset(tmp_path):
    from test_agent_serve import Daemon, _ask, _until

    from fleetops.sim import gpu as sim

    state = tmp_path / "n.json"
    sim.init_state(str(state), "n")
    sim.inject(str(state), "ecc-dbe", 2)  # a volatile DBE, and the XID 48 the driver logs with it
    uuid = sim.read_state(str(state))["gpus"][2]["uuid"]

    def crit(doc):
        return sorted(f["check"] for f in doc["daemon"]["findings"]
                      if (f.get("gpu") or {}).get("uuid") == uuid and f["severity"] == "crit")

    def full_after(at):
        """The daemon's first full snapshot (with its findings) taken after ``at``."""
        def fn():
            doc = _ask(state, "snapshot") or {}
            return doc if doc.get("daemon") and (doc.get("collected_at") or 0) > at else None
        doc: dict = _until(f"a full snapshot after {at}", fn)
        return doc

    d = Daemon([state])
    d.start()
    try:
        doc = full_after(0)
        assert crit(doc) == ["memory.ecc_dbe_volatile", "xid.recent"]
        for _ in range(3):  # full snapshots go on: without a reset the findings stay
            doc = full_after(doc["collected_at"])
            assert crit(doc) == ["memory.ecc_dbe_volatile", "xid.recent"]
        with sim.locked_state(str(state)) as st:
            sim.reset_gpu(st, 2)
            reset_at = st["resets"][-1]["at"]
        doc = full_after(reset_at)
        assert crit(doc) == []
        gpu = next(g for g in doc["gpus"] if g["uuid"] == uuid)
        assert gpu["ecc_uncorrected_volatile"] == 0 and gpu["last_reset_at"] == reset_at
    finally:
        d.stop()
