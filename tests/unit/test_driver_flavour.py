"""The driver must be a data center one: an allowed branch (from the version NVML reports) and a
data center package flavour (from the packages the node has installed and who built them)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fleetops import baseline, model
from fleetops.checks import REGISTRY, checks_run, run_node_checks, versions
from fleetops.checks.versions import (
    CONSUMER,
    DATACENTER,
    driver_branch,
    driver_flavour,
    package_flavour,
)
from fleetops.gpu import hostinfo
from fleetops.sim import gpu as sim

UBUNTU = "Ubuntu Core Developers <ubuntu-devel-discuss@lists.ubuntu.com>"
NVIDIA = "NVIDIA <cudatools@nvidia.com>"
DC = baseline.from_mapping({"driver": {"branches": [535, 550, 570, 580], "flavour": "datacenter"}}, "dc")


@pytest.mark.parametrize(("name", "origin", "flavour"), [
    ("nvidia-driver-580-server", UBUNTU, DATACENTER),
    ("nvidia-driver-580-server-open", UBUNTU, DATACENTER),
    ("nvidia-headless-no-dkms-570-server", None, DATACENTER),
    ("linux-modules-nvidia-580-server-6.8.0-49-generic", UBUNTU, DATACENTER),
    ("nvidia-driver-580-open", NVIDIA, DATACENTER),  # NVIDIA's repository ships this name too
    ("cuda-drivers-580", None, DATACENTER),
    ("nvidia-open", None, DATACENTER),
    ("kmod-nvidia-open-dkms", "NVIDIA Corporation", DATACENTER),
    ("nvidia-driver-580", UBUNTU, CONSUMER),
    ("nvidia-driver-580-open", UBUNTU, CONSUMER),
    ("akmod-nvidia", "RPM Fusion", CONSUMER),
    ("nvidia-driver-580", None, None),  # Ubuntu's or NVIDIA's: unknown without the origin
])
def test_package_flavour(name: str, origin: str | None, flavour: str | None) -> None:
    found = package_flavour(name, origin)
    assert found is not None and found[0] == flavour


def test_packages_that_say_nothing_about_the_flavour_are_skipped() -> None:
    assert package_flavour("nvidia-fabricmanager-580", UBUNTU) is None
    assert package_flavour("cuda-toolkit-13-0", NVIDIA) is None  # NVIDIA's, but not the driver
    assert package_flavour("libnvidia-compute-580-server", None) is None


def test_branch_is_the_major_number_of_the_nvml_version() -> None:
    assert driver_branch("580.159.04") == 580 and driver_branch("535.261.03") == 535
    assert driver_branch(None) is None and driver_branch("unknown") is None


def _consumer(node: model.Node) -> model.Node:
    node.packages = {"nvidia-driver-580": "580.159.04-0ubuntu1", "nvidia-fabricmanager-580": "580.159.04-1"}
    node.package_origins = {"nvidia-driver-580": UBUNTU}
    return node


def test_the_default_simulated_node_has_a_datacenter_driver(sim_node) -> None:
    node = sim_node("n1")
    assert driver_flavour(node)[0] == DATACENTER
    got = {f.check for f in run_node_checks(node, DC, None)}
    assert not {c for c in got if c.startswith("versions.")}


def test_a_consumer_package_is_a_warning_naming_it(sim_node) -> None:
    [f] = [f for f in run_node_checks(_consumer(sim_node("n1")), DC, None) if f.check == "versions.driver_flavour"]
    assert f.severity == "warn" and f.expected == DATACENTER
    assert "nvidia-driver-580 without -server is Ubuntu's consumer package" in f.message
    assert "nvidia-driver-580-server" in f.action and "fleetops rollout driver" in f.action


def test_a_branch_outside_the_list_is_a_warning(sim_node) -> None:
    node = sim_node("n1", faults=["driver-drift"])  # 570.133.20
    b = baseline.from_mapping({"driver": {"branches": [535, 580]}}, "b")
    [f] = [f for f in run_node_checks(node, b, None) if f.check == "versions.driver_branch"]
    assert (f.severity, f.expected) == ("warn", [535, 580])
    assert f.observed == {"branch": 570, "driver_version": "570.133.20", "nvml_build_branch": "r570_00"}
    assert f.message == ("driver 570.133.20 is branch 570; NVML names its build branch 'r570_00', not one of "
                         "the baseline's data center branches 535, 580")
    assert [f for f in run_node_checks(node, DC, None) if f.check == "versions.driver_branch"] == []


def test_the_real_h200s_build_branch_is_not_its_product_branch(sim_node) -> None:
    """On the real H200 the 580.159.04 driver's NVML names build branch r582_49: a baseline that
    allows branch 580 passes it, one that allows only 582 does not (the branch is the version's)."""
    node = sim_node("n1")
    assert (node.driver_version, node.driver_branch) == ("580.159.04", "r582_49")
    assert versions.loaded_branch(node) == 580
    allows_580 = baseline.from_mapping({"driver": {"branches": [580]}}, "b")
    assert [f for f in run_node_checks(node, allows_580, None) if f.check.startswith("versions.")] == []
    allows_582 = baseline.from_mapping({"driver": {"branches": [582]}}, "b")
    [f] = [f for f in run_node_checks(node, allows_582, None) if f.check == "versions.driver_branch"]
    assert f.observed == {"branch": 580, "driver_version": "580.159.04", "nvml_build_branch": "r582_49"}


def test_without_nvmls_branch_the_finding_names_the_version_alone(sim_node) -> None:
    node = sim_node("n1", faults=["driver-drift"])
    node.driver_branch = None
    node.unavailable["driver_branch"] = "FunctionNotFound"
    b = baseline.from_mapping({"driver": {"branches": [580]}}, "b")
    found = run_node_checks(node, b, None)
    [f] = [f for f in found if f.check == "versions.driver_branch"]
    assert f.observed == {"branch": 570, "driver_version": "570.133.20", "nvml_build_branch": None}
    assert f.message == "driver 570.133.20 is branch 570, not one of the baseline's data center branches 580"
    assert "versions.unreadable" not in {f.check for f in found}  # a missing call is no unknown


def test_the_simulator_reports_the_build_branch_of_its_loaded_driver(sim_node) -> None:
    assert sim_node("n1").driver_branch == "r582_49"  # as the real H200's NVML names it
    assert sim_node("n1", faults=["driver-drift"]).driver_branch == "r570_00"
    from tests.unit.conftest import node_from_state

    state = sim.build_state("n1", {"node": {"driver_branch": None}})  # a driver without the call
    node = node_from_state(state, None)
    assert node.driver_branch is None and node.unavailable == {"driver_branch": "FunctionNotFound"}
    assert sim.driver_branch_of("580.159.04") == "r582_49" and sim.driver_branch_of(None) is None
    assert sim.driver_branch_of("570.133.20") == "r570_00"


def test_an_ambiguous_package_is_unknown_not_consumer(sim_node) -> None:
    node = sim_node("n1")
    node.packages = {"nvidia-driver-580": "580.159.04-1"}
    node.package_origins = {}
    findings = run_node_checks(node, DC, None)
    assert "versions.driver_flavour" not in {f.check for f in findings}
    [u] = [f for f in findings if f.check == "versions.unreadable"]
    assert u.severity == "unknown" and "driver_flavour" in u.observed


def test_unreadable_packages_are_unknown(sim_node) -> None:
    node = sim_node("n1")
    node.packages, node.package_origins = {}, {}
    node.unavailable["packages"] = "no dpkg status file and no rpm"
    [u] = [f for f in run_node_checks(node, DC, None) if f.check == "versions.unreadable"]
    assert "packages" in u.observed


def test_without_the_baseline_key_nothing_is_judged(sim_node) -> None:
    node = _consumer(sim_node("n1"))
    other = baseline.from_mapping({"driver": {"flavour": "any"}}, "any")
    for b in (None, other):
        assert "versions.driver_flavour" not in {f.check for f in run_node_checks(node, b, None)}
    assert "versions.driver_flavour" in checks_run(node, DC) and "versions.driver_flavour" not in checks_run(node, other)
    assert REGISTRY["versions.driver_flavour"].requires == "driver.flavour: datacenter"


def test_the_simulator_reports_the_flavour_a_scenario_sets() -> None:
    state = sim.build_state("n1", {"node": {"packages": {"nvidia-driver-580": "580.159.04-0ubuntu1"},
                                            "package_origins": {"nvidia-driver-580": UBUNTU}}})
    node = model.node_from_dict(sim.snapshot(state))
    assert node.package_origins == {"nvidia-driver-580": UBUNTU}
    assert driver_flavour(node)[0] == CONSUMER
    default = model.node_from_dict(sim.snapshot(sim.build_state("n2")))
    assert default.package_origins == {"nvidia-driver-580-server": UBUNTU}


# --- collection on the node ---------------------------------------------------------------

STATUS = """\
Package: nvidia-driver-580-server
Status: install ok installed
Maintainer: Ubuntu Core Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Version: 580.159.04-0ubuntu1

Package: nvidia-fabricmanager-580
Status: install ok installed
Maintainer: NVIDIA <cudatools@nvidia.com>
Version: 580.159.04-1

Package: nvidia-driver-570
Status: deinstall ok config-files
Maintainer: Ubuntu Core Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Version: 570.133.20-0ubuntu1

Package: bash
Status: install ok installed
Maintainer: Ubuntu Developers
Version: 5.2
"""


def test_dpkg_status_gives_versions_and_the_driver_packages_maintainers(tmp_path: Path) -> None:
    path = tmp_path / "status"
    path.write_text(STATUS)
    found, origins, reason = hostinfo.nvidia_packages_with_origins(str(path))
    assert reason is None
    assert found == {"nvidia-driver-580-server": "580.159.04-0ubuntu1", "nvidia-fabricmanager-580": "580.159.04-1"}
    assert origins == {"nvidia-driver-580-server": UBUNTU}  # removed packages and non-driver ones: none


def _fake_rpm(folder: Path) -> None:
    rpm = folder / "rpm"
    rpm.write_text("#!/bin/sh\n[ \"$1\" = -qa ] || exit 2\nprintf '%s' \"$FAKE_RPM_OUT\"\n")
    rpm.chmod(rpm.stat().st_mode | stat.S_IXUSR)


def test_rpm_query_gives_vendors_and_absent_tools_are_tolerated(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    missing = str(tmp_path / "no-dpkg-status")
    assert hostinfo.nvidia_packages_with_origins(missing) == ({}, {}, "no dpkg status file and no rpm")
    monkeypatch.setenv("FAKE_RPM_OUT", "akmod-nvidia\t580.95.05-1.fc41\tRPM Fusion\nbash\t5.2-1\tFedora Project\n"
                       "nvidia-driver\t580.95.05-1.el9\tNVIDIA Corporation\ncuda-toolkit\t13.0-1\t(none)\n")
    _fake_rpm(bin_dir)
    found, origins, reason = hostinfo.nvidia_packages_with_origins(missing)
    assert reason is None
    assert found == {"akmod-nvidia": "580.95.05-1.fc41", "nvidia-driver": "580.95.05-1.el9", "cuda-toolkit": "13.0-1"}
    assert origins == {"akmod-nvidia": "RPM Fusion", "nvidia-driver": "NVIDIA Corporation"}
