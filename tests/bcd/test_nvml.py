"""NVML readings mapped to inventory and health, on readings shaped like what NVML answers
on an HGX H100 host and on A100 PCIe cards (MIG on one, a row remap pending on one, an XID
79 on one); the simulated machine answers through the same interface; and every call the
inventory makes exists in NVIDIA's own bindings."""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import pynvml
import pytest

from bcd.inventory.described import DescribedNvml
from bcd.inventory.fake import FRESH_SECONDS, SimulatedInventory
from bcd.inventory.faults import faults_file, inject
from bcd.inventory.nvml import NvmlInventory, clear_health, cleared_file_of, linked_domains

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"
HOST = {"hostname": "h", "vcpus": 224, "memoryGiB": 2048}


def recorded(name: str, tmp_path: Path | None = None) -> NvmlInventory:
    machine = json.loads((FIXTURES / name).read_text())
    return NvmlInventory(DescribedNvml(lambda: machine), host=lambda: dict(HOST),
                         cleared_file=cleared_file_of(tmp_path) if tmp_path else None)


def watched(inventory: NvmlInventory) -> None:
    """Take every pending XID event off the event set, as the agent's thread does."""
    inventory.watch_xids(timeout_ms=100, until_quiet=True)


def test_an_hgx_h100_host_is_one_nvlink_domain_with_its_products_and_memory():
    gpus = recorded("h100-hgx.json").report()["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["nvlinkDomain"] for g in gpus} == {"nv0"}  # all eight on the NVSwitches
    assert {(g["product"], g["vramGiB"]) for g in gpus} == {("NVIDIA H100 80GB HBM3", 80)}
    assert gpus[0]["uuid"] == "GPU-8e1a9d9c-2c1f-3b0e-6a7d-0f3c1b2a4d5e"
    assert gpus[0]["serial"] == "1652323004100"
    assert [g["health"] for g in gpus].count("healthy") == 7
    assert (gpus[6]["health"], gpus[6]["healthReason"]) == ("unhealthy",
                                                            "hardware thermal slowdown")


def test_a100_cards_bridged_in_pairs_with_mig_a_remap_pending_and_a_link_down():
    gpus = recorded("a100-pcie-mig.json").report()["gpus"]
    assert [g["nvlinkDomain"] for g in gpus] == ["nv0", "nv0", "nv1", "nv1"]
    assert gpus[0]["mig"] == [
        {"uuid": "MIG-9f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0", "profile": "3g.20gb",
         "vramGiB": 20},
        {"uuid": "MIG-8e0d1c2b-3a49-4857-9665-b4a3c2d1e0f9", "profile": "2g.10gb",
         "vramGiB": 10},
        {"uuid": "MIG-7dfc0b1a-2938-4746-a554-c392b1c0dfe8", "profile": "1g.5gb",
         "vramGiB": 5}]
    assert gpus[1]["mig"] == []
    assert (gpus[1]["health"], gpus[1]["healthReason"]) == ("unhealthy",
                                                            "1 NVLink link(s) down")
    assert (gpus[2]["health"], gpus[2]["healthReason"]) == (
        "unhealthy", "memory repair pending: reset the GPU")
    assert gpus[3]["health"] == "healthy"  # the XID has not been taken off the event set yet


def test_an_xid_79_event_makes_its_gpu_unhealthy_until_cleared(tmp_path):
    inventory = recorded("a100-pcie-mig.json", tmp_path)
    watched(inventory)
    gpu = inventory.report()["gpus"][3]
    assert (gpu["health"], gpu["healthReason"]) == ("unhealthy",
                                                    "XID 79: the GPU has fallen off the bus")
    clear_health(cleared_file_of(tmp_path), gpu["uuid"])  # after the GPU was reset
    assert inventory.report()["gpus"][3]["health"] == "healthy"


def test_application_xids_say_nothing_of_the_gpu(tmp_path):
    machine = json.loads((FIXTURES / "h100-hgx.json").read_text())
    machine["events"] = [{"id": "a", "gpu": 2, "xid": 13}, {"id": "b", "gpu": 2, "xid": 31}]
    inventory = NvmlInventory(DescribedNvml(lambda: machine), host=lambda: dict(HOST))
    watched(inventory)
    assert inventory.report()["gpus"][2]["health"] == "healthy"


def test_telemetry_in_the_units_the_ledger_shows():
    readings = recorded("h100-hgx.json").telemetry()
    first = readings["GPU-8e1a9d9c-2c1f-3b0e-6a7d-0f3c1b2a4d5e"]
    assert first == {"utilization": 0.0, "temperatureC": 31.0, "powerW": 69.0,
                     "memoryUsedMiB": 4.0}


@pytest.mark.parametrize(("links", "expected"), [
    ({"a": ["s1"], "b": ["s1"], "c": ["s2"], "d": ["s2"]}, ["nv0", "nv0", "nv1", "nv1"]),
    ({"a": ["b"], "b": ["a"], "c": [], "d": []}, ["nv0", "nv0", "", ""]),
    ({"a": [], "b": [], "c": [], "d": []}, ["", "", "", ""]),
])
def test_linked_domains_follow_the_links(links, expected):
    assert list(linked_domains(links, ["a", "b", "c", "d"]).values()) == expected


def test_a_simulated_machine_answers_through_the_same_interface(tmp_path):
    machine = SimulatedInventory("gpu-01", root=str(tmp_path))
    assert isinstance(machine.nvml, NvmlInventory)
    inject(faults_file(tmp_path), 4, "xid", 79)
    watched(machine.nvml)
    gpu = machine.report()["gpus"][4]
    assert gpu["healthReason"] == "XID 79: the GPU has fallen off the bus"
    assert machine.report()["simulated"] == {"root": str(tmp_path)}


def test_a_simulated_machine_is_described_again_only_when_a_fault_changes_it(tmp_path):
    """One inventory read makes hundreds of NVML calls within milliseconds: they read one
    description (one look at the faults file), made again when a fault is injected or
    healed, so a fault is seen by the calls a tenth of a second later."""
    machine = SimulatedInventory("gpu-01", root=str(tmp_path))
    first = machine.describe()
    assert machine.describe() is first
    inject(faults_file(tmp_path), 2, "nvlink-down")
    time.sleep(FRESH_SECONDS)
    linked = machine.describe()
    assert linked is not first
    assert linked["gpus"][2]["nvlinks"][0][0] == 0
    time.sleep(FRESH_SECONDS)
    assert machine.describe() is linked  # looked again: nothing changed
    inject(faults_file(tmp_path), 2, "heal")
    time.sleep(FRESH_SECONDS)
    assert machine.describe()["gpus"][2]["nvlinks"][0][0] == 1


def nvml_calls() -> set[str]:
    """Every nvml* function bcd.inventory.nvml calls or looks up by name."""
    source = (Path(__file__).parents[2] / "bcd/inventory/nvml.py").read_text()
    call = re.compile(r"^nvml[A-Z]\w+$")
    names = {node.attr for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Attribute) and call.match(node.attr)}
    names |= {node.value for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and call.match(node.value)}
    return names


def test_every_call_exists_in_nvidias_bindings_and_in_the_simulated_nvml():
    calls = nvml_calls()
    assert len(calls) > 15
    assert sorted(c for c in calls if not hasattr(pynvml, c)) == []
    assert sorted(c for c in calls if not hasattr(DescribedNvml, c)) == []
