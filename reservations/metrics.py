"""The ledger's series, read from Postgres when `/metrics` is scraped: per pool and tenant,
what the GPUs are doing, what waits and for how long, what accrues usage, preemptions and
sandboxes. Pools are labelled by id (`bc_pool_info` gives their names), tenants by slug."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Count, Min, Q, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from fleet.models import Pool
from reservations.capacity import GPU_STATES, gpu_counts
from reservations.models import Booking, Reservation, Sandbox, UsageRecord
from reservations.models.sandboxes import LIVE, SandboxState
from reservations.services.metering import gpu_meter
from reservations.services.sandbox_use import PAUSED_RATE, pool_paused_rate
from reservations.states import HOLDING, TERMINAL

GIB = 2**30


def ledger_series(now: datetime) -> Iterator[Metric]:
    """Every family of this module, each from one query."""
    yield from (pool_info(), pool_gpus(now), atoms_held(now), usage_metered(), usage_rate(now))
    yield from pending(now)
    yield from preemptions()
    yield from sandbox_series()


def pool_info() -> GaugeMetricFamily:
    family = GaugeMetricFamily("bc_pool_info", "Each pool (always 1), with its name and class.",
                               labels=["pool", "name", "class"])
    for pool_id, name, pool_class in Pool.objects.values_list("id", "name", "pool_class"):
        family.add_metric([pool_id, name, pool_class], 1)
    return family


def pool_gpus(now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "bc_pool_gpus", "Whole GPUs of a pool by state, as `capacity` counts them: total, "
        "allocatable, allocated (held now), reserved (booked later), available, and those "
        "provisioning, unhealthy, in maintenance or unreachable.", labels=["pool", "state"])
    for pool_id, counts in sorted(gpu_counts(now).items()):
        for state in GPU_STATES:
            family.add_metric([pool_id, state], counts[state])
    return family


def _held_now(now: datetime):  # type: ignore[no-untyped-def]
    """Bookings of live allocations that cover `now`."""
    return Booking.objects.filter(allocation__isnull=False, allocation__ended_at__isnull=True,
                                  during__contains=now)


def atoms_held(now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "bc_tenant_atoms_allocated", "Atoms held now (whole GPUs, MIG instances, shares), per "
        "pool, tenant and class.", labels=["pool", "tenant", "class"])
    rows = (_held_now(now).values_list("allocation__reservation__pool_id",
                                       "allocation__reservation__tenant__slug",
                                       "device__device_class")
            .annotate(n=Count("pk")).order_by())
    for pool_id, tenant, device_class, count in sorted(rows):
        family.add_metric([pool_id, tenant, device_class], count)
    return family


def pending(now: datetime) -> Iterator[GaugeMetricFamily]:
    count = GaugeMetricFamily("bc_reservations_pending",
                              "Reservations waiting for a placement, by pool and tenant.",
                              labels=["pool", "tenant"])
    oldest = GaugeMetricFamily(
        "bc_reservations_pending_oldest_seconds",
        "How long the oldest waiting reservation has waited, by pool and tenant.",
        labels=["pool", "tenant"])
    rows = (Reservation.objects.filter(state="pending")
            .values_list("pool_id", "tenant__slug")
            .annotate(n=Count("pk"), since=Min("created_at")).order_by())
    for pool_id, tenant, n, since in sorted(rows):
        count.add_metric([pool_id, tenant], n)
        oldest.add_metric([pool_id, tenant], max(0.0, (now - since).total_seconds()))
    return iter((count, oldest))


def preemptions() -> Iterator[Metric]:
    done = CounterMetricFamily(
        "bc_preemptions", "Reservations given notice to make room for another request that "
        "have ended, by the pool and the tenant that lost them.", labels=["pool", "tenant"])
    noticed = GaugeMetricFamily(
        "bc_preemptions_noticed", "Reservations under preemption notice now (released at "
        "their deadline).", labels=["pool", "tenant"])
    rows = (Reservation.objects.exclude(preempted_for="")
            .values_list("pool_id", "tenant__slug")
            .annotate(ended=Count("pk", filter=Q(state__in=TERMINAL)),
                      notice=Count("pk", filter=Q(state__in=HOLDING)))
            .order_by())
    for pool_id, tenant, ended, notice in sorted(rows):
        done.add_metric([pool_id, tenant], ended)
        noticed.add_metric([pool_id, tenant], notice)
    return iter((done, noticed))


def usage_metered() -> CounterMetricFamily:
    family = CounterMetricFamily(
        "bc_usage_metered", "Usage closed (every hour while it runs, and at its end), per "
        "tenant and meter (such as gpu.H100.hours).", labels=["tenant", "meter"])
    rows = (UsageRecord.objects.values_list("tenant__slug", "meter")
            .annotate(total=Sum("quantity")).order_by())
    for tenant, meter, total in sorted(rows):
        family.add_metric([tenant, meter], float(total))
    return family


def sandbox_series() -> Iterator[GaugeMetricFamily]:
    vcpus = GaugeMetricFamily("bc_sandbox_vcpus", "vCPUs claimed by live sandboxes.",
                              labels=["pool", "tenant"])
    memory = GaugeMetricFamily("bc_sandbox_memory_bytes",
                               "Memory claimed by live sandboxes.", labels=["pool", "tenant"])
    count = GaugeMetricFamily("bc_sandboxes", "Live sandboxes, by state.",
                              labels=["pool", "tenant", "state"])
    totals: dict[tuple[str, str], list[int]] = {}
    for pool_id, tenant, state, n, cpus, gib in _live_sandboxes():
        count.add_metric([pool_id, tenant, state], n)
        sums = totals.setdefault((pool_id, tenant), [0, 0])
        sums[0] += cpus
        sums[1] += gib
    for (pool_id, tenant), (cpus, gib) in sorted(totals.items()):
        vcpus.add_metric([pool_id, tenant], cpus)
        memory.add_metric([pool_id, tenant], gib * GIB)
    return iter((vcpus, memory, count))


def _live_sandboxes() -> list[tuple[str, str, str, int, int, int]]:
    rows = (Sandbox.objects.filter(state__in=LIVE)
            .values_list("pool_id", "tenant__slug", "state")
            .annotate(n=Count("pk"), cpus=Sum("vcpus"), gib=Sum("memory_gib")).order_by())
    return sorted(rows)


def usage_rate(now: datetime) -> GaugeMetricFamily:
    """What accrues now, in each meter's unit per hour: the atoms held now, and the vCPUs and
    memory of running sandboxes (paused ones at their pool's paused rate)."""
    family = GaugeMetricFamily(
        "bc_usage_rate", "Usage accruing now, per pool, tenant and meter, in the meter's "
        "unit per hour (for gpu.H100.hours: H100s held).", labels=["pool", "tenant", "meter"])
    rates: dict[tuple[str, str, str], float] = {}
    # (metered as release meters it: by the pool's model and the reservation's class)
    held = (_held_now(now).values_list("allocation__reservation__pool_id",
                                       "allocation__reservation__tenant__slug",
                                       "allocation__reservation__device_class",
                                       "allocation__reservation__pool__gpu_model",
                                       "allocation__reservation__profile")
            .annotate(n=Count("pk")).order_by())
    for pool_id, tenant, device_class, model, profile, n in held:
        key = (pool_id, tenant, gpu_meter(model, device_class, profile))
        rates[key] = rates.get(key, 0.0) + n
    paused = {pool_id: pool_paused_rate(policy)
              for pool_id, policy in Pool.objects.values_list("id", "policy")}
    running = (Sandbox.objects.filter(state__in=(SandboxState.RUNNING, SandboxState.PAUSED))
               .values_list("pool_id", "tenant__slug", "state")
               .annotate(cpus=Sum("vcpus"), gib=Sum("memory_gib")).order_by())
    for pool_id, tenant, state, cpus, gib in running:
        rate = paused.get(pool_id, PAUSED_RATE) if state == SandboxState.PAUSED else 1.0
        for meter, amount in (("vcpu.hours", cpus), ("memory.gib-hours", gib)):
            key = (pool_id, tenant, meter)
            rates[key] = rates.get(key, 0.0) + amount * rate
    for (pool_id, tenant, meter), rate in sorted(rates.items()):
        family.add_metric([pool_id, tenant, meter], rate)
    return family

