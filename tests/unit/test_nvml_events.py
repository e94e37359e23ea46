"""NVML's XID events path on the fake NVML's event API: the fake as strict as NVML, the daemon's
events loop surviving any error and registering again, a lost GPU's event keeping its bus id, a
quiesced daemon holding no event set, and both sources through a real daemon process counted
once with the printk clock 30 s off wall time."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fake_nvml
import polling
import pytest

from fleetops.agent.serve import client, exposition
from fleetops.gpu import nvml as gpu_nvml
from fleetops.gpu.nvml.access import NvmlAccess

BUS = ["0000:18:00.0", "0000:19:00.0"]  # the fake's two GPUs


def _until(what: str, fn: Callable[[], Any], deadline_s: float = 30.0) -> Any:
    return polling.until(what, fn, deadline_s, step_s=0.05)


@pytest.fixture()
def control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "control.json"
    path.write_text(json.dumps({"mode": "ok", "temp": 40}))
    monkeypatch.setenv("FAKE_NVML_CONTROL", str(path))
    monkeypatch.setenv(gpu_nvml.NVML_MODULE_ENV, "fake_nvml")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)  # put back after the test
    fake_nvml.fresh()
    yield path
    fake_nvml.fresh()


def _edit(path: Path, **changes: Any) -> None:
    c = json.loads(path.read_text())
    c.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del c[key]
    path.with_suffix(".tmp").write_text(json.dumps(c))
    path.with_suffix(".tmp").replace(path)


class Loop:
    """The daemon's events loop on its own thread, as ``NodeService.start_events`` runs it."""

    def __init__(self, backend: NvmlAccess, on_xid: Callable[[str | None, int], None] | None = None) -> None:
        self.backend = backend
        self.got: list[tuple[str | None, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=backend.events, args=(on_xid or self.record, self.stop), daemon=True)

    def record(self, bus: str | None, code: int) -> None:
        self.got.append((bus, code))

    def __enter__(self) -> Loop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def _registered(backend: NvmlAccess, n: int) -> Callable[[], bool]:
    return lambda: backend.events_status()["registered"] == n


def test_the_fake_event_api_is_as_strict_as_nvml(control: Path) -> None:
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        fake_nvml.nvmlEventSetCreate()  # nothing before nvmlInit
    fake_nvml.nvmlInit()
    es = fake_nvml.nvmlEventSetCreate()
    fake_nvml.xid(str(control), 0, 13)  # before the GPU is registered: never delivered to this set
    with pytest.raises(fake_nvml.NVMLError_NotSupported):
        fake_nvml.nvmlDeviceRegisterEvents(0, 0x2, es)  # only XID events are raised by the fake
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlDeviceRegisterEvents(7, fake_nvml.nvmlEventTypeXidCriticalError, es)  # no such GPU
    fake_nvml.nvmlDeviceRegisterEvents(0, fake_nvml.nvmlEventTypeXidCriticalError, es)
    start = time.monotonic()
    with pytest.raises(fake_nvml.NVMLError_Timeout):
        fake_nvml.nvmlEventSetWait_v2(es, 200)
    assert time.monotonic() - start >= 0.2
    fake_nvml.xid(str(control), 1, 31)  # GPU 1 is not registered on this set
    fake_nvml.xid(str(control), 0, 43)
    data = fake_nvml.nvmlEventSetWait(es, 1000)
    assert (data.device, data.eventType, data.eventData) == (0, fake_nvml.nvmlEventTypeXidCriticalError, 43)
    with pytest.raises(fake_nvml.NVMLError_Timeout):
        fake_nvml.nvmlEventSetWait_v2(es, 0)  # each event once
    fake_nvml.nvmlEventSetFree(es)
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlEventSetWait_v2(es, 0)  # freed
    kept = fake_nvml.nvmlEventSetCreate()
    fake_nvml.nvmlShutdown()
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):
        fake_nvml.nvmlEventSetWait_v2(kept, 0)
    fake_nvml.nvmlInit()
    with pytest.raises(fake_nvml.NVMLError_InvalidArgument):
        fake_nvml.nvmlEventSetFree(kept)  # the sets ended with the last shutdown
    fake_nvml.nvmlShutdown()


def test_a_lost_gpu_answers_gpu_is_lost_to_every_query_but_its_xid_79_is_delivered(control: Path) -> None:
    fake_nvml.nvmlInit()
    es = fake_nvml.nvmlEventSetCreate()
    for gpu in (0, 1):
        fake_nvml.nvmlDeviceRegisterEvents(gpu, fake_nvml.nvmlEventTypeXidCriticalError, es)
    fake_nvml.fall_off_bus(str(control), 1)
    assert fake_nvml.nvmlDeviceGetHandleByIndex(1) == 1  # NVML keeps the handle
    for query in (lambda: fake_nvml.nvmlDeviceGetPciInfo(1), lambda: fake_nvml.nvmlDeviceGetUUID(1),
                  lambda: fake_nvml.nvmlDeviceGetTemperature(1, 0),
                  lambda: fake_nvml.nvmlDeviceRegisterEvents(1, fake_nvml.nvmlEventTypeXidCriticalError, es)):
        with pytest.raises(fake_nvml.NVMLError_GpuIsLost):
            query()
    assert fake_nvml.nvmlDeviceGetTemperature(0, 0) == 40  # the other GPU answers
    data = fake_nvml.nvmlEventSetWait_v2(es, 1000)
    assert (data.device, data.eventData) == (1, 79)
    fake_nvml.nvmlEventSetFree(es)
    fake_nvml.nvmlShutdown()


def test_a_lost_gpus_nvml_event_gets_its_bus_id_from_its_registered_handle(control: Path) -> None:
    backend = NvmlAccess()
    backend.light()
    with Loop(backend) as loop:
        _until("both GPUs registered", _registered(backend, 2))
        fake_nvml.fall_off_bus(str(control), 1)
        _until("the XID 79 event", lambda: loop.got)
        assert loop.got == [(BUS[1], 79)]  # its PCI query answers GpuIsLost; the handle's bus stands


def test_the_events_thread_survives_a_non_nvml_exception_and_registers_again(control: Path) -> None:
    backend = NvmlAccess()
    backend.light()
    got: list[tuple[str | None, int]] = []

    def on_xid(bus: str | None, code: int) -> None:
        got.append((bus, code))
        if code == 13:
            raise KeyError("not an NVML error")  # the book, a bug: whatever the callback raises

    with Loop(backend, on_xid):
        _until("both GPUs registered", _registered(backend, 2))
        fake_nvml.xid(str(control), 0, 13)
        _until("a second set registered after the backoff", lambda: backend.events_status()["sets"] == 2
               and backend.events_status()["registered"] == 2)
        status = backend.events_status()
        assert status["failures"] == 0 and status["error"] is None
        assert "KeyError" in status["last_failure"]
        assert len(fake_nvml._SETS) == 1  # the first set was freed
        fake_nvml.xid(str(control), 1, 43)
        _until("the next XID", lambda: len(got) == 2)
        assert got == [(BUS[0], 13), (BUS[1], 43)]
        fake_nvml.xid(str(control), 0, 13)
        _until("the callback raised again", lambda: len(got) == 3)
        start = time.monotonic()
        backend.release()  # a quiesce during the backoff: the set is freed already, nothing to wait for
        assert time.monotonic() - start < 2.0 and fake_nvml._SETS == {}
        backend.light()
        _until("a set registered after the resume", lambda: backend.events_status()["sets"] == 3
               and backend.events_status()["registered"] == 2)


def test_a_registration_that_keeps_failing_is_reported_then_registered_again(control: Path) -> None:
    _edit(control, register_error={"1": "Unknown"})
    backend = NvmlAccess()
    backend.light()
    with Loop(backend) as loop:
        status = _until("the failure reported", lambda: (lambda s: s if s["error"] else None)(backend.events_status()))
        assert status["registered"] == 1 and status["gpus"] == 2
        assert status["error"].startswith("NVML XID events down (3 failures in a row")
        assert status["error"].endswith(f"XID events not registered on {BUS[1]}: Unknown")
        assert exposition._reason_token(status["error"]) == "xid_events_down"  # the metrics' reason label
        fake_nvml.xid(str(control), 0, 31)  # GPU 0 is registered meanwhile
        _until("GPU 0's XID", lambda: loop.got == [(BUS[0], 31)])
        _edit(control, register_error=None)
        _until("GPU 1 registered on the same set", _registered(backend, 2), deadline_s=15)
        status = backend.events_status()
        assert status["error"] is None and status["failures"] == 0 and status["sets"] == 1
        fake_nvml.xid(str(control), 1, 48)
        _until("GPU 1's XID", lambda: loop.got == [(BUS[0], 31), (BUS[1], 48)])


def test_released_the_loop_holds_no_set_reports_nothing_and_registers_again_after(control: Path) -> None:
    _edit(control, register_error={"0": "Unknown", "1": "Unknown"})
    backend = NvmlAccess()
    backend.light()
    with Loop(backend) as loop:
        _until("the failure reported", lambda: backend.events_status()["error"])
        backend.release()  # the quiesce before a reset: NVML shut down
        assert backend.events_quiet.is_set() and fake_nvml._SETS == {}
        assert fake_nvml.holders(str(control)) == []
        time.sleep(1.0)
        status = backend.events_status()
        assert status["error"] is None and status["registered"] == 0 and fake_nvml._SETS == {}
        _edit(control, register_error=None)
        backend.light()  # resumed: NVML initialised again, new handles
        _until("registered again", _registered(backend, 2))
        fake_nvml.xid(str(control), 1, 94)
        _until("an XID after the resume", lambda: loop.got == [(BUS[1], 94)])


def test_a_reinit_with_more_gpus_registers_a_new_set_on_them(control: Path) -> None:
    """A partial init (a GPU not enumerated) and a re-init after it: the loop registers on the
    complete new list of handles, not only on what it found first."""
    _edit(control, lost=[1])
    backend = NvmlAccess()
    backend.light()
    assert [bus for _, bus, _ in backend.handles] == [BUS[0]]
    with Loop(backend) as loop:
        _until("GPU 0 registered", _registered(backend, 1))
        _edit(control, lost=None)  # the GPU is back (a reset)
        backend._drop()  # what the sampler does on Uninitialized; the next read initialises again
        backend.light()
        _until("both registered on a new set", lambda: _registered(backend, 2)() and backend.events_status()["sets"] == 2)
        fake_nvml.xid(str(control), 1, 13)
        _until("the returned GPU's XID", lambda: loop.got == [(BUS[1], 13)])


def test_both_sources_through_a_real_daemon_count_once_with_printk_30s_ahead(tmp_path: Path) -> None:
    """The NVML path end to end: the fake's events in a daemon process, the kernel log's records
    stamped 30 s ahead of wall time; each XID counted once, a lost GPU's too; a quiesce leaves no
    event set and no error, and the events come back after it."""
    from test_agent_serve import _ask_path, _nvml_daemon, _temps

    d, control, kmsg_file, sock = _nvml_daemon(tmp_path)
    seq = [0]

    def kernel(gpu: int, code: int) -> None:
        with open("/proc/uptime", encoding="ascii") as fh:
            printk = float(fh.read().split()[0]) + 30.0  # the printk clock, 30 s ahead
        pci = "PCI:" + BUS[gpu].rsplit(".", 1)[0]
        with kmsg_file.open("a") as fh:
            fh.write(f"3,{seq[0]},{int(printk * 1e6)},-;NVRM: Xid ({pci}): {code}, pid='<unknown>', "
                     "name=<unknown>, text\n")
        seq[0] += 1

    def daemon() -> dict[str, Any]:
        return (_ask_path(sock) or {}).get("daemon") or {}

    try:
        _until("GPUs at 40 C", lambda: _temps(_ask_path(sock)) == [40, 40], deadline_s=60)
        _until("events registered", lambda: (daemon().get("nvml_events") or {}).get("registered") == 2, deadline_s=60)
        for i in range(6):
            if i % 2:
                kernel(0, 13)
                fake_nvml.xid(str(control), 0, 13)
            else:
                fake_nvml.xid(str(control), 0, 13)
                kernel(0, 13)
        _until("6 paired", lambda: daemon().get("xid_paired") == 6, deadline_s=60)
        doc = daemon()
        assert doc["xid_counts"] == {f"{BUS[0]}/13": 6}
        assert doc["printk_offset_s"] is not None and -32.0 < doc["printk_offset_s"] < -28.0
        fake_nvml.fall_off_bus(str(control), 1)
        kernel(1, 79)
        _until("the lost GPU's XID paired", lambda: daemon().get("xid_paired") == 7, deadline_s=60)
        assert daemon()["xid_counts"] == {f"{BUS[0]}/13": 6, f"{BUS[1]}/79": 1}
        with client.Quiesce(str(sock), 60, "events test") as pause:
            assert pause.answer is not None
            doc = _until("no event set held", lambda: (lambda x: x if x.get("nvml_events", {}).get("registered") == 0
                                                       else None)(daemon()))
            assert not doc["degraded"] and doc["nvml_events"]["error"] is None
            assert fake_nvml.holders(str(control)) == []
            kernel(0, 31)  # the kernel log is still followed
            _until("the kernel's XID while quiesced", lambda: daemon()["xid_counts"].get(f"{BUS[0]}/31") == 1)
        _until("registered again", lambda: (daemon().get("nvml_events") or {}).get("registered") == 1, deadline_s=60)
        fake_nvml.xid(str(control), 0, 43)
        _until("an NVML XID after the resume", lambda: daemon()["xid_counts"].get(f"{BUS[0]}/43") == 1)
        doc = daemon()
        assert not doc["degraded"], doc["reason"]
    finally:
        d.stop()
