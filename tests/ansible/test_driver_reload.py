"""The nvidia_driver role's driver reload (tasks/reload.yml) through the real ansible-playbook
against a simulated node over real SSH, with the resident agent running.

The node has no kernel modules and no systemd, so two stand-ins as strict as the real tools
take their place on its PATH:

- ``systemctl`` runs each unit as a real process (the agent is a real ``fleetops-agent serve
  --backend sim``, which holds the simulated node's device file while it has NVML; the
  persistenced stand-in holds it too), waits for it to hold the device on start, and for it to
  exit on stop; a unit it does not know is ``LoadState=not-found``, as systemd answers;
- ``modprobe`` keeps the loaded modules as folders of a fake ``/sys/module`` (the role's
  ``nvidia_driver_sysfs_module_dir``), refuses ``-r`` with "Module nvidia is in use" while any
  process holds one of the node's device files (``gpu/holders.py``, the scan the reset uses) or
  a module that depends on it is loaded, and on load writes the installed version to
  ``nvidia/version``, as the kernel shows it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetops.sim import gpu as sim

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)
AGENT = os.path.join(BIN, "fleetops-agent")
NODE = "node001"
OLD, NEW = "580.159.04", "580.163.01"
LOADED = ["nvidia", "nvidia_modeset", "nvidia_drm", "nvidia_uvm"]

FAKE_SYSTEMCTL = r'''#!PYTHON
"""systemctl for the test node: units from $FAKE_SYSTEMD/units.json run as real processes."""
import json, os, signal, subprocess, sys, time
root = os.environ["FAKE_SYSTEMD"]
with open(os.path.join(root, "units.json")) as fh:
    units = json.load(fh)
args = [a for a in sys.argv[1:] if not a.startswith("-")]
with open(os.environ["FAKE_CALLS"], "a") as fh:
    fh.write("systemctl " + " ".join(args) + "\n")
verb, name = args[0], (args[1] if len(args) > 1 else "")
name = name[:-8] if name.endswith(".service") else name
pidfile = os.path.join(root, name + ".pid")

def pid():
    try:
        with open(pidfile) as fh:
            p = int(fh.read())
        with open(f"/proc/{p}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return p if state not in ("Z", "X") else None
    except (OSError, ValueError):
        return None

def holds(p, prefix):
    # an fd may close between the listing and its readlink: skip that one, not the process
    try:
        fds = os.listdir(f"/proc/{p}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{p}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False

if verb == "show":
    if name not in units:
        print(f"Id={name}.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead")
    else:
        active = pid() is not None
        print(f"Id={name}.service\nLoadState=loaded\nActiveState={'active' if active else 'inactive'}\n"
              f"SubState={'running' if active else 'dead'}\nUnitFileState=enabled\nMainPID={pid() or 0}")
elif verb == "is-active":
    print("active" if pid() else "inactive")
    sys.exit(0 if pid() else 3)
elif verb == "is-enabled":
    print("enabled" if name in units else "")
    sys.exit(0 if name in units else 1)
elif name not in units:
    print(f"Failed to {verb} {name}.service: Unit {name}.service not found.", file=sys.stderr)
    sys.exit(5)
elif verb == "start" and pid() is None:
    unit = units[name]
    log = open(os.path.join(root, name + ".log"), "ab")
    child = subprocess.Popen(unit["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True, close_fds=True)
    with open(pidfile, "w") as fh:
        fh.write(str(child.pid))
    deadline = time.monotonic() + 30
    while not holds(child.pid, unit["ready_holds"]):
        if child.poll() is not None or time.monotonic() > deadline:
            print(f"Job for {name}.service failed.", file=sys.stderr)
            sys.exit(1)
        time.sleep(0.05)
elif verb == "stop" and pid() is not None:
    p = pid()
    os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid() is not None:
        os.kill(p, signal.SIGKILL)
        while pid() is not None:
            time.sleep(0.05)
    os.unlink(pidfile)
'''

FAKE_MODPROBE = r'''#!PYTHON
"""modprobe for the test node: loaded modules are folders of $FAKE_SYSFS_MODULES."""
import os, sys
from fleetops.gpu import holders
sysfs, prefix = os.environ["FAKE_SYSFS_MODULES"], os.environ["FAKE_DEVICE_PREFIX"]
DEPENDS = {"nvidia": [], "nvidia_modeset": ["nvidia"], "nvidia_drm": ["nvidia_modeset"], "nvidia_uvm": ["nvidia"],
           "nvidia_peermem": ["nvidia", "ib_core"]}
DEVICES = {"nvidia": prefix, "nvidia_uvm": prefix + "-uvm", "nvidia_modeset": prefix + "-modeset"}
args = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as fh:
    fh.write("modprobe " + " ".join(args) + "\n")
loaded = lambda m: os.path.isdir(os.path.join(sysfs, m))

def load(m):
    if loaded(m):
        return
    if m not in DEPENDS:
        print(f"modprobe: FATAL: Module {m} not found in directory /lib/modules/6.8.0-fleetops", file=sys.stderr)
        sys.exit(1)
    for dep in DEPENDS[m]:
        load(dep)
    os.mkdir(os.path.join(sysfs, m))
    if m == "nvidia":
        with open(os.environ["FAKE_INSTALLED_VERSION"]) as src, open(os.path.join(sysfs, m, "version"), "w") as dst:
            dst.write(src.read())

if args[0] == "-r":
    m = args[1]
    if not loaded(m):
        print(f"modprobe: FATAL: Module {m} is not in kernel.", file=sys.stderr)
        sys.exit(1)
    users = [u for u, deps in DEPENDS.items() if m in deps and loaded(u)]
    if users or (m in DEVICES and holders.scan(DEVICES[m])):
        print(f"modprobe: FATAL: Module {m} is in use.", file=sys.stderr)
        sys.exit(1)
    for name in os.listdir(os.path.join(sysfs, m)):
        os.unlink(os.path.join(sysfs, m, name))
    os.rmdir(os.path.join(sysfs, m))
else:
    load(args[0])
'''

HOLD = "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); time.sleep(3600)"


class Node:
    """The stand-ins' files for one test and what the test reads back from them."""

    def __init__(self, root: Path, state: str) -> None:
        self.root, self.state = root, state
        self.prefix = sim.device_prefix(state)
        self.bin, self.systemd, self.modules = root / "bin", root / "systemd", root / "sys" / "module"
        self.calls, self.installed = root / "calls.log", root / "installed_version"
        for folder in (self.bin, self.systemd, self.modules):
            folder.mkdir(parents=True)
        for name, text in (("systemctl", FAKE_SYSTEMCTL), ("modprobe", FAKE_MODPROBE)):
            tool = self.bin / name
            tool.write_text(text.replace("PYTHON", sys.executable, 1))
            tool.chmod(0o755)
        for module in LOADED:
            (self.modules / module).mkdir()
        (self.modules / "nvidia" / "version").write_text(OLD)
        self.installed.write_text(NEW)  # the package upgrade put the new driver on disk
        os.makedirs(os.path.dirname(self.prefix), exist_ok=True)
        for device in ("ctl", "0", "-uvm"):
            Path(self.prefix + device).touch()
        units = {
            "fleetops-agent": {"argv": [AGENT, "serve", "--backend", "sim", "--state", state],
                               "ready_holds": self.prefix},
            "nvidia-persistenced": {"argv": [sys.executable, "-c", HOLD, self.prefix + "ctl"],
                                    "ready_holds": self.prefix},
            "nvidia-fabricmanager": {"argv": [sys.executable, "-c", HOLD, self.prefix + "ctl"],
                                     "ready_holds": self.prefix},
        }
        (self.systemd / "units.json").write_text(json.dumps(units))
        self.env = dict(os.environ, FAKE_SYSTEMD=str(self.systemd), FAKE_CALLS=str(self.calls),
                        FAKE_SYSFS_MODULES=str(self.modules), FAKE_DEVICE_PREFIX=self.prefix,
                        FAKE_INSTALLED_VERSION=str(self.installed))
        self.env.pop("FLEETOPS_SIM_STATE", None)

    def systemctl(self, *args: str) -> None:
        subprocess.run([str(self.bin / "systemctl"), *args], env=self.env, check=True, timeout=60)

    def pid(self, unit: str) -> int | None:
        try:
            p = int((self.systemd / f"{unit}.pid").read_text())
        except (OSError, ValueError):
            return None
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None
        return p if state not in ("Z", "X") else None

    def loaded(self) -> list[str]:
        return sorted(p.name for p in self.modules.iterdir())

    def version(self) -> str | None:
        path = self.modules / "nvidia" / "version"
        return path.read_text() if path.exists() else None

    def call_log(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def stop_all(self) -> None:
        for unit in ("fleetops-agent", "nvidia-persistenced", "nvidia-fabricmanager"):
            subprocess.run([str(self.bin / "systemctl"), "stop", unit], env=self.env, check=False, timeout=60)


@pytest.fixture
def node(sim_fleet: Any, tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node", str(sim_fleet.state_path(NODE)))
    n.systemctl("start", "fleetops-agent")
    n.systemctl("start", "nvidia-persistenced")
    n.calls.unlink()  # the log holds what the reload did, not this setup
    try:
        yield n
    finally:
        n.stop_all()


def _reload(fleet: Any, n: Node, tmp_path: Path, check: bool = False) -> subprocess.CompletedProcess[str]:
    play = [{
        "name": "Reload the driver",
        "hosts": NODE,
        "gather_facts": False,
        "environment": {
            "PATH": os.pathsep.join([str(n.bin), BIN, "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
            **{k: n.env[k] for k in ("FAKE_SYSTEMD", "FAKE_CALLS", "FAKE_SYSFS_MODULES", "FAKE_DEVICE_PREFIX",
                                     "FAKE_INSTALLED_VERSION")},
        },
        "tasks": [{
            "name": "Reload the driver modules",
            "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "reload"},
            "vars": {"nvidia_driver_sysfs_module_dir": str(n.modules), "nvidia_driver_device_prefix": n.prefix,
                     "nvidia_driver_agent_path": AGENT},
        }],
    }]
    book = tmp_path / "reload.yml"
    book.write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
    argv = [os.path.join(BIN, "ansible-playbook"), "-v", "-i", fleet.inventory, str(book)]
    if check:
        argv.append("--check")
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False,
                          stdin=subprocess.DEVNULL)


def _holds(pid: int, prefix: str) -> bool:
    """Whether the process has a file under prefix open. An fd may close between the listing
    and its readlink (the interpreter's own start-up files): that one is skipped."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except FileNotFoundError:
            continue
    return False


def _daemon_answers(state: str) -> bool:
    """The restarted daemon serves its socket again (a snapshot with its daemon section)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = subprocess.run([AGENT, "collect", "--backend", "sim", "--state", state, "--max-age", "30"],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0 and "daemon" in json.loads(done.stdout):
            return True
        time.sleep(0.5)
    return False


def test_the_reload_stops_the_daemon_unloads_loads_the_new_driver_and_starts_it_again(
    sim_fleet: Any, node: Node, tmp_path: Path
) -> None:
    agent, persistenced = node.pid("fleetops-agent"), node.pid("nvidia-persistenced")
    assert agent and persistenced and node.version() == OLD
    done = _reload(sim_fleet, node, tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    calls = node.call_log()
    # the clients stop before the driver goes (the agent first), and start after the new one loaded
    stop_agent, stop_persistenced = calls.index("systemctl stop fleetops-agent"), calls.index(
        "systemctl stop nvidia-persistenced")
    unload, load = calls.index("modprobe -r nvidia"), calls.index("modprobe nvidia")
    start_persistenced, start_agent = calls.index("systemctl start nvidia-persistenced"), calls.index(
        "systemctl start fleetops-agent")
    assert stop_agent < stop_persistenced < unload < load < start_persistenced < start_agent, calls
    # the driver really went and the new one is loaded, with the modules that depend on it
    assert node.version() == NEW and node.loaded() == sorted(LOADED)
    # both came back as new processes; the agent serves its socket again
    assert node.pid("fleetops-agent") not in (None, agent)
    assert node.pid("nvidia-persistenced") not in (None, persistenced)
    assert _daemon_answers(node.state)
    # a client that was not running stays stopped; one the node lacks is no failure
    assert node.pid("nvidia-fabricmanager") is None
    assert "systemctl start nvidia-fabricmanager" not in calls and "systemctl stop nvidia-dcgm" not in calls


def test_a_holder_keeps_the_module_loaded_the_reload_fails_naming_it_and_the_daemon_comes_back(
    sim_fleet: Any, node: Node, tmp_path: Path
) -> None:
    """A workload nobody stopped holds /dev/nvidia0: modprobe -r nvidia refuses, and the play
    fails naming its PID and command, not at the verification later; the daemon is running again
    on the old driver."""
    agent = node.pid("fleetops-agent")
    workload = subprocess.Popen([sys.executable, "-c", HOLD, node.prefix + "0"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _holds(workload.pid, node.prefix):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        done = _reload(sim_fleet, node, tmp_path)
    finally:
        os.kill(workload.pid, signal.SIGTERM)
        workload.wait(timeout=10)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    failed = [line for line in out.splitlines() if "The nvidia module is still loaded" in line]
    assert failed, out
    assert "Module nvidia is in use" in failed[0]
    assert f"pid {workload.pid} (root: {sys.executable} -c" in failed[0] and f"{node.prefix}0" in failed[0]
    assert "fleetops-agent serve" not in failed[0]  # the daemon was stopped: it is not among the holders
    calls = node.call_log()
    assert "modprobe nvidia" not in calls  # nothing loaded over the old driver
    assert calls.index("systemctl stop fleetops-agent") < calls.index("modprobe -r nvidia") < calls.index(
        "systemctl start fleetops-agent")
    assert node.version() == OLD and "nvidia" in node.loaded()
    assert node.pid("fleetops-agent") not in (None, agent) and node.pid("nvidia-persistenced") is not None
    assert _daemon_answers(node.state)


def test_check_mode_stops_nothing_and_unloads_nothing(sim_fleet: Any, node: Node, tmp_path: Path) -> None:
    agent, persistenced = node.pid("fleetops-agent"), node.pid("nvidia-persistenced")
    done = _reload(sim_fleet, node, tmp_path, check=True)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = node.call_log()
    assert not [c for c in calls if c.startswith("modprobe")], calls
    assert not [c for c in calls if c.split()[1] in ("stop", "start")], calls
    assert node.pid("fleetops-agent") == agent and node.pid("nvidia-persistenced") == persistenced
    assert node.version() == OLD and node.loaded() == sorted(LOADED)
