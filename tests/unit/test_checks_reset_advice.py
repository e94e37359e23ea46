"""Every finding that advises a GPU reset names a command that works when pasted: the node, the
GPU and ``-i INVENTORY`` (the checks never know the inventory's path; the operator puts it in,
as for every other ``-i INVENTORY`` in advice), and ``fleetops``'s own parser takes it."""

from __future__ import annotations

import re

import pytest

from fleetops import cli
from fleetops.checks import registry_dicts, run_node_checks
from fleetops.docgen import data as docs_data
from fleetops.sim import gpu as sim
from fleetops.xid import catalog as xid_catalog

RESET = re.compile(r"fleetops reset (\S+) (\S+?) -i INVENTORY\b")


def _commands(text: str) -> list[tuple[str, str]]:
    found = RESET.findall(text)
    assert len(found) == text.count("fleetops reset"), f"a `fleetops reset` without -i INVENTORY: {text}"
    return found


def _parses(node: str, gpu: str) -> None:
    args = cli.build_parser().parse_args(["reset", node, gpu, "-i", "hosts.yml"])
    assert (args.node, args.gpu, args.inventory) == (node, gpu, "hosts.yml")


@pytest.mark.parametrize("fault", sorted(sim.FAULT_NAMES))
def test_a_findings_reset_advice_names_node_gpu_and_inventory_and_parses(fault, sim_baseline, sim_node) -> None:
    entry = fault if fault == "driver-drift" else f"{fault}@3"
    findings = run_node_checks(sim_node(faults=[entry]), sim_baseline, sim_node())
    for f in findings:
        for node, gpu in _commands(f.action or ""):
            assert node == "n1"
            if f.gpu is not None:
                assert gpu == f.gpu["uuid"]
            _parses(node, gpu)


def test_every_written_reset_advice_carries_the_inventory() -> None:
    texts = [str(d.get("action") or "") for d in registry_dicts()]
    texts += list(xid_catalog.ACTION_TEXT.values())
    texts += [v for v in vars(docs_data).values() if isinstance(v, str)]
    texts += [v for d in vars(docs_data).values() if isinstance(d, dict) for v in d.values() if isinstance(v, str)]
    assert sum(len(_commands(t)) for t in texts) > 5
