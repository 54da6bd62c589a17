"""bcd's device plugin against a kubelet stand-in built from the same v1beta1 proto: it
registers `bcd.dev/gpu`; ListAndWatch shows exactly the GPUs held for Kubernetes and changes
within a second when a hold starts or ends or a GPU turns unhealthy; Allocate answers CDI
names for held GPUs and refuses others; a kubelet restart leads to a new registration; a
restarted bcd lists the same GPUs."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from bcd.agent import Agent
from bcd.config import Config, Paths, Tuning
from bcd.contract import ids
from bcd.contract.kubelet import api_pb2 as pb
from bcd.contract.kubelet import api_pb2_grpc as rpc
from bcd.deviceplugin import GpuSource, run_device_plugin
from bcd.inventory.faults import faults_file, inject
from tests.bcd.test_journal import gpus_of


class Kubelet(rpc.RegistrationServicer):
    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []

    async def Register(self, request, context):
        self.requests.append(request)
        return pb.Empty()


async def kubelet_at(directory: Path) -> tuple[Kubelet, grpc.aio.Server]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kubelet.sock").unlink(missing_ok=True)
    kubelet, server = Kubelet(), grpc.aio.server()
    rpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{directory / 'kubelet.sock'}")
    await server.start()
    return kubelet, server


def hold(gpus: list[str], kubernetes: bool) -> dict:
    return {"allocationId": ids.new("alloc"), "reservationId": ids.new("rsv"), "gpus": gpus,
            "kubernetes": kubernetes}


async def eventually(check, seconds: float = 5.0) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < seconds, "not in time"
        await asyncio.sleep(0.05)
    return time.monotonic() - began


PUSHED_WITHIN = 5.0  # seconds; checks every 0.1 s, where an agent's default is 2 s


def agent_of(root: Path) -> Agent:
    return Agent(Config.read(Paths(root).config_file),
                 Tuning(inventory_check_seconds=0.1))


def test_the_plugin_end_to_end_with_a_kubelet_stand_in(root):
    # A short folder: a unix socket's path has at most 107 bytes (the kubelet's is short).
    directory = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp"))
    gpus = gpus_of(root, 8)
    k8s, other, later = hold(gpus[:2], True), hold(gpus[2:3], False), hold(gpus[4:6], True)

    async def scenario():
        kubelet, kubelet_server = await kubelet_at(directory)
        agent = agent_of(root)
        agent.apply_spec(1, {"allocations": [k8s, other]})
        watching = asyncio.create_task(agent.watch_inventory())
        plugin = asyncio.create_task(run_device_plugin(
            GpuSource(agent.held, agent.current_inventory), root=root, directory=directory,
            check_seconds=0.1))
        await eventually(lambda: kubelet.requests)
        first = kubelet.requests[0]
        assert (first.version, first.resource_name, first.endpoint) == (
            "v1beta1", "bcd.dev/gpu", "bcd-gpu.sock")
        async with grpc.aio.insecure_channel(f"unix://{directory / 'bcd-gpu.sock'}") as channel:
            stub = rpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(pb.Empty())
            listed = await stream.read()
            assert sorted(d.ID for d in listed.devices) == sorted(gpus[:2])
            assert {d.health for d in listed.devices} == {"Healthy"}
            assert [n.ID for d in listed.devices for n in d.topology.nodes] == [0, 0]
            agent.apply_spec(2, {"allocations": [k8s, other, later]})  # a hold starts
            # Each change is pushed within a few of the 0.1 s checks (without the push the
            # stream never sends again); the bound leaves room for a loaded machine.
            started = time.monotonic()
            listed = await stream.read()
            assert time.monotonic() - started < PUSHED_WITHIN
            assert sorted(d.ID for d in listed.devices) == sorted(gpus[:2] + gpus[4:6])
            inject(faults_file(root), 5, "ecc")  # GPU 5 turns unhealthy
            started = time.monotonic()
            listed = await stream.read()
            assert time.monotonic() - started < PUSHED_WITHIN
            assert {d.ID: d.health for d in listed.devices}[gpus[5]] == "Unhealthy"
            agent.apply_spec(3, {"allocations": [k8s, other]})  # that hold ends
            listed = await stream.read()
            assert sorted(d.ID for d in listed.devices) == sorted(gpus[:2])

            allocated = await stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=gpus[:2])]))
            answer = allocated.container_responses[0]
            assert [c.name for c in answer.cdi_devices] == [f"bcd.dev/gpu={g}"
                                                            for g in gpus[:2]]
            assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus[:2])
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=[gpus[2]])]))  # not for k8s
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert gpus[2] in refused.value.details()
            preferred = await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=gpus[:2], allocation_size=2)]))
            assert sorted(preferred.container_responses[0].deviceIDs) == sorted(gpus[:2])
            stream.cancel()

        # The kubelet restarts: its socket is made again and ours removed.
        await kubelet_server.stop(grace=None)
        (directory / "bcd-gpu.sock").unlink(missing_ok=True)
        kubelet, kubelet_server = await kubelet_at(directory)
        await eventually(lambda: kubelet.requests, 30)
        assert (directory / "bcd-gpu.sock").exists()

        # bcd restarts: a new agent from the same root lists the same GPUs.
        plugin.cancel()
        watching.cancel()
        again = agent_of(root)
        source = GpuSource(again.held, again.current_inventory)
        assert sorted(d.ID for d in source.devices()) == sorted(gpus[:2])
        await kubelet_server.stop(grace=None)

    try:
        asyncio.run(scenario())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
