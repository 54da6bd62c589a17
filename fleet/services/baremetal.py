"""Bare metal: machines enrolled by their BMC and driven through the site's provisioner.

enrolled -> verifying -> manageable -> inspecting -> available (deploy and undeploy are in
fleet.services.deploy); a failed step stays `*-failed` with the reason until a retry or
`nodes abort`. Every BMC action is a command for the site's provisioner (a bcd started with
`--provisioner`), carrying the machine's credentials sealed to that provisioner's key for
that one machine; at rest they are sealed under the KEK. A BMC that stops answering only
marks the node: nothing it holds is released and nothing is retired on that account (I5).
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from django.db import IntegrityError, transaction

from audit.sealing import SealedSecret, seal, unseal
from audit.services import audit_record, audited
from bcd.contract.bmc import CREDENTIALS_USE, BadBmcAddress, BmcAddress, parse_bmc
from bcd.contract.crypto import jwe_seal
from compute.core.db import database_now
from compute.core.errors import AlreadyExists, InvalidArgument, InvalidState
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.models import JoinToken, Node, NodeCommand, NodeRole, ProvisionState
from fleet.selectors import access_node_by_id, access_pool_by_id
from fleet.services.nodes import node_event
from fleet.services.specs import command_create, desired_state_changed

PS = ProvisionState
# Each step: the state it runs in, where success leads, where failure leads.
# A deploy's BMC step succeeds when the machine boots the deploy ramdisk: it stays
# `deploying` until the agent of the OS it writes joins (fleet.services.deploy).
STEPS = {"bmc.verify": (PS.VERIFYING, PS.MANAGEABLE, PS.VERIFY_FAILED),
         "bmc.inspect": (PS.INSPECTING, PS.AVAILABLE, PS.INSPECT_FAILED),
         "bmc.deploy": (PS.DEPLOYING, PS.DEPLOYING, PS.DEPLOY_FAILED),
         "bmc.undeploy": (PS.UNDEPLOYING, PS.AVAILABLE, PS.UNDEPLOY_FAILED)}
# Where `nodes abort` leaves a machine: before the step it was in or that failed.
ABORT_TO = {PS.VERIFYING: PS.ENROLLED, PS.VERIFY_FAILED: PS.ENROLLED,
            PS.INSPECTING: PS.MANAGEABLE, PS.INSPECT_FAILED: PS.MANAGEABLE,
            PS.DEPLOYING: PS.AVAILABLE, PS.DEPLOY_FAILED: PS.AVAILABLE}
VERIFY_FROM = (PS.ENROLLED, PS.VERIFY_FAILED)
INSPECT_FROM = (PS.MANAGEABLE, PS.AVAILABLE, PS.INSPECT_FAILED)
POWER_STATES = ("on", "off", "cycle")
UNCHANGED = "unchanged"  # a poll that found the BMC as it was: nothing to audit
BUSY = (PS.VERIFYING, PS.INSPECTING, PS.DEPLOYING, PS.UNDEPLOYING)


class NoProvisioner(InvalidState):
    """The machine's site has no provisioner to send a BMC command to."""


def bmc_secret_name(node_id: str) -> str:
    return f"bmc:{node_id}"


def bmc_address_allowed(text: str, *, policy: dict[str, Any]) -> BmcAddress:
    """The BMC address, refused unless it is Redfish over HTTPS (plain HTTP only on
    loopback, or where the pool's policy says `bmc: {allowHttp: true}`)."""
    try:
        address = parse_bmc(text)
    except BadBmcAddress as error:
        raise InvalidArgument(f"bmc: {error}", field="bmc") from None
    allow_http = bool((policy.get("bmc") or {}).get("allowHttp"))
    if address.scheme == "http" and not (address.loopback or allow_http):
        raise InvalidArgument("bmc: redfish+http sends the BMC password in the clear; use "
                              "redfish+https (plain HTTP is taken only on loopback or where "
                              "the pool's policy sets bmc.allowHttp)", field="bmc")
    return address


@audited
def node_enroll(*, tenant: Tenant, actor: Principal, pool_id: str, bmc: str, username: str,
                password: str, verify_ca: str = "", insecure: bool = False,
                hostname: str = "") -> Node:
    """Enroll a machine by its BMC and start verifying that the BMC answers with these
    credentials (the site's provisioner does it)."""
    pool = access_pool_by_id(tenant=tenant, pool_id=pool_id, owned=True, lock=True)
    address = bmc_address_allowed(bmc, policy=pool.policy or {})
    if verify_ca and insecure:
        raise InvalidArgument("verifyCa and insecure exclude each other", field="insecure")
    existing = Node.objects.filter(bmc_address=str(address)).exclude(
        provision_state=PS.RETIRED).first()
    if existing is not None:
        raise AlreadyExists(f"{address} is already enrolled as node {existing.id}",
                            nodeId=existing.id)
    verify: dict[str, Any] = ({"insecure": True} if insecure else
                              {"caPem": verify_ca} if verify_ca else {})
    try:
        with transaction.atomic():  # the partial unique index referees racing enrolments
            node = Node.objects.create(pool=pool, site_id=pool.site_id, hostname=hostname,
                                       provision_state=PS.ENROLLED, bmc_address=str(address),
                                       bmc_verify=verify)
    except IntegrityError:
        raise AlreadyExists(f"{address} is already enrolled") from None
    node.pool = pool
    seal(bmc_secret_name(node.id), json.dumps({"username": username,
                                                "password": password}).encode())
    node_event(node, FleetEvent.NODE_ENROLLED, bmc=str(address), hostname=hostname)
    try:
        command: NodeCommand | None = step_start(node, "bmc.verify")
    except NoProvisioner as missing:  # enrolled all the same: `nodes verify` once one runs
        node.provision_error = missing.message
        node.save(update_fields=["provision_error"])
        command = None
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="node.enroll", target=node.id,
                 data={"poolId": pool.id, "bmc": str(address),
                       "tls": node.bmc_tls,
                       "commandId": command.id if command else None})
    return node


@audited
def node_verify(*, tenant: Tenant, actor: Principal, node_id: str) -> Node:
    """Check again that the BMC answers with the enrolled credentials."""
    return _step_again(tenant, actor, node_id, "bmc.verify")


@audited
def node_inspect(*, tenant: Tenant, actor: Principal, node_id: str) -> Node:
    """Read the machine's identity and size from its BMC."""
    return _step_again(tenant, actor, node_id, "bmc.inspect")


# A step an operator runs again: the states it may start from, and how its refusal says it.
AGAIN = {"bmc.verify": (VERIFY_FROM, "verified", "node.verify"),
         "bmc.inspect": (INSPECT_FROM, "inspected", "node.inspect")}


def _step_again(tenant: Tenant, actor: Principal, node_id: str, kind: str) -> Node:
    allowed, verb, action = AGAIN[kind]
    node = bare_metal_locked(tenant, node_id, allowed=allowed, action=verb)
    command = step_start(node, kind)
    provision_audit(tenant, actor, node, action, command)
    return node


@audited
def node_power(*, tenant: Tenant, actor: Principal, node_id: str, state: str,
               reason: str = "") -> Node:
    """Power the machine on, off or cycle it through its BMC."""
    if state not in POWER_STATES:
        raise InvalidArgument(f"state: {state!r} is not one of {', '.join(POWER_STATES)}",
                              field="state")
    node = bare_metal_locked(tenant, node_id, allowed=None, action="powered")
    if node.provision_state in BUSY:
        raise InvalidState(f"node {node.id} is {node.provision_state}; power it once that "
                           "is done or aborted", provisionState=node.provision_state)
    command = provisioner_command(node, "bmc.power", state=state)
    node_event(node, FleetEvent.NODE_POWER_REQUESTED, state=state, reason=reason,
               commandId=command.id)
    provision_audit(tenant, actor, node, "node.power", command, state=state, reason=reason)
    return node


@audited
def node_abort(*, tenant: Tenant, actor: Principal, node_id: str, reason: str) -> Node:
    """Stop a provision step (or clear its failure): the machine goes back to where it was
    before that step; a late answer of the step changes nothing."""
    node = bare_metal_locked(tenant, node_id, allowed=tuple(ABORT_TO), action="aborted")
    before = node.provision_state
    provision_move(node, ABORT_TO[PS(before)], reason=f"aborted: {reason}")
    if before in (PS.DEPLOYING, PS.DEPLOY_FAILED):
        deploy_token_revoke_locked(node)
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action="node.abort", target=node.id,
                 reason=reason, data={"from": before, "to": node.provision_state})
    return node


def bmc_result_locked(command: NodeCommand, status: str, output: dict[str, Any]) -> str:
    """Apply a provisioner's answer to a `bmc.*` command to the machine it was for;
    returns what happened, for the result's audit row."""
    target = Node.objects.select_for_update(no_key=True).select_related("pool").filter(
        pk=command.payload.get("target"), role=NodeRole.NODE).first()
    if target is None:
        return "no such machine"
    reachability_changed = _note_reachability(target, status, output)
    succeeded = status == "succeeded"
    error = "" if succeeded else str(output.get("error") or (
        "the provisioner stopped while running it; its outcome is unknown"
        if status == "unknown" else status))
    power = str(output.get("powerState") or target.power_state)[:16]
    power_changed = power != target.power_state
    if power_changed:
        target.power_state = power
        target.save(update_fields=["power_state"])
    if command.kind == "bmc.status":
        return "changed" if reachability_changed or power_changed else UNCHANGED
    if command.kind == "bmc.power":
        node_event(target, FleetEvent.NODE_POWER, state=command.payload.get("state"),
                   powerState=target.power_state, error=error)
        return "powered" if succeeded else f"power failed: {error}"
    if command.kind not in STEPS:
        return "recorded"  # a boot-device change: what the BMC shows is all it tells
    running, passed, failed = STEPS[command.kind]
    if target.provision_state != running or target.provision_command != command.id:
        return "stale"  # aborted, or a later attempt of this step runs
    if not succeeded:
        provision_move(target, failed, reason=error)
        if command.kind == "bmc.deploy":
            deploy_token_revoke_locked(target)
        return str(failed)
    if command.kind == "bmc.inspect":
        _identity(target, output)
    if command.kind == "bmc.deploy":
        target.deployment = {**target.deployment, "booted": output,
                             "bootedAt": database_now().isoformat()}
        target.save(update_fields=["deployment"])
    provision_move(target, passed, reason="", command_id="")
    if passed == PS.MANAGEABLE:  # a verified machine is inspected next
        try:
            step_start(target, "bmc.inspect")
        except NoProvisioner as missing:  # gone meanwhile: `nodes inspect` once one runs
            target.provision_error = missing.message
            target.save(update_fields=["provision_error"])
    return "booting the deploy ramdisk" if command.kind == "bmc.deploy" else str(passed)


def bare_metal_locked(tenant: Tenant, node_id: str, *, allowed: tuple[str, ...] | None,
                      action: str) -> Node:
    node = access_node_by_id(tenant=tenant, node_id=node_id, lock=True)
    if not node.bmc_address:
        raise InvalidState(f"node {node.id} joined by itself and has no BMC; only an enrolled "
                           f"machine can be {action}")
    if allowed is not None and node.provision_state not in allowed:
        raise InvalidState(f"node {node.id} is {node.provision_state}; it can be {action} "
                           f"only when {' or '.join(allowed)}",
                           provisionState=node.provision_state)
    return node


def step_start(node: Node, kind: str, **params: Any) -> NodeCommand:
    """Start a provision step: the command for the provisioner, and the step's state."""
    command = provisioner_command(node, kind, **params)
    provision_move(node, STEPS[kind][0], reason="", command_id=command.id)
    return command


def provisioner_command(node: Node, kind: str, *, sealed: dict[str, bytes] | None = None,
                        **params: Any) -> NodeCommand:
    """A command for the site's provisioner about `node`, with the BMC credentials (and any
    other `sealed` secret) sealed to that provisioner for this machine."""
    provisioner = (Node.objects.filter(site_id=node.site_id, role=NodeRole.PROVISIONER)
                   .exclude(provision_state=PS.RETIRED).exclude(public_key="")
                   .order_by("connectivity", "-last_heartbeat_at").first())
    if provisioner is None:
        raise NoProvisioner(f"site {node.site_id} has no provisioner: start `bcd node "
                            "--provisioner` on a machine that reaches the BMCs",
                            siteId=node.site_id)
    recipient = load_pem_public_key(provisioner.public_key.encode())
    if not isinstance(recipient, ec.EllipticCurvePublicKey):
        raise InvalidState(f"provisioner {provisioner.id} has no EC key")
    row = SealedSecret.objects.get(pk=bmc_secret_name(node.id))
    secrets = {"credentials": (CREDENTIALS_USE, unseal(row))}
    secrets.update({name: (name, value) for name, value in (sealed or {}).items()})
    command = command_create(node_id=provisioner.id, kind=kind, payload={
        "target": node.id, "address": node.bmc_address, "verify": node.bmc_verify,
        **{name: jwe_seal(value, recipient, {"use": use, "node": node.id})
           for name, (use, value) in secrets.items()}, **params})
    node.bmc_polled_at = database_now()  # a command is a poll: the next one can wait
    node.save(update_fields=["bmc_polled_at"])
    desired_state_changed()
    return command


def deploy_token_revoke_locked(node: Node) -> None:
    """The join token a deploy minted for this machine can no longer be used."""
    token_id = node.deployment.get("tokenId")
    if token_id:
        JoinToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=database_now())


def provision_move(node: Node, state: str, *, reason: str, command_id: str = "") -> None:
    """Into `state`, keeping the failure's reason (or none) and the command of the step
    it now runs (an answer to any other is stale)."""
    before = node.provision_state
    node.provision_state = state
    node.provision_error = reason
    node.provision_command = command_id
    node.save(update_fields=["provision_state", "provision_error", "provision_command"])
    if before != state:
        node_event(node, FleetEvent.NODE_PROVISION_STATE, **{"from": before, "to": state},
                   reason=reason)


def _note_reachability(node: Node, status: str, output: dict[str, Any]) -> bool:
    """Whether the BMC answered (a refusal is an answer); an event when that changes (and
    True)."""
    reachable = not output.get("unreachable") if status != "unknown" else node.bmc_reachable
    if reachable is None or reachable == node.bmc_reachable:
        return False
    node.bmc_reachable = reachable
    node.save(update_fields=["bmc_reachable"])
    node_event(node, FleetEvent.NODE_BMC_REACHABLE if reachable
               else FleetEvent.NODE_BMC_UNREACHABLE, error=str(output.get("error", "")))
    return True


def _identity(node: Node, found: dict[str, Any]) -> None:
    """What inspection read: serial, product UUID, MACs and size (the deploy's join token
    is bound to them)."""
    node.serial = str(found.get("serial") or "")[:128]
    node.product_uuid = str(found.get("productUuid") or "")[:64]
    node.macs = [str(mac)[:17] for mac in found.get("macs", [])][:64]
    node.vcpus = max(int(found.get("cpus") or 0), node.vcpus_allocated)
    node.memory_gib = max(int(found.get("memoryGib") or 0), node.memory_gib_allocated)
    node.hostname = node.hostname or str(found.get("hostname") or found.get("name") or "")
    node.save(update_fields=["serial", "product_uuid", "macs", "vcpus", "memory_gib",
                             "hostname"])


def provision_audit(tenant: Tenant, actor: Principal, node: Node, action: str,
                    command: NodeCommand | None, **data: Any) -> None:
    audit_record(tenant_id=tenant.id, actor_id=actor.id, action=action, target=node.id,
                 reason=str(data.pop("reason", "")),
                 data={"commandId": command.id if command else None,
                       "provisionState": node.provision_state, **data})
