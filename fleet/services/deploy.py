"""Deploying an OS to an enrolled machine, and taking it back.

available -> deploying: the site's provisioner boots the machine from the deploy ramdisk
(virtual media, or PXE where the pool says so) and keeps the deploy's instructions for it:
the OS image to write (by URL and sha256) and a fresh single-use join token bound to the
machine's serial and product UUID. The ramdisk writes the image and reboots into it; the
OS's agent joins with that token as this same node (`deployed`), passes acceptance
(`adopted`) and is bookable. A deploy that does not join before its deadline turns
`deploy-failed` and the machine is powered off.

undeploy (from deployed, adopted or a failure) ejects the media and powers the machine off;
the node's agent identity ends with it, and the machine is `available` again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from audit.services import audit_record, audited
from compute.core import secrets
from compute.core.db import database_now
from compute.core.errors import InvalidArgument, InvalidState, NotFound
from compute.platform.tenancy.models import Principal, Tenant
from fleet.events import FleetEvent
from fleet.holders import refuse_while_held
from fleet.models import CommandState, Image, JoinToken, Node, NodeCommand, ProvisionState
from fleet.services.baremetal import (
    bare_metal_locked,
    deploy_token_revoke_locked,
    provision_audit,
    provision_move,
    provisioner_command,
    step_start,
)
from fleet.services.join_tokens import TOKEN_SCHEME
from fleet.services.nodes import node_event

PS = ProvisionState
DEPLOY_FROM = (PS.AVAILABLE, PS.DEPLOY_FAILED)
UNDEPLOY_FROM = (PS.DEPLOYED, PS.ADOPTED, PS.ACCEPTANCE_FAILED, PS.DEPLOY_FAILED,
                 PS.UNDEPLOY_FAILED)
DEPLOYED_OR_GOING = (PS.DEPLOYING, PS.DEPLOYED, PS.ADOPTED)
BOOT_DEVICES = ("cd", "pxe")
DEFAULT_TIMEOUT = timedelta(minutes=30)
MIN_TIMEOUT, MAX_TIMEOUT = timedelta(minutes=1), timedelta(hours=24)
OPEN = (CommandState.QUEUED, CommandState.SENT)


@audited
def node_deploy(*, tenant: Tenant, actor: Principal, node_id: str, image: str,
                ramdisk: str = "", timeout: timedelta = DEFAULT_TIMEOUT) -> Node:
    """Write `image` (its disk part) to the machine through the pool's deploy ramdisk; the
    node is adopted when the OS's agent joins and passes acceptance. Asked again for the
    image it is deploying or runs, it answers the node as it is."""
    if not MIN_TIMEOUT <= timeout <= MAX_TIMEOUT:
        raise InvalidArgument("timeout: must be between 1m and 24h", field="timeout")
    node = bare_metal_locked(tenant, node_id, allowed=None, action="deployed")
    if node.provision_state in DEPLOYED_OR_GOING and image in (
            node.deployment.get("imageId"), node.deployment.get("image")):
        return node  # a repeat: nothing to do
    if node.provision_state not in DEPLOY_FROM:
        raise InvalidState(f"node {node.id} is {node.provision_state}; it can be deployed "
                           f"only when {' or '.join(DEPLOY_FROM)}",
                           provisionState=node.provision_state)
    if not (node.serial or node.product_uuid):
        raise InvalidState(f"node {node.id} has no serial or product UUID to bind its join "
                           "token to: inspect it first", provisionState=node.provision_state)
    policy = node.pool.policy.get("bmc") or {}
    boot = str(policy.get("deployBoot") or "cd")
    if boot not in BOOT_DEVICES:
        raise InvalidState(f"pool {node.pool_id}: bmc.deployBoot {boot!r} is not cd or pxe")
    os_image = _image(node, image, field="image")
    ramdisk_image = _image(node, ramdisk or str(policy.get("deployRamdisk") or ""),
                           field="ramdisk")
    if not os_image.disk_url:
        raise InvalidArgument(f"image: {os_image.name} has no disk to write", field="image")
    if boot == "cd" and not ramdisk_image.disk_url:
        raise InvalidArgument(f"ramdisk: {ramdisk_image.name} has no disk part (the bootable "
                              "ISO the BMC inserts as virtual media)", field="ramdisk")
    deploy_token_revoke_locked(node)  # a failed attempt's token
    token, plaintext = _bound_token(node, timeout)
    media = ({"url": ramdisk_image.disk_url, "sha256": ramdisk_image.disk_sha256}
             if boot == "cd" else ramdisk_image.parts())
    command = step_start(node, "bmc.deploy", sealed={"joinToken": plaintext.encode()},
                         boot=boot, media=media,
                         image={"url": os_image.disk_url, "sha256": os_image.disk_sha256},
                         serial=node.serial, productUuid=node.product_uuid,
                         timeoutSeconds=int(timeout.total_seconds()))
    now = database_now()
    node.deployment = {"imageId": os_image.id, "image": os_image.name,
                       "ramdiskId": ramdisk_image.id, "boot": boot, "tokenId": token.id,
                       "commandId": command.id, "startedAt": now.isoformat(),
                       "deadline": (now + timeout).isoformat()}
    node.save(update_fields=["deployment"])
    provision_audit(tenant, actor, node, "node.deploy", command, image=os_image.id,
                    ramdisk=ramdisk_image.id, boot=boot, tokenId=token.id,
                    timeoutSeconds=int(timeout.total_seconds()))
    return node


@audited
def node_undeploy(*, tenant: Tenant, actor: Principal, node_id: str, reason: str) -> Node:
    """Eject the media and power the machine off; its agent's identity ends (it joins
    again only through another deploy). Refused while it holds anything; a machine already
    undeploying or available is answered as it is."""
    node = bare_metal_locked(tenant, node_id, allowed=None, action="undeployed")
    if node.provision_state in (PS.UNDEPLOYING, PS.AVAILABLE):
        return node  # a repeat, or nothing deployed: nothing to do
    if node.provision_state not in UNDEPLOY_FROM:
        raise InvalidState(f"node {node.id} is {node.provision_state}; it can be undeployed "
                           f"only when {' or '.join(UNDEPLOY_FROM)}",
                           provisionState=node.provision_state)
    refuse_while_held(node, "undeployed")  # the ledger's bookings, future ones too
    deploy_token_revoke_locked(node)
    node.key_pin, node.public_key = "", ""  # its certificate no longer opens a session
    node.session_epoch += 1
    node.save(update_fields=["key_pin", "public_key", "session_epoch"])
    command = step_start(node, "bmc.undeploy")
    provision_audit(tenant, actor, node, "node.undeploy", command, reason=reason)
    return node


def deploy_join_locked(token: JoinToken) -> Node:
    """The deployed OS's agent redeemed its deploy's token: the node it joins as."""
    node = (Node.objects.select_for_update(no_key=True).select_related("pool")
            .get(pk=token.adopts_id))
    if node.provision_state != PS.DEPLOYING or node.deployment.get("tokenId") != token.id:
        raise InvalidState(f"node {node.id} is {node.provision_state}, not deploying with "
                           f"token {token.id}")
    node.acceptance = {}
    node.save(update_fields=["acceptance"])
    provision_move(node, PS.DEPLOYED, reason="")
    return node


@audited
def deploy_time_out(*, node_id: str) -> Node | None:
    """A deploy past its deadline without a join: `deploy-failed`, its token revoked and the
    machine powered off (left manageable: retry the deploy or abort). None if not due."""
    node = (Node.objects.select_for_update(no_key=True, of=("self",)).select_related("pool")
            .filter(pk=node_id, provision_state=PS.DEPLOYING).first())
    if node is None or _deadline(node) > database_now():
        return None
    deadline = node.deployment.get("deadline", "")
    provision_move(node, PS.DEPLOY_FAILED, reason=f"the deployed OS did not join by {deadline}")
    deploy_token_revoke_locked(node)
    try:
        command: NodeCommand | None = provisioner_command(node, "bmc.power", state="off")
    except InvalidState:
        command = None
    node_event(node, FleetEvent.NODE_POWER_REQUESTED, state="off", reason="deploy timed out",
               commandId=command.id if command else None)
    audit_record(tenant_id=node.pool.tenant_id, actor_id="system", action="node.deploy.timeout",
                 target=node.id, reason="no join before the deadline",
                 data={"deadline": deadline, "commandId": command.id if command else None})
    return node


@transaction.atomic(durable=True)
def bmc_poll(*, node_id: str) -> bool:
    """Ask an enrolled machine's BMC whether it answers and how its power is, when it was
    last asked a poll interval ago and no step or other command is asking it now (a deploy
    waiting for its OS to join is polled: a BMC gone mid-deploy shows). A poll is delivery
    bookkeeping, like a heartbeat: what it finds is audited only when it changes something
    (the BMC stopped or started answering). False when not due."""
    node = (Node.objects.select_for_update(no_key=True, of=("self",), skip_locked=True)
            .select_related("pool").filter(pk=node_id, provision_command="")
            .exclude(bmc_address="").exclude(provision_state=PS.RETIRED).first())
    now = database_now()
    if node is None or (node.bmc_polled_at and node.bmc_polled_at > now - poll_interval()):
        return False
    node.bmc_polled_at = now  # asked now, or not askable now: either way, next interval
    node.save(update_fields=["bmc_polled_at"])
    if _bmc_command_open(node):
        return False
    try:
        provisioner_command(node, "bmc.status")
    except InvalidState:
        return False
    return True


def machines_due(limit: int = 500) -> tuple[list[str], list[str]]:
    """Deploys past their deadline, and enrolled machines whose BMC is due a poll."""
    now = database_now()
    enrolled = Node.objects.exclude(bmc_address="").exclude(provision_state=PS.RETIRED)
    late = enrolled.filter(provision_state=PS.DEPLOYING,
                           deployment__deadline__lt=now.isoformat())
    quiet = enrolled.filter(provision_command="").filter(
        Q(bmc_polled_at__isnull=True) | Q(bmc_polled_at__lt=now - poll_interval()))
    return (list(late.values_list("id", flat=True)[:limit]),
            list(quiet.values_list("id", flat=True)[:limit]))


def poll_interval() -> timedelta:
    return timedelta(seconds=settings.BC_BMC_POLL_SECONDS)


def _deadline(node: Node) -> datetime:
    return datetime.fromisoformat(node.deployment["deadline"])


def _bmc_command_open(node: Node) -> bool:
    """Whether a BMC command about this machine is queued or on its way (the state index
    keeps this to the few commands in flight)."""
    return NodeCommand.objects.filter(state__in=OPEN, kind__startswith="bmc.",
                                      payload__target=node.id).exists()


def _image(node: Node, name_or_id: str, *, field: str) -> Image:
    if not name_or_id:
        raise InvalidArgument(f"{field}: name an image of pool {node.pool_id} (or set the "
                              "pool's bmc.deployRamdisk)", field=field)
    found = Image.objects.filter(Q(pk=name_or_id) | Q(name=name_or_id), pool=node.pool).first()
    if found is None:
        raise NotFound(f"{field}: pool {node.pool_id} has no image {name_or_id}", field=field)
    return found


def _bound_token(node: Node, timeout: timedelta) -> tuple[JoinToken, str]:
    """A single-use join token, valid for the deploy, bound to this machine's identity."""
    token = JoinToken(pool=node.pool, max_uses=1, expires_at=database_now() + timeout,
                      expect_serial=node.serial, expect_product_uuid=node.product_uuid,
                      adopts=node)
    plaintext, token.secret_sha256 = secrets.mint(TOKEN_SCHEME, token.id)
    token.save(force_insert=True)
    return token, plaintext
