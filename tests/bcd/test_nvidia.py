"""GPUs from nvidia-smi: NVLink domains from `nvidia-smi topo -m`."""

from pathlib import Path

from bcd.inventory.nvidia import nvlink_domains

# An 8-GPU board with two fully connected NVLink islands of four (abridged `topo -m`).
TOPOLOGY = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity
GPU0\t X \tNV18\tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\t0-47
GPU1\tNV18\t X \tNV18\tNV18\tSYS\tSYS\tSYS\tSYS\t0-47
GPU2\tNV18\tNV18\t X \tNV18\tSYS\tSYS\tSYS\tSYS\t0-47
GPU3\tNV18\tNV18\tNV18\t X \tSYS\tSYS\tSYS\tSYS\t0-47
GPU4\tSYS\tSYS\tSYS\tSYS\t X \tNV18\tNV18\tNV18\t48-95
GPU5\tSYS\tSYS\tSYS\tSYS\tNV18\t X \tNV18\tNV18\t48-95
GPU6\tSYS\tSYS\tSYS\tSYS\tNV18\tNV18\t X \tNV18\t48-95
GPU7\tSYS\tSYS\tSYS\tSYS\tNV18\tNV18\tNV18\t X \t48-95
"""


def test_two_islands_of_four():
    domains = nvlink_domains(TOPOLOGY)
    assert domains == {0: "nv0", 1: "nv0", 2: "nv0", 3: "nv0",
                       4: "nv1", 5: "nv1", 6: "nv1", 7: "nv1"}


def test_pcie_only_gpus_have_no_domain():
    topology = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n"
    assert nvlink_domains(topology) == {0: "", 1: ""}


def test_no_nvidia_smi_output_means_no_gpus():
    assert nvlink_domains("") == {}


SMI = Path(__file__).parent / "fixtures" / "nvidia-smi"


def test_an_h100_host_from_nvidia_smi_xml_with_health_from_its_readings():
    from bcd.inventory.nvidia import parse_smi_xml

    gpus = parse_smi_xml((SMI / "h100-hgx.xml").read_text())
    assert len(gpus) == 8
    assert (gpus[0]["product"], gpus[0]["vramGiB"], gpus[0]["serial"]) == (
        "NVIDIA H100 80GB HBM3", 80, "1652323004100")
    assert (gpus[2]["health"], gpus[2]["healthReason"]) == (
        "unhealthy", "2 volatile uncorrectable ECC error(s)")
    assert (gpus[6]["health"], gpus[6]["healthReason"]) == ("unhealthy",
                                                            "hardware thermal slowdown")
    assert [g["health"] for g in gpus].count("healthy") == 6
    assert all(g["mig"] == [] for g in gpus)


def test_an_a100_host_with_mig_and_a_pending_row_remap_from_older_tags():
    from bcd.inventory.nvidia import parse_smi_xml

    gpus = parse_smi_xml((SMI / "a100-pcie-mig.xml").read_text(),
                         (SMI / "a100-pcie-mig.list").read_text())
    assert gpus[0]["mig"] == [
        {"uuid": "MIG-9f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0", "profile": "3g.20gb",
         "vramGiB": 20},
        {"uuid": "MIG-8e0d1c2b-3a49-4857-9665-b4a3c2d1e0f9", "profile": "2g.10gb",
         "vramGiB": 10}]
    assert (gpus[2]["health"], gpus[2]["healthReason"]) == (
        "unhealthy", "memory repair pending: reset the GPU")
    assert [g["vramGiB"] for g in gpus] == [40, 40, 40, 40]


def test_telemetry_from_nvidia_smi_xml():
    from bcd.inventory.nvidia import smi_telemetry

    readings = smi_telemetry((SMI / "a100-pcie-mig.xml").read_text())
    assert readings["GPU-a1b2c3d4-0002-4e5f-8a9b-0c1d2e3f4a5b"] == {
        "utilization": 0.0, "temperatureC": 36.0, "powerW": 39.1, "memoryUsedMiB": 4.0}
    assert smi_telemetry("") == {}


def test_simulated_telemetry_differs_per_gpu_and_stays_plausible():
    from bcd.inventory.fake import SimulatedInventory

    readings = SimulatedInventory("gpu-01").telemetry()
    assert len(readings) == 8
    assert len({r["temperatureC"] for r in readings.values()}) > 1
    for reading in readings.values():
        assert 0 <= reading["utilization"] <= 100
        assert 30 <= reading["temperatureC"] < 75
