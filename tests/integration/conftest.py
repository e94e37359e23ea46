"""Integration fixtures: a small simulated fleet of real sshd on loopback, shared by the session.

Tests here are marked ``root``: they start sshd processes, which needs root and openssh-server.
Where either is missing they are skipped with the reason.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fleetops.fleet import inventory
from fleetops.sim import fleet

FLEET_NODES = 6
# A block of its own, away from the 127.0.10.x default a developer's demo fleet uses.
FLEET_FIRST_ADDRESS = os.environ.get("FLEETOPS_TEST_FLEET_ADDRESS", "127.0.20.1")


def root_sshd_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: the simulated fleet runs real sshd processes (run the tests as root)"
    if fleet.find_sshd() is None:
        return "needs sshd: apt-get install -y openssh-server"
    return None


def free_port(address: str) -> int:
    """A TCP port nothing listens on at ``address`` now (so parallel runs do not collide)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def root_sshd() -> None:
    reason = root_sshd_skip_reason()
    if reason:
        pytest.skip(reason)


@dataclass
class SimFleet:
    directory: str
    info: dict[str, Any]
    hosts: list[inventory.Host]

    @property
    def inventory_path(self) -> str:
        return os.path.join(self.directory, "inventory.yml")

    def host(self, name: str) -> inventory.Host:
        return next(h for h in self.hosts if h.name == name)


@pytest.fixture(scope="session")
def sim_fleet(root_sshd: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    directory = str(tmp_path_factory.mktemp("simfleet"))
    info = fleet.up(
        FLEET_NODES, directory, first_address=FLEET_FIRST_ADDRESS, port=free_port(FLEET_FIRST_ADDRESS)
    )
    try:
        hosts = inventory.load(os.path.join(directory, "inventory.yml"))
        yield SimFleet(directory, info, hosts)
    finally:
        fleet.down(directory)


@pytest.fixture
def clean_fleet(sim_fleet: SimFleet) -> Iterator[SimFleet]:
    """The session fleet, with every fault cleared again after the test."""
    yield sim_fleet
    for name in sorted(sim_fleet.info["nodes"]):
        fleet.clear(sim_fleet.directory, name, "all")
