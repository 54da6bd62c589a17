"""An NVML that answers from a description of a machine instead of a driver: the simulated
machines of `--sim` (described by bcd.inventory.fake, faults and all) and recorded readings
in tests. It implements exactly the calls bcd.inventory.nvml makes, with NVML's errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # NVML's own names
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig: int | None = None


class DescribedNvml:
    """`describe()` returns the machine now: {"gpus": [...], "events": [...]} (see the
    fixtures under tests/bcd/fixtures/nvml for every field)."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, describe: Callable[[], dict[str, Any]]) -> None:
        self.describe = describe
        self._delivered: set[str] = set()
        self._lock = threading.Lock()

    def _gpu(self, handle: Handle) -> dict[str, Any]:
        gpu: dict[str, Any] = self.describe()["gpus"][handle.gpu]
        if handle.mig is not None:
            found: dict[str, Any] = gpu["mig"]["devices"][handle.mig]
            return found
        return gpu

    def _field(self, handle: Handle, name: str) -> Any:
        value = self._gpu(handle).get(name)
        if value is None:
            raise NVMLError_NotSupported(name)
        return value

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.describe()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise NVMLError_NotFound(index)
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return str(self._field(handle, "uuid"))

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        return str(self._field(handle, "name"))

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        return int(self._field(handle, "numaNode"))

    def nvmlDeviceGetSerial(self, handle: Handle) -> str:
        return str(self._field(handle, "serial"))

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        total = int(self._field(handle, "memoryTotal"))
        used = int(self._gpu(handle).get("memoryUsed", 0))
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._field(handle, "busId"))

    def _link(self, handle: Handle, link: int) -> list[Any]:
        links = self._gpu(handle).get("nvlinks", [])
        if link >= len(links):
            raise NVMLError_NotSupported(f"link {link}")
        found: list[Any] = links[link]
        return found

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        return int(self._link(handle, link)[0])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link(handle, link)[1])

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        mig = self._field(handle, "mig")
        return [int(mig["mode"]), int(mig["mode"])]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        return int(self._field(handle, "mig")["maxDevices"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        devices = self._field(handle, "mig")["devices"]
        if index >= len(devices) or devices[index] is None:
            raise NVMLError_NotFound(f"MIG slot {index}")
        return Handle(handle.gpu, index)

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, kind: int, counter: int) -> int:
        return int(self._field(handle, "eccVolatileUncorrected"))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return int(self._field(handle, "retiredPagesPending"))

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        rows = self._field(handle, "remappedRows")
        return (int(rows["correctable"]), int(rows["uncorrectable"]), int(rows["pending"]),
                int(rows["failure"]))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        return int(self._gpu(handle).get("throttleReasons", 0))

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(gpu=int(self._field(handle, "utilization")), memory=0)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        return int(self._field(handle, "temperatureC"))

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return int(self._field(handle, "powerMw"))

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Handle, types: int, events: object) -> None:
        pass

    def nvmlEventSetWait_v2(self, events: object, timeout_ms: int) -> SimpleNamespace:
        """The next XID not delivered yet, as NVML's event data; Timeout when none came."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for event in self.describe().get("events", []):
                with self._lock:
                    if event["id"] in self._delivered:
                        continue
                    self._delivered.add(event["id"])
                return SimpleNamespace(device=Handle(int(event["gpu"])), eventType=0x8,
                                       eventData=int(event["xid"]))
            if time.monotonic() >= deadline:
                raise NVMLError_Timeout()
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
