"""GPUs through NVML's interface: inventory, health and telemetry, the same code for a real
host (`pynvml`, from the nvidia-ml-py package) and for a simulated one (an object that
answers the same calls). Every call here blocks, so the agent makes them off its event loop;
XID events are waited for on a thread of their own.

NVLink domains come from each link's remote PCI address: GPUs linked to each other, or to
the same NVSwitch, are one domain. An XID is remembered until `bcd health clear` (after the
GPU was reset) says it is history.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bcd.config import file_stamp
from bcd.inventory.health import GpuReadings, gpu_health

# NVML's stable ABI values (nvml.h), used when the bindings do not name them.
MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC, TEMPERATURE_GPU = 1, 0, 0
XID_CRITICAL_ERROR_EVENT = 0x8
MIG_ENABLED = 1
HW_SLOWDOWN, HW_THERMAL_SLOWDOWN, HW_POWER_BRAKE = 0x8, 0x40, 0x80


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus(value: Any) -> str:
    """A PCI bus id in one spelling: '00000000:18:00.0' and '0000:18:00.0' are the same."""
    domain, _, rest = _text(value).lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else domain


def linked_domains(links: dict[str, list[str]], gpu_bus: list[str]) -> dict[str, str]:
    """GPU bus id -> domain name (nv0, nv1… by first GPU), from each GPU's active links'
    remote bus ids; a GPU with no link to another GPU or switch has no domain."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for bus, remotes in links.items():
        for remote in remotes:
            parent[find(bus)] = find(remote)
    groups: dict[str, list[str]] = {}
    for bus in gpu_bus:
        groups.setdefault(find(bus), []).append(bus)
    names: dict[str, str] = {}
    for members in groups.values():
        linked = len(members) > 1 or any(links.get(m) for m in members)
        if linked and len(members) > 1:
            name = f"nv{len(set(names.values()))}"
            names.update(dict.fromkeys(members, name))
    return {bus: names.get(bus, "") for bus in gpu_bus}


class NvmlInventory:
    """The machine's GPUs as NVML reports them; `host()` gives the rest of the inventory."""

    def __init__(self, nvml: Any, host: Callable[[], dict[str, Any]],
                 cleared_file: Path | None = None) -> None:
        self.nvml = nvml
        self.host = host
        self.cleared_file = cleared_file
        self._xids: dict[str, list[tuple[float, int]]] = {}
        self._lock = threading.Lock()
        self._watching: threading.Thread | None = None
        self._events: Any = None  # take_events's event set, made at its first look
        self._cleared_read: tuple[Any, dict[str, float]] = (None, {})  # (its stamp, read)
        nvml.nvmlInit()

    def _call(self, name: str, *args: Any, default: Any = None) -> Any:
        """One NVML call; a feature the GPU lacks (NotSupported and the like) is `default`."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError:
            return default

    def _handles(self) -> list[Any]:
        return [self.nvml.nvmlDeviceGetHandleByIndex(i)
                for i in range(self.nvml.nvmlDeviceGetCount())]

    def _links(self, handle: Any) -> tuple[list[str], int]:
        """Remote bus ids of the GPU's active NVLinks, and how many links are down."""
        up, down = [], 0
        for link in range(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            state = self._call("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                continue  # no such link on this GPU
            if state:
                up.append(_bus(self.nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
            else:
                down += 1
        return up, down

    def _cleared(self) -> dict[str, float]:
        """When each GPU's past XIDs were cleared: read again only when the file changed."""
        stamp = file_stamp(self.cleared_file) if self.cleared_file else None
        if stamp != self._cleared_read[0]:
            try:
                cleared = json.loads(self.cleared_file.read_text()) if self.cleared_file else {}
                self._cleared_read = (stamp, {str(k): float(v) for k, v in cleared.items()})
            except (OSError, ValueError):
                return {}
        return self._cleared_read[1]

    def readings(self, handle: Any, uuid: str, links_down: int,
                 cleared: dict[str, float] | None = None) -> GpuReadings:
        """The GPU's health readings; `cleared` is `_cleared()` when the caller read it
        already (once for every GPU of a report)."""
        remapped = self._call("nvmlDeviceGetRemappedRows", handle, default=(0, 0, 0, 0))
        reasons = int(self._call("nvmlDeviceGetCurrentClocksThrottleReasons", handle,
                                 default=0))
        slowdown = ("thermal" if reasons & HW_THERMAL_SLOWDOWN else
                    "power" if reasons & HW_POWER_BRAKE else
                    "clock" if reasons & HW_SLOWDOWN else "")
        since = (self._cleared() if cleared is None else cleared).get(uuid, 0.0)
        with self._lock:
            xids = tuple(xid for at, xid in self._xids.get(uuid, []) if at > since)
        return GpuReadings(
            ecc_volatile_uncorrected=int(self._call(
                "nvmlDeviceGetTotalEccErrors", handle, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC,
                default=0)),
            retired_pages_pending=bool(self._call("nvmlDeviceGetRetiredPagesPendingStatus",
                                                  handle, default=0)),
            remapped_rows_pending=bool(remapped[2]), remapped_rows_failed=bool(remapped[3]),
            xids=xids, nvlink_links_down=links_down, hw_slowdown=slowdown)

    def _mig(self, handle: Any) -> list[dict[str, Any]]:
        mode = self._call("nvmlDeviceGetMigMode", handle)
        if not mode or mode[0] != MIG_ENABLED:
            return []
        instances = []
        for slot in range(int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle, default=0))):
            mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:
                continue  # an empty slot
            name = _text(self.nvml.nvmlDeviceGetName(mig))
            instances.append({"uuid": _text(self.nvml.nvmlDeviceGetUUID(mig)),
                              "profile": name.rpartition(" ")[2],
                              "vramGiB": round(self.nvml.nvmlDeviceGetMemoryInfo(mig).total
                                               / 2**30)})
        return instances

    def gpus(self) -> list[dict[str, Any]]:
        rows, links = [], {}
        cleared = self._cleared()
        for index, handle in enumerate(self._handles()):
            uuid = _text(self.nvml.nvmlDeviceGetUUID(handle))
            bus = _bus(self.nvml.nvmlDeviceGetPciInfo(handle).busId)
            up, down = self._links(handle)
            links[bus] = up
            health, reason = gpu_health(self.readings(handle, uuid, down, cleared))
            rows.append({"uuid": uuid, "index": index, "bus": bus,
                         "product": _text(self.nvml.nvmlDeviceGetName(handle)),
                         "vramGiB": round(self.nvml.nvmlDeviceGetMemoryInfo(handle).total
                                          / 2**30),
                         "serial": _text(self._call("nvmlDeviceGetSerial", handle,
                                                    default="")),
                         "health": health, "healthReason": reason,
                         "numaNode": self._call("nvmlDeviceGetNumaNodeId", handle),
                         "mig": self._mig(handle)})
        domains = linked_domains(links, [row["bus"] for row in rows])
        for row in rows:
            row["nvlinkDomain"] = domains[row.pop("bus")]
        return rows

    def report(self) -> dict[str, Any]:
        return {**self.host(), "gpus": self.gpus()}

    def telemetry(self) -> dict[str, dict[str, float]]:
        readings = {}
        for handle in self._handles():
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = self._call("nvmlDeviceGetUtilizationRates", handle)
            readings[_text(self.nvml.nvmlDeviceGetUUID(handle))] = {
                "utilization": float(utilization.gpu if utilization else 0),
                "temperatureC": float(self._call("nvmlDeviceGetTemperature", handle,
                                                 TEMPERATURE_GPU, default=0)),
                "powerW": float(self._call("nvmlDeviceGetPowerUsage", handle, default=0))
                / 1000,
                "memoryUsedMiB": float(memory.used) / 2**20}
        return readings

    def watch_xids(self, stop: threading.Event | None = None, *, timeout_ms: int = 1000,
                   until_quiet: bool = False) -> None:
        """Wait for XID events on this thread (NVML's wait blocks) and remember them; with
        `until_quiet`, return at the first wait that times out."""
        events = self._event_set()
        while stop is None or not stop.is_set():
            try:
                data = self.nvml.nvmlEventSetWait_v2(events, timeout_ms)
            except self.nvml.NVMLError:  # a timeout: nothing happened
                if until_quiet:
                    return
                continue
            self._remember(data)

    def take_events(self) -> None:
        """Remember the XID events that came since the last look, without waiting: for
        machines that share one thread that looks at each in turn."""
        if self._events is None:
            self._events = self._event_set()
        while True:
            try:
                data = self.nvml.nvmlEventSetWait_v2(self._events, 0)
            except self.nvml.NVMLError:  # none left
                return
            self._remember(data)

    def _event_set(self) -> Any:
        events = self.nvml.nvmlEventSetCreate()
        for handle in self._handles():
            self._call("nvmlDeviceRegisterEvents", handle, XID_CRITICAL_ERROR_EVENT, events)
        return events

    def _remember(self, data: Any) -> None:
        uuid = _text(self.nvml.nvmlDeviceGetUUID(data.device))
        with self._lock:
            self._xids.setdefault(uuid, []).append((time.time(), int(data.eventData)))

    def start_watching(self) -> None:
        if self._watching is None:
            self._watching = threading.Thread(target=self.watch_xids, name="nvml-xids",
                                              daemon=True)
            self._watching.start()


def cleared_file_of(root: Path) -> Path:
    return root / "var/lib/bcd/health-cleared.json"


def clear_health(cleared_file: Path, uuid: str) -> None:
    """Mark a GPU's past XIDs as history (after it was reset)."""
    cleared: dict[str, float] = {}
    if cleared_file.exists():
        cleared = json.loads(cleared_file.read_text())
    cleared[uuid] = time.time()
    cleared_file.parent.mkdir(parents=True, exist_ok=True)
    partial = cleared_file.with_suffix(".tmp")
    partial.write_text(json.dumps(cleared))
    partial.replace(cleared_file)
