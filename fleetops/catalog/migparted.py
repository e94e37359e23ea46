"""nvidia-mig-parted's configuration format, read so that a site which keeps one keeps using it.

The format (``version: v1``)::

    version: v1
    mig-configs:
      all-3g.71gb:
        - devices: all            # or a list of GPU indices: [0, 1]
          mig-enabled: true
          mig-devices:
            "3g.71gb": 2
      all-disabled:
        - devices: all
          mig-enabled: false

A named config is a list of entries; each says which GPUs (by NVML index) it covers, whether
MIG mode is on, and how many instances of each profile they get. The GPU's layout is the
profiles repeated by their counts, larger profiles first (the order instances are created in).
``device-filter`` (PCI device ids, ``0x233510DE``) narrows an entry to GPU models: a GPU whose
device id is unknown to the caller does not match a filtered entry.

Plain data in, ``BaselineError``-style messages out: every error names the file, the config and
the entry (``FILE: mig-configs.NAME[1].mig-devices: ...``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

VERSION = "v1"
_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")


class MigPartedError(ValueError):
    """A config file that does not parse or validate; the message names the file and the key."""


@dataclass(frozen=True)
class Entry:
    devices: tuple[int, ...] | None  # None: all GPUs
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]  # (profile, count), in the file's order
    device_filter: tuple[str, ...] = ()

    def layout(self) -> list[str]:
        """The instances, larger profiles first (the slices before the dot)."""
        out = [name for name, count in self.mig_devices for _ in range(count)]
        return sorted(out, key=lambda n: -_slices(n))

    def covers(self, index: int, device_id: str | None = None) -> bool:
        if self.devices is not None and index not in self.devices:
            return False
        if self.device_filter:
            return device_id is not None and device_id.lower() in {d.lower() for d in self.device_filter}
        return True


def _slices(name: str) -> int:
    m = re.match(r"\s*(\d+)g\.", name)
    return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class Config:
    source: str
    configs: Mapping[str, tuple[Entry, ...]]

    def select(self, name: str) -> tuple[Entry, ...]:
        if name not in self.configs:
            import difflib

            close = difflib.get_close_matches(name, list(self.configs), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise MigPartedError(f"{self.source}: mig-configs: no config named {name!r}{hint}; "
                                 f"configs: {', '.join(self.configs) or 'none'}")
        return self.configs[name]


def want_for(entries: Sequence[Entry], index: int, device_id: str | None = None) -> tuple[bool, list[str]] | None:
    """(MIG mode, layout) the selected config gives the GPU at ``index``; None when no entry
    covers it (mig-parted leaves such a GPU alone). The last entry that covers it wins."""
    found = None
    for entry in entries:
        if entry.covers(index, device_id):
            found = (entry.mig_enabled, entry.layout() if entry.mig_enabled else [])
    return found


def parse(data: Any, source: str) -> Config:
    if not isinstance(data, dict):
        raise MigPartedError(f"{source}: expected a mapping with version and mig-configs")
    unknown = sorted(str(k) for k in data if k not in ("version", "mig-configs"))
    if unknown:
        raise MigPartedError(f"{source}: unknown key {unknown[0]!r}; known keys: version, mig-configs")
    if data.get("version") != VERSION:
        raise MigPartedError(f"{source}: version: expected {VERSION!r}, got {data.get('version')!r}")
    configs = data.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigPartedError(f"{source}: mig-configs: expected a mapping of config name to a list of entries")
    out: dict[str, tuple[Entry, ...]] = {}
    for name, entries in configs.items():
        where = f"{source}: mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise MigPartedError(f"{where}: expected a non-empty list of entries")
        out[str(name)] = tuple(_entry(e, f"{where}[{i}]") for i, e in enumerate(entries))
    return Config(source, out)


def _entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise MigPartedError(f"{where}: expected a mapping")
    for key in raw:
        if key not in _ENTRY_KEYS:
            raise MigPartedError(f"{where}: unknown key {key!r}; known keys: {', '.join(_ENTRY_KEYS)}")
    devices_raw = raw.get("devices")
    devices: tuple[int, ...] | None
    if devices_raw == "all":
        devices = None
    elif isinstance(devices_raw, list) and devices_raw and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices_raw):
        devices = tuple(devices_raw)
    else:
        raise MigPartedError(f"{where}.devices: expected 'all' or a list of GPU indices, got {devices_raw!r}")
    enabled = raw.get("mig-enabled")
    if not isinstance(enabled, bool):
        raise MigPartedError(f"{where}.mig-enabled: expected true or false, got {enabled!r}")
    filt = raw.get("device-filter", [])
    if isinstance(filt, str):
        filt = [filt]
    if not isinstance(filt, list) or not all(isinstance(f, str) and re.fullmatch(r"0x[0-9A-Fa-f]{8}", f) for f in filt):
        raise MigPartedError(f"{where}.device-filter: expected PCI device ids like 0x233510DE, got {filt!r}")
    mig_devices_raw = raw.get("mig-devices") or {}
    if not isinstance(mig_devices_raw, dict):
        raise MigPartedError(f"{where}.mig-devices: expected a mapping of profile to count")
    if not enabled and mig_devices_raw:
        raise MigPartedError(f"{where}.mig-devices: given with mig-enabled: false")
    pairs = []
    for profile, count in mig_devices_raw.items():
        if not isinstance(profile, str) or not re.fullmatch(r"\d+g\.\d+gb(\+me)?", profile.strip()):
            raise MigPartedError(f"{where}.mig-devices: {profile!r} is not a MIG profile name like 3g.71gb")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MigPartedError(f"{where}.mig-devices.{profile}: expected a count (0 or more), got {count!r}")
        if count:
            pairs.append((profile.strip(), count))
    return Entry(devices=devices, mig_enabled=enabled, mig_devices=tuple(pairs), device_filter=tuple(filt))


def load(path: str) -> Config:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise MigPartedError(f"{path}: cannot read the mig-parted config: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise MigPartedError(f"{path}: not YAML: {exc}") from None
    return parse(data, path)
