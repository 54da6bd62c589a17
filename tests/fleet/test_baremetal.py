"""Bare metal on the control plane's side: enrolment, sealed credentials, the provision
state machine driven by the provisioner's answers, and a BMC that stops answering (I5)."""

from __future__ import annotations

import json

import pytest
from django.db import transaction

from audit.models import AuditEvent
from audit.sealing import SealedSecret, seal, unseal
from bcd.contract.bmc import CREDENTIALS_USE
from bcd.contract.crypto import jwe_open
from compute.platform.events.models import Event
from fleet.models import Node, NodeCommand
from fleet.services.baremetal import bmc_secret_name
from fleet.services.lifecycle import command_outcome_unknown, command_result_locked
from reservations.models import Reservation
from tests.factories import make_node, make_provisioner
from tests.support.work import run_due_work

pytestmark = pytest.mark.django_db

PASSWORD = "pw-7c1e9b-never-shown"
BMC = "redfish+https://10.20.0.5/redfish/v1/Systems/1"


def enroll(root, pool, bmc=BMC, **extra):
    return root.call("nodes.enroll", poolId=pool["id"], bmc=bmc,
                     credentials={"username": "admin", "password": PASSWORD}, **extra)


def last_command(provisioner: Node) -> NodeCommand:
    return NodeCommand.objects.filter(node=provisioner).order_by("-created_at", "-id").first()


def answer(command: NodeCommand, status: str, output: dict) -> dict | None:
    """The provisioner's result for `command`, recorded as the gateway records it."""
    with transaction.atomic():
        provisioner = Node.objects.select_for_update().get(pk=command.node_id)
        return command_result_locked(provisioner, command_id=command.id, status=status,
                                     output=output)


def node(node_id: str) -> Node:
    return Node.objects.get(pk=node_id)


def test_enrolment_seals_the_credentials_and_only_the_provisioner_can_open_them(root, pool):
    provisioner, key = make_provisioner(pool["id"])
    answered = enroll(root, pool)
    assert answered.ok, answered.body
    enrolled = answered.body["result"]
    assert enrolled["provisionState"] == "verifying"
    assert enrolled["bmc"] == {**enrolled["bmc"], "address": BMC, "tls": "system",
                               "reachable": None, "powerState": None, "deployment": None}
    sealed = SealedSecret.objects.get(pk=bmc_secret_name(enrolled["id"]))
    assert PASSWORD.encode() not in bytes(sealed.ciphertext)
    assert json.loads(unseal(sealed))["password"] == PASSWORD
    command = last_command(provisioner)
    assert command.kind == "bmc.verify"
    assert command.payload["target"] == enrolled["id"]
    assert PASSWORD not in json.dumps(command.payload)
    assert PASSWORD not in command.signed
    header, plaintext = jwe_open(command.payload["credentials"], key)
    assert header == {**header, "use": CREDENTIALS_USE, "node": enrolled["id"]}
    assert json.loads(plaintext)["password"] == PASSWORD
    shown = [root.call("nodes.get", nodeId=enrolled["id"]).body,
             root.call("nodes.list").body, root.call("events.list").body]
    assert all(PASSWORD not in json.dumps(body) for body in shown)
    assert not [row for row in AuditEvent.objects.all() if PASSWORD in json.dumps(row.data)]
    assert not [e for e in Event.objects.all() if PASSWORD in json.dumps(e.payload)]


@pytest.mark.parametrize(("bmc", "extra", "says"), [
    ("redfish+http://10.20.0.5/redfish/v1/Systems/1", {}, "redfish+http sends the BMC"),
    ("https://10.20.0.5/redfish/v1/Systems/1", {}, "scheme must be redfish+https"),
    ("redfish+https://10.20.0.5/redfish/v1/Managers/1", {}, "path must be /redfish/v1/Systems"),
    ("redfish+https://admin:pw@10.20.0.5/redfish/v1/Systems/1", {}, "credentials do not "),
    (BMC, {"insecure": True, "verifyCa": "-----BEGIN CERTIFICATE-----"}, "exclude each other"),
])
def test_a_bad_bmc_address_is_refused_naming_what_is_wrong(root, pool, bmc, extra, says):
    make_provisioner(pool["id"])
    answered = enroll(root, pool, bmc=bmc, **extra)
    assert answered.status == 400, answered.body
    assert says in answered.body["error"]["message"]
    assert not Node.objects.exclude(bmc_address="").exists()


def test_plain_http_is_taken_on_loopback_or_where_the_pool_allows_it(root, pool):
    make_provisioner(pool["id"])
    assert enroll(root, pool, bmc="redfish+http://127.0.0.1:8000/redfish/v1/Systems/a").ok
    assert enroll(root, pool, bmc="redfish+http://10.20.0.9/redfish/v1/Systems/b").status == 400
    lab = root("pools.create", siteId=pool["siteId"], gpuModel="H100",
               policy={"bmc": {"allowHttp": True}}, **{"class": "metal-host"})
    assert enroll(root, lab, bmc="redfish+http://10.20.0.9/redfish/v1/Systems/b").ok


def test_the_same_bmc_is_enrolled_once(root, pool):
    make_provisioner(pool["id"])
    first = enroll(root, pool).body["result"]
    again = enroll(root, pool)
    assert again.status == 409
    assert first["id"] in again.body["error"]["message"]


def test_without_a_provisioner_the_machine_waits_enrolled_and_says_why(root, pool):
    enrolled = enroll(root, pool).body["result"]
    assert enrolled["provisionState"] == "enrolled"
    assert "has no provisioner" in enrolled["provisionError"]
    make_provisioner(pool["id"])
    assert root("nodes.verify", nodeId=enrolled["id"])["provisionState"] == "verifying"


def test_answers_walk_enrolled_verified_inspected_available(root, pool):
    provisioner, _ = make_provisioner(pool["id"])
    machine = enroll(root, pool).body["result"]["id"]
    assert answer(last_command(provisioner), "succeeded",
                  {"powerState": "Off"})["provision"] == "manageable"
    inspect = last_command(provisioner)
    assert inspect.kind == "bmc.inspect"
    assert node(machine).provision_state == "inspecting"
    answer(inspect, "succeeded", {
        "powerState": "Off", "serial": "SN-42", "productUuid": "8cf9a7a3-2c1b-4c5e",
        "macs": ["52:54:00:aa:bb:01"], "cpus": 64, "memoryGib": 512, "name": "metal-1"})
    inspected = node(machine)
    assert (inspected.provision_state, inspected.serial, inspected.product_uuid,
            inspected.macs, inspected.vcpus, inspected.memory_gib, inspected.hostname,
            inspected.power_state, inspected.bmc_reachable) == (
        "available", "SN-42", "8cf9a7a3-2c1b-4c5e", ["52:54:00:aa:bb:01"], 64, 512,
        "metal-1", "Off", True)
    assert not inspected.schedulable  # available is not adopted: nothing books it yet
    types = [e.type for e in Event.objects.filter(subject=machine).order_by("seq")]
    assert types == ["node.enrolled", "node.provision_state", "node.bmc.reachable",
                     "node.provision_state", "node.provision_state", "node.provision_state"]


def test_a_refusal_fails_verification_and_abort_makes_a_late_answer_stale(root, pool):
    provisioner, _ = make_provisioner(pool["id"])
    machine = enroll(root, pool).body["result"]["id"]
    first = last_command(provisioner)
    answer(first, "failed", {"error": "the BMC refused the credentials: 401",
                             "httpStatus": 401})
    failed = node(machine)
    assert failed.provision_state == "verify-failed"
    assert "401" in failed.provision_error
    assert failed.bmc_reachable is True  # it answered: a refusal is an answer
    assert root.call("nodes.inspect", nodeId=machine).status == 409
    retry = root("nodes.verify", nodeId=machine)
    assert retry["provisionState"] == "verifying"
    aborted = root("nodes.abort", nodeId=machine, reason="wrong password file")
    assert (aborted["provisionState"], aborted["provisionError"]) == (
        "enrolled", "aborted: wrong password file")
    assert answer(last_command(provisioner), "succeeded", {})["provision"] == "stale"
    assert node(machine).provision_state == "enrolled"


def test_an_unknown_outcome_after_journal_loss_fails_the_step(root, pool):
    provisioner, _ = make_provisioner(pool["id"])
    machine = enroll(root, pool).body["result"]["id"]
    answer(last_command(provisioner), "unknown", {"error": ""})
    assert node(machine).provision_state == "verify-failed"
    assert "outcome is unknown" in node(machine).provision_error


def test_a_bmc_that_stops_answering_marks_the_node_and_releases_nothing(root, acme, pool):
    """I5: an adopted machine with a live reservation loses its BMC; the reservation, its
    bookings and the node's state stay; only the BmcReachable condition turns false."""
    provisioner, _ = make_provisioner(pool["id"])
    machine = make_node(pool["id"])
    Node.objects.filter(pk=machine.pk).update(bmc_address=BMC, bmc_reachable=True)
    seal(bmc_secret_name(machine.id), json.dumps({"username": "a", "password": PASSWORD}).encode())
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    rsv = acme("reservations.create", poolId=pool["id"],
               devices=[{"class": "gpu", "count": 8}], duration=3_600_000)
    root("nodes.power", nodeId=machine.id, state="off", reason="firmware")
    answer(last_command(provisioner), "failed",
           {"error": "the BMC did not answer: connection refused", "unreachable": True})
    after = node(machine.id)
    assert (after.provision_state, after.bmc_reachable, after.connectivity,
            after.cordoned) == ("adopted", False, machine.connectivity, False)
    shown = root("nodes.get", nodeId=machine.id)
    assert {"type": "BmcReachable", "status": False, "reason": "bmc-unreachable"} in \
        shown["conditions"]
    assert Reservation.objects.get(pk=rsv["id"]).state == rsv["state"]
    assert Event.objects.filter(subject=machine.id, type="node.bmc.unreachable").count() == 1
    assert not Event.objects.filter(subject=rsv["id"], type__in=[
        "reservation.released", "reservation.cancelled", "reservation.replaced"]).exists()


def test_power_and_provision_steps_refuse_machines_without_a_bmc(root, pool):
    joined = make_node(pool["id"])
    refused = root.call("nodes.power", nodeId=joined.id, state="on")
    assert refused.status == 409
    assert "has no BMC" in refused.body["error"]["message"]


def test_a_provisioner_that_lost_its_journal_ends_the_step_unknown(root, pool):
    """The provisioner comes back with a new journal: the command it had is marked unknown
    (never sent again) and the machine's step fails saying so."""
    from tests.factories import open_session

    provisioner, _ = make_provisioner(pool["id"])
    machine = enroll(root, pool).body["result"]["id"]
    open_session(provisioner.id, 1)
    NodeCommand.objects.filter(node=provisioner).update(state="sent")  # delivered, no answer
    open_session(provisioner.id, 2)
    assert last_command(provisioner).state == "unknown"
    assert node(machine).provision_state == "verifying"  # the gateway may not settle it
    run_due_work()
    assert node(machine).provision_state == "verify-failed"
    assert "lost its journal" in node(machine).provision_error
    command_outcome_unknown(command_id=last_command(provisioner).id)  # settled once
    assert Event.objects.filter(subject=machine, type="node.provision_state").count() == 2
