"""The run: the plan carried out under the node lock (destroy, create, the GPU reset a MIG
mode waits for), then read back and compared with the plan; ``main_args`` for the CLI."""

from __future__ import annotations

import time
from typing import Any

from fleetops.agent import lock as node_lock
from fleetops.agent.mig import REPORT_KIND, MigError
from fleetops.agent.mig_apply.ops import MigChangeError, MigOps, make_ops
from fleetops.agent.mig_apply.plan import Source, parse_layout, pending_detail, plan, plan_gpu
from fleetops.catalog.actions import mig_budget_s, reset_budget_s

# --- the run -----------------------------------------------------------------------------------


def _comparable(entry: dict[str, Any]) -> Any:
    return (entry["status"], entry["destroy"], entry["create"])


def run(source: Source, selector: str, dry_run: bool, backend: str, state_path: str | None,
        lock_path: str | None, ops: MigOps | None = None, reset: bool = True) -> tuple[dict[str, Any], int]:
    started = time.time()
    default_lock = None
    if ops is None:
        ops, default_lock = make_ops(backend, state_path, dry_run)
    host = ops.hostname()
    entries = plan(ops, source, selector, host, reset)
    doc: dict[str, Any] = {"kind": REPORT_KIND, "action": "mig apply", "node": host, "backend": ops.name,
                           "dry_run": dry_run, "reset": reset, "source": source.describe(), "gpus": entries,
                           "changed": False, "refused": False, "result": None, "message": ""}
    refused = [e for e in entries if e["status"] == "refused"]
    waiting = [e for e in entries if e["status"] == "mode-pending"]
    todo = [e for e in entries if e["status"] not in ("unchanged", "mode-pending")]
    if refused:
        doc.update(refused=True, result="refused", message="refused, nothing changed: "
                   + "; ".join(f"{e['uuid']}: {e['detail']}" for e in refused))
        return doc, 1
    if not todo and waiting:
        doc.update(result="mode-pending", message=_pending_message(waiting))
        return doc, 1
    if not todo:
        doc.update(result="unchanged", message=f"MIG layout already as wanted on {len(entries)} GPU(s)")
        return doc, 0
    if dry_run:
        blocked = _dry_run_resets(ops, todo, lock_path or default_lock) if reset else []
        if blocked:
            doc.update(result="mode-pending", message="dry run: the GPU reset a MIG mode change needs would be refused, "
                       "leaving the mode pending: " + "; ".join(f"{e['uuid']}: {e['reset_report']['message']}"
                                                               for e in blocked))
            return doc, 1
        doc.update(result="would-change", message=f"dry run: would change MIG on {len(todo)} GPU(s): "
                   + "; ".join(f"{e['uuid']}: {e['detail']}" for e in todo))
        return doc, 0
    path = lock_path or default_lock or node_lock.DEFAULT_PATH
    steps = sum(len(e["destroy"]) + len(e["create"]) + 1 for e in todo)
    resets = sum(1 for e in todo if reset and e["reset"] is not False)
    try:
        held = node_lock.acquire(path, "mig apply", ",".join(e["uuid"] for e in todo),
                                 mig_budget_s(steps) + resets * reset_budget_s())
    except node_lock.LockHeld as exc:
        doc.update(refused=True, result="refused", message=str(exc), holder=exc.holder)
        return doc, 1
    from fleetops.agent.reset.flow import Interrupted, SignalGuard

    guard = SignalGuard()
    try:
        with guard:
            try:
                # the plan again, from a read under the lock: act only on what the operator was shown
                again = {e["uuid"]: e for e in plan(ops, source, selector, host, reset)}
                moved = [e for e in todo
                         if _comparable(again.get(e["uuid"], {"status": "gone", "destroy": [], "create": []}))
                         != _comparable(e)]
                if moved:
                    for e in moved:
                        fresh = again.get(e["uuid"])
                        e.update(status="refused", detail="the GPU changed between the plan and the lock: "
                                 + (fresh["detail"] if fresh else "it is gone"), remedy="look again and retry")
                    doc.update(refused=True, result="refused", message="refused, nothing changed: "
                               + "; ".join(f"{e['uuid']}: {e['detail']}" for e in moved))
                    return doc, 1
                failed, pending = _execute(ops, todo, held, steps, guard, reset)
                held.heartbeat("read back", mig_budget_s(0))
                _verify(ops, todo, source)
            except Interrupted as exc:
                # a change is never cut in half (each runs deferred); what was made is read back
                with guard.shielded():
                    _verify(ops, todo, source)
                    doc["elapsed_s"] = round(time.time() - started, 3)
                    doc["changed"] = any(e["changed"] for e in entries)
                    name = signal_name(exc.signum)
                    doc.update(result="interrupted", interrupted_by=name,
                               message=f"interrupted by {name}: look again (mig apply --dry-run) before a rerun")
                return doc, 128 + exc.signum
            finally:
                with guard.shielded():
                    held.release()
    finally:
        held.release()
    doc["elapsed_s"] = round(time.time() - started, 3)
    doc["changed"] = any(e["changed"] for e in entries)
    bad = [e for e in todo if e.get("result") == "failed"]
    if bad or failed:
        doc.update(result="failed", message="MIG apply failed on " + "; ".join(f"{e['uuid']}: {e['detail']}" for e in bad))
        return doc, 1
    if pending or waiting:
        doc.update(result="mode-pending", message=_pending_message(pending + waiting))
        return doc, 1
    doc.update(result="applied", message=f"applied the MIG layout on {len(todo)} GPU(s)")
    return doc, 0


def _pending_message(entries: list[dict[str, Any]]) -> str:
    text = "MIG mode pending until a GPU reset on " + ", ".join(e["uuid"] for e in entries)
    refused = [e for e in entries if e.get("reset_report")]
    if refused:
        return text + "; the safe reset flow refused: " + "; ".join(
            f"{e['uuid']}: {e['reset_report']['message']} (remedy: {e.get('remedy')})" for e in refused)
    return text + "; reset them (fleetops-agent reset --gpu UUID), then rerun mig apply"


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def _execute(ops: MigOps, todo: list[dict[str, Any]], held: Any, steps: int,
             guard: Any, reset: bool = True) -> tuple[bool, list[dict[str, Any]]]:
    failed = False
    pending: list[dict[str, Any]] = []
    left = steps
    # the GPU resets still ahead (a mode that may wait for one), in the lock's deadline too
    resets = sum(1 for e in todo if reset and e["reset"] is not False)

    def budget() -> float:
        return mig_budget_s(left) + resets * reset_budget_s()

    current = {g.uuid: g for g in ops.read()}
    for e in todo:
        gpu = current[e["uuid"]]
        by_id = {m.gpu_instance_id: m for m in gpu.instances or []}
        want = e["want"]
        try:
            for gi in e["destroy"]:
                held.heartbeat(f"destroy GI {gi} on {e['uuid']}", budget())
                with guard.deferred():
                    ops.destroy(e["uuid"], by_id[gi])
                    e["changed"] = True
                left -= 1
            if gpu.mode_current != want["mode"]:
                now = False
                if e["mode"].get("send", True):
                    held.heartbeat(f"MIG mode on {e['uuid']}", budget())
                    with guard.deferred():
                        now = ops.set_mode(e["uuid"], bool(want["mode"]))
                        e["changed"] = True
                left -= 1
                if reset and e["reset"] is not False:
                    resets -= 1  # used now or not needed: out of the deadline either way
                if not now and reset:
                    now = _reset_for_mode(ops, e, held, guard, bool(want["mode"]))
                    if e.get("result") == "failed":
                        failed = True
                        continue
                if not now:
                    if e.get("status") != "mode-pending":
                        e.update(result="mode-pending", status="mode-pending",
                                 detail=pending_detail(e["uuid"], bool(want["mode"])),
                                 remedy=f"fleetops-agent reset --gpu {e['uuid']}")
                    pending.append(e)
                    continue
                held.heartbeat(f"MIG mode on {e['uuid']} applied", budget())
            table = gpu.table
            for item in e["create"]:
                assert table is not None
                prof = table.get(item["profile"])
                assert prof is not None
                held.heartbeat(f"create {prof.name} on {e['uuid']}", budget())
                with guard.deferred():
                    ops.create(e["uuid"], prof, int(item["placement_start"]))
                    e["changed"] = True
                left -= 1
            e["result"] = "done"
        except MigChangeError as exc:
            e.update(result="failed", detail=f"{e['detail']}: stopped: {exc}")
            failed = True
    return failed, pending


def _reset_options(uuid: str, bus_id: str, held: Any, dry_run: bool, lock_path: str | None = None) -> Any:
    """The reset flow's options for the GPU reset a MIG mode waits for: the reset command's
    defaults (clients from $FLEETOPS_RESET_CLIENTS, the backend's journal and lock) and never
    ``--kill-processes``: a GPU with compute processes is refused by the flow's precondition,
    with its remedy (drain the jobs), and left mode-pending."""
    from fleetops.agent.reset.options import Options, parse_clients

    return Options(selector=uuid, expected_bus=bus_id, dry_run=dry_run, clients=parse_clients(None),
                   lock_path=lock_path, held_lock=held)


def _reset_summary(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: doc.get(k) for k in ("result", "message", "remedy", "verified")}
    out["preconditions"] = [{k: c.get(k) for k in ("name", "status", "detail", "remedy") if c.get(k) is not None}
                            for c in doc.get("preconditions") or []]
    if doc.get("actions"):
        out["actions"] = [{k: a.get(k) for k in ("action", "unit", "ok", "detail") if k in a} for a in doc["actions"]]
    if doc.get("log"):
        out["log"] = doc["log"]
    return out


def _flow(call: Any, *args: Any) -> dict[str, Any]:
    """The reset flow's report; one that cannot even start (no NVML, an unreadable state) is a
    report with result ``error`` naming why, so the GPU is left mode-pending rather than mig
    apply stopping with the rest of its plan unreported."""
    try:
        rdoc, _code = call(*args)
    except Exception as exc:  # noqa: BLE001
        return {"result": "error", "message": f"the reset flow could not start: {exc}",
                "remedy": "look at the node (fleetops-agent reset --gpu GPU --dry-run)"}
    return dict(rdoc)


def _reset_for_mode(ops: MigOps, e: dict[str, Any], held: Any, guard: Any, enabled: bool) -> bool:
    """Run the safe reset flow for a GPU whose MIG mode is pending, under the lock mig apply
    holds; True when the mode is current after it. A refusal leaves the GPU ``mode-pending``
    with the flow's reason and remedy; a failed reset fails the GPU; a signal during the reset
    ends the flow as it ends the reset command, then interrupts mig apply."""
    from fleetops.agent.reset import flow

    opts = _reset_options(e["uuid"], e["bus_id"], held, False)
    rdoc = _flow(flow.run, opts, ops.reset_backend(), guard)
    e["reset_report"] = _reset_summary(rdoc)
    result = rdoc.get("result")
    if result == "interrupted":
        import signal

        raise flow.Interrupted(int(signal.Signals[str(rdoc["interrupted_by"])]))
    word = "enabled" if enabled else "disabled"
    if result == "reset":
        again = next((g for g in ops.read() if g.uuid == e["uuid"]), None)
        if again is not None and again.mode_current == enabled:
            e["changed"] = True
            e["detail"] += f"; the GPU was reset (safe reset flow) and MIG mode is {word}"
            return True
        e.update(result="failed", detail=f"{e['detail']}: stopped: the GPU was reset but MIG mode is still not {word}",
                 remedy="look at the GPU (nvidia-smi -q), then reboot the node if the mode stays pending")
        return False
    if result == "failed":
        e["changed"] = True
        e.update(result="failed", detail=f"{e['detail']}: stopped: the GPU reset failed: {rdoc.get('message')}",
                 remedy=rdoc.get("remedy") or "look at the GPU (fleetops-agent reset --dry-run)")
        return False
    e.update(result="mode-pending", status="mode-pending",
             detail=f"MIG mode {word} is pending until the GPU is reset, and the safe reset flow refused: "
             f"{rdoc.get('message')}",
             remedy=rdoc.get("remedy") or f"fleetops-agent reset --gpu {e['uuid']}")
    return False


def _dry_run_resets(ops: MigOps, todo: list[dict[str, Any]], lock_path: str | None) -> list[dict[str, Any]]:
    """A dry run of the reset flow for each GPU whose mode change may wait for a reset: its
    preconditions evaluated, nothing changed. The entries whose needed reset would be refused."""
    from fleetops.agent.reset import flow

    blocked = []
    for e in todo:
        if e["status"] != "mode-change" or e["reset"] is False:
            continue
        opts = _reset_options(e["uuid"], e["bus_id"], None, True, lock_path)
        rdoc = _flow(flow.run, opts, ops.reset_backend())
        e["reset_report"] = _reset_summary(rdoc)
        if rdoc.get("result") == "would-reset":
            continue
        how = "could not be evaluated" if rdoc.get("result") == "error" else "would be refused"
        maybe = " (if NVML keeps the mode pending)" if e["reset"] is None else ""
        e["detail"] += f"; the GPU reset{maybe} {how}: {rdoc.get('message')}"
        e["remedy"] = rdoc.get("remedy")
        if e["reset"] is True:
            blocked.append(e)
    return blocked


def _verify(ops: MigOps, todo: list[dict[str, Any]], source: Source) -> None:
    after = {g.uuid: g for g in ops.read()}
    for e in todo:
        gpu = after.get(e["uuid"])
        if gpu is None:
            e.update(result="failed", detail=f"{e['detail']}; the GPU is gone after the change")
            continue
        e["after"] = [m.to_dict() for m in gpu.instances or []]
        if e.get("result") != "done":
            continue
        check = plan_gpu(gpu, source.want(gpu))
        if check["status"] != "unchanged":
            e.update(result="failed", detail=f"{e['detail']}; read back: {check['detail']}")
            continue
        placed = {(m.profile, m.start) for m in gpu.instances or []}
        missing = [c for c in e["create"] if (c["profile"], c["placement_start"]) not in placed]
        if missing:
            e.update(result="failed", detail=f"{e['detail']}; read back without "
                     + ", ".join(f"{c['profile']} at slice {c['placement_start']}" for c in missing))


def main_args(args: Any) -> tuple[dict[str, Any], int]:
    if args.profiles:
        raise MigError("--profiles belongs to mig reset; mig apply takes --layout or --config/--select", "usage", 2)
    if bool(args.layout) == bool(args.config):
        raise MigError("mig apply needs exactly one of --layout PROFILES or --config FILE --select NAME", "usage", 2)
    if args.config and not args.select:
        raise MigError("--config needs --select NAME (the config in the file)", "usage", 2)
    if args.select and not args.config:
        raise MigError("--select needs --config FILE", "usage", 2)
    source = Source(layout=parse_layout(args.layout)) if args.layout else Source(config=args.config, select=args.select)
    return run(source, args.gpu, bool(args.dry_run), args.backend, args.state, args.lock_file,
               reset=not getattr(args, "no_reset", False))
