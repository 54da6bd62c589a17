"""GPUs from nvidia-smi: NVLink domains from `nvidia-smi topo -m`."""

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


def test_telemetry_from_nvidia_smi_csv():
    from bcd.inventory.nvidia import parse_telemetry

    csv = ("GPU-aaaa, 87, 61, 512.33, 40960\n"
           "GPU-bbbb, 0, 34, [N/A], 0\n")
    assert parse_telemetry(csv) == {
        "GPU-aaaa": {"utilization": 87.0, "temperatureC": 61.0, "powerW": 512.33,
                     "memoryUsedMiB": 40960.0},
        "GPU-bbbb": {"utilization": 0.0, "temperatureC": 34.0, "powerW": 0.0,
                     "memoryUsedMiB": 0.0},
    }


def test_simulated_telemetry_differs_per_gpu_and_stays_plausible():
    from bcd.inventory.fake import SimulatedInventory

    readings = SimulatedInventory("gpu-01").telemetry()
    assert len(readings) == 8
    assert len({r["temperatureC"] for r in readings.values()}) > 1
    for reading in readings.values():
        assert 0 <= reading["utilization"] <= 100
        assert 30 <= reading["temperatureC"] < 75
