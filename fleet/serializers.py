"""Wire shapes of fleet objects, and the pool policy schema."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from compute.api.inputs import Input
from fleet.models import Pool, Site

ACCEPTANCE_CHECKS = ("diag.nvml", "diag.cpu", "diag.disk", "diag.network")


class AcceptanceCheckIn(Input):
    kind = serializers.ChoiceField(choices=ACCEPTANCE_CHECKS)
    params = serializers.DictField(required=False)


class ExpectIn(Input):
    gpu_count = serializers.IntegerField(required=False, min_value=0, max_value=64)
    vcpus = serializers.IntegerField(required=False, min_value=1)
    memory_gi_b = serializers.IntegerField(required=False, min_value=1)


class HostShareIn(Input):
    vcpus_per_gpu = serializers.IntegerField(min_value=0, max_value=1024)
    memory_gi_b_per_gpu = serializers.IntegerField(min_value=0, max_value=16384)


class PolicyIn(Input):
    """A pool's policy. Stored in the wire form it was given, once validated."""

    acceptance = AcceptanceCheckIn(many=True, required=False)
    expect = ExpectIn(required=False)
    host_share = HostShareIn(required=False)
    kubernetes = serializers.BooleanField(required=False, default=False)


def present_site(site: Site) -> dict[str, Any]:
    return {"id": site.id, "tenantId": site.tenant_id, "kind": site.kind,
            "region": site.region, "name": site.name, "createdAt": site.created_at}


def present_pool(pool: Pool) -> dict[str, Any]:
    return {"id": pool.id, "tenantId": pool.tenant_id, "siteId": pool.site_id,
            "name": pool.name, "class": pool.pool_class, "gpuModel": pool.gpu_model or None,
            "policy": pool.policy, "createdAt": pool.created_at}
