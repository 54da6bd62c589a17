"""What a request asks for, as one value carried from the API's input to the placer, the
quota and the meter: `count` atoms of one class (whole GPUs, MIG instances of a profile,
GPU shares), how they sit together, and which devices may serve. The reservation row keeps
the same fields (`Shape.of`, `Shape.columns`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
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
    slurm_account: str = ""  # publish the hold to the node's Slurm, for this account
    fraction: float = 0.0  # of one GPU, asked as time-sliced shares; `on` counts them

    @classmethod
    def of(cls, rsv: Reservation) -> Shape:
        """The shape a reservation was made with."""
        return cls(count=rsv.count, device_class=rsv.device_class, profile=rsv.profile,
                   topology=rsv.topology, model=rsv.model, product=rsv.product,
                   selector=rsv.selector, kubernetes=rsv.kubernetes,
                   slurm_account=rsv.slurm_account)

    @classmethod
    def of_series(cls, series: ReservationSeries) -> Shape:
        """The shape each occurrence of a series books (whole GPUs)."""
        return cls(count=series.count, topology=series.topology, product=series.product,
                   selector=series.selector)

    def on(self, pool: Pool) -> Shape:
        """The shape as `pool` books it: a fraction of a GPU becomes the fewest of the pool's
        time-sliced shares of one GPU that cover it (0.22 of a GPU sliced in 10: 3 shares)."""
        if not self.fraction:
            return self
        count = max(1, math.ceil(round(self.fraction * max(1, pool.shares_per_gpu), 9)))
        return replace(self, count=count, topology="same-gpu")

    def columns(self) -> dict[str, Any]:
        """The reservation row's fields for this shape (a fraction is booked as its count)."""
        columns = asdict(self)
        del columns["fraction"]
        return columns

    def inputs(self) -> dict[str, Any]:
        """As an idempotency key's recorded input compares it."""
        return {"gpus": self.count, "topology": self.topology, "model": self.model,
                "product": self.product, "selector": self.selector,
                "kubernetes": self.kubernetes, "device_class": self.device_class,
                "profile": self.profile,
                **({"slurm": self.slurm_account} if self.slurm_account else {}),
                **({"fraction": self.fraction} if self.fraction else {})}


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
