"""Realistic test hosts: Debian booted with ``systemd-nspawn -b`` (full systemd, sshd, own hostname),
and a local apt repository of stand-in NVIDIA packages built here with dpkg-deb.

Layers, all overlayfs (an overlay per host costs milliseconds):

    base/   debootstrap bookworm minbase + systemd, sshd, python3 (cached between runs: ~1-2.5 min)
    prep/   per test session: the old driver, fabric manager and CUDA packages installed with dpkg,
            the apt hook that mirrors dpkg into the simulator state
    <host>/ per host: hostname, sshd on its own loopback address, authorized key, simulator state

The hosts share the machine's network namespace and listen only on 127.0.48.N (loopback).

The stand-in packages behave like NVIDIA's where it matters to a rollout:
- installing ``nvidia-driver-580-server`` changes what is *installed*; the *loaded* driver (the
  simulator state's ``driver_version``, which the agent reports) changes only when
  ``nvidia-sim-load.service`` runs at boot (or ``/usr/lib/nvidia-sim/load`` is run): a rollout
  that does not reboot or reload fails its verification, as on a real node;
- ``nvidia-fabricmanager-580`` refuses to start when its version differs from the loaded driver;
- an apt hook copies the installed NVIDIA packages into the simulator state after every dpkg run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetops.sim import gpu as sim

SUITE = "bookworm"
MIRROR = os.environ.get("FLEETOPS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# python3-apt and python3-packaging: what the apt and pip modules need on a Debian node.
INCLUDE = "systemd,systemd-sysv,dbus,openssh-server,python3,python3-venv,python3-apt,python3-packaging,iproute2,procps,slurmd,munge"
CACHE = Path(os.environ.get("FLEETOPS_NSPAWN_CACHE", "/var/tmp/fleetops-nspawn"))
STATE_IN_HOST = "/var/lib/fleetops-sim/state.json"
REPO_IN_HOST = "/srv/fleetops-repo"
# The container's init start time (field 22 of /proc/1/stat) changes on every container boot;
# boot_id is the host kernel's and does not.
BOOT_TIME_COMMAND = "cut -d' ' -f22 /proc/1/stat"
PACKAGE_PREFIXES = ("nvidia-", "cuda-", "libnvidia-")


class HostsUnavailable(Exception):
    """debootstrap, overlayfs or systemd-nspawn cannot run here; the message says why."""


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (debootstrap, overlay mounts, systemd-nspawn)"
    missing = [t for t in ("debootstrap", "systemd-nspawn", "dpkg-deb") if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)}: apt-get install -y debootstrap systemd-container"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return None


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if done.returncode != 0:
        raise HostsUnavailable(
            f"{' '.join(cmd[:4])}... failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}"
        )
    return done


# --- base image ------------------------------------------------------------------------------


def base_image() -> tuple[Path, float]:
    """The cached debootstrap tree (built once per machine); returns (path, seconds spent)."""
    key = hashlib.sha256(f"{SUITE}|{INCLUDE}|{MIRROR}|v1".encode()).hexdigest()[:12]
    target = CACHE / f"base-{SUITE}-{key}"
    if (target / ".fleetops-complete").exists():
        return target, 0.0
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tmp = CACHE / f".building-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    done = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={INCLUDE}", SUITE, str(tmp), MIRROR],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise HostsUnavailable(f"debootstrap {SUITE} failed: {(done.stderr or done.stdout)[-800:]}")
    # No network package sources inside: apt sees only the local test repository.
    for path in (tmp / "etc/apt/sources.list", *(tmp / "etc/apt/sources.list.d").glob("*")):
        path.unlink(missing_ok=True)
    (tmp / "etc/apt/sources.list").write_text("")
    (tmp / ".fleetops-complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
    try:
        tmp.rename(target)
    except OSError:  # another run finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return target, time.monotonic() - started


# --- stand-in packages -----------------------------------------------------------------------

LOAD_SCRIPT = r'''#!/usr/bin/python3
"""Stand-in for loading the NVIDIA kernel module: the installed version becomes the loaded one."""
import fcntl, json, os, sys, tempfile
STATE = os.environ.get("FLEETOPS_SIM_STATE", "/var/lib/fleetops-sim/state.json")
if os.path.exists("/etc/nvidia-sim/fail-load"):
    sys.exit("nvidia-sim: the module failed to load (/etc/nvidia-sim/fail-load exists)")
version = open("/usr/lib/nvidia-sim/driver-version").read().strip()
with open(STATE + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    state = json.load(open(STATE))
    state["node"]["driver_version"] = version
    state["node"]["nvml_version"] = "13." + version
    for gpu in state["gpus"]:
        gpu["gsp_firmware"] = version
        # A fresh module load resets the power limit to its default, as NVML's does.
        gpu["power_limit_w"] = gpu.get("power_default_limit_w", gpu["power_limit_w"])
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(STATE))
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh, indent=1)
    os.replace(tmp, STATE)
print("nvidia-sim: loaded driver", version)
'''

FM_CHECK = r'''#!/usr/bin/python3
"""Fabric Manager refuses to run against a driver of another version."""
import json, os, sys
STATE = os.environ.get("FLEETOPS_SIM_STATE", "/var/lib/fleetops-sim/state.json")
mine = sys.argv[1]
loaded = json.load(open(STATE))["node"]["driver_version"]
if loaded != mine:
    sys.exit(f"nv-fabricmanager {mine}: driver version mismatch (loaded {loaded})")
'''

SYNC_SCRIPT = r'''#!/usr/bin/python3
"""apt hook: mirror the installed NVIDIA/CUDA packages (dpkg status) into the simulator state."""
import fcntl, json, os, tempfile
STATE = os.environ.get("FLEETOPS_SIM_STATE", "/var/lib/fleetops-sim/state.json")
PREFIXES = ("nvidia-", "cuda-", "libnvidia-")
if not os.path.exists(STATE):
    raise SystemExit(0)
found, name, version, ok = {}, None, None, False
for line in open("/var/lib/dpkg/status", encoding="utf-8", errors="replace"):
    if line.startswith("Package: "):
        name, version, ok = line[9:].strip(), None, False
    elif line.startswith("Status: "):
        ok = line.rstrip().endswith(" installed")
    elif line.startswith("Version: "):
        version = line[9:].strip()
    elif line == "\n":
        if name and version and ok and name.startswith(PREFIXES):
            found[name] = version
        name = None
if name and version and ok and name.startswith(PREFIXES):
    found[name] = version
with open(STATE + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    state = json.load(open(STATE))
    state["node"]["packages"] = found
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(STATE))
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh, indent=1)
    os.replace(tmp, STATE)
'''


def _unit(description: str, service: str, after: str = "", before: str = "") -> str:
    lines = ["[Unit]", f"Description={description}"]
    if after:
        lines.append(f"After={after}")
    if before:
        lines.append(f"Before={before}")
    lines += ["", "[Service]", service.strip(), "", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def _enable_postinst(*units: str) -> str:
    links = "\n".join(
        f"  ln -sf /lib/systemd/system/{u} /etc/systemd/system/multi-user.target.wants/{u}" for u in units
    )
    return textwrap.dedent(
        """\
        #!/bin/sh
        set -e
        if [ "$1" = configure ]; then
          mkdir -p /etc/systemd/system/multi-user.target.wants
        {links}
          if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
        fi
        """
    ).format(links=links)


def package_specs(driver: str) -> list[dict]:
    branch = driver.split(".")[0]
    env = f"Environment=FLEETOPS_SIM_STATE={STATE_IN_HOST}"
    return [
        {
            "name": f"nvidia-driver-{branch}-server",
            "version": f"{driver}-0ubuntu1",
            "files": {
                "usr/lib/nvidia-sim/driver-version": (driver + "\n", 0o644),
                "usr/lib/nvidia-sim/load": (LOAD_SCRIPT, 0o755),
                "lib/systemd/system/nvidia-sim-load.service": (
                    _unit(
                        "Load the (simulated) NVIDIA kernel module",
                        f"Type=oneshot\nRemainAfterExit=yes\n{env}\nExecStart=/usr/lib/nvidia-sim/load",
                        before="nvidia-persistenced.service nvidia-fabricmanager.service fleetops-gpu-power.service",
                    ),
                    0o644,
                ),
                "lib/systemd/system/nvidia-persistenced.service": (
                    _unit(
                        "NVIDIA Persistence Daemon (stand-in)",
                        "ExecStart=/bin/sleep infinity",
                        after="nvidia-sim-load.service",
                    ),
                    0o644,
                ),
            },
            "postinst": _enable_postinst("nvidia-sim-load.service"),
        },
        {
            "name": f"nvidia-fabricmanager-{branch}",
            "version": f"{driver}-1",
            "files": {
                "usr/lib/nvidia-sim/fabricmanager-check": (FM_CHECK, 0o755),
                "lib/systemd/system/nvidia-fabricmanager.service": (
                    _unit(
                        "NVIDIA Fabric Manager (stand-in)",
                        f"{env}\nExecStartPre=/usr/lib/nvidia-sim/fabricmanager-check {driver}\nExecStart=/bin/sleep infinity",
                        after="nvidia-sim-load.service",
                    ),
                    0o644,
                ),
            },
        },
    ]


CUDA_SPEC = {
    "name": "cuda-toolkit-13-0",
    "version": "13.0.2-1",
    "files": {
        "usr/local/cuda-13.0/bin/nvcc": (
            "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.2'\n",
            0o755,
        )
    },
}


def build_deb(spec: dict, out: Path, work: Path) -> Path:
    root = work / f"{spec['name']}_{spec['version']}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "DEBIAN").mkdir(parents=True)
    for rel, (text, mode) in spec["files"].items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
    control = (
        f"Package: {spec['name']}\nVersion: {spec['version']}\nArchitecture: all\n"
        "Maintainer: fleetops tests <tests@fleetops.invalid>\nSection: non-free/libs\nPriority: optional\n"
        f"Description: fleetops test stand-in for NVIDIA's {spec['name']}\n"
    )
    (root / "DEBIAN/control").write_text(control)
    if spec.get("postinst"):
        (root / "DEBIAN/postinst").write_text(spec["postinst"])
        (root / "DEBIAN/postinst").chmod(0o755)
    deb = out / f"{spec['name']}_{spec['version']}_all.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)])
    return deb


def build_repo(directory: Path, drivers: list[str]) -> dict[str, list[Path]]:
    """A flat apt repository (Packages, Release) of the stand-ins for each driver version."""
    directory.mkdir(parents=True, exist_ok=True)
    work = directory.parent / (directory.name + "-build")
    debs: dict[str, list[Path]] = {}
    for driver in drivers:
        debs[driver] = [build_deb(spec, directory, work) for spec in package_specs(driver)]
    debs["cuda"] = [build_deb(CUDA_SPEC, directory, work)]
    shutil.rmtree(work, ignore_errors=True)
    stanzas = []
    for deb in sorted(directory.glob("*.deb")):
        fields = _run(["dpkg-deb", "-f", str(deb)]).stdout.strip()
        data = deb.read_bytes()
        stanzas.append(
            f"{fields}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = "\n".join(stanzas)
    (directory / "Packages").write_text(packages)
    digest = hashlib.sha256(packages.encode()).hexdigest()
    (directory / "Release").write_text(
        f"Origin: fleetops-test\nLabel: fleetops-test\nDate: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}\n"
        f"SHA256:\n {digest} {len(packages.encode())} Packages\n"
    )
    return debs


# --- hosts -----------------------------------------------------------------------------------


@dataclass
class Host:
    name: str
    address: str
    directory: Path
    proc: subprocess.Popen | None = None
    boots: int = 0

    @property
    def root(self) -> Path:
        return self.directory / "root"

    @property
    def state(self) -> Path:
        return self.root / STATE_IN_HOST.lstrip("/")


@dataclass
class Cluster:
    directory: Path
    hosts: list[Host]
    port: int
    key: Path
    known_hosts: Path
    repo: Path
    timings: dict[str, float] = field(default_factory=dict)
    slurm: Slurm | None = None

    @property
    def inventory(self) -> Path:
        return self.directory / "inventory.yml"

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def ssh(self, host: Host, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [
            "ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "ConnectTimeout=5",
            f"root@{host.address}", command,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(
                f"{host.name}: {command!r} exited {done.returncode}: {done.stderr}{done.stdout}"
            )
        return done

    def state(self, name: str) -> dict:
        return json.loads(self.host(name).state.read_text())


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _mount_overlay(lower: list[Path], upper: Path, work: Path, target: Path) -> None:
    for path in (upper, work, target):
        path.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={':'.join(str(p) for p in lower)},upperdir={upper},workdir={work}"
    _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(target)])


def _umount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


def _prepare_layer(base: Path, directory: Path, debs: list[Path]) -> Path:
    """prep/: the old packages installed with dpkg, held, and the apt hook; returns the layer."""
    layer, work, root = directory / "prep", directory / "prep-work", directory / "prep-root"
    _mount_overlay([base], layer, work, root)
    try:
        (root / "tmp/debs").mkdir(parents=True, exist_ok=True)
        for deb in debs:
            shutil.copy(deb, root / "tmp/debs" / deb.name)
        sync = root / "usr/local/sbin/fleetops-sim-sync-packages"
        sync.write_text(SYNC_SCRIPT)
        sync.chmod(0o755)
        (root / "etc/apt/apt.conf.d/99fleetops-sim").write_text(
            'DPkg::Post-Invoke { "/usr/local/sbin/fleetops-sim-sync-packages || true"; };\n'
        )
        names = [d.name.split("_")[0] for d in debs]
        script = "dpkg -i /tmp/debs/*.deb && " + " && ".join(f"apt-mark hold {n}" for n in names)
        _run(["chroot", str(root), "/bin/sh", "-c", script])
        shutil.rmtree(root / "tmp/debs")
        # Nodes that run NVIDIA's driver already have NVIDIA's repository configured.
        (root / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/apt/sources.list.d/nvidia-cuda.sources").write_text(
            f"Types: deb\nURIs: file:{REPO_IN_HOST}\nSuites: ./\nTrusted: yes\n"
        )
        (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
        (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    finally:
        _umount(root)
    return layer


def _installed(status: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for block in status.read_text(errors="replace").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(" ")
        )
        if fields.get("Package", "").startswith(PACKAGE_PREFIXES) and fields.get("Status", "").endswith(
            " installed"
        ):
            found[fields["Package"]] = fields["Version"]
    return found


def _keypair(directory: Path) -> Path:
    key = directory / "id_ed25519"
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetops-nspawn-tests", "-f", str(key)])
    return key


def _start(host: Host, repo: Path) -> None:
    """Boot the host; a reboot inside (exit 133) boots it again, as systemd-nspawn@.service does."""
    log = open(host.directory / "console.log", "ab")
    nspawn = (
        f"systemd-nspawn -q -D {host.root} -b --register=no --keep-unit --machine=fo-{host.name} "
        f"--hostname={host.name} --bind-ro={repo}:{REPO_IN_HOST}"
    )
    loop = f'while :; do {nspawn}; rc=$?; [ "$rc" = 133 ] || exit "$rc"; done'
    host.proc = subprocess.Popen(
        ["/bin/sh", "-c", loop],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_ssh(cluster: Cluster, host: Host, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.proc is not None and host.proc.poll() is not None:
            break
        done = subprocess.run(
            ["ssh", "-i", str(cluster.key), "-p", str(cluster.port), "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "ConnectTimeout=2",
             f"root@{host.address}", "systemctl is-system-running --wait >/dev/null 2>&1; true"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        if done.returncode == 0:
            return
        time.sleep(0.5)
    console = (host.directory / "console.log").read_text(errors="replace")[-2000:]
    raise HostsUnavailable(f"{host.name} did not come up on ssh within {timeout:.0f}s; console:\n{console}")


# --- a real slurmctld on the machine, slurmd in every host -----------------------------------


def slurm_skip_reason() -> str | None:
    missing = [t for t in ("slurmctld", "scontrol", "munged") if shutil.which(t) is None]
    if missing:
        return f"no {', '.join(missing)} here (apt-get install -y slurmctld slurm-client munge)"
    return None


@dataclass
class Slurm:
    directory: Path
    conf: Path
    scontrol: Path  # a wrapper that points scontrol at this cluster's slurm.conf
    ctld: subprocess.Popen | None = None
    munged_pid: int | None = None

    def show(self, node: str) -> tuple[str, str | None]:
        out = subprocess.run(
            [str(self.scontrol), "show", "node", node, "-o"], capture_output=True, text=True, check=True
        ).stdout
        state = next((w[6:] for w in out.split() if w.startswith("State=")), "")
        reason = out.split(" Reason=", 1)[1].rsplit(" [", 1)[0].strip() if " Reason=" in out else None
        return state, reason

    def run(self, *args: str) -> None:
        """``scontrol ARGS`` against this cluster; a refusal raises."""
        subprocess.run([str(self.scontrol), *args], check=True, capture_output=True, text=True)

    def states(self) -> dict[str, str]:
        """Every node's State, from ``scontrol show nodes -o``."""
        out = subprocess.run(
            [str(self.scontrol), "show", "nodes", "-o"], capture_output=True, text=True, check=True
        ).stdout
        states = {}
        for line in out.splitlines():
            words = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if "NodeName" in words:
                states[words["NodeName"]] = words.get("State", "")
        return states

    def until_idle(self, timeout: float = 180.0) -> None:
        """Every node IDLE and responding: each slurmd registered (slurmctld may mark a node
        NOT_RESPONDING for a moment after a resume on a loaded machine, and the capacity guard
        rightly counts such a node out of service)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states()
            if states and all(s == "IDLE" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the nodes did not all come up IDLE within {timeout:g}s: {states}")
            time.sleep(0.5)

    def resume_all(self) -> None:
        """Every node back in service, as the guard counts it: no drain, and its slurmd answering."""
        for node, state in self.states().items():
            if "DRAIN" in state:
                self.run("update", f"NodeName={node}", "State=RESUME")
        self.until_idle(120.0)


NVIDIA_MAJOR = 195  # /dev/nvidia<minor>'s character device major (the driver's, fixed)
GRES_CONF_IN_HOST = "/etc/slurm/gres.conf"


def gres_devices(root: Path, minors: list[int]) -> None:
    """A GPU node's gres.conf and its device files, for a host whose simulated GPUs have these
    device ``minors`` (by NVML index): gres.conf lists ``/dev/nvidia<minor>`` in minor order, as
    a site writes it (``File=/dev/nvidia[0-7]``), so gres id N is the Nth smallest minor, which
    is not NVML's index N where the minors are out of index order.

    systemd-nspawn gives the container a /dev of its own (a tmpfs it fills with the basic nodes),
    so device files made in the image's /dev are hidden; the files are made at boot instead, by
    a oneshot unit ordered before slurmd, so they exist when slurmd reads gres.conf. mknod works
    in the container: nspawn keeps CAP_MKNOD, and with --register=no no device policy refused it
    here. Nothing opens the files (there is no driver behind them): slurmd and the agent only
    stat them, and their st_rdev is what the agent resolves by."""
    ordered = sorted(minors)
    lines = ["# fleetops nspawn test host: one simulated GPU per device minor", "AutoDetect=off"]
    lines += [f"Name=gpu File=/dev/nvidia{m}" for m in ordered]
    (root / GRES_CONF_IN_HOST.lstrip("/")).write_text("\n".join(lines) + "\n")
    make = " && ".join(
        f"{{ [ -c /dev/nvidia{m} ] || mknod -m 0666 /dev/nvidia{m} c {NVIDIA_MAJOR} {m}; }}" for m in ordered
    )
    unit = _unit(
        "Make the simulated GPUs' /dev/nvidia<minor> device files",
        f"Type=oneshot\nRemainAfterExit=yes\nExecStart=/bin/sh -c '{make}'",
        before="slurmd.service",
    )
    (root / "etc/systemd/system/fleetops-sim-nvidia-devices.service").write_text(unit)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "fleetops-sim-nvidia-devices.service").unlink(missing_ok=True)
    (wants / "fleetops-sim-nvidia-devices.service").symlink_to(
        "/etc/systemd/system/fleetops-sim-nvidia-devices.service"
    )


def _slurm_conf(
    hosts: list[Host], ctld_port: int, node_ports: dict[str, int], auth_socket: str | None, gpus: int = 0
) -> str:
    lines = [
        "ClusterName=fleetopstest",
        *(["GresTypes=gpu"] if gpus else []),
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "AuthType=auth/munge",
        *([f"AuthInfo=socket={auth_socket}"] if auth_socket else []),
        "SlurmUser=root",
        "SlurmdUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        # with GPUs, jobs share the node (OverSubscribe below): memory untracked, or the first job
        # takes the node's whole declared memory and the next one waits for it
        *(["SelectTypeParameters=CR_Core"] if gpus else []),
        "SchedulerType=sched/builtin",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=600",
        # Gres, at verbose: slurmd logs its GPU device list in the order it numbers them (gres ids)
        "DebugFlags=NO_CONF_HASH" + (",Gres" if gpus else ""),
        *(["SlurmdDebug=verbose"] if gpus else []),
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmdLogFile=/var/log/slurmd.log",
    ]
    for host in hosts:
        lines.append(
            f"NodeName={host.name} NodeAddr={host.address} Port={node_ports[host.name]} CPUs=1 State=UNKNOWN"
            + (f" Gres=gpu:{gpus}" if gpus else "")
        )
    # A GPU node declares one CPU: OverSubscribe lets jobs that ask (--oversubscribe) share it, so
    # several GPU jobs run on a node at once, each with GPUs of its own.
    lines.append(
        f"PartitionName=gpu Nodes={','.join(h.name for h in hosts)} Default=YES State=UP"
        + (" OverSubscribe=YES" if gpus else "")
    )
    return "\n".join(lines) + "\n"


def _slurm_up(directory: Path, base: Path, hosts: list[Host], gpus: int = 0) -> Slurm:
    """munged (with the hosts' key) and slurmctld on loopback; returns the handle. ``gpus``:
    every node declares that many ``gpu`` gres (slurm.conf ``GresTypes=gpu``, ``Gres=gpu:N``)."""
    sdir = directory / "slurm"
    for sub in ("run", "state", "log"):
        (sdir / sub).mkdir(parents=True, exist_ok=True)
    ctld_port = _free_port("127.0.0.1")
    node_ports = {h.name: _free_port(h.address) for h in hosts}
    socket_path = sdir / "run" / "munge.sock"
    conf = sdir / "slurm.conf"
    conf.write_text(
        _slurm_conf(hosts, ctld_port, node_ports, str(socket_path), gpus)
        + f"StateSaveLocation={sdir / 'state'}\nSlurmctldPidFile={sdir / 'run/slurmctld.pid'}\n"
        f"SlurmctldLogFile={sdir / 'log/slurmctld.log'}\n"
    )
    for host in hosts:
        (host.root / "etc/slurm/slurm.conf").write_text(_slurm_conf(hosts, ctld_port, node_ports, None, gpus))
    wrapper = sdir / "scontrol"
    wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={conf} exec {shutil.which("scontrol")} "$@"\n')
    wrapper.chmod(0o755)
    pidfile = sdir / "run" / "munged.pid"
    _run(
        [
            "munged", "--force", f"--socket={socket_path}", f"--key-file={base / 'etc/munge/munge.key'}",
            f"--log-file={sdir / 'log/munged.log'}", f"--pid-file={pidfile}", f"--seed-file={sdir / 'run/munged.seed'}",
        ]
    )  # fmt: skip
    slurm = Slurm(sdir, conf, wrapper, munged_pid=int(pidfile.read_text().strip()))
    log = open(sdir / "log" / "slurmctld.out", "ab")
    slurm.ctld = subprocess.Popen(
        [shutil.which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(conf)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, "SLURM_CONF": str(conf)},
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done = subprocess.run([str(wrapper), "ping"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and "UP" in done.stdout:
            return slurm
        if slurm.ctld.poll() is not None:
            break
        time.sleep(0.3)
    _slurm_down(slurm)
    tail = (sdir / "log" / "slurmctld.out").read_text(errors="replace")[-1500:]
    raise HostsUnavailable(f"slurmctld did not come up: {tail}")


def _slurm_down(slurm: Slurm) -> None:
    if slurm.ctld is not None and slurm.ctld.poll() is None:
        slurm.ctld.terminate()
        try:
            slurm.ctld.wait(timeout=15)
        except subprocess.TimeoutExpired:
            slurm.ctld.kill()
            slurm.ctld.wait(timeout=5)
    if slurm.munged_pid:
        try:
            os.kill(slurm.munged_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def up(
    directory: Path,
    names: list[str],
    old_driver: str,
    new_driver: str,
    first: str = "127.0.48.1",
    slurm: bool = False,
    gpu_minor_numbers: list[int] | None = None,
    gres: bool = False,
) -> Cluster:
    """Boot ``names`` (see the module docstring). ``gpu_minor_numbers``: each simulated GPU's
    device minor, by NVML index (the sim scenario's option; default the index). ``gres`` (with
    ``slurm``): the nodes are GPU nodes to Slurm: slurm.conf declares their GPUs, each host has a
    gres.conf naming ``/dev/nvidia<minor>`` in minor order and those device files, made at boot as
    character devices of NVIDIA's major (195) with the simulated GPUs' minors (gres_devices)."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    base, timings["debootstrap_s"] = base_image()
    t = time.monotonic()
    repo = directory / "repo"
    debs = build_repo(repo, [old_driver, new_driver])
    timings["repo_s"] = time.monotonic() - t
    t = time.monotonic()
    prep = _prepare_layer(base, directory, debs[old_driver] + debs["cuda"])
    timings["prep_s"] = time.monotonic() - t
    key = _keypair(directory)
    prefix = first.rsplit(".", 1)[0]
    start = int(first.rsplit(".", 1)[1])
    hosts = [Host(n, f"{prefix}.{start + i}", directory / n) for i, n in enumerate(names)]
    port = _free_port(hosts[0].address)
    host_pub = (base / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    known = directory / "known_hosts"
    known.write_text("".join(f"[{h.address}]:{port} {' '.join(host_pub)}\n" for h in hosts))
    cluster = Cluster(directory, hosts, port, key, known, repo, timings)
    installed = _installed(prep / "var/lib/dpkg/status")
    t = time.monotonic()
    try:
        for host in hosts:
            _mount_overlay([prep, base], host.directory / "upper", host.directory / "work", host.root)
            root = host.root
            (root / "etc/hostname").write_text(host.name + "\n")
            (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{host.address} {host.name}\n")
            (root / "root/.ssh").mkdir(mode=0o700, parents=True, exist_ok=True)
            (root / "root/.ssh/authorized_keys").write_text(Path(str(key) + ".pub").read_text())
            (root / "etc/ssh/sshd_config.d/fleetops.conf").write_text(
                f"ListenAddress {host.address}\nPort {port}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                f"UseDNS no\nSetEnv FLEETOPS_SIM_STATE={STATE_IN_HOST}\n"
            )
            for unit in (
                "apt-daily.timer",
                "apt-daily-upgrade.timer",
                "e2scrub_all.timer",
                "console-getty.service",
            ):
                (root / "etc/systemd/system" / unit).unlink(missing_ok=True)
                (root / "etc/systemd/system" / unit).symlink_to("/dev/null")
            scenario: dict = {"node": {"driver_version": old_driver, "nvml_version": "13." + old_driver}}
            if gpu_minor_numbers is not None:
                scenario["gpu_minor_numbers"] = list(gpu_minor_numbers)
            state = sim.build_state(host.name, scenario)
            if gres:
                gres_devices(root, [int(g["minor_number"]) for g in state["gpus"]])
            state["node"]["packages"] = dict(installed)
            host.state.parent.mkdir(parents=True, exist_ok=True)
            sim.write_state(str(host.state), state)
            if not slurm:  # no slurm.conf: slurmd's unit condition keeps it from starting
                (root / "etc/systemd/system/slurmd.service").symlink_to("/dev/null")
                (root / "etc/systemd/system/munge.service").symlink_to("/dev/null")
        if slurm:
            gpus = len(cluster.state(hosts[0].name)["gpus"]) if gres else 0
            cluster.slurm = _slurm_up(directory, base, hosts, gpus)
        for host in hosts:
            _start(host, repo)
        for host in hosts:
            _wait_ssh(cluster, host)
            host.boots = 1
            cluster.ssh(host, "apt-get update -qq")
    except BaseException:
        down(cluster)  # nothing left running or mounted when the hosts cannot come up
        raise
    timings["boot_s"] = time.monotonic() - t
    timings["total_up_s"] = time.monotonic() - started
    return cluster


def down(cluster: Cluster) -> None:
    """Halt the hosts (SIGTERM: a clean shutdown), stop slurmctld and munged, unmount."""
    if cluster.slurm is not None:
        _slurm_down(cluster.slurm)
    for host in cluster.hosts:
        if host.proc is None:
            continue
        try:
            os.killpg(host.proc.pid, signal.SIGTERM)  # the loop shell and systemd-nspawn: clean halt
        except ProcessLookupError:
            pass
    for host in cluster.hosts:
        if host.proc is not None:
            _wait_group_gone(host.proc, 30.0)
        _umount(host.root)


def _wait_group_gone(proc: subprocess.Popen, timeout: float) -> None:
    """Wait until the loop shell and systemd-nspawn (one process group) have exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=5)


def write_inventory(cluster: Cluster, wheelhouse: Path, extra: dict | None = None) -> Path:
    import yaml

    hosts = {
        h.name: {
            "ansible_host": h.address,
            "ansible_port": cluster.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(cluster.key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={cluster.known_hosts}",
            "ansible_python_interpreter": "/usr/bin/python3",
            "fleetops_sim_state": STATE_IN_HOST,
        }
        for h in cluster.hosts
    }
    group_vars = {
        "fleetops_sim_container": True,
        "fleetops_agent_wheelhouse_src": str(wheelhouse),
        "fleetops_agent_extra_packages": [],
        "fleetops_agent_install_os_packages": False,
        "nvidia_driver_repo_debian_uris": f"file:{REPO_IN_HOST}",
        "nvidia_driver_repo_debian_suites": "./",
        "nvidia_driver_repo_debian_key_url": "",
        "nvidia_driver_repo_debian_trusted": True,
        "nvidia_driver_reboot_boot_time_command": BOOT_TIME_COMMAND,
        "nvidia_driver_reboot_timeout": 300,
        "fleetops_baseline": {
            "gpu_count": 8,
            "persistence_mode": True,
            "power_limit_w": 700,
            "mig": {"mode": False},
        },
        # With slurmctld the hosts are Slurm nodes (drained through its scontrol on the
        # controller); without it Slurm does not manage them, which the strict drain rule needs
        # said (fleetops_slurm_managed: false), else every drain fails on the missing scontrol.
        **(
            {
                "slurm_drain_scontrol": str(cluster.slurm.scontrol),
                "slurm_drain_delegate_to": "localhost",
                "slurm_drain_poll_interval": 1,
            }
            if cluster.slurm
            else {"fleetops_slurm_managed": False}
        ),
        **(extra or {}),
    }
    doc = {"all": {"children": {"gpu": {"hosts": hosts, "vars": group_vars}}}}
    cluster.inventory.write_text(
        "# nspawn test cluster; written by tests/ansible/nspawn_hosts.py\n"
        + yaml.safe_dump(doc, sort_keys=False)
    )
    return cluster.inventory


# --- the agent's wheelhouse ------------------------------------------------------------------


def build_wheel(source: Path, out: Path) -> Path:
    """A pure-Python wheel of the fleetops package in ``source``, built without network or the
    ``wheel`` package (a wheel is a zip with a dist-info folder)."""
    import base64
    import tomllib
    import zipfile

    project = tomllib.loads((source / "pyproject.toml").read_text())["project"]
    name, version = project["name"], project["version"]
    dist_info = f"{name}-{version}.dist-info"
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{name}-{version}-py3-none-any.whl"
    records: list[str] = []

    def add(zf: zipfile.ZipFile, arcname: str, data: bytes) -> None:
        zf.writestr(zipfile.ZipInfo(arcname, date_time=(2026, 1, 1, 0, 0, 0)), data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        records.append(f"{arcname},sha256={digest},{len(data)}")

    suffixes = {".py", ".yml", ".yaml", ".tcss", ".json"}
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted((source / "fleetops").rglob("*")):
            if path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts:
                add(zf, path.relative_to(source).as_posix(), path.read_bytes())
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {project.get('description', '')}\n"
        add(zf, f"{dist_info}/METADATA", meta.encode())
        add(
            zf,
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: fleetops-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        scripts = project.get("scripts", {})
        entry = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        add(zf, f"{dist_info}/entry_points.txt", entry.encode())
        records.append(f"{dist_info}/RECORD,,")
        zf.writestr(
            zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2026, 1, 1, 0, 0, 0)), "\n".join(records) + "\n"
        )
    return wheel
