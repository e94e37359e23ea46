"""What the reference pages say, as plain data read from the code they describe.

Each ``*_page_data()`` returns the dicts and lists one template renders: the baseline
``SCHEMA``, the checks ``REGISTRY``, the XID ``CATALOG``, the argparse parsers of ``fleetops``
and ``fleetops-agent``. The templates decide the layout and the prose; these functions decide
nothing about Markdown beyond the anchors that links need. Nothing here depends on the clock,
the host or the environment, so two runs give the same pages.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Callable
from typing import Any

from fleetops.docgen.markdown import Anchors, slug

# --- baseline.md -------------------------------------------------------------------------


def _example_model() -> str:
    from fleetops import baseline as bl

    return str(next(iter(bl.SCHEMA_BY_PATH["gpu_models"].example)))


def _parts(path: str) -> list[Any]:
    """A schema path's keys, each ``*`` replaced by the first key of its parent's example (a GPU
    model under ``gpu_models``, an XID code under ``xid_policy``)."""
    from fleetops import baseline as bl

    raw = path.split(".")
    return [next(iter(bl.SCHEMA_BY_PATH[".".join(raw[:i])].example)) if p == "*" else p
            for i, p in enumerate(raw)]


def _nest(path: str, value: Any) -> dict[str, Any]:
    """``{"a": {"b": value}}`` for ``a.b``; ``*`` stands for the example GPU model or XID code."""
    parts = _parts(path)
    out: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        out = {part: out}
    return out


def _set_path(target: dict[str, Any], path: str, value: Any) -> None:
    parts = _parts(path)
    for part in parts[:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def example_baseline() -> dict[str, Any]:
    """A baseline that sets every key, each to its example, in schema order. Keys with
    children are built from their children's examples."""
    from fleetops import baseline as bl

    parents = {k.parent for k in bl.SCHEMA}
    alone = set(bl.EXAMPLE_ALONE)  # keys that exclude others: documented, not in the example
    out: dict[str, Any] = {}
    for key in bl.SCHEMA:
        if key.path in parents or key.path in alone:
            continue
        _set_path(out, key.path, key.example)
    return out


def baseline_anchors() -> dict[str, str]:
    """Key path -> its anchor in baseline.md (``gpu_models`` and ``gpu_models.*`` share a slug,
    so the second gets ``-1``; the page's two headings before the keys are counted first)."""
    from fleetops import baseline as bl

    anchors = Anchors()
    for heading in ("Baseline reference", "Keys"):
        anchors(heading)
    return {k.path: anchors(k.path) for k in bl.SCHEMA}


def baseline_page_data() -> dict[str, Any]:
    from fleetops import baseline as bl

    example = example_baseline()
    bl.from_mapping(example, source="the generated example")  # the page promises that it validates
    anchor = baseline_anchors()
    keys = []
    for key in bl.schema_dicts():
        path = key["path"]
        wildcard = ("xid" if path.startswith("xid_policy.*") else "package" if path.startswith("packages.*")
                    else "model" if "*" in path else None)
        keys.append(
            {**key, "anchor": anchor[path], "wildcard": wildcard, "example_doc": _nest(path, key["example"])}
        )
    return {
        "wrapper_key": bl.WRAPPER_KEY,
        "keys": keys,
        "example_model": _example_model(),
        "full_example": example,
    }


# --- checks.md ---------------------------------------------------------------------------

SEVERITY_TEXT = {
    "ok": "the check ran and found nothing (passing checks produce no finding)",
    "info": "worth knowing, not a fault (e.g. a counter total without a rate); never fails an audit",
    "unknown": "a value could not be read, or the node could not be reached: fleetops cannot tell",
    "warn": "a fault or a drift to fix in working hours",
    "crit": "a fault that puts jobs at risk now: drain, reset or reboot as the action says",
}
SCOPE_TEXT = {
    "node": "per node",
    "fleet": "across the fleet (majority vote)",
    "node+fleet": "per node against the baseline; across the fleet (majority vote) for what the baseline does not pin",
}
# Topics of "What is deliberately not a fault", matched against each check's not_a_fault text.
NOT_A_FAULT_TOPICS: tuple[tuple[str, str, Callable[[str], bool]], ...] = (
    (
        "Values the hardware or the VM cannot report",
        (
            "A value NVML reports as Not Supported is recorded as such and stays silent, unless the "
            "baseline asks for it (then it is `unknown`, never `warn` or `crit`)."
        ),
        lambda t: "not supported" in t.lower(),
    ),
    (
        "Throttle reasons that are normal operation",
        (
            "Only slowdown reasons are faults; an idle GPU or one running at its software power cap is "
            "working as intended."
        ),
        lambda t: "gpu_idle" in t or "sw_power_cap" in t,
    ),
    (
        "NVLink state while MIG is on",
        "With MIG mode on, NVML reports the NVLinks as down; fleetops does not report that.",
        lambda t: "MIG" in t,
    ),
    (
        "Counters without a rate",
        (
            "Error counters accumulate from driver load: a total alone is `info`; faults come from the "
            "growth between two snapshots."
        ),
        lambda t: "accumulate" in t or "counter" in t.lower(),
    ),
)
MISSING_COMMANDS_HEADING = "Commands named in actions that do not exist yet"


def _family_doc(family: str) -> str:
    module = importlib.import_module(f"fleetops.checks.{family}")
    first = (module.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(first.split()).replace("``", "`")


def _threshold_paths(text: str) -> list[str]:
    """The ``thresholds.*`` keys a check's threshold text names (by their bare name)."""
    from fleetops import baseline as bl

    found = []
    for name in re.findall(r"\b([a-z][a-z0-9_]+)\b", text):
        path = f"thresholds.{name}"
        if path in bl.SCHEMA_BY_PATH and path not in found:
            found.append(path)
    return found


def _command_words(text: str) -> list[list[str]]:
    """``fleetops SUB [SUB2]`` commands named in a text, as word lists."""
    return [m.split() for m in re.findall(r"\bfleetops(?: [a-z][a-z-]*){1,2}", text)]


def command_exists(words: list[str], parser: argparse.ArgumentParser | None = None) -> bool:
    """Whether ``fleetops WORD...`` names a real subcommand: each word must be one of the
    parser's subcommands, or of the choices of its first positional argument; the first word
    that is a free argument (a node name) ends the walk."""
    if parser is None:
        from fleetops.cli import build_parser

        parser = build_parser()
    current = parser
    for word in words[1:] if words and words[0] == "fleetops" else words:
        if word.startswith("-"):
            break
        subs = _subcommands(current)
        if subs:
            if word not in subs:
                return False
            current = subs[word][0]
            continue
        positional = [a for a in _arguments(current) if not a.option_strings]
        if positional and positional[0].choices is not None and word not in positional[0].choices:
            return False
        break
    return True


def checks_page_data() -> dict[str, Any]:
    from fleetops import checks, model
    from fleetops.cli import build_parser
    from fleetops.fleet import audit

    anchor = baseline_anchors()
    parser = build_parser()
    rows: list[dict[str, Any]] = []
    missing: dict[str, list[str]] = {}
    for s in checks.registry_dicts():
        rows.append({
            **s,
            "anchor": slug(s["id"]),
            "thresholds": [{"path": p, "anchor": anchor[p]} for p in _threshold_paths(s["threshold"])],
            "scope_text": SCOPE_TEXT.get(s["scope"], s["scope"]),
        })
        for words in _command_words(s["action"]):
            if not command_exists(words, parser):
                missing.setdefault(" ".join(words), []).append(s["id"])
    families = [
        {"name": family, "doc": _family_doc(family), "checks": [r for r in rows if r["family"] == family]}
        for family in checks.FAMILIES
    ]

    notes: dict[str, list[str]] = {}
    for r in rows:
        if r["not_a_fault"]:
            notes.setdefault(r["not_a_fault"], []).append(r["id"])
    topics: list[dict[str, Any]] = []
    placed: set[str] = set()
    for title, intro, matches in NOT_A_FAULT_TOPICS:
        hits = [t for t in notes if matches(t)]
        if hits:
            placed.update(hits)
            topics.append({
                "title": title, "intro": intro, "notes": [{"text": t, "checks": notes[t]} for t in hits],
            })
    rest = [t for t in notes if t not in placed]
    if rest:
        topics.append({
            "title": "Other", "intro": None, "notes": [{"text": t, "checks": notes[t]} for t in rest],
        })

    transport_actions: dict[str, str] = getattr(audit, "_ACTIONS", {})
    return {
        "severities": [{"name": s, "meaning": SEVERITY_TEXT[s]} for s in model.SEVERITIES],
        "checks": rows,
        "families": families,
        "transport": [{"id": f"transport.{k}", "action": v} for k, v in sorted(transport_actions.items())],
        "not_a_fault": topics,
        "missing_commands_heading": MISSING_COMMANDS_HEADING,
        "missing_commands": [{"command": c, "checks": ids} for c, ids in sorted(missing.items())],
    }


# --- xid.md ------------------------------------------------------------------------------

# What carries out each XID catalog action. Every action of ``xid.catalog.ACTIONS`` must be here
# (a KeyError stops generation when the catalog grows an action the docs do not map).
ACTION_COMMANDS: dict[str, str] = {
    "none": "Nothing to run. `fleetops history NODE -v` shows whether it keeps coming back.",
    "restart_app": "No fleetops command: the job's owner (or the scheduler) restarts the job. "
    "`fleetops tui` (XIDs view, key `4`) shows the pid and process name the XID line names.",
    "reset_gpu": "`fleetops reset NODE GPU -i INVENTORY` for one GPU (GPU: UUID, bus id or index; it asks first), "
    "or `fleetops remediate -i INVENTORY --yes` for every reset the nodes' latest audit results call for, one node "
    "at a time; in `fleetops tui`, select the GPU and press `r`. From Ansible: `playbooks/gpu_reset.yml`.",
    "reboot_node": "Drain, then reboot: fleetops never reboots a node. Drain it in Slurm (`fleetops tui`, "
    "key `d`, or `fleetops drain NODE --reason TEXT -i INVENTORY`), reboot it once its jobs are "
    "gone, then `fleetops audit -i INVENTORY --limit NODE`. `fleetops remediate` lists it under "
    '"Reboot".',
    "drain_and_inspect": "Drain the node (`fleetops tui`, key `d`, or `scontrol`) and open a hardware "
    'case; `fleetops remediate` lists it under "Drain and send for inspection".',
    "check_nvlink": "`fleetops audit -i INVENTORY --limit NODE` for the `nvlink.*` and "
    "`config.fabric_state` findings, `nvidia-smi nvlink -s` / `-e` on the node, then "
    "`fleetops reset NODE GPU -i INVENTORY`.",
    "check_cooling_power": "No fleetops command: check the BMC (sensors, PSUs, fans); "
    "`fleetops audit` reports the `thermal_power.*` findings while it lasts.",
    "follow_other_xid": "Look at the XIDs logged with it: the `xid.recent` finding of "
    "`fleetops audit` lists every code per GPU; `fleetops tui` has an XIDs view (key `4`).",
}
# The NVSwitch SXid lines the page shows as examples, one fatal and one not.
SXID_EXAMPLES = ("Fatal, Link 32 LTSSM Fault Up", "Non-fatal, Link 12 ingress buffer ECC")


def _plan_label(action: str) -> str:
    from fleetops.catalog import remedies
    from fleetops.remedy import plan

    return plan.LABEL[remedies.FROM_XID_ACTION[action]]


def _planned(info: Any, sxid: bool = False) -> str:
    """What ``fleetops remediate`` plans for an ``xid.recent`` finding of this one code."""
    from fleetops import model
    from fleetops.catalog import remedies
    from fleetops.remedy import plan

    if info.severity not in ("warn", "crit"):
        return plan.LABEL["none"]
    entry = {
        "code": info.code,
        "name": info.name,
        "severity": info.severity,
        "count": 1,
        "new": 1,
        "last_age_s": 0.0,
        "sxid": sxid,
    }
    finding = model.Finding(
        check="xid.recent", severity=info.severity, node="n", message="", observed=[entry]
    )
    return plan.LABEL[remedies.action_for(finding)]


def _xid_info(info: Any, sxid: bool = False) -> dict[str, Any]:
    from fleetops.xid import catalog as xid
    return {
        "code": info.code,
        "name": info.name,
        "meaning": info.meaning,
        "severity": info.severity,
        "action": info.action,
        "action_text": xid.ACTION_TEXT[info.action],
        "with_fleetops": ACTION_COMMANDS[info.action],
        "category": info.category,
        "planned": _planned(info, sxid),
    }


def xid_page_data() -> dict[str, Any]:
    from fleetops import model
    from fleetops.xid import catalog as xid
    from fleetops.xid import policy as xid_policy

    unmapped = [a for a in xid.ACTIONS if a not in ACTION_COMMANDS]
    if unmapped:
        raise KeyError(f"ACTION_COMMANDS has no entry for XID actions {unmapped}")
    policy = []
    for code, entry in sorted(xid_policy.DEFAULT_POLICY.items()):
        judged = xid_policy.judgement(xid.lookup(code))
        esc = judged.escalate
        policy.append({
            "code": code,
            "severity": judged.severity,
            "action": judged.action,
            "escalation": None if esc is None else {
                "count": esc.count,
                "within": xid_policy.span_text(esc.within_s),
                "severity": esc.severity,
                "action": esc.action,
            },
            "decision": entry.decision,
        })
    recovery = []
    seen: set[str] = set()
    for label, action in xid.RECOVERY_ACTIONS.items():
        if action in seen or action == "none":
            continue
        seen.add(action)
        message = f"GPU recovery action changed from 0x0 (None) to 0x1 ({label})"
        recovery.append({"label": label, "recovery": action,
                         **_xid_info(xid.info_for(model.XidEvent(code=154, message=message)))})
    sxids = []
    for text in SXID_EXAMPLES:
        event = model.XidEvent(code=12028, message=text, source="kernel" + xid.SXID_SUFFIX)
        sxids.append({"says": text.split(",")[0], **_xid_info(xid.info_for(event), sxid=True)})
    unknown = xid.lookup(max(xid.CATALOG) + 10_000)
    return {
        "codes": [_xid_info(info) for _, info in sorted(xid.CATALOG.items())],
        "non_critical": sorted(xid.NON_CRITICAL),
        "policy": policy,
        "actions": [
            {
                "name": a,
                "text": xid.ACTION_TEXT[a],
                "with_fleetops": ACTION_COMMANDS[a],
                "planned": _plan_label(a),
            }
            for a in xid.ACTIONS
        ],
        "unknown": {"severity": unknown.severity, "action": unknown.action, "meaning": unknown.meaning},
        "recovery": recovery,
        "sxids": sxids,
    }


# --- commands.md: both command lines, read from their parsers -----------------------------
#
# argparse has no public way to list a parser's arguments or subcommands, so the two helpers
# below are the only places that read its internals (``_actions``, the subparsers action's
# ``choices`` and its per-choice help); everything else works on what they return. A registry
# kept while adding arguments would need hooks in every parser class and argument group of both
# command lines; tests/unit/test_argparse_shape.py fails, naming the attribute, if a Python
# release changes these (tested on 3.11 and 3.12).


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's own arguments, in definition order, without ``-h`` and without hidden ones."""
    return [
        a for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and a.help != argparse.SUPPRESS
    ]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str | None]]:
    """Subcommand name -> (its parser, the help its ``add_parser`` gave), in definition order.
    An alias resolves to the same parser; hidden subcommands (help suppressed) are left out."""
    out: dict[str, tuple[argparse.ArgumentParser, str | None]] = {}
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            if helps.get(name) == argparse.SUPPRESS:
                continue
            out[name] = (sub, helps.get(name))
    return out


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _value_text(action: argparse.Action) -> str:
    """What follows the flag, as argparse's usage line writes it: ``X``, ``[X]``, ``X [X ...]``."""
    if action.nargs == 0:
        return ""
    m = _metavar(action)
    if action.nargs is None:
        return m
    if action.nargs == argparse.OPTIONAL:
        return f"[{m}]"
    if action.nargs == argparse.ZERO_OR_MORE:
        return f"[{m} ...]"
    if action.nargs == argparse.ONE_OR_MORE:
        return f"{m} [{m} ...]"
    if isinstance(action.nargs, int):
        return " ".join([m] * action.nargs)
    return m


def _help_text(action: argparse.Action, prog: str) -> str:
    """The help with argparse's ``%(default)s``-style fields filled in, as ``--help`` shows it."""
    text = action.help or ""
    if "%" not in text:
        return text
    fields = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    fields["prog"] = prog
    if fields.get("choices") is not None:
        fields["choices"] = ", ".join(str(c) for c in fields["choices"])
    return text % fields


def _argument(action: argparse.Action, prog: str) -> dict[str, Any]:
    positional = not action.option_strings
    if positional:
        required = action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
    else:
        required = bool(action.required)
    default = action.default
    if default is argparse.SUPPRESS or action.nargs == 0 or default is None:
        default = None
    return {
        "names": [action.dest] if positional else list(action.option_strings),
        "positional": positional,
        "value": "" if positional else _value_text(action),
        "choices": None if action.choices is None else [str(c) for c in action.choices],
        "required": required,
        "default": default,
        "help": _help_text(action, prog),
    }


def _synopsis(words: list[str], arguments: list[dict[str, Any]], has_subcommands: bool) -> list[str]:
    """The command's usage line as its parts: the command words, then one part per argument
    (bracketed when optional), as argparse's usage writes them but without its terminal-width
    wrapping, so the page is the same on every machine."""
    parts = [" ".join(words)]
    for arg in arguments:
        if arg["positional"]:
            text = arg["names"][0]
            parts.append(text if arg["required"] else f"[{text}]")
            continue
        text = arg["names"][0] + (f" {arg['value']}" if arg["value"] else "")
        parts.append(text if arg["required"] else f"[{text}]")
    if has_subcommands:
        parts.append("COMMAND ...")
    return parts


def command_tree(parser: argparse.ArgumentParser, words: list[str] | None = None,
                 help_text: str | None = None) -> list[dict[str, Any]]:
    """Every command of a parser, depth first: itself, then each subcommand and theirs. A
    subcommand a later version adds appears without any change here; an alias is listed with
    the name it stands for."""
    words = words or [parser.prog]
    arguments = [_argument(a, " ".join(words)) for a in _arguments(parser)]
    subs: list[dict[str, Any]] = []
    parsers: dict[int, tuple[str, argparse.ArgumentParser, str | None]] = {}
    for name, (sub, sub_help) in _subcommands(parser).items():
        if id(sub) in parsers:
            next(s for s in subs if s["word"] == parsers[id(sub)][0])["aliases"].append(name)
            continue
        parsers[id(sub)] = (name, sub, sub_help)
        subs.append({"word": name, "name": " ".join([*words, name]), "help": sub_help, "aliases": []})
    entry = {
        "name": " ".join(words),
        "words": words,
        "help": help_text,
        "description": parser.description,
        "synopsis": _synopsis(words, arguments, bool(subs)),
        "arguments": arguments,
        "subcommands": subs,
    }
    out = [entry]
    for name, sub, sub_help in parsers.values():
        out += command_tree(sub, [*words, name], sub_help)
    return out


def commands_page_data() -> dict[str, Any]:
    from fleetops.agent.main import build_parser as agent_parser
    from fleetops.cli import build_parser

    anchors = Anchors()
    anchors("Command reference")
    programs = []
    for parser in (build_parser(), agent_parser()):
        commands = command_tree(parser)
        commands[0]["anchor"] = anchors(parser.prog)  # the program's own section heading
        for command in commands[1:]:
            command["anchor"] = anchors(command["name"])
        anchor = {c["name"]: c["anchor"] for c in commands}
        for command in commands:
            for sub in command["subcommands"]:
                sub["anchor"] = anchor[sub["name"]]
        programs.append({"prog": parser.prog, "description": parser.description, "commands": commands})
    return {"programs": programs}
