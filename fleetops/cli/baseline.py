"""``fleetops baseline``: the desired state as the controller resolves it: a host's effective
(layered) baseline key by key with where each key came from (``show``), every host's layered
baseline as extra variables for ansible-playbook (``vars``), the baseline's JSON Schema."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from fleetops.cli.output import write_out
from fleetops.cli.parser import Parser
from fleetops.common.errors import UsageError
from fleetops.ops import frontend


def register(sub: Any) -> None:
    p = sub.add_parser("baseline", help="the desired state: a host's effective (layered) baseline, the JSON Schema")
    bsub = p.add_subparsers(dest="baseline_command", required=True, parser_class=Parser)
    q = bsub.add_parser("show", help="a host's effective baseline, key by key, with the group each key came from")
    frontend.inventory_arg(q)
    q.add_argument("host", help="inventory host name")
    q.add_argument("--json", action="store_true", help="as JSON: keys with value, level, file and line")
    q = bsub.add_parser("vars", help="every host's layered baseline as extra variables, for ansible-playbook -e @FILE")
    frontend.inventory_arg(q)
    frontend.limit_arg(q)
    q.add_argument("-o", "--output", help="write it to this file (atomically) instead of stdout")
    q = bsub.add_parser("schema", help="the baseline's JSON Schema (for editors and validators)")
    q.add_argument("-o", "--output", help="write it to this file (atomically) instead of stdout")
    p.set_defaults(func=cmd_baseline)


def _show_value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else json.dumps(value, ensure_ascii=False)



def cmd_baseline(args: argparse.Namespace) -> int:
    import difflib

    if args.baseline_command == "schema":
        from fleetops import baseline as bl

        write_out(json.dumps(bl.json_schema(), indent=2) + "\n", args.output)
        return 0
    args.inventory = frontend.inventory_path(args.inventory)
    if args.baseline_command == "vars":
        from fleetops import baseline as bl
        from fleetops.fleet import inventory
        from fleetops.ops.baseline import PLAYBOOK_VAR, playbook_vars

        try:
            layered = playbook_vars(inventory.load(args.inventory, args.limit), args.inventory)
        except bl.BaselineError as exc:
            raise UsageError(str(exc)) from None
        write_out(json.dumps({PLAYBOOK_VAR: layered or {"hosts": {}, "baselines": []}}, indent=1) + "\n",
                   args.output)
        return 0
    from fleetops.fleet import inventory
    from fleetops.ops.baseline import explain

    hosts = {h.name: h for h in inventory.load(args.inventory)}
    if args.host not in hosts:
        close = difflib.get_close_matches(args.host, list(hosts), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UsageError(f"{args.inventory}: no host {args.host!r} in the inventory{hint}")
    doc = explain(hosts[args.host], args.inventory)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0
    if not doc["keys"]:
        print(f"{args.host}: no level of {args.inventory} sets fleetops_baseline: nothing is pinned "
              "(settings are compared with the fleet's majority)")
        return 0
    print(f"{args.host}: effective baseline, layered from " + " < ".join(la["level"] for la in doc["layers"]))
    width = max(len(k["path"]) for k in doc["keys"])
    vwidth = min(40, max(len(_show_value(k["value"])) for k in doc["keys"]))
    lwidth = max(len(k["level"]) for k in doc["keys"])
    here = os.getcwd() + os.sep
    for k in doc["keys"]:
        source = k["source"]
        if source.startswith(here):  # files under the working folder, as the user typed them
            source = source[len(here):]
        where = source + (f":{k['line']}" if k["line"] is not None else "")
        print(f"  {k['path']:<{width}}  {_show_value(k['value']):<{vwidth}}  {k['level']:<{lwidth}}  ({where})")
    if doc["ansible_differs"]:
        print(f"note: Ansible alone resolves fleetops_baseline to the most specific group's mapping, with other "
              f"values for {', '.join(doc['ansible_differs'])}; fleetops rollout/apply hand the playbooks this "
              "layered baseline (for ansible-playbook: -e @FILE from fleetops baseline vars -i INVENTORY -o FILE)")
    return 0
