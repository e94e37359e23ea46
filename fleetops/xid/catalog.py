"""The XID catalog: what each NVIDIA XID code means, how bad it is, and what to do about it.

Domain knowledge shared by the agent (verification after a reset), the checks (``xid.recent``,
``xid.storm``), ``fleetops remediate`` and the generated XID runbook. The entries follow the
resolution buckets of NVIDIA's published XID catalog (texts are our own). Reading and parsing the
kernel log is the GPU access layer's business (``fleetops.xid.kernlog``); here are only tables and
pure functions over ``model.XidEvent``.

SXid events come from NVSwitch, not from a GPU, and their codes live in another number space:
``is_sxid(event)`` tells them apart, and ``info_for(event)`` explains them as NVSwitch errors.

Standard library only: this module is on the agent's import path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetops.model import XidEvent

# The parser marks an SXid event by this suffix on its ``source`` ("kernel:sxid").
SXID_SUFFIX = ":sxid"


def is_sxid(event: XidEvent) -> bool:
    """True for an NVSwitch SXid event (its code is not a GPU XID code)."""
    return event.source.endswith(SXID_SUFFIX)


SEVERITIES = ("info", "warn", "crit")
ACTIONS = (
    "none",
    "restart_app",
    "reset_gpu",
    "reboot_node",
    "drain_and_inspect",
    "check_nvlink",
    "check_cooling_power",
    "follow_other_xid",
)
ACTION_TEXT: dict[str, str] = {
    "none": "Nothing to do on the GPU; look again only if it keeps repeating.",
    "restart_app": "The GPU is fine; the job that hit it failed and must be restarted. "
    "If it recurs, debug the application (compute-sanitizer, cuda-gdb).",
    "reset_gpu": "Drain the GPU's jobs, then reset it: fleetops reset NODE GPU -i INVENTORY. "
    "If the XID returns after the reset, drain the node and have it inspected.",
    "reboot_node": "Drain the node and reboot it: a GPU reset cannot reach a GPU that stopped "
    "answering. If the GPU is still missing after the reboot, open a hardware case.",
    "drain_and_inspect": "Drain the node and keep it out of service until the hardware has been "
    "checked (field diagnostics, vendor case).",
    "check_nvlink": "Check NVLink state and error counters (nvidia-smi nvlink -s / -e) and that "
    "Fabric Manager is running, then reset the GPU; links still down or erroring after that "
    "point at the baseboard or NVSwitch: drain and inspect.",
    "check_cooling_power": "Check the GPU's power feed and cooling (BMC sensors, PSUs, cables, "
    "fans); the GPU runs slowed or unprotected until that is fixed.",
    "follow_other_xid": "Find the other XIDs logged for this GPU at about the same time and act "
    "on those; this one reports a consequence or a summary, not a cause.",
}
CATEGORIES = (
    "application",
    "engine",
    "memory",
    "nvlink",
    "nvswitch",
    "pcie",
    "firmware",
    "power_thermal",
    "recovery",
    "unknown",
)


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    severity: str  # one of SEVERITIES
    action: str  # one of ACTIONS
    category: str  # one of CATEGORIES


def _entries() -> dict[int, XidInfo]:
    rows: list[tuple[int, str, str, str, str, str]] = [
        # (code, name, severity, action, category, meaning)
        (
            8,
            "GPU stopped processing (channel idle timeout)",
            "warn",
            "restart_app",
            "engine",
            (
                "A channel stopped making progress and the driver timed it out; the job using it is "
                "lost. Often follows a hung kernel; look for 109/119 at the same time."
            ),
        ),
        (
            13,
            "Graphics engine exception",
            "warn",
            "restart_app",
            "application",
            (
                "A kernel did something illegal (out-of-bounds access, bad instruction, bad register). "
                "Almost always an application bug; the GPU stays usable."
            ),
        ),
        (
            31,
            "GPU memory page fault",
            "warn",
            "restart_app",
            "application",
            (
                "The GPU's MMU caught an access to an address the context does not map. Usually an "
                "application bug, rarely a driver or hardware fault."
            ),
        ),
        (
            32,
            "Invalid or corrupted push buffer stream",
            "warn",
            "restart_app",
            "pcie",
            (
                "The DMA engine feeding the GPU received a bad command stream, most often from poor "
                "PCIe signal quality rather than the application."
            ),
        ),
        (
            38,
            "Driver firmware error (engine watchdog timeout)",
            "warn",
            "none",
            "firmware",
            (
                "The graphics-engine firmware's watchdog fired. No immediate action; if it repeats, "
                "collect a bug report for NVIDIA."
            ),
        ),
        (
            43,
            "GPU stopped processing (application fault)",
            "info",
            "none",
            "application",
            "An application hit a software-induced fault and was terminated; the GPU remains healthy.",
        ),
        (
            44,
            "Graphics engine fault during context switch",
            "warn",
            "none",
            "engine",
            (
                "The engine faulted while switching contexts. No immediate action; repeated events on "
                "one GPU deserve a look."
            ),
        ),
        (
            45,
            "Preemptive cleanup after earlier errors",
            "info",
            "follow_other_xid",
            "application",
            (
                "The driver tore down a GPU context because of an earlier error, a reset, or the "
                "process being killed (Ctrl-C, SIGKILL). A consequence, not a cause."
            ),
        ),
        (
            46,
            "GPU stopped processing (GPU timeout)",
            "crit",
            "reset_gpu",
            "engine",
            "The GPU stopped responding to work; it must be reset before it is trusted again.",
        ),
        (
            48,
            "Double-bit (uncorrectable) ECC error",
            "crit",
            "reset_gpu",
            "memory",
            (
                "An uncorrectable memory error hit the GPU and the application was told. A GPU reset "
                "clears it; repeated DBEs, or SRAM DBEs past the threshold, mean hardware service."
            ),
        ),
        (
            54,
            "Auxiliary power not connected",
            "crit",
            "check_cooling_power",
            "power_thermal",
            "The board reports its auxiliary power feed missing and runs at reduced clocks.",
        ),
        (
            56,
            "Display engine error",
            "warn",
            "drain_and_inspect",
            "engine",
            (
                "Legacy code for a display channel exception; not expected on data-center Hopper GPUs, "
                "so treat it as suspicious hardware."
            ),
        ),
        (
            57,
            "Framebuffer link training failure",
            "crit",
            "drain_and_inspect",
            "memory",
            (
                "Legacy code: the link between the GPU and its memory failed to train. Not expected on "
                "current GPUs; a hardware problem if seen."
            ),
        ),
        (
            58,
            "Framebuffer memory error",
            "crit",
            "drain_and_inspect",
            "memory",
            (
                "Legacy code for an unstable memory interface. Not expected on current GPUs; a hardware"
                " problem if seen."
            ),
        ),
        (
            61,
            "Internal micro-controller breakpoint",
            "warn",
            "reset_gpu",
            "firmware",
            (
                "Legacy code: an on-GPU micro-controller hit a breakpoint or warning. Reset the GPU if "
                "the GPU misbehaves; collect a bug report if it repeats."
            ),
        ),
        (
            62,
            "Internal micro-controller halt",
            "crit",
            "reset_gpu",
            "firmware",
            "An on-GPU micro-controller halted; the GPU needs a reset.",
        ),
        (
            63,
            "Row remap recorded",
            "warn",
            "reset_gpu",
            "memory",
            (
                "ECC handling marked a memory row for remapping; the replacement row takes effect at "
                "the next GPU reset. Not urgent: reset when the GPU is next idle."
            ),
        ),
        (
            64,
            "Row remap failure",
            "crit",
            "reset_gpu",
            "memory",
            (
                "A memory row could not be remapped (no spare rows or a remapper error). Reset the GPU;"
                " if the failure persists after a reset, drain and inspect the hardware."
            ),
        ),
        (
            68,
            "Video decoder (NVDEC0) exception",
            "warn",
            "restart_app",
            "engine",
            "The video decode engine faulted on the job using it.",
        ),
        (
            69,
            "Graphics engine class error",
            "warn",
            "restart_app",
            "application",
            "The application sent a method the engine does not accept; an application or CUDA library bug.",
        ),
        (
            74,
            "NVLink error",
            "crit",
            "check_nvlink",
            "nvlink",
            (
                "A fatal error on an NVLink to another GPU or to an NVSwitch. The link stays down until"
                " a GPU reset or reboot; the fault may be at either end of the link."
            ),
        ),
        (
            79,
            "GPU has fallen off the bus",
            "crit",
            "reboot_node",
            "pcie",
            (
                "The GPU no longer answers on PCIe: link failure, board failure, power, or a driver "
                "fault. Only a node reboot brings it back."
            ),
        ),
        (
            92,
            "High single-bit ECC error rate",
            "warn",
            "none",
            "memory",
            (
                "Corrected memory errors are arriving unusually fast. No immediate action; watch the "
                "ECC and row-remap counters."
            ),
        ),
        (
            94,
            "Contained memory error",
            "warn",
            "restart_app",
            "memory",
            (
                "An uncorrectable error was contained to one application, which must be restarted; "
                "other work is unaffected. Reset the GPU when convenient."
            ),
        ),
        (
            95,
            "Uncontained memory error",
            "crit",
            "reset_gpu",
            "memory",
            (
                "An uncorrectable error could not be contained and may have corrupted several "
                "applications; the GPU must be reset before it runs work again."
            ),
        ),
        (
            109,
            "Context switch timeout",
            "warn",
            "reset_gpu",
            "engine",
            (
                "A context did not switch out in time, often a kernel spinning forever; can also "
                "precede a GSP hang. Reset the GPU if its work does not recover."
            ),
        ),
        (
            110,
            "Security fault",
            "crit",
            "reset_gpu",
            "firmware",
            (
                "The GPU's security engine reported a fault; rare without a hardware problem. Reset the"
                " GPU; if it returns, cold-reset the node and open a hardware case."
            ),
        ),
        (
            119,
            "GSP RPC timeout",
            "crit",
            "reset_gpu",
            "firmware",
            (
                "The GPU System Processor did not answer the driver in time. The GPU needs a reset (or "
                "a power cycle if that fails); recurring events point at driver or firmware."
            ),
        ),
        (
            120,
            "GSP error",
            "crit",
            "reset_gpu",
            "firmware",
            (
                "Code running on the GPU System Processor raised an error. Reset the GPU; recurring "
                "events point at driver or firmware."
            ),
        ),
        (
            121,
            "C2C link corrected error",
            "info",
            "none",
            "nvlink",
            (
                "Corrected errors on the chip-to-chip link to a Grace CPU; no impact. A GPU reset in a "
                "service window retrains the link."
            ),
        ),
        (
            122,
            "SPI read failure via PMU",
            "warn",
            "drain_and_inspect",
            "firmware",
            (
                "The GPU could not read its SPI flash (VBIOS/InfoROM storage). Not expected on current "
                "GPUs; inspect the board."
            ),
        ),
        (
            123,
            "SPI write failure via PMU",
            "warn",
            "drain_and_inspect",
            "firmware",
            (
                "The GPU could not write its SPI flash (VBIOS/InfoROM storage). Not expected on current"
                " GPUs; inspect the board."
            ),
        ),
        (
            136,
            "NVLink training failed",
            "crit",
            "check_nvlink",
            "nvlink",
            (
                "An NVLink did not come up during link training; the GPU runs with fewer links. Reset "
                "the GPU and check signal integrity of the link if it fails again."
            ),
        ),
        (
            137,
            "NVLink privilege error",
            "warn",
            "restart_app",
            "application",
            (
                "A peer-to-peer access over NVLink was refused by the remote side, usually an "
                "application bug (like a page fault, but across GPUs)."
            ),
        ),
        (
            140,
            "Unrecovered ECC error",
            "crit",
            "reset_gpu",
            "memory",
            (
                "Uncorrectable memory errors arrived in a way that stopped the driver from retiring or "
                "remapping the memory. Reset the GPU; if it repeats, open a hardware case."
            ),
        ),
        (
            143,
            "GPU initialization error",
            "crit",
            "reset_gpu",
            "firmware",
            "The GPU failed to initialise. Reset it; a GPU that keeps failing needs service.",
        ),
        (
            154,
            "GPU recovery action changed",
            "info",
            "follow_other_xid",
            "recovery",
            (
                "Informational summary the driver prints alongside other XIDs, stating the recovery it "
                "now requires (None, Drain P2P, Drain and Reset, GPU Reset Required, Node Reboot "
                "Required). info_for() reads that requirement from the message."
            ),
        ),
        (
            155,
            "NVLink software-defined error",
            "warn",
            "reset_gpu",
            "nvlink",
            (
                "A link went down on purpose (for example into sleep) and was reported. Blackwell "
                "systems; reset the GPU if the link is needed."
            ),
        ),
        (
            156,
            "Resource retirement event",
            "warn",
            "reset_gpu",
            "memory",
            "The GPU retired a faulty internal resource; the change takes effect at the next GPU reset.",
        ),
        (
            157,
            "Resource retirement failure",
            "warn",
            "drain_and_inspect",
            "memory",
            (
                "The GPU could not retire a faulty resource because no spares are left. Work may "
                "continue but the error can recur; plan hardware service."
            ),
        ),
        (
            158,
            "GPU fatal timeout",
            "crit",
            "reset_gpu",
            "engine",
            "The GPU hit a fatal internal timeout and must be reset.",
        ),
    ]
    nvlink5 = {144: "SAW", 145: "RLW", 146: "TLW", 147: "TREX", 148: "NVLPW_CTRL", 149: "NETIR", 150: "MSE"}
    for code, unit in nvlink5.items():
        meaning = (
            f"A fatal error in the NVLink {unit} unit (fifth-generation NVLink, Blackwell; not "
            "expected on H100/H200). The affected links are down until the GPU is reset."
        )
        rows.append((code, f"NVLink {unit} error", "crit", "check_nvlink", "nvlink", meaning))
    return {
        code: XidInfo(code=code, name=name, meaning=meaning, severity=sev, action=action, category=cat)
        for code, name, sev, action, cat, meaning in sorted(rows)
    }


CATALOG: dict[int, XidInfo] = _entries()

# Codes that reflect on the application (or are bookkeeping), not on the GPU's health; the
# GPU stays usable. For callers that want to alert only on GPU/node faults.
NON_CRITICAL: frozenset[int] = frozenset({13, 31, 43, 45, 63, 68, 69, 92, 94, 109, 137})

# NVML's recovery actions as Xid 154 names them, in the vocabulary of model.Gpu.recovery_action.
RECOVERY_ACTIONS = {
    "none": "none",
    "gpu reset required": "gpu_reset",
    "pf flr": "gpu_reset",
    "node reboot required": "node_reboot",
    "drain p2p": "drain_p2p",
    "drain and reset": "drain_and_reset",
}
_RECOVERY_CODES = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}
_RECOVERY_TO_ACTION = {
    "none": "none",
    "gpu_reset": "reset_gpu",
    "node_reboot": "reboot_node",
    "drain_p2p": "reset_gpu",
    "drain_and_reset": "reset_gpu",
}
_RECOVERY_SEVERITY = {
    "none": "info",
    "gpu_reset": "crit",
    "node_reboot": "crit",
    "drain_p2p": "crit",
    "drain_and_reset": "warn",
}
_TO_RE = re.compile(r"\bto\s+0x(?P<num>[0-9a-fA-F]+)(?:\s*\((?P<label>[^)]*)\))?", re.IGNORECASE | re.ASCII)


def lookup(code: int) -> XidInfo:
    """The catalog entry for ``code``; a generic 'unknown XID' entry (warn, drain_and_inspect)
    for codes the catalog does not list."""
    info = CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code=code,
        name="unknown XID",
        meaning="A code this catalog does not list: look it up in NVIDIA's XID catalog for "
        "the installed driver before returning the GPU to service.",
        severity="warn",
        action="drain_and_inspect",
        category="unknown",
    )


def recovery_action(message: str) -> str | None:
    """The recovery an Xid 154 message asks for ("GPU recovery action changed from 0x0 (None)
    to 0x2 (Node Reboot Required)"), as ``model.Gpu.recovery_action`` names it, or None."""
    found = list(_TO_RE.finditer(message or ""))
    if not found:
        return None
    m = found[-1]  # the last "to ..." is the new action
    label = (m["label"] or "").strip().lower()
    if label in RECOVERY_ACTIONS:
        return RECOVERY_ACTIONS[label]
    return _RECOVERY_CODES.get(int(m["num"], 16))


def info_for(event: XidEvent) -> XidInfo:
    """``lookup`` made event-aware: an SXid is explained as an NVSwitch error (crit when the
    switch calls it fatal), and an Xid 154 takes the severity and action its message asks
    for."""
    if is_sxid(event):
        fatal = bool(re.match(r"\s*fatal\b", event.message, re.IGNORECASE))
        return XidInfo(
            code=event.code,
            name="NVSwitch SXid" + (" (fatal)" if fatal else ""),
            meaning="An error reported by an NVSwitch, not by a GPU; fatal ones take the "
            "switch's links (and the fabric's bandwidth) down until the node is reset.",
            severity="crit" if fatal else "warn",
            action="check_nvlink",
            category="nvswitch",
        )
    info = lookup(event.code)
    if event.code == 154:
        wanted = recovery_action(event.message)
        if wanted is not None and wanted != "none":
            return XidInfo(
                code=154,
                name=f"{info.name}: {wanted}",
                meaning=info.meaning,
                severity=_RECOVERY_SEVERITY[wanted],
                action=_RECOVERY_TO_ACTION[wanted],
                category=info.category,
            )
    return info
