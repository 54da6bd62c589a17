"""bcd's Kubernetes device plugin (kubelet device plugin API v1beta1) for `bcd.dev/gpu`.

It serves DevicePlugin on a unix socket in the kubelet's device-plugins directory and
registers with the kubelet there; when the kubelet restarts (its socket is made again, and
ours is removed) it serves and registers again. It advertises exactly the GPUs that holds
made with `--kubernetes` hold on this node, with the node's health, and keeps no state of its
own: its list is read from the journal's holds each time, so a restarted bcd lists the same.
`Allocate` answers with CDI device names (and NVIDIA_VISIBLE_DEVICES and the device nodes
for runtimes without CDI) and refuses any device this node does not hold for Kubernetes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from bcd.config import file_stamp
from bcd.contract.holds import CDI_KIND, Hold
from bcd.contract.kubelet import api_pb2 as pb
from bcd.contract.kubelet import api_pb2_grpc as rpc

logger = logging.getLogger("bcd.deviceplugin")
API_VERSION = "v1beta1"
RESOURCE = "bcd.dev/gpu"
SOCKET_NAME = "bcd-gpu.sock"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_DIR = "var/lib/kubelet/device-plugins"


class GpuSource:
    """What the plugin reads: the holds (journal) and the inventory (health, topology)."""

    def __init__(self, holds: Callable[[], dict[str, Hold]],
                 inventory: Callable[[], dict[str, Any]]) -> None:
        self.holds, self.inventory = holds, inventory

    def devices(self) -> list[pb.Device]:
        """The GPUs held for Kubernetes here, with health and NUMA node."""
        gpus = {g["uuid"]: g for g in self.inventory().get("gpus", [])}
        held = sorted({uuid for hold in self.holds().values() if hold.kubernetes
                       for uuid in hold.gpus})
        devices = []
        for uuid in held:
            gpu = gpus.get(uuid, {})
            healthy = gpu.get("health", "unhealthy") == "healthy"
            topology = (pb.TopologyInfo(nodes=[pb.NUMANode(ID=int(gpu["numaNode"]))])
                        if gpu.get("numaNode") is not None else None)
            devices.append(pb.Device(ID=uuid, health="Healthy" if healthy else "Unhealthy",
                                     topology=topology))
        return devices

    def domain_of(self) -> dict[str, str]:
        return {g["uuid"]: g.get("nvlinkDomain", "") for g in self.inventory().get("gpus", [])}

    def index_of(self) -> dict[str, int]:
        return {g["uuid"]: int(g["index"]) for g in self.inventory().get("gpus", [])}


# The servicer base is generated code, which mypy does not read.
class Plugin(rpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, source: GpuSource, *, root: Path, poll: float = 0.3) -> None:
        self.source, self.root, self.poll = source, root, poll

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any
                                     ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: pb.Empty, context: Any
                           ) -> AsyncIterator[pb.ListAndWatchResponse]:
        """The current list, then a new one whenever a hold or a GPU's health changes."""
        last: list[tuple[str, str]] | None = None
        while True:
            devices = await asyncio.to_thread(self.source.devices)
            now = [(d.ID, d.health) for d in devices]
            if now != last:
                last = now
                yield pb.ListAndWatchResponse(devices=devices)
            await asyncio.sleep(self.poll)

    async def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                                     context: Any) -> pb.PreferredAllocationResponse:
        """Keep a container's GPUs inside one NVLink domain when the choice allows it."""
        domain_of = await asyncio.to_thread(self.source.domain_of)
        answers = []
        for ask in request.container_requests:
            chosen = list(ask.must_include_deviceIDs)
            rest = [d for d in ask.available_deviceIDs if d not in chosen]
            wanted = {domain_of.get(d, "") for d in chosen} - {""}
            by_domain: dict[str, list[str]] = {}
            for device in rest:
                by_domain.setdefault(domain_of.get(device, ""), []).append(device)
            need = ask.allocation_size - len(chosen)
            ranked = sorted(by_domain.items(), key=lambda item: (
                item[0] not in wanted, item[0] == "", len(item[1]) < need, -len(item[1])))
            for _, members in ranked:
                chosen += members[:max(0, ask.allocation_size - len(chosen))]
            answers.append(pb.ContainerPreferredAllocationResponse(
                deviceIDs=chosen[:ask.allocation_size]))
        return pb.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        held = {d.ID for d in await asyncio.to_thread(self.source.devices)}
        index_of = await asyncio.to_thread(self.source.index_of)
        answers = []
        for ask in request.container_requests:
            foreign = sorted(set(ask.devices_ids) - held)
            if foreign:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"not held for Kubernetes on this node: {', '.join(foreign)}")
            nodes = [f"/dev/nvidia{index_of[d]}" for d in ask.devices_ids if d in index_of]
            answers.append(pb.ContainerAllocateResponse(
                envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ask.devices_ids)},
                cdi_devices=[pb.CDIDevice(name=f"{CDI_KIND}={d}") for d in ask.devices_ids],
                devices=[pb.DeviceSpec(container_path=n, host_path=n, permissions="rw")
                         for n in nodes if (self.root / n.lstrip("/")).exists()]))
        return pb.AllocateResponse(container_responses=answers)

    async def PreStartContainer(self, request: pb.PreStartContainerRequest,
                                context: Any) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


async def _register(directory: Path) -> None:
    target = f"unix://{directory / KUBELET_SOCKET}"
    async with grpc.aio.insecure_channel(target) as channel:
        await rpc.RegistrationStub(channel).Register(pb.RegisterRequest(
            version=API_VERSION, endpoint=SOCKET_NAME, resource_name=RESOURCE,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True)),
            timeout=10)


async def run_device_plugin(source: GpuSource, *, root: Path, directory: Path | None = None,
                            check_seconds: float = 0.5) -> None:
    """Serve and register whenever the kubelet is there; again after it restarts."""
    directory = directory or root / DEFAULT_DIR
    ours = directory / SOCKET_NAME
    server: grpc.aio.Server | None = None
    registered_with: tuple[int, int, int] | None = None
    try:
        while True:
            kubelet = file_stamp(directory / KUBELET_SOCKET)
            if kubelet is not None and (kubelet != registered_with or not ours.exists()):
                if server is not None:
                    await server.stop(grace=None)
                ours.unlink(missing_ok=True)
                server = grpc.aio.server()
                rpc.add_DevicePluginServicer_to_server(Plugin(source, root=root), server)
                server.add_insecure_port(f"unix://{ours}")
                await server.start()
                os.chmod(ours, 0o600)
                try:
                    await _register(directory)
                    registered_with = kubelet
                    logger.info("device plugin %s registered with the kubelet", RESOURCE)
                except grpc.aio.AioRpcError as error:
                    logger.warning("kubelet registration failed: %s", error.details())
            await asyncio.sleep(check_seconds)
    finally:
        if server is not None:
            await server.stop(grace=None)
