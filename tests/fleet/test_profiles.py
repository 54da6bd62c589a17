"""Node profiles and Slurm publication as the control plane keeps them: the pool's policy
names the units, every adopted node's next spec carries them, the node's report of their
state is shown, and only a unit the policy requires stands in the way of acceptance."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from bcd.contract.crypto import public_pem
from bcd.contract.holds import BadHold, Hold
from compute.core.errors import InvalidArgument
from fleet.models import Node, NodeCommand
from fleet.services.sessions import command_result_record, inventory_report_record
from tests.conftest import POLICY
from tests.factories import inventory, make_bare_node, make_node, open_session, report_inventory
from tests.fleet.test_sessions import signed_result
from tests.support.work import run_due_work
from tests.support.writes import assert_wrote

SLURM = {"slurm": {"cluster": "gpu-eu", "partition": "gpu"}, "profile": {"units": ["slurmd"]}}
READY = {"state": "ready", "reason": "no Slurm hold on this node", "generation": 3,
         "at": "2026-12-06T00:00:00+00:00"}


def test_a_new_policy_gives_every_adopted_node_a_spec_with_its_units(root, pool):
    adopted = make_node(pool["id"])
    joining = make_bare_node(pool["id"])
    before = adopted.specs.order_by("-generation").first()
    with assert_wrote(audit="pool.policy.update", events=["pool.policy.updated"]):
        updated = root("pools.update", poolId=pool["id"], policy={**POLICY, **SLURM})
    assert updated["policy"]["slurm"] == SLURM["slurm"]
    latest = adopted.specs.order_by("-generation").first()
    assert latest.generation == before.generation + 1
    assert latest.spec["profile"] == {"units": ["slurmd"]}
    assert latest.spec["allocations"] == before.spec["allocations"]
    assert not joining.specs.exists()  # it gets generation 1, with the units, when adopted
    root("pools.update", poolId=pool["id"], policy=POLICY)
    assert "profile" not in adopted.specs.order_by("-generation").first().spec


@pytest.mark.parametrize(("policy", "units"), [
    ({"slurm": {"cluster": "gpu-eu"}}, ["slurmd"]),
    ({"profile": {"units": ["slurmd"], "required": ["container-toolkit"]}},
     ["slurmd", "container-toolkit"]),
    ({"profile": {"units": ["slurmd", "slurmd"]}, "slurm": {"cluster": "c"}}, ["slurmd"]),
])
def test_the_units_a_policy_implies_are_kept_once_each(root, pool, policy, units):
    node = make_node(pool["id"])
    root("pools.update", poolId=pool["id"], policy={**POLICY, **policy})
    assert node.specs.order_by("-generation").first().spec["profile"] == {"units": units}


@pytest.mark.parametrize(("policy", "field", "words"), [
    ({"profile": {"units": ["dcgm"]}}, "policy.profile.units", "dcgm"),
    ({"slurm": {"cluster": "gpu eu; rm -rf /"}, "profile": {"units": ["slurmd"]}},
     "policy.slurm.cluster", ""),
])
def test_a_policy_that_cannot_work_is_refused_naming_the_field(root, pool, policy, field, words):
    with assert_wrote(audit=None):
        answer = root.call("pools.update", poolId=pool["id"], policy={**POLICY, **policy})
    assert (answer.status, answer.code) == (400, "invalid_argument")
    assert answer.body["error"]["details"]["field"].startswith(field), answer.body
    assert words in answer.message


def test_slurm_is_asked_only_of_a_pool_that_publishes_to_slurm(root, pool):
    make_node(pool["id"])
    shape = {"poolId": pool["id"], "devices": [{"class": "gpu", "count": 1}],
             "duration": 3_600_000, "idempotencyKey": "slurm-1", "slurm": "team-a"}
    answer = root.call("reservations.create", **shape)
    assert (answer.code, answer.body["error"]["details"]["field"]) == ("invalid_argument",
                                                                      "slurm")
    assert "publishes no holds to Slurm" in answer.message
    spaced = root.call("reservations.create", **{**shape, "slurm": "team a"})
    assert spaced.body["error"]["details"]["field"] == "slurm"
    root("pools.update", poolId=pool["id"], policy={**POLICY, **SLURM})
    rsv = root("reservations.create", **shape)
    assert rsv["slurm"] == "team-a"
    run_due_work()  # binding: the hold goes into the node's spec
    node = Node.objects.get(pk=rsv["nodeId"])
    held = Hold.from_wire(node.specs.order_by("-generation").first().spec["allocations"][0])
    assert held.slurm is not None
    assert (held.slurm.account, held.slurm.partition) == ("team-a", "gpu")
    assert held.slurm.until[:19] == rsv["end"][:19]  # the window's end
    root("reservations.extend", reservationId=rsv["id"], by=3_600_000)
    extended = Hold.from_wire(node.specs.order_by("-generation").first().spec["allocations"][0])
    assert extended.slurm.until > held.slurm.until  # the node learns the new end


@pytest.mark.parametrize("slurm", [{"account": "a b"}, {"account": "a", "until": "soon"},
                                   {"account": "a", "partition": "$(x)", "until": ""}, "a"])
def test_a_hold_with_a_malformed_slurm_part_is_refused(slurm):
    entry = {"allocationId": "alloc_01jfq0000000000000000000aa",
             "reservationId": "rsv_01jfq0000000000000000000aa",
             "gpus": ["GPU-1"], "slurm": slurm}
    with pytest.raises(BadHold, match="slurm"):
        Hold.from_wire(entry)


def test_the_nodes_report_of_its_units_is_shown(root, pool):
    node = make_node(pool["id"])
    report_inventory(node, inventory(profile={"generation": 3, "units": {"slurmd": READY}}))
    shown = root("nodes.get", nodeId=node.id)["profile"]
    assert shown == {"generation": 3, "units": {"slurmd": READY}}
    with pytest.raises(InvalidArgument, match="state must be one of"):
        report_inventory(node, inventory(profile={"units": {"slurmd": {"state": "fine"}}}))
    with pytest.raises(InvalidArgument, match="is not a unit"):
        report_inventory(node, inventory(profile={"units": {"sshd": READY}}))


def joining(pool_id: str) -> tuple[ec.EllipticCurvePrivateKey, Node, int]:
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_bare_node(pool_id)
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    epoch = open_session(node.id)
    inventory_report_record(node_id=node.id, epoch=epoch, report_id="inv-1",
                            body=json.dumps(inventory()))
    return key, node, epoch


def test_a_required_unit_is_an_acceptance_check_and_its_failure_fails_acceptance(root, pool):
    root("pools.update", poolId=pool["id"], policy={
        **POLICY, "profile": {"units": ["container-toolkit"], "required": ["container-toolkit"]}})
    key, node, epoch = joining(pool["id"])
    check = NodeCommand.objects.get(node=node, kind="profile.check")
    assert check.payload["params"] == {"units": ["container-toolkit"]}
    for command in NodeCommand.objects.filter(node=node).exclude(pk=check.pk):
        command_result_record(node_id=node.id, epoch=epoch, report_id=f"r-{command.id}",
                              **signed_result(key, command.id))
    reason = "profile: container-toolkit unavailable: nvidia-ctk not found"
    command_result_record(node_id=node.id, epoch=epoch, report_id="r-profile",
                          **signed_result(key, check.id, "failed", {"error": reason}))
    node.refresh_from_db()
    assert node.provision_state == "acceptance-failed"
    assert node.acceptance["failure"] == f"profile.check: {reason}"


def test_a_unit_not_required_does_not_stand_in_the_way_of_bookings(root, pool):
    root("pools.update", poolId=pool["id"], policy={
        **POLICY, "profile": {"units": ["container-toolkit"]}})
    key, node, epoch = joining(pool["id"])
    assert not NodeCommand.objects.filter(node=node, kind="profile.check").exists()
    for command in NodeCommand.objects.filter(node=node):
        command_result_record(node_id=node.id, epoch=epoch, report_id=f"r-{command.id}",
                              **signed_result(key, command.id))
    failed = {**READY, "state": "failed", "reason": "nvidia-ctk cdi generate failed (1)"}
    report_inventory(node, inventory(profile={"units": {"container-toolkit": failed}}))
    node.refresh_from_db()
    assert node.schedulable
    rsv = root("reservations.create", poolId=pool["id"], idempotencyKey="ok",
               devices=[{"class": "gpu", "count": 8}], duration=3_600_000)
    assert rsv["nodeId"] == node.id
