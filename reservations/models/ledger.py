"""The ledger's rows: reservations, their allocations on a node, and device bookings."""

from __future__ import annotations

from datetime import datetime

from django.contrib.postgres.fields import ArrayField, DateTimeRangeField
from django.contrib.postgres.indexes import GistIndex
from django.db import models
from django.utils import timezone

from compute.core.fields import id_field


class ReservationState(models.TextChoices):
    PENDING = "pending"
    PLACED = "placed"
    BINDING = "binding"
    ACTIVE = "active"
    RELEASED = "released"
    CANCELLED = "cancelled"
    FAILED = "failed"


class Topology(models.TextChoices):
    ANY = "any"
    NVLINK_ALL = "nvlink-all"
    SAME_GPU = "same-gpu"  # time-sliced shares all of one GPU (a fraction of a GPU)


class ReservationSeries(models.Model):
    """Reservations that recur: one occurrence per window of `every` (see
    reservations.recurrence) in `time_zone`, on the days from `first_day` to `until`. The
    reconciler books occurrences `horizon_days` ahead; each is an ordinary reservation."""

    id = id_field("ser")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT,
                               related_name="reservation_series")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="+")
    count = models.PositiveSmallIntegerField()
    topology = models.CharField(max_length=16, default="any")
    product = models.CharField(max_length=96, blank=True)
    selector = models.CharField(max_length=300, blank=True)
    every = models.CharField(max_length=64)
    time_zone = models.CharField(max_length=64)
    first_day = models.DateField()
    until = models.DateField()
    horizon_days = models.PositiveSmallIntegerField(default=14)
    booked_through = models.DateField(null=True, blank=True,
                                      help_text="Occurrences of the days up to this one exist.")
    refusals = models.JSONField(default=list, blank=True,
                                help_text="Occurrences refused by quota or limits: start, why.")
    created_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id} {self.every} ({self.time_zone})"


class Gang(models.Model):
    """A multi-node reservation: `nodes` member reservations of one shape, one per node,
    booked together for one window or not at all, active only once every member's node
    reported its hold, and ended together. Lock order: the members' rows in id order (a
    member's own row is never locked alone while another member's may be)."""

    id = id_field("gang")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT, related_name="+")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="+")
    nodes = models.PositiveSmallIntegerField()
    placements = models.PositiveSmallIntegerField(default=0, help_text=(
        "Times the whole gang was placed (again after a member could not be re-placed)."))
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id} x{self.nodes}"


class Reservation(models.Model):
    """A tenant's request for GPUs of one pool for a window of time, and its lifecycle.

    A pending reservation has no allocation. A placed one has exactly one live allocation
    whose bookings cover `count` devices over the reservation's window. A member of a
    `gang` is one node's part of a multi-node reservation.
    """

    id = id_field("rsv")
    tenant = models.ForeignKey("compute.Tenant", on_delete=models.PROTECT,
                               related_name="reservations")
    pool = models.ForeignKey("fleet.Pool", on_delete=models.PROTECT, related_name="reservations")
    state = models.CharField(max_length=16, choices=ReservationState.choices,
                             default=ReservationState.PENDING, db_index=True)
    count = models.PositiveSmallIntegerField(help_text="How many atoms of its class.")
    device_class = models.CharField(max_length=16, default="gpu",
                                    help_text="gpu (whole GPUs), mig or gpu-share.")
    profile = models.CharField(max_length=32, blank=True,
                               help_text="For mig: the instance profile, such as 1g.10gb.")
    topology = models.CharField(max_length=16, choices=Topology.choices, default=Topology.ANY)
    model = models.CharField(max_length=32, blank=True)
    product = models.CharField(max_length=96, blank=True)
    selector = models.CharField(max_length=300, blank=True)
    kubernetes = models.BooleanField(default=False)
    slurm_account = models.CharField(max_length=64, blank=True, help_text=(
        "Published to the node's Slurm for this account (the pool's policy names the cluster)."))
    priority_class = models.CharField(max_length=32, default="normal",
                                      help_text="The priority class it was asked with.")
    priority = models.SmallIntegerField(default=50, help_text=(
        "Its class's weight when it was asked for: pending requests of a higher one are "
        "placed first."))
    borrowed = models.BooleanField(default=False, help_text=(
        "Placed over its tenant's quota (a preemptible request, while GPUs were free): it "
        "consumed no quota, and any request within quota may preempt it."))
    preempt_at = models.DateTimeField(null=True, blank=True, help_text=(
        "Preempted: released at this time unless the request it makes room for no longer "
        "needs it."))
    planned = models.BooleanField(default=False, help_text=(
        "Placed by the queue at the earliest window it fits (a planned start), for a request "
        "that asked to start as soon as it could: the window only moves earlier."))
    gpu_models = ArrayField(models.CharField(max_length=64), default=list, blank=True, help_text=(
        "The GPU models the request accepts (upper case; empty: its pool's only): while it "
        "waits, a pool of its site with one of them may place it."))
    preempted_for = models.CharField(max_length=32, blank=True,
                                     help_text="The pending reservation it makes room for.")
    binding_kind = models.CharField(max_length=16, default="hold")
    requested_start = models.DateTimeField(null=True, blank=True,
                                           help_text="Null: start as soon as placed.")
    duration_ms = models.BigIntegerField()
    during = DateTimeRangeField(null=True, blank=True,
                                help_text="The booked window, once placed.")
    placement_attempts = models.PositiveSmallIntegerField(default=0)
    failure_reason = models.CharField(max_length=300, blank=True)
    binding = models.JSONField(null=True, blank=True)
    binding_started_at = models.DateTimeField(null=True, blank=True)
    series = models.ForeignKey(ReservationSeries, on_delete=models.PROTECT, null=True,
                               blank=True, related_name="occurrences")
    gang = models.ForeignKey(Gang, on_delete=models.PROTECT, null=True, blank=True,
                             related_name="members")
    gang_index = models.PositiveSmallIntegerField(default=0, db_default=0, help_text=(
        "Its place in its gang; member 0 answers for the gang (expiry, the pending queue)."))
    idle_since = models.DateTimeField(null=True, blank=True,
                                      help_text="Flagged idle by its offering's idle reclaim.")
    metered_until = models.DateTimeField(null=True, blank=True, help_text=(
        "Its usage is metered up to here (closed hourly while it runs; null: not yet)."))
    ending_notice_sent = models.FloatField(null=True, blank=True, help_text=(
        "The last `reservation.ending` notice sent for its current end, in seconds before "
        "it (cleared when the end moves)."))
    created_at = models.DateTimeField(default=timezone.now)
    placed_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["pool", "state", "created_at"],
                                name="reservations_rsv_pool_state")]
        constraints = [models.UniqueConstraint(
            fields=["series", "requested_start"], condition=models.Q(series__isnull=False),
            name="reservations_rsv_one_per_occurrence")]

    def __str__(self) -> str:
        return f"{self.id} {self.state}"

    @property
    def starts_at(self) -> datetime | None:
        return self.during.lower if self.during else self.requested_start

    @property
    def ends_at(self) -> datetime | None:
        return self.during.upper if self.during else None


class Allocation(models.Model):
    """One placement of a reservation on one node: its device bookings and host share.

    `ended_at` is null while it holds capacity.
    """

    id = id_field("alloc")
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE,
                                    related_name="allocations")
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT, related_name="allocations")
    vcpus = models.PositiveIntegerField(default=0)
    memory_gib = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(
            fields=["reservation"], condition=models.Q(ended_at__isnull=True),
            name="reservations_allocation_one_live_per_reservation")]

    def __str__(self) -> str:
        return self.id


class MaintenanceWindow(models.Model):
    """A node taken out of service for a window of time: it books every GPU of the node for
    the window (so the EXCLUDE constraint refuses what overlaps, both ways) and takes no
    sandbox while it lasts."""

    id = id_field("mnt")
    node = models.ForeignKey("fleet.Node", on_delete=models.PROTECT,
                             related_name="maintenance_windows")
    during = DateTimeRangeField()
    reason = models.CharField(max_length=300)
    created_by = models.CharField(max_length=40)
    created_at = models.DateTimeField(default=timezone.now)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.node_id} {self.during}: {self.reason}"


class Booking(models.Model):
    """One device atom held over a time range, by an allocation or a maintenance window.

    Two EXCLUDE constraints referee every booking: no two bookings of one device overlap
    (`reservations_booking_device_no_overlap`, migration 0004), and no booking of a whole
    GPU overlaps a booking of one of its parts, MIG instances or shares
    (`reservations_booking_gpu_no_overlap`, migration 0012). `gpu` and `whole` are written
    by a trigger from the device's row, whatever the inserting code says.
    """

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, null=True,
                                   related_name="bookings")
    maintenance = models.ForeignKey(MaintenanceWindow, on_delete=models.CASCADE, null=True,
                                    related_name="bookings")
    device = models.ForeignKey("fleet.Device", on_delete=models.PROTECT, related_name="bookings")
    during = DateTimeRangeField()
    gpu = models.ForeignKey("fleet.Device", on_delete=models.PROTECT, related_name="+",
                            null=True, editable=False,
                            help_text="The physical GPU (the device, or its parent).")
    whole = models.BooleanField(null=True, editable=False,
                                help_text="A whole GPU, not a part of one.")

    class Meta:
        indexes = [models.Index(fields=["allocation"], name="reservations_booking_alloc"),
                   # Placement asks which bookings meet a window, whatever the device.
                   GistIndex(fields=["during"], name="reservations_booking_during")]
        constraints = [models.CheckConstraint(
            condition=models.Q(allocation__isnull=False, maintenance__isnull=True)
            | models.Q(allocation__isnull=True, maintenance__isnull=False),
            name="reservations_booking_one_holder")]

    def __str__(self) -> str:
        return f"{self.device_id} {self.during}"
