"""Deploying an OS to an enrolled machine, on the control plane's side: the deploy command
and its sealed join token, the OS's agent joining as the same node through the real join
relay (bound to the machine's identity), acceptance to adopted, the deploy deadline, the
BMC poll and undeploy."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction

from audit.models import AuditEvent
from bcd.contract.crypto import jwe_open
from bcd.join.documents import prepare
from compute.platform.events.models import Event
from fleet.models import JoinToken, Node, NodeCommand
from fleet.services.deploy import bmc_poll, deploy_time_out, machines_due
from tests.factories import IMAGE_PART, inventory, make_provisioner, report_inventory
from tests.fleet.test_baremetal import BMC, answer, enroll, last_command, node

pytestmark = pytest.mark.django_db

UUID = "8CF9A7A3-2C1B-4C5E-9D3A-0123456789AB"
OS_DISK = {"url": "http://images.example/os.raw", "sha256": "1" * 64}
RAMDISK_ISO = {"url": "http://images.example/deploy.iso", "sha256": "2" * 64}


@pytest.fixture
def images(root, pool):
    root("images.create", poolId=pool["id"], name="ubuntu-24.04", kernel=IMAGE_PART,
         initrd=IMAGE_PART, disk=OS_DISK)
    root("images.create", poolId=pool["id"], name="deploy", kernel=IMAGE_PART,
         initrd=IMAGE_PART, disk=RAMDISK_ISO)


@pytest.fixture
def available(root, pool):
    """An enrolled machine, verified and inspected: (its id, the provisioner and its key)."""
    provisioner, key = make_provisioner(pool["id"])
    machine = enroll(root, pool).body["result"]["id"]
    answer(last_command(provisioner), "succeeded", {"powerState": "Off"})
    answer(last_command(provisioner), "succeeded", {
        "powerState": "Off", "serial": "", "productUuid": UUID.lower(), "cpus": 96,
        "memoryGib": 1024, "macs": ["52:54:00:aa:bb:01"], "name": "metal-1"})
    assert node(machine).provision_state == "available"
    return machine, provisioner, key


def deploy(root, machine, **extra):
    return root.call("nodes.deploy", nodeId=machine, image="ubuntu-24.04", ramdisk="deploy",
                     **extra)


def join_as(client, token, hardware):
    wellknown = client.get("/.well-known/better-compute").json()
    request = prepare(token, wellknown, hardware["hostname"])
    import base64
    response = client.post("/api/agent/join", content_type="application/json", data=json.dumps({
        "sealedToken": request.sealed_token, "csr": base64.b64encode(request.csr_der).decode(),
        "hardware": hardware}))
    return response.status_code, response.json()


def test_a_deploy_sends_the_provisioner_the_media_and_a_token_bound_to_the_machine(
        root, images, available):
    machine, provisioner, key = available
    answered = deploy(root, machine, timeout=600_000)
    assert answered.ok, answered.body
    shown = answered.body["result"]
    assert shown["provisionState"] == "deploying"
    assert shown["bmc"]["deployment"]["image"] == "ubuntu-24.04"
    command = last_command(provisioner)
    assert command.kind == "bmc.deploy"
    assert (command.payload["boot"], command.payload["media"], command.payload["image"]) == (
        "cd", RAMDISK_ISO, OS_DISK)
    header, token = jwe_open(command.payload["joinToken"], key)
    assert header == {**header, "use": "joinToken", "node": machine}
    assert token.decode() not in json.dumps(command.payload) + command.signed
    bound = JoinToken.objects.get(adopts_id=machine)
    assert (bound.max_uses, bound.expect_product_uuid) == (1, UUID.lower())
    assert token.decode().startswith(f"bcjt_{bound.id}.")
    assert answer(command, "succeeded", {"powerState": "On", "bootTarget": "Cd",
                                         "mediaInserted": True})["provision"] == \
        "booting the deploy ramdisk"
    assert node(machine).provision_state == "deploying"  # until its OS joins


def test_the_deployed_os_joins_as_the_same_node_and_is_adopted_after_acceptance(
        client, root, images, available):
    machine, provisioner, key = available
    deploy(root, machine)
    token = jwe_open(last_command(provisioner).payload["joinToken"], key)[1].decode()
    stranger = {"hostname": "other", "serial": "", "productUuid": "0" * 32, "macs": []}
    assert join_as(client, token, stranger)[0] == 403  # bound to this machine's UUID
    # The sim and DMI spell UUIDs their own way: dashes and case do not matter.
    hardware = {"hostname": "metal-1", "serial": "SIM-1", "macs": [],
                "productUuid": UUID.replace("-", "").lower()}
    status, body = join_as(client, token, hardware)
    assert status == 200, body
    assert node(machine).provision_state == "deployed"
    assert Node.objects.filter(pool_id=node(machine).pool_id).count() == 2  # no new node
    assert join_as(client, token, hardware)[0] == 403  # single use
    deployed = node(machine)
    report_inventory(deployed, inventory(hostname="metal-1", serial="SIM-1",
                                         productUuid=hardware["productUuid"]))
    check = NodeCommand.objects.get(node_id=machine, kind="diag.nvml")
    with transaction.atomic():
        from fleet.services.lifecycle import command_result_locked
        command_result_locked(Node.objects.select_for_update().get(pk=machine),
                              command_id=check.id, status="succeeded",
                              output={"healthyGpus": 8})
    adopted = node(machine)
    assert adopted.provision_state == "adopted"
    assert adopted.schedulable
    states = [e.payload["to"] for e in Event.objects.filter(
        subject=machine, type="node.provision_state").order_by("seq")]
    assert states[-2:] == ["deploying", "deployed"]
    assert Event.objects.filter(subject=machine, type="node.adopted").exists()


def test_a_deploy_is_refused_with_what_is_wrong(root, pool, images, available):
    machine, _, _ = available
    assert deploy(root, machine, timeout=1000).status == 400
    missing = root.call("nodes.deploy", nodeId=machine, image="nope", ramdisk="deploy")
    assert (missing.status, "no image nope" in missing.body["error"]["message"]) == (404, True)
    no_disk = root.call("nodes.deploy", nodeId=machine, image="default", ramdisk="deploy")
    assert no_disk.status == 400
    assert "has no disk to write" in no_disk.body["error"]["message"]
    no_ramdisk = root.call("nodes.deploy", nodeId=machine, image="ubuntu-24.04")
    assert "bmc.deployRamdisk" in no_ramdisk.body["error"]["message"]
    assert deploy(root, machine).ok
    commands = NodeCommand.objects.count()
    again = deploy(root, machine)  # a repeat answers the node as it is, and sends nothing
    assert (again.status, again.body["result"]["provisionState"]) == (200, "deploying")
    assert NodeCommand.objects.count() == commands
    other = root.call("nodes.deploy", nodeId=machine, image="deploy", ramdisk="deploy")
    assert other.status == 409
    assert "only when available or deploy-failed" in other.body["error"]["message"]


def test_a_deploy_past_its_deadline_fails_revokes_its_token_and_powers_off(
        root, images, available):
    machine, provisioner, _ = available
    deploy(root, machine, timeout=60_000)
    answer(last_command(provisioner), "succeeded", {"powerState": "On"})
    assert deploy_time_out(node_id=machine) is None  # not due yet
    Node.objects.filter(pk=machine).update(deployment={
        **node(machine).deployment, "deadline": "2000-01-01T00:00:00+00:00"})
    assert machine in machines_due()[0]
    failed = deploy_time_out(node_id=machine)
    assert failed.provision_state == "deploy-failed"
    assert "did not join by" in failed.provision_error
    off = last_command(provisioner)
    assert (off.kind, off.payload["state"]) == ("bmc.power", "off")
    assert JoinToken.objects.get(adopts_id=machine).revoked_at is not None
    assert AuditEvent.objects.filter(action="node.deploy.timeout", target=machine).count() == 1
    assert root("nodes.abort", nodeId=machine, reason="bad image")["provisionState"] == \
        "available"


def test_the_bmc_is_polled_and_only_a_change_is_audited(root, images, available, settings):
    machine, provisioner, _ = available
    settings.BC_BMC_POLL_SECONDS = 60
    assert not bmc_poll(node_id=machine)  # the inspection just asked it
    Node.objects.filter(pk=machine).update(bmc_polled_at=node(machine).bmc_polled_at
                                           - timedelta(minutes=5))
    assert machine in machines_due()[1]
    assert bmc_poll(node_id=machine)
    poll = last_command(provisioner)
    assert poll.kind == "bmc.status"
    assert not bmc_poll(node_id=machine)  # one at a time
    # The gateway's filer audits a result only when it changes something (not None).
    assert answer(poll, "succeeded", {"powerState": "Off"}) is None
    Node.objects.filter(pk=machine).update(bmc_polled_at=None)
    assert bmc_poll(node_id=machine)
    gone = answer(last_command(provisioner), "failed", {"error": "did not answer",
                                                        "unreachable": True})
    assert gone["provision"] == "changed"
    assert node(machine).bmc_reachable is False
    assert node(machine).provision_state == "available"


def test_undeploy_is_refused_while_the_node_holds_work_then_takes_the_machine_back(
        root, images, available):
    machine, provisioner, _ = available
    commands = NodeCommand.objects.count()
    assert root("nodes.undeploy", nodeId=machine, reason="x")["provisionState"] == "available"
    assert NodeCommand.objects.count() == commands  # nothing deployed: nothing to do
    Node.objects.filter(pk=machine).update(provision_state="verify-failed")
    assert root.call("nodes.undeploy", nodeId=machine, reason="x").status == 409
    Node.objects.filter(pk=machine).update(provision_state="adopted", vcpus_allocated=4,
                                           key_pin="pin", public_key="pem")
    busy = root.call("nodes.undeploy", nodeId=machine, reason="retire the OS")
    assert busy.status == 409
    assert "still holds host capacity" in busy.body["error"]["message"]
    Node.objects.filter(pk=machine).update(vcpus_allocated=0, provision_state="adopted")
    taken = root("nodes.undeploy", nodeId=machine, reason="retire the OS")
    assert taken["provisionState"] == "undeploying"
    assert (node(machine).key_pin, node(machine).public_key) == ("", "")
    assert last_command(provisioner).kind == "bmc.undeploy"
    assert root("nodes.undeploy", nodeId=machine, reason="again")["provisionState"] == \
        "undeploying"  # a repeat
    answer(last_command(provisioner), "succeeded", {"powerState": "Off"})
    assert node(machine).provision_state == "available"


def test_power_without_a_provisioner_is_a_conflict(root, pool):
    machine = enroll(root, pool).body["result"]["id"]
    refused = root.call("nodes.power", nodeId=machine, state="on")
    assert refused.status == 409
    assert "has no provisioner" in refused.body["error"]["message"]
    assert root.call("nodes.verify", nodeId=machine).status == 409


def test_the_database_refuses_a_second_live_enrolment_of_one_bmc(root, pool):
    """The partial unique index referees what the service's check might race past."""
    first = enroll(root, pool).body["result"]
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.create(pool_id=first["poolId"], site_id=first["siteId"],
                            bmc_address=BMC, provision_state="enrolled")
    Node.objects.filter(pk=first["id"]).update(provision_state="retired")
    Node.objects.create(pool_id=first["poolId"], site_id=first["siteId"], bmc_address=BMC,
                        provision_state="enrolled")
