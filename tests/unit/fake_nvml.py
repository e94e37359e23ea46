"""A fake ``pynvml`` for the daemon tests (``$FLEETOPS_AGENT_NVML_MODULE=fake_nvml``): two GPUs,
driven by a JSON control file (``$FAKE_NVML_CONTROL``): ``mode`` ok | unloaded | hang, ``temp``,
and optionally ``nvlinks`` (links per GPU, default none) and ``link_kib`` (``"GPU/LINK"`` ->
``[tx, rx]`` KiB counters). Every NVML function counts its calls in ``CALLS`` (``calls()``,
``reset_calls()``), so a test can say how many NVML calls a daemon tick costs."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

CALLS: dict[str, int] = {}

# Field ids the daemon's light read asks for, with NVML's own numbers (distinct ones matter:
# a field-values call answers per id); any other NVML_* constant is 0.
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_PCIE_REPLAY_COUNTER = 94
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
NVML_FI_DEV_NVLINK_ERROR_DL_CRC = 163
NOT_SUPPORTED = 3


def calls() -> dict[str, int]:
    return dict(CALLS)


def reset_calls() -> None:
    CALLS.clear()


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


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


def _gate(name: str, initialising: bool = False) -> dict[str, Any]:
    _count(name)
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
    _gate("nvmlInit", initialising=True)


def nvmlSystemGetDriverVersion() -> str:
    _gate("nvmlSystemGetDriverVersion")
    return "580.0"


def nvmlDeviceGetCount() -> int:
    _gate("nvmlDeviceGetCount")
    return 2


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gate("nvmlDeviceGetHandleByIndex")
    return index


def nvmlDeviceGetUUID(h: int) -> str:
    _gate("nvmlDeviceGetUUID")
    return f"GPU-fake-{h}"


def nvmlDeviceGetPciInfo(h: int) -> Any:
    _gate("nvmlDeviceGetPciInfo")
    return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0")


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetTemperature(h: int, sensor: int) -> int:
    return int(_gate("nvmlDeviceGetTemperature")["temp"])


def nvmlDeviceGetTemperatureV(h: int, sensor: int) -> int:
    return int(_gate("nvmlDeviceGetTemperatureV")["temp"])


def nvmlDeviceGetPowerUsage(h: int) -> int:
    _gate("nvmlDeviceGetPowerUsage")
    return 100000


def nvmlDeviceGetClockInfo(h: int, clock: int) -> int:
    _gate("nvmlDeviceGetClockInfo")
    return 1980


def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:
    _gate("nvmlDeviceGetCurrentClocksEventReasons")
    return 0


def nvmlDeviceGetUtilizationRates(h: int) -> Any:
    _gate("nvmlDeviceGetUtilizationRates")
    return SimpleNamespace(gpu=0, memory=0)


def nvmlDeviceGetPcieThroughput(h: int, counter: int) -> int:
    _gate("nvmlDeviceGetPcieThroughput")
    return 0


def _field(fid: int, scope: int, ret: int, value: int = 0) -> Any:
    return SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=ret, valueType=3,
                           value=SimpleNamespace(ullVal=value))


def nvmlDeviceGetFieldValues(h: int, ids: list[Any]) -> list[Any]:
    c = _gate("nvmlDeviceGetFieldValues")
    links = int(c.get("nvlinks", 0))
    kib = c.get("link_kib", {})
    out = []
    for key in ids:
        fid, scope = key if isinstance(key, tuple) else (key, 0)
        if fid == NVML_FI_DEV_NVLINK_LINK_COUNT:
            out.append(_field(fid, scope, 0 if links else NOT_SUPPORTED, links))
        elif fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            pair = kib.get(f"{h}/{scope}", [0, 0])
            value = pair[0] if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else pair[1]
            out.append(_field(fid, scope, 0 if scope < links else NOT_SUPPORTED, int(value)))
        elif fid in (NVML_FI_DEV_NVLINK_ERROR_DL_CRC, NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                     NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY):
            out.append(_field(fid, scope, 0 if scope < links else NOT_SUPPORTED, 0))
        elif fid in (NVML_FI_DEV_ECC_SBE_VOL_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL, NVML_FI_DEV_PCIE_REPLAY_COUNTER):
            out.append(_field(fid, scope, 0, 0))
        elif fid == NVML_FI_DEV_MEMORY_TEMP:
            out.append(_field(fid, scope, 0, int(c["temp"])))
        else:
            out.append(_field(fid, scope, NOT_SUPPORTED))
    return out
