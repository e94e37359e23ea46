"""How fleetops reads a Slurm node and recognises the drains it made.

A drain fleetops sets carries ``MARKER`` at the start of its Reason; resume lifts a drain only
when the node's current Reason still starts with it. Someone else's drain (``maintenance by
alice``), or ours replaced by someone else's reason, never carries it, so it is left alone. The
rule lives in the Reason itself, where slurmctld keeps it, so every place that can run scontrol
(the controller, a Slurm host, the Ansible module on a node) reads the same answer.

The Ansible module ``plugins/modules/fleetops_slurm_node.py`` is a standalone file that cannot
import fleetops; it carries the same functions, and a unit test holds the two to the same
answers.
"""

from __future__ import annotations

import re

MARKER = "[fleetops]"
DEFAULT_REASON = "fleetops maintenance"
DRAIN_FLAGS = ("DRAIN", "DRAINED", "DRAINING")
# slurmctld appends who set the reason and when: "[root@2026-12-02T10:00:00]"
_STAMP = re.compile(r"\s*\[([^\]]*)@([^\]]*)\]\s*$")
_STATE_SPLIT = re.compile(r"[+*~#!%$@^-]")


def marked_reason(reason: str | None) -> str:
    """The Reason fleetops sets for a drain: the operator's words after the marker."""
    text = " ".join((reason or "").split()) or DEFAULT_REASON
    if is_ours(text):
        return text
    return f"{MARKER} {text}"


def is_ours(reason: str | None) -> bool:
    """Whether a node's current Reason (stamp removed, as ``parse_node`` gives it) is a drain
    fleetops set."""
    return (reason or "").strip().startswith(MARKER)


def parse_node(text: str) -> tuple[str | None, str | None]:
    """State and Reason from ``scontrol show node -o NAME`` (one line of Key=Value pairs); the
    Reason without slurmctld's ``[user@time]`` stamp."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    state = None
    found = re.search(r"(?:^|\s)State=(\S+)", line)
    if found:
        state = found.group(1)
    reason = None
    found = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if found:
        reason = _STAMP.sub("", found.group(1)).strip()
        # later keys, if any, start with " Key=" in CamelCase
        later = re.search(r"\s[A-Z][A-Za-z]+=", reason)
        if later:
            reason = _STAMP.sub("", reason[: later.start()]).strip()
    return state, reason


def reason_stamp(text: str) -> tuple[str | None, str | None]:
    """Who set the node's Reason and when, from slurmctld's ``[user@time]`` stamp in
    ``scontrol show node -o`` output; (None, None) when Slurm did not say."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    found = re.search(r"(?:^|\s)Reason=(.*)$", line)
    if not found:
        return None, None
    value = found.group(1)
    later = re.search(r"\s[A-Z][A-Za-z]+=", value)
    if later:
        value = value[: later.start()]
    stamp = _STAMP.search(value)
    if not stamp:
        return None, None
    return stamp.group(1).strip() or None, stamp.group(2).strip() or None


def is_drained(state: str | None) -> bool:
    """A drain is set (DRAIN, DRAINING or DRAINED, with any other flags)."""
    parts = _STATE_SPLIT.split((state or "").upper())
    return any(p in DRAIN_FLAGS for p in parts)
