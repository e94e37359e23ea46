"""The NVML module and the one door to it: ``load_module`` (pynvml, or the module a test
names), ``Nvml.call`` (never raises: a value or the reason), ``GpuReader`` (one GPU's calls,
none after GpuIsLost) and the small conversions every reader of NVML answers shares."""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetops import model

LOST = "GpuIsLost"


def as_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip("\x00").strip()
    return str(value).strip()


NVML_MODULE_ENV = "FLEETOPS_AGENT_NVML_MODULE"  # test hook: a module used in place of pynvml


def load_module() -> Any:
    """``pynvml``, or the module ``$FLEETOPS_AGENT_NVML_MODULE`` names (a test's fake NVML), which
    is then also ``sys.modules['pynvml']`` so every reader in this layer and the daemon's sees it."""
    name = os.environ.get(NVML_MODULE_ENV)
    if name:
        module = importlib.import_module(name)
        sys.modules["pynvml"] = module
        return module
    import pynvml

    return pynvml


def reason_of(exc: BaseException) -> str:
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return name[len("NVMLError_") :]
    value = getattr(exc, "value", None)
    if name == "NVMLError" and value is not None:
        return f"NVMLError{value}"
    return f"{name}: {exc}" if str(exc) else name


class Nvml:
    """The one door to NVML: ``call`` answers (value, None) or (None, reason), never raises."""

    def __init__(self, module: Any, trace: bool = False) -> None:
        self.N = module
        self.trace: list[tuple[float, str]] | None = [] if trace else None

    def call(self, name: str, *args: Any) -> tuple[Any, str | None]:
        fn = getattr(self.N, name, None)
        if fn is None:
            return None, f"{name} not in this nvidia-ml-py"
        start = time.perf_counter() if self.trace is not None else 0.0
        try:
            value, reason = fn(*args), None
        except self.N.NVMLError as exc:
            value, reason = None, reason_of(exc)
        except Exception as exc:  # noqa: BLE001
            value, reason = None, reason_of(exc)
        if self.trace is not None:
            self.trace.append(((time.perf_counter() - start) * 1000.0, name))
        return value, reason

    def reason_code(self, code: int) -> str:
        # NVMLError(code) builds the code's own subclass (NVMLError_NotSupported, ...)
        try:
            name = type(self.N.NVMLError(code)).__name__
        except Exception:  # a binding without that behaviour: the plain code  # noqa: BLE001
            name = ""
        if name.startswith("NVMLError_"):
            return name[len("NVMLError_") :]
        return f"NVMLError{code}"

    def const(self, name: str, default: Any = None) -> Any:
        return getattr(self.N, name, default)


class GpuReader:
    """Reads one GPU; after GpuIsLost it makes no more calls."""

    def __init__(self, nv: Nvml, gpu: model.Gpu, handle: Any) -> None:
        self.nv = nv
        self.gpu = gpu
        self.handle = handle
        self.lost = False
        self.errors: list[str] = []  # collector bugs, copied to node.errors

    def call(self, name: str, *args: Any) -> tuple[Any, str | None]:
        if self.lost:
            return None, LOST
        value, reason = self.nv.call(name, self.handle, *args)
        if reason == LOST:
            self.lost = True
        return value, reason

    def read(self, field_name: str, name: str, *args: Any, conv: Callable[[Any], Any] | None = None) -> Any:
        value, reason = self.call(name, *args)
        if reason is not None:
            self.gpu.unavailable[field_name] = reason
            return None
        if conv is not None:
            value = conv(value)
        setattr(self.gpu, field_name, value)
        return value

    def miss(self, field_name: str, reason: str) -> None:
        setattr(self.gpu, field_name, None)
        self.gpu.unavailable[field_name] = reason


class NvmlUnavailable(Exception):
    """NVML cannot start at all (no nvidia-ml-py, no driver, no library); the message says why."""


def field_value(fv: Any) -> Any:
    vt = fv.valueType
    v = fv.value
    if vt == 0:
        return v.dVal
    if vt == 1:
        return v.uiVal
    if vt == 2:
        return v.ulVal
    if vt == 3:
        return v.ullVal
    if vt == 4:
        return v.sllVal
    if vt == 5:
        return v.siVal
    if vt == 6:
        return v.usVal
    return v.ullVal


def instance_id(value: Any) -> int | None:
    """A process's MIG instance id; NVML fills 0xFFFFFFFF where the GPU is not in MIG mode."""
    if value is None or int(value) == 0xFFFFFFFF:
        return None
    return int(value)
