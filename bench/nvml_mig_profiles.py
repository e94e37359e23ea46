"""Read-only: the MIG GPU-instance profiles and placements NVML reports for each GPU.

Prints one JSON document. It never changes MIG mode or creates instances; NVML answers these
queries with MIG mode off as well, which is how the simulator's tables are checked against a
real GPU::

    python3 bench/nvml_mig_profiles.py > profiles.json
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _placements(nv: Any, handle: Any, profile_id: int) -> list[list[int]]:
    """Possible placements (start, size in slices); nvidia-ml-py takes the caller's buffer."""
    import ctypes

    count = ctypes.c_uint(0)
    kind = nv.c_nvmlGpuInstancePlacement_t
    buf = (kind * 32)()
    count.value = 32
    nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, buf, ctypes.byref(count))
    return [[buf[i].start, buf[i].size] for i in range(count.value)]


def main() -> int:
    import pynvml as nv

    nv.nvmlInit()
    out: dict[str, Any] = {"driver": _plain(nv.nvmlSystemGetDriverVersion()), "gpus": []}
    for index in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(index)
        gpu: dict[str, Any] = {"index": index, "name": _plain(nv.nvmlDeviceGetName(h)), "profiles": []}
        try:
            gpu["mig_mode"] = list(nv.nvmlDeviceGetMigMode(h))
        except nv.NVMLError as exc:
            gpu["mig_mode"] = str(exc)
        for profile in range(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 16)):
            row: dict[str, Any] = {"profile": profile}
            try:
                try:
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfoV(h, profile)
                except (AttributeError, TypeError):
                    info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, profile)
            except nv.NVMLError as exc:
                row["error"] = str(exc)
                gpu["profiles"].append(row)
                continue
            for name, _ in info._fields_:
                if name != "version":
                    row[name] = _plain(getattr(info, name))
            try:
                row["placements"] = _placements(nv, h, info.id)
            except Exception as exc:  # noqa: BLE001 - recorded per profile, the others still read
                row["placements"] = f"{type(exc).__name__}: {exc}"
            gpu["profiles"].append(row)
        out["gpus"].append(gpu)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
