"""Each simulator fault's warn/crit findings, kept by hand rather than read back from the
checks: the unit checks test and the audit-over-SSH test both assert them exactly, so a crit
that turns into a warn fails both."""

from __future__ import annotations

# fault -> the warn/crit check ids it must raise (exactly) and their severity.
EXPECTED: dict[str, dict[str, str]] = {
    "power-cap-drift": {"thermal_power.power_limit": "warn"},
    "persistence-off": {"config.persistence_mode": "warn"},
    "mig-drift": {"config.mig_mode": "warn"},
    "vbios-drift": {"versions.vbios": "warn"},
    "driver-drift": {
        "versions.driver": "warn",
        "versions.fabric_manager_match": "crit",  # FM 580 cannot run against driver 570
        "versions.driver_package": "warn",  # installed package 580 is not the loaded 570
    },
    "ecc-dbe": {"memory.ecc_dbe_volatile": "crit", "xid.recent": "crit"},  # the sim also logs XID 48
    "ecc-sbe-storm": {"memory.ecc_sbe_volatile": "warn", "memory.ecc_sbe_rate": "warn"},
    "row-remap-pending": {"memory.row_remap_pending": "warn"},
    "row-remap-failure": {"memory.row_remap_failure": "crit", "xid.recent": "crit"},  # and XID 64
    "pcie-downgrade": {"pcie.link_degraded": "warn"},
    "pcie-replay-storm": {"pcie.replay_rate": "warn"},
    "nvlink-down": {"nvlink.links_down": "crit"},
    "nvlink-crc-storm": {"nvlink.error_rate": "warn"},
    "nvlink-idle": {"nvlink.idle_link": "warn"},  # the fault runs a job: the other links carry traffic
    "thermal-slowdown": {
        "thermal_power.throttle": "warn",
        "thermal_power.temperature": "crit",
        "thermal_power.memory_temperature": "warn",
    },
    "power-brake": {"thermal_power.throttle": "warn"},
    "gpu-missing": {"config.gpu_count": "crit", "config.gpu_missing": "crit"},
    "stray-process": {"config.stray_processes": "warn"},
    "xid:79": {"xid.recent": "crit", "config.gpu_count": "crit", "config.gpu_missing": "crit"},
    "xid:48": {"xid.recent": "crit"},
    "xid:94": {"xid.recent": "warn"},
    "xid:13": {"xid.recent": "warn"},
    # the HCA beside the GPU (mlx5_N); the port is named in observed, the finding is the node's
    "ib-port-down": {"fabric.port_down": "crit"},
    "ib-degraded": {"fabric.port_degraded": "crit"},  # the baseline pins 400 Gb/s 4X
    "ib-flap": {"fabric.port_down": "crit"},  # taken 2 minutes in: the port is in its down half
    "ib-symbol-errors": {"fabric.link_errors": "crit"},  # 50/s: over 120 within the hour
    "ib-link-downed": {"fabric.link_downed": "crit"},
    "ib-fw-drift": {"fabric.firmware": "warn"},
    "ib-missing-hca": {"fabric.port_count": "crit", "fabric.gpu_without_hca": "warn"},
}
NODE_LEVEL = {"versions.driver", "versions.fabric_manager_match", "versions.driver_package", "config.gpu_count",
              "fabric.port_down", "fabric.port_degraded", "fabric.firmware", "fabric.port_count",
              "fabric.link_downed", "fabric.error_counters", "fabric.link_errors"}
# Checks that compare two snapshots (rates): an audit without history has no previous snapshot
# for them. config.gpu_missing needs none for a lost GPU: it stays listed, answering GpuIsLost.
NEEDS_PREVIOUS = {"memory.ecc_sbe_rate", "pcie.replay_rate", "nvlink.error_rate", "nvlink.idle_link",
                  "fabric.link_downed", "fabric.error_counters", "fabric.link_errors"}
