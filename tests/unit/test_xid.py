"""XID parsing and kernel-log reading (fleetops.xid.kernlog), and the XID catalog (fleetops.xid.catalog)."""

from __future__ import annotations

import dataclasses
import subprocess
import time
from datetime import UTC, datetime

import pytest

from fleetops.sim import gpu as sim
from fleetops.xid import catalog as catalog
from fleetops.xid import kernlog as xid

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
ISO_2026_12_01 = datetime(2026, 12, 1, 3, 12, 44, tzinfo=UTC).timestamp()


# --- line forms ------------------------------------------------------------------------


def test_dmesg_unknown_pid_and_name():
    line = (
        "[  123.456789] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus."
    )
    ev = xid.parse_line(line)
    assert ev is not None
    assert ev.code == 79
    assert ev.bus_id == "0000:18:00.0"
    assert ev.pid is None and ev.process_name is None
    assert ev.message == "GPU has fallen off the bus."
    assert ev.uptime_s == pytest.approx(123.456789)
    assert ev.timestamp is None
    assert ev.source == "kernel"
    assert ev.raw == line
    assert ev.gpu_uuid is None and ev.gpu_index is None


def test_dmesg_with_pid_and_name_keeps_commas_in_message():
    line = (
        "[ 5012.331] NVRM: Xid (PCI:0000:9a:00): 13, pid=31337, name=python3, "
        "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Illegal Instruction Encoding"
    )
    ev = xid.parse_line(line, source="dmesg")
    assert ev is not None
    assert (ev.code, ev.bus_id, ev.pid, ev.process_name) == (13, "0000:9a:00.0", 31337, "python3")
    assert ev.message == "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Illegal Instruction Encoding"
    assert ev.uptime_s == pytest.approx(5012.331)
    assert ev.source == "dmesg"


def test_older_driver_form_without_pid_and_name():
    line = (
        "NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected "
        "on GPU in the framebuffer at partition 3, subpartition 0."
    )
    ev = xid.parse_line(line)
    assert ev is not None
    assert (ev.code, ev.bus_id, ev.pid, ev.process_name) == (48, "0000:3b:00.0", None, None)
    assert ev.message.startswith("An uncorrectable double bit error (DBE)")
    assert ev.message.endswith("subpartition 0.")
    assert ev.uptime_s is None and ev.timestamp is None


@pytest.mark.parametrize(
    ("bus", "expected"),
    [
        ("0000:18:00", "0000:18:00.0"),  # no "PCI:" prefix
        ("PCI:0000:18:00.0", "0000:18:00.0"),  # with the function
        ("PCI:0000:DB:00", "0000:db:00.0"),  # upper case hex
        ("PCI:00000000:2a:00", "0000:2a:00.0"),  # NVML-style 8-digit domain
        ("PCI:18:00", "0000:18:00.0"),  # no domain
        ("0002:c1:00.1", "0002:c1:00.1"),  # other domain and function kept
    ],
)
def test_bus_id_forms_are_normalised(bus, expected):
    ev = xid.parse_line(f"NVRM: Xid ({bus}): 31, pid=77, name=train, Ch 00000008, intr 00000000.")
    assert ev is not None
    assert ev.bus_id == expected
    assert ev.code == 31 and ev.pid == 77 and ev.process_name == "train"


def test_dmesg_T_form_gives_local_timestamp():
    line = "[Tue Dec  1 03:12:44 2026] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    ev = xid.parse_line(line)
    assert ev is not None
    assert ev.code == 79 and ev.bus_id == "0000:18:00.0"
    assert ev.timestamp == time.mktime((2026, 12, 1, 3, 12, 44, 0, 0, -1))
    assert ev.uptime_s is None


def test_journal_short_iso():
    line = (
        "2026-12-01T03:12:44+0000 node017 kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=1234, "
        "name=python, Contained: SM (0x1). RST: No, D-RST: No"
    )
    ev = xid.parse_line(line, source="journal")
    assert ev is not None
    assert (ev.code, ev.bus_id, ev.pid, ev.process_name) == (94, "0000:18:00.0", 1234, "python")
    assert ev.message == "Contained: SM (0x1). RST: No, D-RST: No"
    assert ev.timestamp == ISO_2026_12_01
    assert ev.uptime_s is None
    assert ev.source == "journal"


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-12-01T03:12:44.250000+00:00", ISO_2026_12_01 + 0.25),  # short-iso-precise
        ("2026-12-01T04:12:44+0100", ISO_2026_12_01),  # another zone
        ("2026-12-01T03:12:44Z", ISO_2026_12_01),
    ],
)
def test_journal_iso_variants(stamp, expected):
    ev = xid.parse_line(
        f"{stamp} node017 kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
    )
    assert ev is not None
    assert ev.timestamp == pytest.approx(expected)


def test_dmesg_time_format_iso_with_comma():
    line = "2026-12-01T03:12:44,500000+00:00 NVRM: Xid (PCI:0000:5d:00): 48, pid=1, name=a, DBE"
    ev = xid.parse_line(line)
    assert ev is not None
    assert ev.timestamp == pytest.approx(ISO_2026_12_01 + 0.5)
    assert ev.bus_id == "0000:5d:00.0"


def test_journal_short_unix():
    line = (
        "1764558764.123456 node017 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus."
    )
    ev = xid.parse_line(line, source="journal")
    assert ev is not None
    assert ev.code == 79
    assert ev.timestamp == pytest.approx(1764558764.123456)
    assert ev.message == "GPU has fallen off the bus."


def _syslog_stamp(epoch: float, precise: bool) -> str:
    t = time.localtime(epoch)
    day = f"{t.tm_mday:02d}" if precise else f"{t.tm_mday:2d}"
    text = f"{MONTHS[t.tm_mon - 1]} {day} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    return text + (".123456" if precise else "")


def test_journal_short_precise_infers_the_year():
    moment = int(time.time()) - 3600
    line = f"{_syslog_stamp(moment, True)} node017 kernel: NVRM: Xid (PCI:0000:ab:00): 119, pid=9, name=nvidia-smi, Timeout"
    ev = xid.parse_line(line, source="journal")
    assert ev is not None
    assert ev.code == 119 and ev.bus_id == "0000:ab:00.0"
    assert ev.timestamp == pytest.approx(moment + 0.123456, abs=1e-3)


def test_syslog_file_form_gives_timestamp_and_uptime():
    moment = int(time.time()) - 86400 * 3
    line = f"{_syslog_stamp(moment, False)} node017 kernel: [ 5012.331] NVRM: Xid (PCI:0000:ba:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error"
    ev = xid.parse_line(line)
    assert ev is not None
    assert ev.timestamp == pytest.approx(moment, abs=1e-3)
    assert ev.uptime_s == pytest.approx(5012.331)
    assert ev.message == "NVLink: fatal error"


def test_dev_kmsg_form_gives_uptime():
    ev = xid.parse_line("4,1234,5012331000,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    assert ev is not None
    assert ev.uptime_s == pytest.approx(5012.331)


def test_xid_154_line():
    line = "[ 99.5] NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    ev = xid.parse_line(line)
    assert ev is not None
    assert ev.code == 154 and ev.pid is None
    assert ev.message.endswith("(Node Reboot Required)")


def test_pid_and_name_variants():
    base = "NVRM: Xid (PCI:0000:18:00): 13, "
    ev = xid.parse_line(base + "pid=<unknown>, name=<unknown>, text")
    assert ev is not None and (ev.pid, ev.process_name, ev.message) == (None, None, "text")
    ev = xid.parse_line(base + "pid='4242', name=pt_main_thread, text")
    assert ev is not None and (ev.pid, ev.process_name) == (4242, "pt_main_thread")
    ev = xid.parse_line(base + "pid=4242, name=Web Content, text, more")
    assert ev is not None and (ev.pid, ev.process_name, ev.message) == (4242, "Web Content", "text, more")
    ev = xid.parse_line(base + "pid='<unknown>', name=<unknown>, ")
    assert ev is not None and (ev.pid, ev.process_name, ev.message) == (None, None, "")


def test_line_cut_after_the_code_still_reports_the_xid():
    # The bus id and the code (closed by its comma) are complete: that is the fact that matters.
    # Fields cut short are left None rather than guessed.
    ev = xid.parse_line("[ 7.0] NVRM: Xid (PCI:0000:18:00): 79, pid=")
    assert ev is not None and ev.code == 79 and ev.pid is None and ev.message == ""
    ev = xid.parse_line("[ 7.0] NVRM: Xid (PCI:0000:18:00): 79, pid=12, name=pyth")
    assert ev is not None and ev.pid == 12 and ev.process_name is None and ev.message == ""


def test_trailing_newline_and_crlf_are_ignored():
    ev = xid.parse_line("[ 1.0] NVRM: Xid (PCI:0000:18:00): 43, pid=5, name=x, Ch 00000010\r\n")
    assert ev is not None and ev.message == "Ch 00000010" and not ev.raw.endswith("\n")


def test_daemon_quoting_an_xid_is_not_a_kernel_xid():
    line = "1764558764.123456 node017 gpud[812]: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
    assert xid.parse_line(line) is None


# --- SXid: parsed, marked by source ------------------------------------------------------


def test_sxid_is_parsed_and_marked():
    line = "[ 88.1] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"
    ev = xid.parse_line(line, source="dmesg")
    assert ev is not None
    assert ev.code == 12028
    assert ev.bus_id == "0000:05:00.0"
    assert ev.source == "dmesg:sxid" and ev.source.endswith("sxid")
    assert catalog.is_sxid(ev)
    assert ev.message == "Non-fatal, Link 32 egress non-posted PRIV error (First)"
    assert ev.uptime_s == pytest.approx(88.1)
    info = catalog.info_for(ev)
    assert (info.category, info.severity, info.action) == ("nvswitch", "warn", "check_nvlink")


def test_fatal_sxid_in_journal_form():
    line = "1764558764.5 node017 kernel: nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20034, Fatal, Link 30 LTSSM Fault Up"
    ev = xid.parse_line(line, source="journal")
    assert ev is not None and catalog.is_sxid(ev) and ev.source == "journal:sxid"
    assert ev.timestamp == pytest.approx(1764558764.5)
    assert catalog.info_for(ev).severity == "crit"


def test_gpu_xid_is_not_sxid():
    ev = xid.parse_line("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    assert ev is not None and not catalog.is_sxid(ev)


# --- malformed and non-XID lines ---------------------------------------------------------

NASTY = [
    "",
    "   ",
    "\n",
    "\x00\x01\x02\xff\xfe garbage \x1b[31m",
    "NVRM: Xid",
    "NVRM: Xid (",
    "NVRM: Xid (PCI:0000:18",  # cut inside the bus id
    "NVRM: Xid (PCI:0000:18:00): ",  # cut before the code
    "NVRM: Xid (PCI:0000:18:00): 7",  # cut inside the code (no comma: could be 79)
    "[  123.456789] NVRM: Xid (PCI:0000:18:00): 7",
    "NVRM: Xid (PCI:0000:18:00): abc, pid=1, name=x, text",  # non-numeric code
    "NVRM: Xid (PCI:0000:18:00): -79, text",
    "NVRM: Xid (PCI:0000:18:00): 0x4f, text",
    "NVRM: Xid (PCI:0000:18:00): 0, text",
    "NVRM: Xid (PCI:0000:18:00): 1234567, text",  # absurdly long code
    "NVRM: Xid (PCI:0000:18:00): \u0667\u0669, text",  # non-ASCII digits
    "NVRM: Xid (PCI:zzzz:18:00): 79, text",  # bad hex
    "NVRM: Xid (PCI:0000:18:00:00:00): 79, text",
    "NVRM: Xid (): 79, text",
    "NVRM: Xid PCI:0000:18:00: 79, text",  # no parentheses
    "NVRM: Xid (PCI:0000:18:00)79, text",  # no colon
    "NVRM: Xid (PCI:0000:18:00): 79 GPU has fallen off the bus.",  # no comma after the code
    "NVRM: Xid (PCI:0000:18:00\x00): 79, text",
    "Xid (PCI:0000:18:00): 79, text",  # no NVRM: marker
    "[    0.471916] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  ",
    "[    0.972856] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. Clearing it.",
    "[    3.801035] NVRM: Persistence mode is deprecated and will be removed in a future release. Please use nvidia-persistenced instead.",
    "-- No entries --",
    "Xid (" * 200_000,  # a megabyte of junk
]


@pytest.mark.parametrize("line", NASTY, ids=range(len(NASTY)))
def test_malformed_and_non_xid_lines_give_none(line):
    assert xid.parse_line(line) is None


@pytest.mark.parametrize("junk", [None, 79, b"\xff\xfe\x00NVRM: Xid (PCI", object(), ["NVRM: Xid"]])
def test_non_string_input_never_raises(junk):
    assert xid.parse_line(junk) is None  # type: ignore[arg-type]


def test_bytes_line_is_decoded():
    ev = xid.parse_line(b"[ 1.0] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")  # type: ignore[arg-type]
    assert ev is not None and ev.code == 79


def test_malformed_junk_is_fast():
    # CPU time of this thread, not wall time: other processes on a loaded machine do not add
    # to it. Well under a second here; a pattern that backtracks over the megabyte lines
    # would take hours of CPU, so twenty CPU seconds tells the two apart.
    start = time.thread_time()
    assert xid.parse_lines(NASTY * 3) == []
    assert time.thread_time() - start < 20


def test_parse_lines_skips_what_is_not_an_xid_and_keeps_order():
    lines = [
        "[    0.471916] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04",
        "[ 10.0] NVRM: Xid (PCI:0000:2a:00): 13, pid=1, name=a, x",
        "garbage",
        "[ 11.0] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:18",
    ]
    events = xid.parse_lines(lines, source="dmesg")
    assert [(e.code, e.bus_id) for e in events] == [(13, "0000:2a:00.0"), (79, "0000:18:00.0")]
    assert all(e.source == "dmesg" for e in events)
    assert xid.parse_lines([]) == []
    assert xid.parse_lines(iter(lines), source="dmesg") == events


# --- simulator lines ---------------------------------------------------------------------


def test_simulator_lines_match_the_gpus():
    state = sim.build_state("n1", {"faults": ["xid:79@2", "xid:13@0", "ecc-dbe@3"]})
    events = xid.parse_lines([e["line"] for e in state["kernel_log"]], source="sim")
    assert len(events) == 3
    by_code = {e.code: e for e in events}
    assert set(by_code) == {79, 13, 48}
    gpus = state["gpus"]
    assert by_code[79].bus_id == gpus[2]["bus_id"] == "0000:3a:00.0"
    assert by_code[13].bus_id == gpus[0]["bus_id"] == "0000:18:00.0"
    assert by_code[48].bus_id == gpus[3]["bus_id"] == "0000:5d:00.0"
    assert (by_code[13].pid, by_code[13].process_name) == (31337, "python3")
    assert (by_code[79].pid, by_code[79].process_name) == (None, None)
    assert by_code[79].message == sim.XID_TEXT[79]
    for ev in events:
        assert ev.source == "sim"
        assert ev.uptime_s == pytest.approx(sim.DEFAULT_UPTIME_S, abs=60)


@pytest.mark.parametrize("code", sorted(sim.XID_TEXT))
def test_every_simulator_xid_text_parses(code):
    state = sim.build_state("n1", {"faults": [f"xid:{code}@5"]})
    (ev,) = xid.parse_lines([e["line"] for e in state["kernel_log"]], source="sim")
    assert ev.code == code
    assert ev.bus_id == state["gpus"][5]["bus_id"]
    assert ev.message == sim.XID_TEXT[code]


# --- catalog -----------------------------------------------------------------------------

REQUIRED = [8, 13, 31, 32, 38, 43, 44, 45, 48, 54, 56, 57, 58, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95,
            109, 110, 119, 120, 121, 122, 123, 136, 137, 140, 143, *range(144, 151), 154, 155]  # fmt: skip


def test_catalog_covers_the_required_codes():
    missing = [code for code in REQUIRED if code not in catalog.CATALOG]
    assert missing == []


def test_every_catalog_entry_is_well_formed():
    assert set(catalog.ACTION_TEXT) == set(catalog.ACTIONS)
    assert all(text.strip() for text in catalog.ACTION_TEXT.values())
    for code, info in catalog.CATALOG.items():
        assert isinstance(info, catalog.XidInfo)
        assert info.code == code
        assert info.severity in ("info", "warn", "crit"), code
        assert info.action in catalog.ACTIONS, code
        assert info.action in catalog.ACTION_TEXT, code
        assert info.category in catalog.CATEGORIES, code
        assert info.name.strip() and info.meaning.strip(), code


def test_xidinfo_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.CATALOG[79].severity = "info"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("code", "severity", "action"),
    [
        (13, "warn", "restart_app"),
        (31, "warn", "restart_app"),
        (43, "info", "none"),
        (45, "info", "follow_other_xid"),
        (48, "crit", "reset_gpu"),
        (62, "crit", "reset_gpu"),
        (63, "warn", "reset_gpu"),
        (64, "crit", "reset_gpu"),
        (74, "crit", "check_nvlink"),
        (79, "crit", "reboot_node"),
        (92, "warn", "none"),
        (94, "warn", "restart_app"),
        (95, "crit", "reset_gpu"),
        (109, "warn", "reset_gpu"),
        (119, "crit", "reset_gpu"),
        (120, "crit", "reset_gpu"),
        (140, "crit", "reset_gpu"),
        (143, "crit", "reset_gpu"),
        (154, "info", "follow_other_xid"),
    ],
)
def test_known_codes(code, severity, action):
    info = catalog.lookup(code)
    assert (info.code, info.severity, info.action) == (code, severity, action)
    assert info.name != "unknown XID"


def test_dcgm_always_fatal_codes_are_crit():
    for code in (48, 74, 79, 95, 119, 120, 140):
        assert catalog.lookup(code).severity == "crit", code


def test_nvlink5_codes_check_nvlink():
    for code in range(144, 151):
        info = catalog.lookup(code)
        assert (info.category, info.action) == ("nvlink", "check_nvlink")


@pytest.mark.parametrize("code", [1, 9999, 12028, 171])
def test_unknown_code_gets_a_generic_entry(code):
    info = catalog.lookup(code)
    assert info.code == code
    assert (info.name, info.severity, info.action, info.category) == (
        "unknown XID",
        "warn",
        "drain_and_inspect",
        "unknown",
    )
    assert code not in catalog.CATALOG  # lookup does not add to the catalog


def test_non_critical_set():
    assert {13, 31, 43, 45, 63, 68, 92, 109} <= catalog.NON_CRITICAL
    assert isinstance(catalog.NON_CRITICAL, frozenset)
    for code in catalog.NON_CRITICAL:
        assert code in catalog.CATALOG
        assert catalog.CATALOG[code].severity != "crit", code
    assert not {48, 64, 74, 79, 95, 119, 120, 140} & catalog.NON_CRITICAL


@pytest.mark.parametrize(
    ("message", "wanted", "severity", "action"),
    [
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "node_reboot",
            "crit",
            "reboot_node",
        ),
        (
            "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            "gpu_reset",
            "crit",
            "reset_gpu",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)", "gpu_reset", "crit", "reset_gpu"),
        (
            "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            "drain_and_reset",
            "warn",
            "reset_gpu",
        ),
        (
            "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
            "none",
            "info",
            "follow_other_xid",
        ),
        ("GPU recovery action changed from 0x0 to 0x3", "drain_p2p", "crit", "reset_gpu"),
        ("something else entirely", None, "info", "follow_other_xid"),
    ],
)
def test_xid_154_recovery_action(message, wanted, severity, action):
    assert catalog.recovery_action(message) == wanted
    ev = xid.parse_line(f"NVRM: Xid (PCI:0000:18:00): 154, {message}")
    assert ev is not None
    info = catalog.info_for(ev)
    assert (info.code, info.severity, info.action) == (154, severity, action)


def test_info_for_plain_xid_is_lookup():
    ev = xid.parse_line("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    assert ev is not None
    assert catalog.info_for(ev) == catalog.lookup(79)


# --- read_kernel_log -----------------------------------------------------------------------


class FakeRun:
    """Stands in for subprocess.run; answers per program name."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        assert isinstance(cmd, list), "commands are argument lists"
        assert not kwargs.get("shell"), "never through a shell"
        answer = self.answers[cmd[0]]
        if isinstance(answer, BaseException):
            raise answer
        rc, out, err = answer
        return subprocess.CompletedProcess(cmd, rc, out.encode(), err.encode())


JOURNAL_LINE = "1764558764.123456 node017 kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
DMESG_LINE = "[ 5012.331] NVRM: Xid (PCI:0000:9a:00): 13, pid=1, name=a, x"


@pytest.fixture
def fake_run(monkeypatch):
    def install(answers):
        fake = FakeRun(answers)
        monkeypatch.setattr(subprocess, "run", fake)
        return fake

    return install


def test_read_kernel_log_prefers_the_journal(fake_run):
    fake = fake_run({"journalctl": (0, JOURNAL_LINE + "\n", ""), "dmesg": (0, DMESG_LINE + "\n", "")})
    lines, reason = xid.read_kernel_log()
    assert (lines, reason) == ([JOURNAL_LINE], None)
    assert len(fake.calls) == 1
    cmd, kwargs = fake.calls[0]
    assert cmd[:4] == ["journalctl", "-k", "-b", "-o"] and "short-unix" in cmd and "--no-pager" in cmd
    assert cmd[cmd.index("-g") + 1] == "NVRM: Xid|SXid"
    assert kwargs["timeout"] == 2.0


def test_read_kernel_log_falls_back_to_dmesg_without_a_journal(fake_run):
    junk = "[    0.1] NVRM: loading NVIDIA UNIX Open Kernel Module\n"
    fake = fake_run(
        {
            "journalctl": (1, "-- No entries --\n", "No journal files were found.\n"),
            "dmesg": (0, junk + DMESG_LINE + "\n", ""),
        }
    )
    assert xid.read_kernel_log() == ([DMESG_LINE], None)
    assert [c[0][0] for c in fake.calls] == ["journalctl", "dmesg"]


def test_read_kernel_log_no_match_in_journal_asks_dmesg(fake_run):
    fake_run({"journalctl": (1, "-- No entries --\n", ""), "dmesg": (0, DMESG_LINE + "\n", "")})
    assert xid.read_kernel_log() == ([DMESG_LINE], None)


def test_read_kernel_log_no_xids_anywhere_is_not_an_error(fake_run):
    fake_run(
        {
            "journalctl": (1, "-- No entries --\n", ""),
            "dmesg": (1, "", "dmesg: read kernel buffer failed: Operation not permitted\n"),
        }
    )
    assert xid.read_kernel_log() == ([], None)


def test_read_kernel_log_unprivileged_user(fake_run):
    hint = "Hint: You are currently not seeing messages from other users and the system.\n"
    fake_run(
        {
            "journalctl": (0, "", hint),
            "dmesg": (1, "", "dmesg: read kernel buffer failed: Operation not permitted\n"),
        }
    )
    lines, reason = xid.read_kernel_log()
    assert lines == []
    assert reason is not None and "not seeing messages" in reason and "Operation not permitted" in reason


def test_read_kernel_log_nothing_installed(fake_run):
    fake_run(
        {"journalctl": FileNotFoundError(2, "No such file"), "dmesg": FileNotFoundError(2, "No such file")}
    )
    lines, reason = xid.read_kernel_log()
    assert lines == []
    assert reason == "journalctl: not installed; dmesg: not installed"


def test_read_kernel_log_timeouts(fake_run):
    fake_run(
        {
            "journalctl": subprocess.TimeoutExpired("journalctl", 0.5),
            "dmesg": subprocess.TimeoutExpired("dmesg", 0.5),
        }
    )
    assert xid.read_kernel_log(timeout_s=0.5) == (
        [], "journalctl: timed out after 0.5 s; dmesg: timed out after 0.5 s"
    )


def test_read_kernel_log_journal_without_grep_support(fake_run):
    fake_run(
        {
            "journalctl": (1, "", "Compiled without pattern matching support\n"),
            "dmesg": (0, DMESG_LINE + "\n", ""),
        }
    )
    assert xid.read_kernel_log() == ([DMESG_LINE], None)


def test_read_kernel_log_keeps_the_latest_lines(fake_run):
    many = [f"[ {i}.0] NVRM: Xid (PCI:0000:18:00): 13, pid={i}, name=a, x" for i in range(1, 51)]
    fake_run({"journalctl": FileNotFoundError(2, "x"), "dmesg": (0, "\n".join(many) + "\n", "")})
    lines, reason = xid.read_kernel_log(max_lines=5)
    assert reason is None and lines == many[-5:]


def _programs(tmp_path, monkeypatch, **scripts):
    """Real executables named journalctl/dmesg (shell scripts) alone on PATH: the real
    subprocess path, with answers the test knows."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\n" + body)
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_read_kernel_log_runs_the_real_journalctl_in_the_c_locale(tmp_path, monkeypatch):
    _programs(
        tmp_path,
        monkeypatch,
        journalctl=f"echo 'NVRM: loading module'; echo 'LC_ALL='$LC_ALL' Xid-args: '\"$*\"\n"
        f"printf '%s\\n' '{JOURNAL_LINE}'\n",
        dmesg="echo dmesg-must-not-run; exit 3\n",
    )
    assert xid.read_kernel_log(timeout_s=30.0) == (
        [
            "LC_ALL=C Xid-args: -k -b -o short-unix --no-pager -g NVRM: Xid|SXid",
            JOURNAL_LINE,
        ],
        None,
    )


def test_read_kernel_log_with_neither_program_installed_says_so(tmp_path, monkeypatch):
    _programs(tmp_path, monkeypatch)
    assert xid.read_kernel_log(timeout_s=30.0) == ([], "journalctl: not installed; dmesg: not installed")


def test_read_kernel_log_real_dmesg_after_an_unreadable_journal(tmp_path, monkeypatch):
    _programs(
        tmp_path,
        monkeypatch,
        journalctl="echo 'No journal files were found.' >&2; exit 1\n",
        dmesg=f"printf '%s\\n' 'junk' '{DMESG_LINE}'\n",
    )
    assert xid.read_kernel_log(timeout_s=30.0) == ([DMESG_LINE], None)
