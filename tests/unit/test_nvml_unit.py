"""The NVML backend without a GPU: pynvml's functions are replaced by fakes.

The default fake answers like the real H200 passthrough VM captured in tests/fixtures/h200
(h200_nvml.json, and h200_nvsmi_q.xml for what the probe did not read): the values below are that
capture's (test_checks_on_h200_capture checks them against it), and every getter that answered
"Not Supported" there (NVLink, NUMA node, retired pages, fan, fabric) raises NotSupported here.
Any pynvml function the fake does not define raises, and the test fails on the reason it leaves.
"""

from __future__ import annotations

import ctypes
import json
import types

import pytest

pynvml = pytest.importorskip("pynvml")

from fleetops import model  # noqa: E402 - after the skip: pynvml must be importable
from fleetops.gpu import nvml  # noqa: E402
from fleetops.gpu.nvml import snapshot as nvml_snapshot  # noqa: E402
from fleetops.gpu.nvml import topology as nvml_topology  # noqa: E402

MIB = 1024 * 1024
# The capture's probe predates nvmlSystemGetDriverBranch: the fake answers the name the simulator
# gives driver 580.159.04's branch (fleetops.sim.gpu.driver_branch_of).
DRIVER_BRANCH = "r580_00"
NS = pynvml.NVML_ERROR_NOT_SUPPORTED
LOST = pynvml.NVML_ERROR_GPU_IS_LOST


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"Handle({self.index})"


def h200(index: int = 0, bus: str = "00000000:00:06.0") -> dict:
    """One GPU as the reference VM's NVML described it."""
    return {
        "uuid": "GPU-ed2c431b-4811-46fb-82e0-deeead4dc641"
        if index == 0
        else f"GPU-0000000{index}-0000-0000-0000-000000000000",
        "bus": bus,
        "name": "NVIDIA H200",
        "serial": "1654024197156",
        "part": "692-2G520-0282-000",
        "vbios": "96.00.A5.00.1A",
        "inforom": "G520.0282.02.02",
        "inforom_oem": "2.1",
        "gsp": b"580.159.04",
        "persistence": 1,
        "compute_mode": 0,
        "power": 77662,
        "limit": 700000,
        "default_limit": 700000,
        "constraints": [200000, 700000],
        "enforced": 700000,
        "temp": 36,
        # shutdown, slowdown: the XML's T.Limit margins in degrees; HBM maximum: not in the capture
        "thresholds": {0: 95, 1: 89, 2: 95},
        "clocks": {1: 345, 2: 3201},
        "max_clocks": {1: 1980, 2: 3201},
        "events": 0x1,
        "util": (0, 0),
        "mem": (143771 * MIB + 512 * 1024, 0, 616 * MIB),  # total, used, reserved
        "ecc_mode": [1, 1],
        "mig_mode": [0, 0],
        "pcie": {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16},
        "processes": [],
        "affinity": [0xFFFF],  # CPUs 0-15
        # field id -> (nvmlReturn, valueType, value)
        "fields": {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (0, 1, 36),
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (0, 3, 0),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (0, 3, 0),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (0, 3, 289),  # lifetime, on a healthy GPU
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (0, 3, 0),
            pynvml.NVML_FI_DEV_REMAPPED_COR: (0, 3, 2),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: (0, 3, 0),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: (0, 3, 0),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (0, 3, 0),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (0, 1, 0),
            pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT: (NS, 1, 0),
            pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: (NS, 0, 0),
            pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: (NS, 0, 0),
            pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: (NS, 0, 0),
            getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230): (0, 1, 0),
        },
        # getter name -> NVML error code it raises (the capture's "Not Supported" set)
        "errors": {
            "nvmlDeviceGetNvLinkState": NS,
            "nvmlDeviceGetNvLinkRemotePciInfo": NS,
            "nvmlDeviceGetNvLinkErrorCounter": NS,
            "nvmlDeviceGetNumaNodeId": NS,
            "nvmlDeviceGetRetiredPagesPendingStatus": NS,
            "nvmlDeviceGetRetiredPages": NS,
            "nvmlDeviceGetFanSpeed": NS,
            "nvmlDeviceGetGpuFabricInfoV": NS,
            "nvmlDeviceGetGpuFabricInfo": NS,
        },
        "nvlinks": [],  # list of (up, remote bus, remote type) when NVLink is supported
        "link_errors": {},  # (link, counter) -> value
        "lost_after": None,  # getter name from which this GPU answers GpuIsLost
        "mig": None,  # {"profiles": {...}, "gis": [...], "devices": [...]}
        "fabric": (0, 0),  # (state, status) when nvmlDeviceGetGpuFabricInfoV is not in "errors"
    }


class FakeNvml:
    """Installs fakes over pynvml's functions; records every call."""

    def __init__(
        self,
        gpus: list[dict],
        monkeypatch: pytest.MonkeyPatch,
        init_error: int | None = None,
        driver_branch: str | None = DRIVER_BRANCH,
    ) -> None:
        self.gpus = gpus
        self.driver_branch = driver_branch  # None: a driver without nvmlSystemGetDriverBranch
        self.calls: list[tuple[str, object]] = []
        self.init_error = init_error
        self.topology: dict[tuple[int, int], int] = {}
        self.lost: set[int] = set()
        # Every pynvml function is replaced: by the fake's own where it has one, else by one
        # that fails (unless a GPU's "errors" says it raises an NVML error first).
        for name in dir(pynvml):
            if name.startswith("nvml") and isinstance(getattr(pynvml, name), types.FunctionType):
                impl = getattr(self, name, None) or self._unexpected(name)
                monkeypatch.setattr(pynvml, name, self._wrap(name, impl))

    # plumbing ----------------------------------------------------------------------------
    def _unexpected(self, name):
        def fn(*args, **kwargs):
            raise AssertionError(f"unexpected NVML call {name}")

        return fn

    def _wrap(self, name, fn):
        def wrapped(*args, **kwargs):
            handle = args[0] if args and isinstance(args[0], Handle) else None
            self.calls.append((name, handle))
            if handle is not None:
                gpu = self.gpus[handle.index]
                if handle.index in self.lost:
                    raise pynvml.NVMLError(LOST)
                if gpu["lost_after"] == name:
                    self.lost.add(handle.index)
                    raise pynvml.NVMLError(LOST)
                if name in gpu["errors"]:
                    raise pynvml.NVMLError(gpu["errors"][name])
            return fn(*args, **kwargs)

        return wrapped

    def g(self, handle: Handle) -> dict:
        return self.gpus[handle.index]

    def count(self, name: str, index: int | None = None) -> int:
        return sum(
            1 for n, h in self.calls if n == name and (index is None or (h is not None and h.index == index))
        )

    # system ------------------------------------------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetDriverBranch(self):
        if self.driver_branch is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = pynvml.c_nvmlSystemDriverBranchInfo_v1_t()
        info.version = pynvml.SystemDriverBranchInfo_v1
        info.branch = self.driver_branch.encode()
        return info

    def nvmlSystemGetNVMLVersion(self):
        return "13.580.159.04"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return Handle(index)

    # identity ----------------------------------------------------------------------------
    def nvmlDeviceGetPciInfo_v3(self, h):
        info = pynvml.nvmlPciInfo_t()
        info.busId = self.g(h)["bus"].encode()
        return info

    def nvmlDeviceGetUUID(self, h):
        if isinstance(h, tuple):  # a MIG device handle
            return f"MIG-{h[1]:08x}-0000-0000-0000-000000000000"
        return self.g(h)["uuid"]

    def nvmlDeviceGetName(self, h):
        return self.g(h)["name"]

    def nvmlDeviceGetSerial(self, h):
        return self.g(h)["serial"]

    def nvmlDeviceGetMinorNumber(self, h):
        return h.index  # the device file /dev/nvidia<N>: as a node enumerates them, in index order

    def nvmlDeviceGetBoardPartNumber(self, h):
        return self.g(h)["part"]

    def nvmlDeviceGetVbiosVersion(self, h):
        return self.g(h)["vbios"]

    def nvmlDeviceGetInforomImageVersion(self, h):
        return self.g(h)["inforom"]

    def nvmlDeviceGetInforomVersion(self, h, obj):
        assert obj == pynvml.NVML_INFOROM_OEM
        return self.g(h)["inforom_oem"]

    def nvmlDeviceGetGspFirmwareVersion(self, h):
        return self.g(h)["gsp"]

    def nvmlDeviceGetPersistenceMode(self, h):
        return self.g(h)["persistence"]

    def nvmlDeviceGetComputeMode(self, h):
        return self.g(h)["compute_mode"]

    # power, thermal, clocks ---------------------------------------------------------------
    def nvmlDeviceGetPowerUsage(self, h):
        return self.g(h)["power"]

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self.g(h)["limit"]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return self.g(h)["default_limit"]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h):
        return list(self.g(h)["constraints"])

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self.g(h)["enforced"]

    def nvmlDeviceGetTemperatureV(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self.g(h)["temp"]

    def nvmlDeviceGetTemperatureThreshold(self, h, which):
        return self.g(h)["thresholds"][which]

    def nvmlDeviceGetClockInfo(self, h, clock):
        return self.g(h)["clocks"][clock]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self.g(h)["max_clocks"][clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.g(h)["events"]

    def nvmlDeviceGetUtilizationRates(self, h):
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = self.g(h)["util"]
        return util

    # memory, ECC, counters ----------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        total, used, reserved = self.g(h)["mem"]
        if version:
            mem = pynvml.c_nvmlMemory_v2_t()
            mem.total, mem.used, mem.reserved, mem.free = total, used, reserved, total - used - reserved
        else:
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = total, used + reserved, total - used - reserved
        return mem

    def nvmlDeviceGetEccMode(self, h):
        return list(self.g(h)["ecc_mode"])

    def nvmlDeviceGetFieldValues(self, h, ids):
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        table = self.g(h)["fields"]
        for i, key in enumerate(ids):
            # a (field id, scopeId) pair, as pynvml takes it for per-link fields
            fid, scope = key if isinstance(key, tuple) else (key, 0)
            ret, vtype, val = table.get(key, (NS, 0, 0))
            values[i].fieldId = fid
            values[i].scopeId = scope
            values[i].nvmlReturn = ret
            values[i].valueType = vtype
            if vtype == 0:
                values[i].value.dVal = float(val)
            else:
                values[i].value.ullVal = int(val)
        return values

    def nvmlDeviceGetTotalEccErrors(self, h, err_type, counter):
        return 0

    def nvmlDeviceGetRemappedRows(self, h):
        return (2, 0, 0, 0)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return 0

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return 0

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return []

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self.g(h)["pcie"]["gen"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.g(h)["pcie"]["gen_max"]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self.g(h)["pcie"]["width"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self.g(h)["pcie"]["width_max"]

    # MIG, processes ------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h):
        return list(self.g(h)["mig_mode"])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        if isinstance(h, tuple):  # MIG device: (parent index, device index)
            dev = self.gpus[h[0]]["mig"]["devices"][h[1]]
            return [pynvml.nvmlFriendlyObject({"pid": p, "usedGpuMemory": MIB}) for p in dev["pids"]]
        return [pynvml.nvmlFriendlyObject(p) for p in self.g(h)["processes"]]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, h, profile):
        profiles = self.g(h)["mig"]["profiles"]
        if profile not in profiles:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        pid, name = profiles[profile]
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id = pid
        info.name = name
        info.instanceCount = 7
        return info

    def nvmlDeviceGetGpuInstances(self, h, profile_id, handles, count_ref):
        gis = [gi for gi in self.g(h)["mig"]["gis"] if gi["profile_id"] == profile_id]
        for i, gi in enumerate(gis):
            handles[i] = ctypes.cast(ctypes.c_void_p(1000 * h.index + gi["id"]), pynvml.c_nvmlGpuInstance_t)
        count_ref._obj.value = len(gis)

    def nvmlGpuInstanceGetInfo(self, gi_handle):
        raw = ctypes.cast(gi_handle, ctypes.c_void_p).value
        parent, gi_id = divmod(raw, 1000)
        gi = next(g for g in self.gpus[parent]["mig"]["gis"] if g["id"] == gi_id)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id = gi["id"]
        info.profileId = gi["profile_id"]
        return info

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, index):
        if index >= len(self.g(h)["mig"]["devices"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return (h.index, index)

    def nvmlDeviceGetGpuInstanceId(self, mig):
        return self.gpus[mig[0]]["mig"]["devices"][mig[1]]["gi"]

    def nvmlDeviceGetComputeInstanceId(self, mig):
        return self.gpus[mig[0]]["mig"]["devices"][mig[1]]["ci"]

    # NVLink ------------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self.g(h)["nvlinks"]
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if links[link][0] else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        info = pynvml.nvmlPciInfo_t()
        info.busId = self.g(h)["nvlinks"][link][1].encode()
        return info

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self.g(h)["nvlinks"][link][2]

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return self.g(h)["link_errors"].get((link, counter), 0)

    # placement ---------------------------------------------------------------------------
    def nvmlDeviceGetGpuFabricInfoV(self, h, info_ref):
        info = info_ref._obj
        info.state, info.status = self.g(h)["fabric"]

    def nvmlDeviceGetCpuAffinity(self, h, words):
        arr = (ctypes.c_ulonglong * words)()
        for i, word in enumerate(self.g(h)["affinity"][:words]):
            arr[i] = word
        return arr

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        key = (min(a.index, b.index), max(a.index, b.index))
        return self.topology.get(key, pynvml.NVML_TOPOLOGY_SYSTEM)


@pytest.fixture(autouse=True)
def _no_sysfs(tmp_path, monkeypatch):
    """No host sysfs/procfs leaks into the tests: both point at empty folders."""
    monkeypatch.setattr(nvml_topology, "SYSFS_PCI", str(tmp_path / "sys"))
    monkeypatch.setattr(nvml_snapshot, "PROC", str(tmp_path / "proc"))
    monkeypatch.delenv("FLEETOPS_NVML_TRACE", raising=False)


def collect(fake: FakeNvml) -> model.Node:
    node = model.Node(hostname="h200-vm", backend="nvml", collected_at=1_800_000_000.0)
    nvml.collect_into(node)
    return node


def assert_no_unexpected(node: model.Node) -> None:
    for gpu in node.gpus:
        bad = {k: v for k, v in gpu.unavailable.items() if "unexpected" in v or v == "not collected"}
        assert not bad, bad
        for link in gpu.nvlinks or []:
            assert not any("unexpected" in v for v in link.unavailable.values()), link


# --- the reference H200 VM ------------------------------------------------------------------


def test_reference_h200_vm(monkeypatch):
    fake = FakeNvml([h200()], monkeypatch)
    node = collect(fake)
    assert_no_unexpected(node)
    assert node.driver_version == "580.159.04"
    assert node.cuda_driver_version == "13.0"
    assert node.nvml_version == "13.580.159.04"
    assert node.gpu_count == 1 and len(node.gpus) == 1
    g = node.gpus[0]
    assert (g.index, g.uuid, g.bus_id) == (0, "GPU-ed2c431b-4811-46fb-82e0-deeead4dc641", "0000:00:06.0")
    assert g.name == "NVIDIA H200"
    assert g.serial == "1654024197156"
    assert g.board_part_number == "692-2G520-0282-000"
    assert g.vbios_version == "96.00.A5.00.1A"
    assert g.inforom_image == "G520.0282.02.02"
    assert g.inforom_oem == "2.1"
    assert g.gsp_firmware == "580.159.04"  # bytes from the binding, text in the snapshot
    assert g.persistence_mode is True
    assert g.compute_mode == "Default"
    assert g.power_draw_w == 77.662
    assert g.power_limit_w == 700.0 and isinstance(g.power_limit_w, float)
    assert (g.power_default_limit_w, g.power_min_limit_w, g.power_max_limit_w) == (700.0, 200.0, 700.0)
    assert g.power_enforced_limit_w == 700.0
    assert (g.temp_gpu_c, g.temp_memory_c) == (36.0, 36.0)
    assert (g.temp_slowdown_c, g.temp_shutdown_c, g.temp_memory_max_c) == (89.0, 95.0, 95.0)
    assert (g.clock_sm_mhz, g.clock_sm_max_mhz, g.clock_mem_mhz, g.clock_mem_max_mhz) == (
        345,
        1980,
        3201,
        3201,
    )
    assert g.clocks_event_mask == 1 and g.clocks_event_reasons == ["gpu_idle"]
    assert (g.utilization_gpu_pct, g.utilization_mem_pct) == (0, 0)
    assert (g.memory_used_mib, g.memory_total_mib) == (0, 143771)
    assert (g.ecc_mode_current, g.ecc_mode_pending) == (True, True)
    assert (g.ecc_corrected_volatile, g.ecc_uncorrected_volatile) == (0, 0)
    assert (g.ecc_corrected_aggregate, g.ecc_uncorrected_aggregate) == (289, 0)
    assert g.remapped_rows_corrected == 2
    assert g.remapped_rows_uncorrected == 0
    assert g.remapped_rows_pending is False and g.remapped_rows_failure is False
    for key in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
        assert getattr(g, key) is None and g.unavailable[key] == "NotSupported"
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.pcie_replay_counter == 0
    assert g.nvlinks is None and g.unavailable["nvlinks"] == "NotSupported"
    assert g.nvlinks_up is None
    assert (g.mig_mode_current, g.mig_mode_pending) == (False, False)
    assert g.mig_instances is None and g.unavailable["mig_instances"] == "MIG disabled"
    assert g.processes == []
    assert g.fabric_state is None and g.unavailable["fabric_state"] == "NotSupported"
    assert g.fabric_status is None and g.unavailable["fabric_status"] == "NotSupported"
    assert g.cpu_affinity == "0-15"  # no sysfs here: NVML's mask
    assert g.numa_node is None and g.unavailable["numa_node"] == "NotSupported"
    assert g.recovery_action == "none"

    topo = node.topology
    assert topo.gpus == ["0000:00:06.0"]
    assert topo.links == [["X"]] and topo.nvlink_counts == [[0]]
    assert topo.numa == {"0000:00:06.0": None}

    # the rules: one FieldValues call, NVLink asked once, the slow checksum never
    assert fake.count("nvmlDeviceGetFieldValues") == 1
    assert fake.count("nvmlDeviceGetNvLinkState") == 1
    assert fake.count("nvmlDeviceGetNvLinkRemotePciInfo") == 0
    assert fake.count("nvmlDeviceGetNvLinkErrorCounter") == 0
    assert fake.count("nvmlDeviceGetInforomConfigurationChecksum") == 0
    assert fake.count("nvmlDeviceGetRemappedRows") == 0  # the fields answered
    assert fake.count("nvmlDeviceGetTotalEccErrors") == 0
    assert fake.count("nvmlDeviceGetRetiredPages") == 0  # pending status said NotSupported
    assert fake.count("nvmlShutdown") == 0  # left to the process exit


def test_the_driver_branch_is_read_once_per_snapshot_at_node_level(monkeypatch):
    fake = FakeNvml([h200(0), h200(1, "00000000:2A:00.0")], monkeypatch)
    node = collect(fake)
    assert node.driver_branch == DRIVER_BRANCH and "driver_branch" not in node.unavailable
    assert fake.count("nvmlSystemGetDriverBranch") == 1


def test_a_driver_without_the_branch_call_fails_nothing(monkeypatch):
    """Drivers before the call answer FunctionNotFound: the branch is unknown, the rest is read."""
    fake = FakeNvml([h200()], monkeypatch, driver_branch=None)
    node = collect(fake)
    assert node.driver_branch is None and node.unavailable == {"driver_branch": "FunctionNotFound"}
    assert node.driver_version == "580.159.04" and node.errors == []
    assert len(node.gpus) == 1 and node.gpus[0].power_limit_w == 700.0


def test_a_binding_without_the_branch_call_fails_nothing(monkeypatch):
    fake = FakeNvml([h200()], monkeypatch)
    monkeypatch.delattr(pynvml, "nvmlSystemGetDriverBranch")
    node = collect(fake)
    assert node.driver_branch is None
    assert node.unavailable == {"driver_branch": "nvmlSystemGetDriverBranch not in this nvidia-ml-py"}
    assert node.driver_version == "580.159.04" and node.errors == [] and len(node.gpus) == 1


def test_round_trips_through_the_schema(monkeypatch):
    FakeNvml([h200()], monkeypatch)
    node = collect(None)
    again = model.node_from_dict(model.to_dict(node))
    assert again == node
    assert model.node_from_json(model.node_to_json(node)) == node
    json.dumps(model.to_dict(node))  # plain JSON types only


def test_every_none_field_has_a_reason(monkeypatch):
    FakeNvml([h200()], monkeypatch)
    node = collect(None)
    for gpu in node.gpus:
        for name in model.Gpu.__dataclass_fields__:
            if getattr(gpu, name) is None:
                assert name in gpu.unavailable, name


def test_sysfs_gives_affinity_and_numa_without_nvml(monkeypatch, tmp_path):
    dev = tmp_path / "sys" / "0000:00:06.0"
    dev.mkdir(parents=True)
    (dev / "local_cpulist").write_text("0-55,112-167\n")
    (dev / "numa_node").write_text("1\n")
    fake = FakeNvml([h200()], monkeypatch)
    node = collect(fake)
    g = node.gpus[0]
    assert g.cpu_affinity == "0-55,112-167"
    assert g.numa_node == 1 and "numa_node" not in g.unavailable
    assert node.topology.numa == {"0000:00:06.0": 1}
    assert fake.count("nvmlDeviceGetCpuAffinity") == 0


def test_sysfs_numa_minus_one_is_unknown(monkeypatch, tmp_path):
    dev = tmp_path / "sys" / "0000:00:06.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("-1\n")  # what the reference VM's sysfs says
    FakeNvml([h200()], monkeypatch)
    g = collect(None).gpus[0]
    assert g.numa_node is None and g.unavailable["numa_node"] == "NotSupported"


def test_process_names_come_from_proc(monkeypatch, tmp_path):
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "comm").write_text("python3\n")
    gpu = h200()
    gpu["processes"] = [{"pid": 4242, "usedGpuMemory": 20480 * MIB}, {"pid": 7, "usedGpuMemory": None}]
    FakeNvml([gpu], monkeypatch)
    g = collect(None).gpus[0]
    assert g.processes == [
        model.GpuProcess(pid=4242, name="python3", used_memory_mib=20480),
        model.GpuProcess(pid=7, name=None, used_memory_mib=None),
    ]


def test_a_process_user_is_read_from_proc_and_a_vanished_process_has_none(monkeypatch, tmp_path):
    """The user is the name of the real uid in /proc/PID/status (the uid where it has no name);
    a process that ended between NVML's list and the read has no /proc entry: no user, no error."""
    import pwd

    for pid, uid in ((4242, 0), (4343, 4_242_421)):
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "status").write_text(
            f"Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )
    with pytest.raises(KeyError):
        pwd.getpwuid(4_242_421)
    gpu = h200()
    gpu["processes"] = [
        {"pid": 4242, "usedGpuMemory": 1024 * MIB},
        {"pid": 4343, "usedGpuMemory": 1024 * MIB},
        {"pid": 7, "usedGpuMemory": 1024 * MIB},  # gone: no /proc/7
    ]
    FakeNvml([gpu], monkeypatch)
    procs = collect(None).gpus[0].processes
    assert procs is not None
    assert [(p.pid, p.user) for p in procs] == [(4242, "root"), (4343, "4242421"), (7, None)]


def test_a_process_in_a_mig_instance_carries_its_instance_ids(monkeypatch, tmp_path):
    # NVML's process info under MIG names the GPU and compute instance; outside MIG it fills 0xFFFFFFFF
    gpu = h200()
    gpu["processes"] = [
        {"pid": 4242, "usedGpuMemory": 1024 * MIB, "gpuInstanceId": 2, "computeInstanceId": 0},
        {"pid": 7, "usedGpuMemory": None, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF},
    ]
    FakeNvml([gpu], monkeypatch)
    procs = collect(None).gpus[0].processes
    assert procs is not None
    assert [(p.pid, p.gpu_instance_id, p.compute_instance_id) for p in procs] == [(4242, 2, 0), (7, None, None)]


@pytest.mark.parametrize(
    "fabric, state, status, reason",
    [
        ((0, 0), "not_supported", None, "NotSupported"),  # what the real H200 VM answered
        ((3, 0), "completed", "success", None),
        ((2, pynvml.NVML_ERROR_TIMEOUT), "in_progress", "Timeout", None),
    ],
)
def test_fabric_states(monkeypatch, fabric, state, status, reason):
    gpu = h200()
    del gpu["errors"]["nvmlDeviceGetGpuFabricInfoV"]
    gpu["fabric"] = fabric
    FakeNvml([gpu], monkeypatch)
    g = collect(None).gpus[0]
    assert (g.fabric_state, g.fabric_status) == (state, status)
    assert g.unavailable.get("fabric_status") == reason
    assert "fabric_state" not in g.unavailable


# --- failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, reason",
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "LibraryNotFound"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "DriverNotLoaded"),
    ],
)
def test_nvml_init_failure_says_nvml_is_unavailable(monkeypatch, code, reason):
    FakeNvml([h200()], monkeypatch, init_error=code)
    with pytest.raises(nvml.NvmlUnavailable, match=reason):
        collect(None)


def test_agent_turns_init_failure_into_json_error(monkeypatch, capsys):
    FakeNvml([h200()], monkeypatch, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    from fleetops.agent import main

    assert main.main(["collect", "--backend", "nvml"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = json.loads(captured.err)
    assert err["kind"] == "collect" and "DriverNotLoaded" in err["error"]


def test_gpu_lost_mid_collection(monkeypatch):
    good, bad = h200(0, "00000000:18:00.0"), h200(1, "00000000:2A:00.0")
    bad["lost_after"] = "nvmlDeviceGetClockInfo"
    fake = FakeNvml([good, bad], monkeypatch)
    node = collect(fake)
    assert [g.bus_id for g in node.gpus] == ["0000:18:00.0", "0000:2a:00.0"]
    ok, lost = node.gpus
    assert ok.clock_sm_mhz == 345 and not any(v == "GpuIsLost" for v in ok.unavailable.values())
    # read before the loss: kept
    assert lost.power_limit_w == 700.0 and lost.vbios_version == "96.00.A5.00.1A"
    # from the loss on: None with the reason, and no more NVML calls for that GPU
    for key in (
        "clock_sm_mhz",
        "clock_mem_mhz",
        "memory_total_mib",
        "ecc_mode_current",
        "remapped_rows_corrected",
        "nvlinks",
        "processes",
        "mig_mode_current",
        "numa_node",
        "recovery_action",
        "pcie_gen_current",
    ):
        assert getattr(lost, key) is None and lost.unavailable[key] == "GpuIsLost", key
    assert fake.count("nvmlDeviceGetClockInfo", 1) == 1
    assert fake.count("nvmlDeviceGetFieldValues", 1) == 0
    assert fake.count("nvmlDeviceGetMemoryInfo", 1) == 0
    # the pair's PCIe path is not asked of a lost GPU
    assert node.topology.links == [["X", None], [None, "X"]]
    assert node.topology.unavailable == {"0000:18:00.0|0000:2a:00.0": "GpuIsLost"}
    assert fake.count("nvmlDeviceGetTopologyCommonAncestor") == 0
    assert model.node_from_dict(model.to_dict(node)) == node


def test_gpu_lost_in_field_values(monkeypatch):
    gpu = h200()
    gpu["fields"] = {fid: (LOST, 0, 0) for fid in gpu["fields"]}
    fake = FakeNvml([gpu], monkeypatch)
    g = collect(fake).gpus[0]
    assert g.temp_memory_c is None and g.unavailable["temp_memory_c"] == "GpuIsLost"
    assert g.unavailable["pcie_gen_current"] == "GpuIsLost"
    assert fake.count("nvmlDeviceGetRemappedRows") == 0


def test_gpu_lost_before_its_uuid_keeps_its_index_named_by_its_bus_id(monkeypatch):
    gpu = h200()
    gpu["errors"]["nvmlDeviceGetUUID"] = LOST
    fake = FakeNvml([gpu | {"bus": "00000000:2a:00.0"}, h200(1, "00000000:3a:00.0")], monkeypatch)
    node = collect(fake)
    assert node.gpu_count == 2 and node.errors == []
    lost, ok = node.gpus
    assert (lost.index, lost.bus_id, lost.uuid) == (0, "0000:2a:00.0", "")
    assert model.gpu_lost(lost) and lost.unavailable["uuid"] == "GpuIsLost" and lost.name is None
    assert fake.count("nvmlDeviceGetName", 0) == 0  # no call after the loss
    assert (ok.index, ok.bus_id, ok.clock_sm_mhz) == (1, "0000:3a:00.0", 345) and not model.gpu_lost(ok)
    assert model.node_from_dict(model.to_dict(node)) == node


def test_gpu_without_a_bus_id_goes_to_errors_and_the_others_keep_their_indices(monkeypatch):
    gpu = h200()
    gpu["errors"]["nvmlDeviceGetPciInfo_v3"] = LOST
    FakeNvml([gpu, h200(1, "00000000:3a:00.0")], monkeypatch)
    node = collect(None)
    assert node.gpu_count == 2 and [(g.index, g.bus_id) for g in node.gpus] == [(1, "0000:3a:00.0")]
    assert node.errors == ["GPU index 0: PCI bus id unreadable: GpuIsLost"]
    assert model.gpu_tally(node, []) == (1, 2)


def test_other_reasons_are_named(monkeypatch):
    gpu = h200()
    gpu["errors"]["nvmlDeviceGetPowerManagementDefaultLimit"] = pynvml.NVML_ERROR_NO_PERMISSION
    gpu["errors"]["nvmlDeviceGetEccMode"] = pynvml.NVML_ERROR_UNKNOWN
    gpu["fields"][pynvml.NVML_FI_DEV_MEMORY_TEMP] = (pynvml.NVML_ERROR_NO_PERMISSION, 0, 0)
    FakeNvml([gpu], monkeypatch)
    g = collect(None).gpus[0]
    assert g.unavailable["power_default_limit_w"] == "NoPermission"
    assert g.unavailable["ecc_mode_current"] == g.unavailable["ecc_mode_pending"] == "Unknown"
    assert g.unavailable["temp_memory_c"] == "NoPermission"
    assert g.power_limit_w == 700.0  # one failure does not stop the rest


def test_field_call_failure_falls_back_to_getters(monkeypatch):
    gpu = h200()
    gpu["errors"]["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    fake = FakeNvml([gpu], monkeypatch)
    g = collect(fake).gpus[0]
    assert g.remapped_rows_corrected == 2 and "remapped_rows_corrected" not in g.unavailable
    assert g.ecc_uncorrected_aggregate == 0 and g.pcie_replay_counter == 0
    assert g.unavailable["temp_memory_c"] == "FunctionNotFound"  # a field with no getter
    assert fake.count("nvmlDeviceGetRemappedRows") == 1
    assert fake.count("nvmlDeviceGetTotalEccErrors") == 4
    # no link count from the fields: NVLink is walked until link 0 says NotSupported
    assert g.unavailable["nvlinks"] == "NotSupported"


# --- NVLink and topology ------------------------------------------------------------------------

SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
HGX = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0"]


def hgx_gpu(index: int, down: tuple[int, ...] = ()) -> dict:
    gpu = h200(index, HGX[index])
    gpu["errors"] = {k: v for k, v in gpu["errors"].items() if "NvLink" not in k}
    gpu["nvlinks"] = [
        (link not in down, f"00000000:{5 + link // 3:02X}:00.{link % 3}", SWITCH) for link in range(18)
    ]
    fields = gpu["fields"]
    fields[pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT] = (0, 1, 18)
    for fid in (
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    ):
        fields[fid] = (0, 3, 0)
    for link in range(18):  # KiB since the driver loaded, distinct per link and direction
        fields[(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link)] = (0, 3, 1_000_000 * (index + 1) + link)
        fields[(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)] = (0, 3, 2_000_000 * (index + 1) + link)
    return gpu


def test_nvswitch_node_is_nv18_without_per_link_counter_calls(monkeypatch):
    fake = FakeNvml([hgx_gpu(i) for i in range(4)], monkeypatch)
    node = collect(fake)
    assert_no_unexpected(node)
    g = node.gpus[0]
    assert len(g.nvlinks) == 18 and g.nvlinks_up == 18
    link = g.nvlinks[4]
    assert (link.link, link.state, link.remote_bus_id, link.remote_type) == (
        4,
        "up",
        "0000:06:00.1",
        "switch",
    )
    assert (link.crc_errors, link.replay_errors, link.recovery_errors) == (0, 0, 0)
    assert fake.count("nvmlDeviceGetNvLinkState") == 4 * 18  # the link count, not NVML_NVLINK_MAX_LINKS
    assert fake.count("nvmlDeviceGetNvLinkErrorCounter") == 0  # zero totals
    topo = node.topology
    assert topo.gpus == ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
    assert topo.links[0] == ["X", "NV18", "NV18", "NV18"]
    assert topo.nvlink_counts[1] == [18, 0, 18, 18]
    assert fake.count("nvmlDeviceGetTopologyCommonAncestor") == 0  # NVLink pairs need no PCIe path
    assert model.node_from_dict(model.to_dict(node)) == node


def test_nvlink_traffic_counters_come_from_one_field_call_per_gpu(monkeypatch):
    gpus = [hgx_gpu(0, down=(3,)), hgx_gpu(1)]
    gpus[1]["fields"][(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 7)] = (pynvml.NVML_ERROR_NO_PERMISSION, 3, 0)
    fake = FakeNvml(gpus, monkeypatch)
    node = collect(fake)
    a, b = node.gpus
    assert (a.nvlinks[4].tx_kib, a.nvlinks[4].rx_kib) == (1_000_004, 2_000_004)
    assert (a.nvlinks[3].tx_kib, a.nvlinks[3].rx_kib) == (1_000_003, 2_000_003)  # a down link still counts
    assert (b.nvlinks[17].tx_kib, b.nvlinks[17].rx_kib) == (2_000_017, 4_000_017)
    assert b.nvlinks[7].rx_kib is None and b.nvlinks[7].unavailable["rx_kib"] == "NoPermission"
    assert b.nvlinks[7].tx_kib == 2_000_007
    # the GPU's scalar fields, then every link's TX and RX: two field calls per GPU in all
    assert fake.count("nvmlDeviceGetFieldValues", 0) == fake.count("nvmlDeviceGetFieldValues", 1) == 2
    assert model.node_from_dict(model.to_dict(node)) == node


def test_per_link_error_fields_answer_in_the_same_call_and_the_getter_is_not_asked(monkeypatch):
    gpu = hgx_gpu(0)
    gpu["fields"][pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] = (0, 3, 7)
    for link in range(18):
        for fid in (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY):
            gpu["fields"][(fid, link)] = (0, 3, 7 if (fid, link) == (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 2) else 0)
    fake = FakeNvml([gpu], monkeypatch)
    g = collect(fake).gpus[0]
    assert [lk.crc_errors for lk in g.nvlinks] == [0, 0, 7] + [0] * 15
    assert g.nvlinks[2].replay_errors == 0 and g.nvlinks[2].recovery_errors == 0
    # the daemon's ring samples these same fields: no getter, and the same counters
    assert fake.count("nvmlDeviceGetNvLinkErrorCounter") == 0
    assert fake.count("nvmlDeviceGetFieldValues") == 2


def test_nvlink_traffic_unreadable_names_the_reason_on_every_link(monkeypatch):
    gpu = hgx_gpu(0)
    fake = FakeNvml([gpu], monkeypatch)
    real = fake.nvmlDeviceGetFieldValues

    def scoped_fails(h, ids):
        if any(isinstance(i, tuple) for i in ids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real(h, ids)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", scoped_fails)
    g = collect(fake).gpus[0]
    assert all(lk.tx_kib is None and lk.unavailable["tx_kib"] == "Unknown" for lk in g.nvlinks)
    assert all(lk.rx_kib is None and lk.unavailable["rx_kib"] == "Unknown" for lk in g.nvlinks)
    assert g.nvlinks_up == 18 and g.temp_memory_c == 36.0  # the rest of the GPU is read as usual


def test_nvlink_down_and_crc_counts(monkeypatch):
    gpus = [hgx_gpu(0, down=(3,)), hgx_gpu(1)]
    gpus[0]["fields"][pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL] = (0, 3, 5012)
    gpus[0]["link_errors"] = {(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 5012}
    fake = FakeNvml(gpus, monkeypatch)
    node = collect(fake)
    g = node.gpus[0]
    assert g.nvlinks_up == 17
    down = g.nvlinks[3]
    assert (
        down.state == "down"
        and down.remote_bus_id is None
        and down.unavailable["remote_bus_id"] == "link down"
    )
    assert g.nvlinks[0].crc_errors == 5012 and g.nvlinks[1].crc_errors == 0
    assert g.nvlinks[0].replay_errors == 0
    assert fake.count("nvmlDeviceGetNvLinkErrorCounter", 0) == 18  # only the non-zero total's counter
    assert fake.count("nvmlDeviceGetNvLinkErrorCounter", 1) == 0
    assert node.topology.links[0][1] == "NV17"  # min of the two GPUs' up links to switches


def test_direct_nvlink_pairs_and_pcie_levels(monkeypatch):
    a, b, c = h200(0, HGX[0]), h200(1, HGX[1]), h200(2, HGX[2])
    for gpu in (a, b, c):
        gpu["errors"] = {k: v for k, v in gpu["errors"].items() if "NvLink" not in k}
        gpu["fields"][pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT] = (0, 1, 4)
    a["nvlinks"] = [(True, HGX[1], GPU)] * 4
    b["nvlinks"] = [(True, HGX[0], GPU)] * 4
    c["nvlinks"] = [(False, "", GPU)] * 4
    fake = FakeNvml([a, b, c], monkeypatch)
    fake.topology = {(0, 2): pynvml.NVML_TOPOLOGY_NODE, (1, 2): pynvml.NVML_TOPOLOGY_HOSTBRIDGE}
    node = collect(fake)
    assert node.topology.links == [["X", "NV4", "NODE"], ["NV4", "X", "PHB"], ["NODE", "PHB", "X"]]
    assert node.topology.nvlink_counts == [[0, 4, 0], [4, 0, 0], [0, 0, 0]]
    assert fake.count("nvmlDeviceGetTopologyCommonAncestor") == 2


def test_pcie_only_gpus_map_every_level(monkeypatch):
    gpus = [h200(i, f"00000000:{0x18 + i:02X}:00.0") for i in range(6)]
    fake = FakeNvml(gpus, monkeypatch)
    levels = [
        pynvml.NVML_TOPOLOGY_INTERNAL,
        pynvml.NVML_TOPOLOGY_SINGLE,
        pynvml.NVML_TOPOLOGY_MULTIPLE,
        pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
        pynvml.NVML_TOPOLOGY_NODE,
        pynvml.NVML_TOPOLOGY_SYSTEM,
    ]
    fake.topology = {(0, j): level for j, level in enumerate(levels) if j}
    node = collect(fake)
    assert node.topology.links[0] == ["X", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert node.topology.nvlink_counts[0] == [0, None, None, None, None, None]  # NVLink unknown


# --- MIG ----------------------------------------------------------------------------------------------


def test_mig_instances_with_profiles_and_use(monkeypatch):
    gpu = h200()
    gpu["mig_mode"] = [1, 1]
    gpu["mig"] = {
        "profiles": {0: (19, "MIG 1g.18gb"), 4: (0, "MIG 7g.141gb"), 2: (9, "MIG 3g.71gb")},
        "gis": [{"id": 3, "profile_id": 9}, {"id": 9, "profile_id": 19}, {"id": 10, "profile_id": 19}],
        "devices": [{"gi": 3, "ci": 0, "pids": [999]}, {"gi": 9, "ci": 0, "pids": []}],
    }
    FakeNvml([gpu], monkeypatch)
    g = collect(None).gpus[0]
    assert (g.mig_mode_current, g.mig_mode_pending) == (True, True)
    assert g.mig_instances == [
        model.MigInstance(3, 0, "3g.71gb", "MIG-00000000-0000-0000-0000-000000000000", True),
        model.MigInstance(9, 0, "1g.18gb", "MIG-00000001-0000-0000-0000-000000000000", False),
        model.MigInstance(10, None, "1g.18gb", None, False),
    ]
    assert "mig_instances" not in g.unavailable


# --- helpers ----------------------------------------------------------------------------------------


def test_cpu_list_and_cuda_version():
    assert nvml.cpu_list([0xFFFF]) == "0-15"
    assert nvml.cpu_list([0x1, 0x3]) == "0,64-65"
    assert nvml.cpu_list([0]) == ""
    assert nvml.cuda_version(13000) == "13.0"
    assert nvml.cuda_version(12080) == "12.8"


def test_importing_the_backend_does_not_import_pynvml():
    import subprocess
    import sys

    code = "import sys, fleetops.gpu.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_collector_bug_is_an_error_not_a_crash(monkeypatch):
    gpu = h200()
    gpu["power"] = "not a number"  # makes the watts conversion raise TypeError
    FakeNvml([gpu], monkeypatch)
    node = collect(None)
    g = node.gpus[0]
    assert g.power_draw_w is None and g.unavailable["power_draw_w"] == "not collected"
    assert g.clock_sm_mhz == 345  # the other sections still ran
    assert len(node.errors) == 1 and node.errors[0].startswith("GPU 0 (0000:00:06.0): TypeError")
