"""A fake ``pynvml`` for the daemon tests (``$FLEETOPS_AGENT_NVML_MODULE=fake_nvml``): two GPUs,
driven by a JSON control file (``$FAKE_NVML_CONTROL``): ``mode`` ok | unloaded | hang, ``temp``."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


def _control() -> dict[str, Any]:
    with open(os.environ["FAKE_NVML_CONTROL"], encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def _gate(initialising: bool = False) -> dict[str, Any]:
    c = _control()
    while c["mode"] == "hang":
        time.sleep(0.05)
        c = _control()
    if c["mode"] == "unloaded":
        raise NVMLError_DriverNotLoaded(9) if initialising else NVMLError_Uninitialized(1)
    return c


def __getattr__(name: str) -> int:
    if name.startswith("NVML_"):
        return 0
    raise AttributeError(name)


def nvmlInit() -> None:
    _gate(initialising=True)


def nvmlSystemGetDriverVersion() -> str:
    _gate()
    return "580.0"


def nvmlDeviceGetCount() -> int:
    _gate()
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gate()
    return index


def nvmlDeviceGetUUID(h: int) -> str:
    _gate()
    return f"GPU-fake-{h}"


def nvmlDeviceGetPciInfo(h: int) -> Any:
    _gate()
    return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
    return int(_gate()["temp"])


def nvmlDeviceGetTemperatureV(h: int, sensor: int) -> int:
    return int(_gate()["temp"])


def nvmlDeviceGetPowerUsage(h: int) -> int:
    _gate()
    return 100000
