"""Slurm's view of a node's GPUs, read as slurmd reads it: ``gres.conf`` (the ``Name=gpu``
devices in order, each a ``File=`` or ``MultipleFiles=`` of device files), each device file's
minor number, and the driver's ``mig-minors`` table (which nvidia-caps minor is which MIG GPU
instance). A job's gres ids (SLURM_JOB_GPUS) index the gres.conf devices in order; the device
file names the GPU by its minor number, which need not be NVML's index.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

DEFAULT_GRES_CONF = "/etc/slurm/gres.conf"
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
DEFAULT_MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
GRES_CONF_ENV = "FLEETOPS_GRES_CONF"

_GPU_FILE = re.compile(r"nvidia([0-9]+)$")
_CAP_FILE = re.compile(r"nvidia-cap([0-9]+)$")


class GresError(Exception):
    """gres.conf or mig-minors cannot be read or says nothing usable; the message names the file
    (and line)."""


@dataclass(frozen=True)
class GresDevice:
    """One gres id's devices: ``files`` as gres.conf names them (one for ``File=``, several for
    ``MultipleFiles=``); ``line``: where it was declared."""

    gres_id: int
    files: tuple[str, ...]
    line: int
    type: str | None = None  # gres.conf's Type= (a MIG profile, a GPU model), None when it names none


@dataclass(frozen=True)
class GresConf:
    path: str
    devices: tuple[GresDevice, ...]
    autodetect: str | None  # "nvml", "off", ... as the file says; None when it does not


def expand(text: str) -> list[str]:
    """Slurm's bracket ranges: ``/dev/nvidia[0-3,5]`` -> nvidia0..nvidia3, nvidia5 (zero
    padding kept: ``gpu[01-02]`` -> gpu01, gpu02). One bracket group at most, as gres.conf's
    device files use."""
    m = re.fullmatch(r"(.*)\[([0-9,\-]+)\](.*)", text)
    if not m:
        return [text]
    head, ranges, tail = m.groups()
    out = []
    for part in ranges.split(","):
        lo, sep, hi = part.partition("-")
        if not lo or (sep and not hi):
            raise ValueError(f"bad range {part!r} in {text!r}")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for n in range(int(lo), int(hi if sep else lo) + 1):
            out.append(f"{head}{n:0{width}d}{tail}")
    return out


def _host_matches(spec: str, hostname: str | None) -> bool:
    if hostname is None:
        return True
    short = hostname.split(".")[0]
    try:
        names = [n for part in re.split(r",(?![^\[]*\])", spec) for n in expand(part)]
    except ValueError:
        return False
    return short in names or hostname in names


def _lines(path: str, what: str) -> list[str]:
    """The file's lines; ``GresError`` naming it (``what`` it is, when it is missing)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        raise GresError(f"{path}: no such file ({what})") from None
    except OSError as exc:
        raise GresError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse(path: str, hostname: str | None = None) -> GresConf:
    """The GPU devices of ``path`` in order (lines for other nodes, by ``NodeName=``, skipped
    when ``hostname`` is given); ``GresError`` naming the file and line."""
    lines = _lines(path, "Slurm's gres.conf: give its path with --gres-conf")
    devices: list[GresDevice] = []
    autodetect: str | None = None
    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        pairs: dict[str, str] = {}
        for word in text.split():
            key, sep, value = word.partition("=")
            if not sep:
                raise GresError(f"{path}:{number}: expected KEY=VALUE, got {word!r}")
            pairs[key.lower()] = value
        if "nodename" in pairs and not _host_matches(pairs["nodename"], hostname):
            continue
        if "autodetect" in pairs:
            autodetect = pairs["autodetect"].lower()
        if pairs.get("name", "").lower() != "gpu":
            continue
        kind = pairs.get("type") or None
        try:
            if "multiplefiles" in pairs:
                files = [f for part in pairs["multiplefiles"].split(",") if part for f in expand(part)]
                devices.append(GresDevice(len(devices), tuple(files), number, kind))
            elif "file" in pairs:
                for f in expand(pairs["file"]):
                    devices.append(GresDevice(len(devices), (f,), number, kind))
        except ValueError as exc:
            raise GresError(f"{path}:{number}: {exc}") from None
    return GresConf(path, tuple(devices), autodetect)


def device_minor(path: str) -> tuple[int, str]:
    """(minor number, how it was found) of a device file: its ``st_rdev`` when it is a character
    device, else the number in its name (``nvidia5``, ``nvidia-cap12``) when the file cannot be
    stat'ed or is no device (a simulated node's). ``ValueError`` when neither says."""
    try:
        st = os.stat(path)
        if stat.S_ISCHR(st.st_mode):
            return os.minor(st.st_rdev), "stat"
    except OSError:
        pass
    base = os.path.basename(path)
    m = _CAP_FILE.search(base) or _GPU_FILE.search(base)
    if m is None:
        raise ValueError(f"{path}: not a character device and no minor number in its name")
    return int(m.group(1)), "name"


def is_cap_file(path: str) -> bool:
    return _CAP_FILE.search(os.path.basename(path)) is not None


def parse_mig_minors(path: str) -> dict[int, tuple[int, int, int | None]]:
    """``/proc/driver/nvidia-caps/mig-minors``: cap minor -> (GPU minor, GPU instance id,
    compute instance id or None for the GPU instance's own ``access``). Lines like
    ``gpu0/gi1/access 12`` and ``gpu0/gi1/ci0/access 13``; ``config`` and ``monitor`` skipped."""
    lines = _lines(path, "the driver's MIG minors table; give it with --mig-minors")
    out: dict[int, tuple[int, int, int | None]] = {}
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words:
            continue
        if len(words) != 2 or not words[1].isdigit():
            raise GresError(f"{path}:{number}: expected 'NAME MINOR', got {line!r}")
        m = re.fullmatch(r"gpu([0-9]+)/gi([0-9]+)(?:/ci([0-9]+))?/access", words[0])
        if m:
            ci = m.group(3)
            out[int(words[1])] = (int(m.group(1)), int(m.group(2)), None if ci is None else int(ci))
    return out


def node_gpu_types(path: str, hostname: str | None) -> list[str] | None:
    """The GPU types of this node's ``Gres=`` in slurm.conf, in the order written there
    (``Gres=gpu:z:1,gpu:a:7`` -> ``["z", "a"]``; an untyped ``gpu:8`` counts as ``""``), from its
    ``NodeName=`` line (a ``NodeName=DEFAULT`` line's Gres= where its own sets none); None when
    the file cannot be read or names no such node. ``Include`` lines are not followed."""
    try:
        lines = _lines(path, "slurm.conf")
    except GresError:
        return None
    default: str | None = None
    for raw in lines:
        text = raw.split("#", 1)[0].strip()
        words = dict(w.partition("=")[::2] for w in text.split())
        words = {k.lower(): v for k, v in words.items()}
        if "nodename" not in words:
            continue
        if words["nodename"].upper() == "DEFAULT":
            default = words.get("gres", default)
            continue
        if not _host_matches(words["nodename"], hostname):
            continue
        spec = words.get("gres", default)
        if spec is None:
            return []
        types: list[str] = []
        for item in re.split(r",(?![^(]*\))", spec):
            parts = item.split("(", 1)[0].split(":")
            if parts[0].lower() != "gpu":
                continue
            kind = parts[1] if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()) else ""
            if kind not in types:
                types.append(kind)
        return types
    return None


def in_slurmd_order(conf: GresConf, types: list[str] | None) -> GresConf:
    """``conf``'s devices numbered as slurmd numbers them: grouped by type in the order of the
    node's slurm.conf ``Gres=`` (``types``, node_gpu_types), gres.conf's order kept within a type.
    Seen from a real slurmd 22.05: with ``Gres=gpu:z:1,gpu:a:7`` and the Type=z line second in
    gres.conf, a job given gres id 0 got the Type=z line's device. Unchanged when ``types`` is
    None or names fewer than two types (one type: gres.conf's order is slurmd's)."""
    if not types or len(types) < 2:
        return conf
    rank = {t: i for i, t in enumerate(types)}
    ordered = sorted(conf.devices, key=lambda d: rank.get(d.type or "", len(types)))
    devices = tuple(GresDevice(i, d.files, d.line, d.type) for i, d in enumerate(ordered))
    return GresConf(conf.path, devices, conf.autodetect)
