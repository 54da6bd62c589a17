"""Prepare a development control plane: root tenant, admin token, a default site and pool
(and, when asked, the gateway's database role and TLS credentials).

Prints one JSON object with the ids; the token goes to a new 0600 file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from compute.platform.schedules import install_schedules
from compute.platform.tenancy.selectors import root_tenant
from compute.platform.tenancy.services import root_bootstrap
from fleet.services.pools import pool_create
from fleet.services.sites import site_create

DEV_POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8},
              "hostShare": {"vcpusPerGpu": 12, "memoryGiBPerGpu": 96}, "kubernetes": False,
              "onDeviceFailure": "replace-future", "sandboxes": {"network": "outbound"}}
CPU_POLICY = {"acceptance": [{"kind": "diag.cpu"}], "kubernetes": False,
              "sandboxes": {"network": "outbound"}}


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--token-file", type=Path, required=True)
        parser.add_argument("--cpu-pool", action="store_true")
        parser.add_argument("--slice-gpus", type=int, default=0,
                            help="time-sliced shares per GPU (not in MIG mode) of the pool")
        parser.add_argument("--gateway-role-password-file", type=Path, default=None,
                            help="also make the gateway's database role (bc_gateway_role)")
        parser.add_argument("--gateway-credentials", type=Path, default=None, metavar="DIR",
                            help="also write the gateway's TLS credentials there "
                            "(bc_gateway_credentials)")
        parser.add_argument("--gateway-host", action="append", default=[],
                            help="a name or address the gateway serves (repeatable)")

    def handle(self, *args: object, token_file: Path, cpu_pool: bool, slice_gpus: int,
               gateway_role_password_file: Path | None, gateway_credentials: Path | None,
               gateway_host: list[str], **options: object) -> None:
        install_schedules()
        if gateway_role_password_file is not None:
            call_command("bc_gateway_role", password_file=gateway_role_password_file,
                         stdout=self.stderr)
        if gateway_credentials is not None:
            call_command("bc_gateway_credentials", out=gateway_credentials, host=gateway_host,
                         stdout=self.stderr)
        minted = root_bootstrap(admin_name="dev-admin")
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(minted.plaintext)
        root, actor = root_tenant(), minted.token.principal
        site = site_create(tenant=root, actor=actor, kind="shared", region="dev-1",
                           name="dev", idempotency_key="dev-site")
        pool = pool_create(tenant=root, actor=actor, site_id=site.id, pool_class="metal-host",
                           gpu_model="H100", name="dev-h100",
                           policy={**DEV_POLICY, **({"timeSlicing": {"replicas": slice_gpus}}
                                                    if slice_gpus else {})},
                           idempotency_key="dev-pool-h100")
        result = {"tenantId": root.id, "siteId": site.id, "poolId": pool.id}
        if cpu_pool:
            cpu = pool_create(tenant=root, actor=actor, site_id=site.id, pool_class="cpu-host",
                              policy=CPU_POLICY, name="dev-cpu", idempotency_key="dev-pool-cpu")
            result["cpuPoolId"] = cpu.id
        self.stdout.write(json.dumps(result))
