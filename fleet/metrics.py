"""The fleet's series, read from Postgres when `/metrics` is scraped: nodes per pool, and
each GPU's last telemetry under the names dcgm-exporter gives them, so that dashboards built
for it read these too. A simulated machine's series say so (`simulated="true"`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily

from fleet.models import GpuSample, Node, NodeRole

# A sample older than this is not shown: the GPU's node stopped sending (bcd sends one every
# BCD_TELEMETRY_SECONDS, 30 s by default).
FRESH_FOR = timedelta(minutes=5)
DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "node", "pool", "simulated"]


def fleet_series(now: datetime) -> Iterator[GaugeMetricFamily]:
    yield pool_nodes()
    yield from gpu_telemetry(now)


def pool_nodes() -> GaugeMetricFamily:
    family = GaugeMetricFamily("bc_pool_nodes", "Nodes of a pool by connectivity, and how "
                               "many of them are simulated.",
                               labels=["pool", "connectivity", "simulated"])
    rows = (Node.objects.filter(role=NodeRole.NODE).exclude(pool=None)
            .values_list("pool_id", "connectivity")
            .annotate(n=Count("pk"), simulated=Count("pk", filter=~Q(simulated_root="")))
            .order_by())
    for pool_id, connectivity, n, simulated in sorted(rows):
        if n - simulated:
            family.add_metric([pool_id, connectivity, "false"], n - simulated)
        if simulated:
            family.add_metric([pool_id, connectivity, "true"], simulated)
    return family


def gpu_telemetry(now: datetime) -> Iterator[GaugeMetricFamily]:
    utilization = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %), as the "
                                    "GPU's node last reported it.", labels=DCGM_LABELS)
    memory = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB), as "
                               "the GPU's node last reported it.", labels=DCGM_LABELS)
    latest = (GpuSample.objects.filter(at__gte=now - FRESH_FOR, device__present=True)
              .order_by("device_id", "-at").distinct("device_id")
              .values_list("utilization", "memory_used_mib", "device__index", "device__uuid",
                           "device__product", "device__node__hostname", "device__node_id",
                           "device__node__pool_id", "device__node__simulated_root"))
    for busy, used, index, uuid, product, hostname, node_id, pool_id, sim_root in latest:
        labels = [str(index), uuid, f"nvidia{index}", product, hostname, node_id,
                  pool_id or "", "true" if sim_root else "false"]
        utilization.add_metric(labels, busy)
        memory.add_metric(labels, used)
    return iter((utilization, memory))
