"""``fleetops-agent check``: this node judged by the audit's own checks, on the node.

Where no controller runs (an Ansible play, the ``fleetops_audit`` role's agent mode, a shell on
the node) the desired state still has one judge: the node-scope checks of ``fleetops.checks``,
run as ``fleetops audit`` runs them for one node (``fleetops.fleet.verdict.node_findings``: with the
daemon's snapshot, its rate and held findings too). The Ansible modules take these findings
instead of comparing values themselves, so a tolerance or a per-model rule lives in one place.

Fleet-scope checks (drift from the fleet's majority, NUMA placement across nodes) need every
node's snapshot and are not run here; the report says so (``scope``, ``fleet_checks_not_run``).

Exit codes follow ``fleetops audit`` (``fleetops.common.errors``): 0 nothing at or above
``--fail-on``, 1 warn, 2 crit, 3 only unknowns or no snapshot could be taken (the JSON error line
on stderr), 4 a usage error such as a baseline that does not validate (``FILE:LINE`` named).
``--exit-zero`` makes a printed report exit 0 (its ``exit_code`` keeps the verdict) for callers
that treat any other exit as the agent failing.

The baseline comes from a file or stdin (``-``), JSON or YAML, through the daemon's loader
(``serve.read_baseline``): a JSON baseline needs no PyYAML, which nodes do not have.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from fleetops.common.errors import EXIT_UNKNOWN, EXIT_USAGE

if TYPE_CHECKING:
    from fleetops import model
    from fleetops.baseline import Baseline

KIND = "fleetops.check/v1"
SCOPE = "node"
STDIN = "-"
STDIN_LABEL = "<stdin>"

SEVERITY_ORDER = {"crit": 0, "warn": 1, "unknown": 2, "info": 3, "ok": 4}


class CheckError(Exception):
    """The check could not run: ``kind`` ``usage`` (exit 4) or ``collect`` (exit 3)."""

    def __init__(self, message: str, kind: str = "usage") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def exit_code(self) -> int:
        return EXIT_USAGE if self.kind == "usage" else EXIT_UNKNOWN


def add_parser(sub: Any) -> None:
    from fleetops.catalog.durations import GRAMMAR, duration_arg

    p = sub.add_parser(
        "check",
        help="judge this node by the audit's node-scope checks against a baseline; exit 0/1/2 like fleetops audit",
    )
    p.add_argument("--baseline", metavar="FILE|-",
                   help="baseline, JSON or YAML (JSON needs no PyYAML); '-' reads it from stdin; "
                   "absent: only the checks that need no baseline")  # fmt: skip
    p.add_argument(
        "--backend", default="auto",
        help="auto|nvml|sim (default auto: sim when FLEETOPS_SIM_STATE is set and this node has no NVIDIA driver, "
        "else nvml)",
    )
    p.add_argument("--state", help="simulator state file (default: $FLEETOPS_SIM_STATE)")
    p.add_argument("--sim-on-gpu-node", action="store_true",
                   help="allow --backend sim on a node with an NVIDIA driver (refused without it)")
    p.add_argument(
        "--json", action="store_true", help=f"print the report as JSON ({KIND}); default: text lines"
    )
    p.add_argument("--pretty", action="store_true", help="indented JSON (implies --json)")
    p.add_argument(
        "--snapshot", action="store_true", help="with --json: include the snapshot that was judged"
    )
    p.add_argument("--fail-on", choices=("warn", "crit"), default="warn",
                   help="lowest severity that fails (exit 1/2); crit lets warnings pass with 0; default warn")  # fmt: skip
    p.add_argument(
        "--exit-zero",
        action="store_true",
        help="exit 0 whenever the report was printed (callers that read its exit_code, such as the "
        "Ansible modules); usage and collect errors keep their codes",
    )
    p.add_argument(
        "--fresh", action="store_true", help="always collect now; never take the daemon's snapshot"
    )
    p.add_argument(
        "--max-age", type=duration_arg("--max-age", allow_zero=True), default=30.0,
        help=f"oldest daemon snapshot accepted ({GRAMMAR}; default 30)",
    )
    p.add_argument(
        "--socket", help="the daemon's socket (default /run/fleetops/agent.sock; sim: by the state)"
    )


def load_baseline(path: str | None, stdin: Any = None) -> tuple[Baseline | None, str | None]:
    """The baseline and the name it is known by. Errors name ``FILE:LINE`` (``<stdin>:LINE``)."""
    if not path:
        return None, None
    from fleetops.agent.serve import read_baseline
    from fleetops.baseline import BaselineError

    if path != STDIN:
        try:
            return read_baseline(path), path
        except BaselineError as exc:
            raise CheckError(str(exc)) from exc
    from fleetops.baseline import load_text

    text = (stdin if stdin is not None else sys.stdin).read()
    try:
        return load_text(text, STDIN_LABEL), STDIN_LABEL
    except BaselineError as exc:
        raise CheckError(str(exc)) from exc


def take_snapshot(args: Any) -> tuple[model.Node, str]:
    """The daemon's snapshot when it is fresher than ``--max-age`` (as ``collect``), else a cold one."""
    from fleetops import model
    from fleetops.agent.collect import CollectError, collect

    if not args.fresh:
        from fleetops.agent.serve import client

        served = client.fetch_snapshot(client.socket_for(args.backend, args.state, args.socket), args.max_age)
        if served is not None:
            try:
                return model.node_from_json(served), "daemon"
            except model.SchemaError:
                pass  # a daemon answer this agent cannot read: judge a cold collect instead
    try:
        return collect(args.backend, args.state), "collect"
    except CollectError as exc:
        raise CheckError(str(exc), kind="collect") from exc


def fleet_scope_ids() -> list[str]:
    """Checks whose fleet half (the majority comparison) needs the whole fleet: not run here."""
    from fleetops import checks

    return [spec.id for spec in checks.REGISTRY.values() if spec.scope in ("fleet", "node+fleet")]


def report(node: model.Node, source: str, baseline: Baseline | None, baseline_name: str | None,
           fail_on: str) -> tuple[dict[str, Any], list[model.Finding], int]:  # fmt: skip
    """The check document, its findings (worst first) and the exit code."""
    from fleetops import checks
    from fleetops.checks import verdict

    result = verdict.NodeResult(name=node.hostname, reachable=True, snapshot=node)
    found = verdict.node_findings(result, baseline, None)
    found.sort(key=lambda f: (SEVERITY_ORDER.get(f.severity, 9), (f.gpu or {}).get("index") or -1, f.check))
    code = verdict.exit_code(found, fail_on)
    counts: dict[str, int] = {}
    for f in found:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    doc: dict[str, Any] = {
        "kind": KIND,
        "node": node.hostname,
        "backend": node.backend,  # which backend the judged snapshot came from (nvml, sim)
        "scope": SCOPE,
        "fleet_checks_not_run": fleet_scope_ids(),
        "baseline": None if baseline is None else {"source": baseline_name},
        "source": result.source,
        "age_s": result.age_s,
        "rates": result.rates,
        "collected_at": node.collected_at,
        "checks_run": checks.checks_run(node, baseline, fleet=False),
        "counts": counts,
        "exit_code": code,
        "findings": [f.to_dict() for f in found],
    }
    return doc, found, code


def _gpu_text(gpu: dict[str, Any] | None) -> str:
    return str((gpu or {}).get("uuid") or "node")


def text_lines(doc: dict[str, Any]) -> list[str]:
    findings = doc["findings"]
    counts = ", ".join(
        f"{sev} {n}" for sev, n in sorted(doc["counts"].items(), key=lambda i: SEVERITY_ORDER.get(i[0], 9))
    )
    baseline = (doc["baseline"] or {}).get("source") or "none"
    head = (f"{doc['node']}: {len(findings)} finding(s){' (' + counts + ')' if counts else ''}; "
            f"baseline {baseline}; snapshot from {doc['source']}; node-scope checks only "
            f"({len(doc['checks_run'])} run; fleet-majority comparisons need fleetops audit)")  # fmt: skip
    lines = [head]
    for f in findings:
        lines.append(f"{f['severity'].upper():7} {f['check']:32} {_gpu_text(f['gpu'])}: {f['message']}"
                     f" (observed {f['observed']!r}, expected {f['expected']!r})")  # fmt: skip
    return lines


def run(args: Any) -> int:
    import json

    try:
        baseline, name = load_baseline(args.baseline)
        node, source = take_snapshot(args)
    except CheckError as exc:
        sys.stderr.write(json.dumps({"error": str(exc), "kind": exc.kind}) + "\n")
        return exc.exit_code
    except Exception as exc:  # a state or snapshot that cannot be read: nothing was judged  # noqa: BLE001
        sys.stderr.write(json.dumps({"error": str(exc), "kind": type(exc).__name__}) + "\n")
        return EXIT_UNKNOWN
    doc, _, code = report(node, source, baseline, name, args.fail_on)
    if args.json or args.pretty:
        if args.snapshot:
            from fleetops import model

            snap = model.to_dict(node)
            if snap.get("daemon") is None:  # as a cold collect prints it: no daemon key
                snap.pop("daemon", None)
            doc["snapshot"] = snap
        sys.stdout.write(json.dumps(doc, indent=2 if args.pretty else None) + "\n")
    else:
        sys.stdout.write("\n".join(text_lines(doc)) + "\n")
    return 0 if args.exit_zero else code
