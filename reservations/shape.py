"""What a request asks for, as one value carried from the API's input to the placer, the
quota and the meter: `count` atoms of one class (whole GPUs, MIG instances of a profile,
GPU shares), how they sit together, and which devices may serve. The reservation row keeps
the same fields (`Shape.of`, `Shape.columns`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fleet.models import DeviceClass

if TYPE_CHECKING:
    from fleet.models import Pool
    from reservations.models import Reservation, ReservationSeries


@dataclass(frozen=True)
class Shape:
    count: int  # atoms of `device_class`, one word from the wire to the quota and the meter
    device_class: str = DeviceClass.GPU
    profile: str = ""  # the MIG profile, for `mig`
    topology: str = "any"
    model: str = ""
    product: str = ""
    selector: str = ""
    kubernetes: bool = False

    @classmethod
    def of(cls, rsv: Reservation) -> Shape:
        """The shape a reservation was made with."""
        return cls(count=rsv.count, device_class=rsv.device_class, profile=rsv.profile,
                   topology=rsv.topology, model=rsv.model, product=rsv.product,
                   selector=rsv.selector, kubernetes=rsv.kubernetes)

    @classmethod
    def of_series(cls, series: ReservationSeries) -> Shape:
        """The shape each occurrence of a series books (whole GPUs)."""
        return cls(count=series.count, topology=series.topology, product=series.product,
                   selector=series.selector)

    def columns(self) -> dict[str, Any]:
        """The reservation row's fields for this shape."""
        return asdict(self)

    def inputs(self) -> dict[str, Any]:
        """As an idempotency key's recorded input compares it."""
        return {"gpus": self.count, "topology": self.topology, "model": self.model,
                "product": self.product, "selector": self.selector,
                "kubernetes": self.kubernetes, "device_class": self.device_class,
                "profile": self.profile}


@dataclass(frozen=True)
class Ask:
    """A shape asked of one pool for a duration, on behalf of a tenant: what the capacity
    questions (preview, earliest) and the earliest-window search work on."""

    tenant_id: str
    pool: Pool
    shape: Shape
    duration_ms: int

    @classmethod
    def of(cls, rsv: Reservation) -> Ask:
        return cls(rsv.tenant_id, rsv.pool, Shape.of(rsv), rsv.duration_ms)
