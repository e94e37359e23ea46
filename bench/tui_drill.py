#!/usr/bin/env python3
"""The on-call drill: ``fleetops tui`` in a real terminal (tmux) over a simulated fleet with
daemons, read from the screen as an operator reads it.

    python3 bench/tui_drill.py                        # 300 nodes, 10 hung, 5 down
    python3 bench/tui_drill.py --nodes 60 --hung 3 --down 2

1. ``fleetops sim up --daemon`` (a real sshd per loopback address, one resident agent for every
   node), then ``fleetops tui -i INVENTORY --db DB`` in a detached tmux session of 200x60, the
   command exactly as an operator types it.
2. Once the header counts every node ok, the faults-only view (``f``); then ``host-hang`` on
   ``--hung`` random nodes and ``host-down`` on ``--down`` others, all within a second. The pane
   is read (``tmux capture-pane``) every 0.5 s: for each faulted node, when its row first shows
   the right state (HUNG for a hung host, UNREACH for a gone one), and every row that shows a
   node that was not faulted or a wrong state. Target: each within 35 s of its fault (the
   30 s stale threshold plus 5), nothing else.
3. The faults are cleared; a DBE is injected on one GPU of a healthy node; once the node reads
   CRIT it is opened (``/`` name, Enter), the GPU selected, ``r`` and the dialog confirmed. The
   verdict the TUI gives after the reset (the action log's outcome and why) is set beside a
   fresh ``fleetops audit --fresh --limit NODE --format json`` of that node: both must say the
   same health.
4. The TUI is quit and started again on the same --db; ``l`` opens the action log: the reset
   must be there, with the outcome the first session gave it.

Prints one JSON object (also to ``--json``): per-node flag times, the false flags, the reset's
two verdicts, the action log rows read back, and ``targets``. The machine is shared: times are
upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fleetops.sim import fleet  # noqa: E402
from fleetops.sim import gpu as sim  # noqa: E402

SOCKET = "fleetops-drill"
SESSION = "drill"
STATES = ("OK", "INFO", "WARN", "CRIT", "UNKNOWN", "UNREACH", "HUNG", "STALE", "PENDING")
ROW = re.compile(r"\b(node\d{3,})\b")
LABEL = re.compile(r"\b(" + "|".join(STATES) + r")\b")


def _say(text: str) -> None:
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {text}\n")


def tmux(*args: str, check: bool = True) -> str:
    done = subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def pane() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def keys(*k: str) -> None:
    tmux("send-keys", "-t", SESSION, *k)


def typed(text: str) -> None:
    """Text sent as the characters it is (no key-name lookup)."""
    tmux("send-keys", "-t", SESSION, "-l", text)


def start_tui(inventory: str, db: str) -> None:
    """The TUI in the pane, as typed (Textual draws on stderr: nothing is redirected)."""
    fleetops = str(Path(sys.executable).with_name("fleetops"))
    tmux("new-session", "-d", "-s", SESSION, "-x", "200", "-y", "60", f"{fleetops} tui -i {inventory} --db {db}")


def wait_screen(predicate: Any, timeout: float, what: str) -> str:
    end = time.monotonic() + timeout
    while True:
        text = pane()
        if predicate(text):
            return text
        if time.monotonic() > end:
            raise RuntimeError(f"waited {timeout:.0f}s for {what}; the screen:\n{text}")
        time.sleep(0.5)


def header_counts(text: str) -> dict[str, int]:
    first = text.splitlines()[0] if text else ""
    counts: dict[str, int] = {}
    for k, v in re.findall(r"\b(nodes|ok|warn|crit|unknown|unreach|stale|waiting) (\d+)\b(?!/)", first):
        counts.setdefault(k, int(v))  # the first: "GPUs ok 160/160" comes later
    return counts


LOGROW = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+(node\d{3,})\s+(\S+)\s+(\w+)\s+(\w+)\s+(.*?)\s*│?$")


def action_rows(text: str) -> list[tuple[str, ...]]:
    """The action log pane's rows: (node, GPU, action, outcome, why)."""
    return [m.groups() for m in map(LOGROW.search, text.splitlines()) if m]


def rows(text: str) -> dict[str, str]:
    """node -> the state label its table row shows (the first label after its name)."""
    out: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        m = ROW.search(line)
        if not m:
            continue
        label = LABEL.search(line, m.end())
        if label:
            out.setdefault(m.group(1), label.group(1))
    return out


def drill(args: argparse.Namespace, directory: str, result: dict[str, Any]) -> None:
    inventory = os.path.join(directory, "inventory.yml")
    db = os.path.join(directory, "history.db")
    _say(f"fleet up: {args.nodes} nodes with daemons")
    fleet.up(args.nodes, directory, first_address=args.first_address, daemon=True)
    names = sorted(json.loads(Path(directory, "fleet.json").read_text())["nodes"])
    rng = random.Random(args.seed)
    picked = rng.sample(names, args.hung + args.down + 1)
    hung, down, reset_node = picked[: args.hung], picked[args.hung : args.hung + args.down], picked[-1]
    result.update(nodes=len(names), hung=hung, down=down)

    start_tui(inventory, db)
    t0 = time.monotonic()
    wait_screen(lambda t: header_counts(t).get("ok") == len(names), args.start_timeout, "every node ok")
    result["all_ok_s"] = round(time.monotonic() - t0, 1)
    _say(f"every node ok after {result['all_ok_s']} s")
    keys("f")
    time.sleep(1.0)

    # --- hung and down hosts --------------------------------------------------------------
    expected = {n: "HUNG" for n in hung} | {n: "UNREACH" for n in down}
    injected: dict[str, float] = {}
    for n in hung:
        fleet.inject(directory, n, "host-hang")
        injected[n] = time.monotonic()
    for n in down:
        fleet.inject(directory, n, "host-down")
        injected[n] = time.monotonic()
    flagged: dict[str, float] = {}
    seen_states: dict[str, list[str]] = {n: [] for n in expected}
    false: dict[str, set[str]] = {}
    end = time.monotonic() + args.watch
    while time.monotonic() < end:
        now = time.monotonic()
        for node, label in rows(pane()).items():
            if node in expected:
                if not seen_states[node] or seen_states[node][-1] != label:
                    seen_states[node].append(label)
                if label == expected[node] and node not in flagged:
                    flagged[node] = round(now - injected[node], 1)
            elif label not in ("OK", "INFO"):
                false.setdefault(node, set()).add(label)
        if len(flagged) == len(expected) and now > max(injected.values()) + args.settle:
            break
        time.sleep(0.5)
    result["flagged_s"] = dict(sorted(flagged.items()))
    result["missed"] = sorted(set(expected) - set(flagged))
    result["states_seen"] = seen_states
    result["false_flags"] = {n: sorted(s) for n, s in sorted(false.items())}
    result["flag_max_s"] = max(flagged.values()) if flagged else None
    _say(f"flagged {len(flagged)}/{len(expected)}, max {result['flag_max_s']} s, false {result['false_flags']}")

    # --- a reset and its verdict against a fresh audit ------------------------------------
    for n in hung:
        fleet.clear(directory, n, "host-hang")
    for n in down:
        fleet.clear(directory, n, "host-down")
    gpu = 3
    uuid = str(sim.read_state(os.path.join(directory, "state", f"{reset_node}.json"))["gpus"][gpu]["uuid"])
    fleet.inject(directory, reset_node, "ecc-dbe", gpu)
    wait_screen(lambda t: rows(t).get(reset_node) == "CRIT", 60, f"{reset_node} CRIT")
    keys("f")  # back to every node, the filter finds it
    keys("/")
    time.sleep(0.3)
    typed(reset_node)
    keys("Enter")
    time.sleep(0.5)
    keys("Enter")
    wait_screen(lambda t: f"{reset_node}: GPUs" in t, 20, "the node screen")
    for _ in range(gpu):
        keys("Down")
    time.sleep(0.5)
    keys("r")
    wait_screen(lambda t: uuid in t and "Reset" in t, 20, "the reset dialog")
    keys("Tab", "Enter")
    t_reset = time.monotonic()
    # the action log: the reset's row settles from "sent" to its verdict
    # the header names the verdict and its snapshot once the reset is judged; then the pane
    wait_screen(lambda t: f"{reset_node} after reset" in t.splitlines()[0], 120, "the reset's verdict in the header")
    keys("l")

    def settled(t: str) -> bool:
        return any(r[0] == reset_node and r[2] == "reset" and r[3] != "sent" for r in action_rows(t))

    text = wait_screen(settled, 30, "the reset's verdict in the action log")
    result["reset_verdict_s"] = round(time.monotonic() - t_reset, 1)
    row = next(r for r in action_rows(text) if r[0] == reset_node and r[2] == "reset")
    result["tui_reset_row"] = list(row)
    m = re.search(r"after reset: (\w+)", row[4])
    result["tui_verdict"] = m.group(1) if m and row[3] == "verified" else row[3]
    fresh = subprocess.run(
        [str(Path(sys.executable).with_name("fleetops")), "audit", "-i", inventory, "--limit", reset_node,
         "--fresh", "--format", "json", "--no-history"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    doc = json.loads(fresh.stdout)
    node_doc = next(n for n in doc["nodes"] if n["name"] == reset_node)
    result["audit_verdict"] = str(node_doc["health"]).upper()
    result["audit_exit"] = fresh.returncode
    _say(f"reset verdict: TUI {result['tui_verdict']}, fresh audit {result['audit_verdict']}")

    # --- the action log after a restart ---------------------------------------------------
    keys("Escape")
    keys("q")
    time.sleep(1.0)
    tmux("kill-session", "-t", SESSION, check=False)
    start_tui(inventory, db)
    wait_screen(lambda t: header_counts(t).get("nodes") == len(names), args.start_timeout, "the TUI again")
    keys("l")
    text = wait_screen(lambda t: any(r[0] == reset_node for r in action_rows(t)), 30, "the action log read back")
    back = [list(r) for r in action_rows(text) if r[0] == reset_node and r[2] == "reset"]
    result["after_restart_rows"] = back
    tmux("kill-session", "-t", SESSION, check=False)

    result["targets"] = {
        "every_fault_flagged_right_within_35s": not result["missed"] and all(v <= 35.0 for v in flagged.values()),
        "no_false_flags": not result["false_flags"],
        "reset_verdict_agrees_with_fresh_audit": result["tui_verdict"] is not None
        and result["tui_verdict"] == result["audit_verdict"],
        "action_log_survives_restart": bool(back) and back[0] == result["tui_reset_row"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=300)
    p.add_argument("--hung", type=int, default=10)
    p.add_argument("--down", type=int, default=5)
    p.add_argument("--watch", type=float, default=60.0, help="seconds to watch after the faults (default 60)")
    p.add_argument("--settle", type=float, default=45.0,
                   help="seconds after the faults the screen is still watched for false flags (default 45)")
    p.add_argument("--start-timeout", type=float, default=180.0)
    p.add_argument("--first-address", default="127.77.1.1")
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--keep", action="store_true", help="keep the fleet folder")
    args = p.parse_args()
    if shutil.which("tmux") is None:
        print("needs tmux (apt-get install -y tmux)", file=sys.stderr)
        return 2
    directory = tempfile.mkdtemp(prefix="fleetops-drill-")
    result: dict[str, Any] = {"directory": directory}
    try:
        drill(args, directory, result)
    finally:
        tmux("kill-server", check=False)
        fleet.down(directory)
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    text = json.dumps(result, indent=2, default=sorted)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
