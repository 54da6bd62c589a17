"""Wire shapes of fleet objects, and the pool policy schema."""

from __future__ import annotations

from typing import Any
from zoneinfo import available_timezones

from rest_framework import serializers

from bcd.contract.holds import MAX_FENCE_GRACE, ON_END, SLURM_ACCOUNT
from bcd.contract.profile import PROFILE_UNITS
from compute.core.api.inputs import Input
from compute.core.api.shapes import BOOLEAN, INTEGER, OBJECT, STRING, TIME, array, nullable, obj
from fleet.models import Device, Image, JoinToken, Node, Pool, Site

ACCEPTANCE_CHECKS = ("diag.nvml", "diag.cpu", "diag.disk", "diag.network",
                     "diag.dcgm")


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


class SandboxPolicyIn(Input):
    max_vcpus = serializers.IntegerField(required=False, min_value=1, max_value=1024)
    max_memory_gi_b = serializers.IntegerField(required=False, min_value=1, max_value=16384)
    images = serializers.ListField(child=serializers.CharField(max_length=63), required=False,
                                   help_text="Image names sandboxes may boot (default: any "
                                             "image of the pool).")
    public_forwards = serializers.BooleanField(
        required=False, default=False,
        help_text="Port forwards listen on every address of the node, not only loopback.")
    network = serializers.ChoiceField(
        choices=["none", "outbound"], required=False, default="none",
        help_text="What a sandbox may ask for: none (only the guest agent's channel, the "
                  "default) or outbound (user-mode networking: outbound traffic and port "
                  "forwards).")
    max_file_bytes = serializers.IntegerField(
        required=False, min_value=1, max_value=2 << 20,
        help_text="The largest file `sandboxes put` and `get` move (2 MiB, the most).")
    max_lifetime = serializers.IntegerField(
        required=False, min_value=60, max_value=366 * 86_400,
        help_text="Seconds after which a sandbox is released, whatever its --timeout.")
    paused_rate = serializers.FloatField(
        required=False, min_value=0, max_value=1,
        help_text="What a paused sandbox's hours count for, against a running one's (0.1).")


class TimeSlicingIn(Input):
    replicas = serializers.IntegerField(min_value=1, max_value=64,
                                        help_text="Shares of each GPU (bookable one by one).")


CLASS_NAME = r"^[a-z][a-z0-9-]{0,31}$"  # a priority class's name


class PriorityClassIn(Input):
    name = serializers.RegexField(CLASS_NAME, max_length=32)
    weight = serializers.IntegerField(min_value=0, max_value=1000,
                                      help_text="Pending requests of a higher weight are "
                                                "placed first.")
    preemptible = serializers.BooleanField(required=False, default=False)


class SharingIn(Input):
    """How tenants share the pool (reservations.sharing)."""

    priority_classes = PriorityClassIn(  # type: ignore[call-arg]
        many=True, required=False, max_length=16,
        help_text="Classes added to high (100), normal (50) and preemptible (0), or their "
                  "weights changed (by name; a name given twice takes its last entry).")
    fair_share_half_life_hours = serializers.FloatField(
        required=False, min_value=0.1, max_value=24 * 366,
        help_text="Usage counts half as much after this long (24 by default).")
    preemption_notice_seconds = serializers.FloatField(
        required=False, min_value=0, max_value=86_400,
        help_text="How long a preempted reservation is told before it is released (120).")
    plan_starts = serializers.BooleanField(
        required=False,
        help_text="A waiting request that fits nowhere now is booked at the earliest window "
                  "it fits (its planned start, which only moves earlier): smaller requests "
                  "use the GPUs before it only if they end before it (backfill).")
    owner_share = serializers.IntegerField(
        required=False, min_value=1, max_value=10_000,
        help_text="The owner's fair-share weight, against each offering's share (1).")


class BmcPolicyIn(Input):
    allow_http = serializers.BooleanField(
        required=False, default=False,
        help_text="Take redfish+http BMC addresses beyond loopback (the password then "
                  "crosses the management network in the clear).")
    deploy_boot = serializers.ChoiceField(
        choices=["cd", "pxe"], required=False,
        help_text="How a deploy boots the ramdisk: virtual media (cd, the default) or PXE.")
    deploy_ramdisk = serializers.CharField(
        required=False, max_length=63,
        help_text="The image a deploy boots unless `nodes deploy --ramdisk` names one: its "
                  "disk is the bootable ISO (virtual media), its kernel and initrd the same "
                  "ramdisk for PXE.")


class SlurmPolicyIn(Input):
    """Where the pool's holds asked with `--slurm ACCOUNT` are published."""

    cluster = serializers.RegexField(SLURM_ACCOUNT, max_length=64,
                                     help_text="The Slurm cluster's name (ClusterName).")
    partition = serializers.RegexField(SLURM_ACCOUNT, max_length=64, required=False,
                                       help_text="The partition the Slurm reservation is in.")


class ProfileIn(Input):
    """Software units bcd keeps on the pool's nodes (desired state, reported back)."""

    units = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(PROFILE_UNITS)), required=False,
        max_length=len(PROFILE_UNITS),
        help_text="container-toolkit: NVIDIA's CDI spec (/etc/cdi/nvidia.json, by UUID) kept "
                  "current; slurmd: the node's Slurm daemon, offering held GPUs (implied by "
                  "the policy's slurm).")
    required_units = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(PROFILE_UNITS)), required=False,
        max_length=len(PROFILE_UNITS),
        help_text="Units that must be ready for a node to pass acceptance (and be booked); "
                  "each is kept on the nodes too.")
    aliases = {"required": "required_units"}


class PolicyIn(Input):
    """A pool's policy. Stored in the wire form it was given, once validated."""

    acceptance = AcceptanceCheckIn(many=True, required=False)
    bmc = BmcPolicyIn(required=False)
    expect = ExpectIn(required=False)
    host_share = HostShareIn(required=False)
    kubernetes = serializers.BooleanField(required=False, default=False)
    slurm = SlurmPolicyIn(required=False)
    profile = ProfileIn(required=False)
    on_device_failure = serializers.ChoiceField(
        choices=["keep", "replace-future"], required=False,
        help_text="A GPU turns unhealthy: keep its bookings (the default), or re-place the "
                  "reservations that have not started onto healthy GPUs (active ones are "
                  "flagged).")
    time_zone = serializers.ChoiceField(
        choices=sorted(available_timezones()), required=False,
        help_text="The pool's time zone (IANA name, UTC by default): where budget periods "
                  "start.")
    ending_notices = serializers.ListField(
        child=serializers.FloatField(min_value=1, max_value=7 * 86_400), required=False,
        max_length=8,
        help_text="How long before a started reservation's end the event reservation.ending "
                  "is sent, in seconds, once each ([900, 60] by default; []: never).")
    on_end = serializers.ChoiceField(
        choices=list(ON_END), required=False,
        help_text="When a hold ends (its end, a release, a preemption): notify (the default) "
                  "leaves its workloads running and the node reports which they are; fence: "
                  "the node stops every process that holds its devices or runs in its "
                  "cgroup (SIGTERM, then SIGKILL after fenceGraceSeconds) before anything "
                  "else may hold them, and reports which it stopped.")
    fence_grace_seconds = serializers.FloatField(
        min_value=0, max_value=MAX_FENCE_GRACE, required=False,
        help_text="With onEnd fence: how long the hold's processes have to exit after "
                  "SIGTERM (10 s by default).")
    sandboxes = SandboxPolicyIn(required=False)
    sharing = SharingIn(required=False)
    time_slicing = TimeSlicingIn(
        required=False,
        help_text="Slice each GPU (not in MIG mode) into this many time-sliced shares, "
                  "booked as class gpu-share; a GPU is booked whole or as shares, never both "
                  "at one time.")


SITE = obj(id=STRING, tenantId=STRING, kind=STRING, region=STRING, name=STRING,
           createdAt=TIME)
POOL = obj(id=STRING, tenantId=STRING, siteId=STRING, name=STRING, gpuModel=nullable(STRING),
           policy=OBJECT, createdAt=TIME, **{"class": STRING})
CONDITION = obj(type=STRING, status=BOOLEAN, reason=STRING)
NODE = obj(
    id=STRING, poolId=STRING, siteId=STRING, hostname=STRING, provisionState=STRING,
    connectivity=STRING, health=STRING, cordoned=BOOLEAN, schedulable=BOOLEAN, labels=OBJECT,
    simulated=BOOLEAN, virtualization=nullable(STRING), vcpus=INTEGER, memoryGiB=INTEGER,
    vcpusAllocated=INTEGER, memoryGiBAllocated=INTEGER, serial=nullable(STRING),
    productUuid=nullable(STRING), macs=array(STRING), createdAt=TIME,
    lastHeartbeatAt=nullable(TIME), sessionEpoch=INTEGER, journalEpoch=INTEGER,
    agentVersion=nullable(STRING), agentRefused=nullable(STRING), gateway=nullable(STRING),
    inventoryRefused=nullable(STRING), conditions=array(CONDITION), role=STRING,
    provisionError=nullable(STRING),
    bmc=nullable(obj(address=STRING, tls=STRING, reachable=nullable(BOOLEAN),
                     powerState=nullable(STRING), polledAt=nullable(TIME),
                     deployment=nullable(obj(image=STRING, imageId=STRING, ramdiskId=STRING,
                                             boot=STRING, startedAt=STRING,
                                             bootedAt=STRING, deadline=STRING)))),
    profile=nullable(obj(generation=INTEGER, units=OBJECT)))
DEVICE = obj(id=STRING, uuid=STRING, index=INTEGER, product=STRING, model=STRING,
             vramGiB=INTEGER, nvlinkDomain=nullable(STRING), profile=nullable(STRING),
             parentId=nullable(STRING), health=STRING, healthReason=nullable(STRING),
             present=BOOLEAN,
             **{"class": STRING})
JOIN_TOKEN = obj(id=STRING, poolId=STRING, role=STRING, maxUses=INTEGER, uses=INTEGER,
                 expiresAt=TIME, revokedAt=nullable(TIME), expectSerial=nullable(STRING),
                 expectProductUuid=nullable(STRING), expectMac=nullable(STRING),
                 nodes=array(STRING), createdAt=TIME)
IMAGE_PART = obj(url=STRING, sha256=STRING)
IMAGE = {**obj(id=STRING, poolId=STRING, name=STRING, kernel=IMAGE_PART, initrd=IMAGE_PART,
               disk=IMAGE_PART, readyLine=STRING, snapshot=BOOLEAN, createdAt=TIME),
         "required": ["createdAt", "id", "initrd", "kernel", "name", "poolId", "readyLine",
                      "snapshot"]}


def present_site(site: Site) -> dict[str, Any]:
    return {"id": site.id, "tenantId": site.tenant_id, "kind": site.kind,
            "region": site.region, "name": site.name, "createdAt": site.created_at}


def present_pool(pool: Pool) -> dict[str, Any]:
    return {"id": pool.id, "tenantId": pool.tenant_id, "siteId": pool.site_id,
            "name": pool.name, "class": pool.pool_class, "gpuModel": pool.gpu_model or None,
            "policy": pool.policy, "createdAt": pool.created_at}


def present_node(node: Node) -> dict[str, Any]:
    return {
        "id": node.id, "poolId": node.pool_id, "siteId": node.site_id,
        "hostname": node.hostname, "provisionState": node.provision_state,
        "connectivity": node.connectivity, "health": node.health, "cordoned": node.cordoned,
        "schedulable": node.schedulable, "labels": node.labels,
        "simulated": bool(node.simulated_root), "virtualization": node.virtualization or None,
        "vcpus": node.vcpus, "memoryGiB": node.memory_gib,
        "vcpusAllocated": node.vcpus_allocated, "memoryGiBAllocated": node.memory_gib_allocated,
        "serial": node.serial or None, "productUuid": node.product_uuid or None,
        "macs": node.macs, "createdAt": node.created_at,
        "lastHeartbeatAt": node.last_heartbeat_at,
        "sessionEpoch": node.session_epoch, "journalEpoch": node.journal_epoch,
        "agentVersion": node.agent_version or None, "agentRefused": node.agent_refused or None,
        "gateway": node.gateway or None, "inventoryRefused": node.inventory_refused or None,
        "conditions": node_conditions(node), "role": node.role,
        "provisionError": node.provision_error or None, "bmc": present_bmc(node),
        "profile": node.profile or None,
    }


DEPLOYMENT_SHOWN = ("image", "imageId", "ramdiskId", "boot", "startedAt", "bootedAt",
                    "deadline")


def present_bmc(node: Node) -> dict[str, Any] | None:
    """Where the machine's BMC is and what it last said (never its credentials)."""
    if not node.bmc_address:
        return None
    deployment = node.deployment or {}
    return {"address": node.bmc_address, "tls": node.bmc_tls,
            "reachable": node.bmc_reachable, "powerState": node.power_state or None,
            "polledAt": node.bmc_polled_at,
            "deployment": {key: str(deployment.get(key, "")) for key in DEPLOYMENT_SHOWN}
            if deployment else None}


def node_conditions(node: Node) -> list[dict[str, Any]]:
    """Why a node is or is not schedulable, one condition each."""
    return [
        {"type": "Adopted", "status": node.provision_state == "adopted",
         "reason": node.provision_state},
        {"type": "InventoryTaken", "status": not node.inventory_refused,
         "reason": node.inventory_refused or ("taken" if node.inventory_generation
                                              else "no report yet")},
        {"type": "Accepted", "status": node.acceptance.get("state") == "passed",
         "reason": node.acceptance.get("failure") or node.acceptance.get("state", "not run")},
        {"type": "Reachable", "status": node.connectivity != "unreachable",
         "reason": node.connectivity},
        {"type": "AgentSupported", "status": not node.agent_refused,
         "reason": node.agent_refused or node.agent_version or "not connected yet"},
        {"type": "Healthy", "status": node.health == "healthy", "reason": node.health},
        {"type": "Schedulable", "status": node.schedulable, "reason": unschedulable_because(node)},
        *([{"type": "BmcReachable", "status": node.bmc_reachable is not False,
            "reason": "bmc-unreachable" if node.bmc_reachable is False else
            "answered" if node.bmc_reachable else "not asked yet"}] if node.bmc_address
          else []),
    ]


def unschedulable_because(node: Node) -> str:
    """Every reason the placer skips the node, in words ("ok" when it does not)."""
    reasons = [why for why, applies in (
        (f"a {node.role}, not a machine to book", node.role != "node"),
        (f"inventory refused: {node.inventory_refused}", bool(node.inventory_refused)),
        (f"not adopted ({node.provision_state})", node.provision_state != "adopted"),
        ("cordoned", node.cordoned),
        ("unreachable", node.connectivity == "unreachable"),
        (f"health {node.health}", node.health != "healthy")) if applies]
    return "; ".join(reasons) or "ok"


def present_device(device: Device) -> dict[str, Any]:
    return {"id": device.id, "uuid": device.uuid, "class": device.device_class,
            "index": device.index, "product": device.product, "model": device.model,
            "vramGiB": device.vram_gib, "nvlinkDomain": device.nvlink_domain or None,
            "profile": device.profile or None, "parentId": device.parent_id,
            "health": device.health,
            "healthReason": device.health_reason or None, "present": device.present}


def present_join_token(token: JoinToken) -> dict[str, Any]:
    return {"id": token.id, "poolId": token.pool_id, "role": token.role,
            "maxUses": token.max_uses, "uses": token.uses, "expiresAt": token.expires_at,
            "revokedAt": token.revoked_at, "expectSerial": token.expect_serial or None,
            "expectProductUuid": token.expect_product_uuid or None,
            "expectMac": token.expect_mac or None, "nodes": token.nodes,
            "createdAt": token.created_at}


def present_image(image: Image) -> dict[str, Any]:
    return {"id": image.id, "poolId": image.pool_id, "name": image.name, **image.parts(),
            "readyLine": image.ready_line, "snapshot": image.snapshot,
            "createdAt": image.created_at}
