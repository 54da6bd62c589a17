"""Walk the registry: every mutating method, called once with valid input, writes exactly one
allowed audit row (for its own action) and only outbox events it declares.

A new mutating method fails `test_every_mutating_method_has_a_call_here` until it gets a
call below, and then fails the walk unless it writes its one audit row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from compute.core.api.registry import REGISTRY
from fleet.models import Node
from tests.factories import make_node, make_provisioner
from tests.support.writes import recorded

SHAPE = {"devices": [{"class": "gpu", "count": 1}], "duration": 3_600_000}
Call = Callable[[Any, dict[str, Any]], tuple[Any, dict[str, Any]]]


def failed_acceptance(world: dict[str, str]) -> str:
    node = make_node(world["pool"], adopted=False)
    Node.objects.filter(pk=node.pk).update(provision_state="acceptance-failed")
    return node.id


def metal(clients: Any, world: dict[str, str], state: str) -> str:
    """A machine enrolled by its BMC, left in `state`."""
    enrolled = clients.root("nodes.enroll", poolId=world["pool"],
                            bmc=f"redfish+https://10.9.1.1/redfish/v1/Systems/{state}",
                            credentials={"username": "admin", "password": "pw"})
    Node.objects.filter(pk=enrolled["id"]).update(provision_state=state,
                                                  product_uuid=f"uuid-{state}")
    return enrolled["id"]


def disk_image(clients: Any, world: dict[str, str], name: str) -> str:
    return clients.root("images.create", poolId=world["pool"], name=name, kernel=PART,
                        initrd=PART, disk=PART)["name"]


# name -> (the audit action it writes, (client, body) of one valid call); `world` holds
# the objects made beforehand.
PART = {"url": "https://images.example/part", "sha256": "1" * 64}
CALLS: dict[str, tuple[str, Call]] = {
    "sites.create": ("site.create", lambda c, w: (
        c.root, {"kind": "shared", "region": "eu-2"})),
    "pools.create": ("pool.create", lambda c, w: (
        c.root, {"siteId": w["site"], "class": "metal-host", "gpuModel": "H100"})),
    "pools.update": ("pool.policy.update", lambda c, w: (
        c.root, {"poolId": w["pool"], "policy": {"kubernetes": True}})),
    "pools.offer": ("pool.offer", lambda c, w: (
        c.root, {"poolId": w["pool"], "to": "acme", "quota": {"gpu": 4}})),
    "tenants.create": ("tenant.create", lambda c, w: (c.root, {"slug": "initech"})),
    "tokens.create": ("token.create", lambda c, w: (
        c.acme, {"name": "ci", "role": "viewer"})),
    "tokens.revoke": ("token.revoke", lambda c, w: (c.acme, {"tokenId": w["token"]})),
    "webhooks.create": ("webhook.create", lambda c, w: (
        c.acme, {"url": "https://1.1.1.1/hooks", "types": "reservation.*"})),
    "webhooks.replay": ("webhook.replay", lambda c, w: (
        c.root, {"webhookId": w["webhook"], "since": 0})),
    "webhooks.delete": ("webhook.delete", lambda c, w: (c.root, {"webhookId": w["webhook"]})),
    "joinTokens.create": ("join_token.create", lambda c, w: (
        c.root, {"poolId": w["pool"], "ttl": 3_600_000})),
    "joinTokens.revoke": ("join_token.revoke", lambda c, w: (
        c.root, {"joinTokenId": w["joinToken"]})),
    "nodes.cordon": ("node.cordon", lambda c, w: (
        c.root, {"nodeId": w["node"], "reason": "disk"})),
    "nodes.uncordon": ("node.uncordon", lambda c, w: (c.root, {"nodeId": w["cordoned"]})),
    "nodes.adopt": ("node.adopt", lambda c, w: (
        c.root, {"nodeId": failed_acceptance(w), "reason": "GPU 3 reseated"})),
    "nodes.retire": ("node.retire", lambda c, w: (
        c.root, {"nodeId": w["cordoned"], "reason": "joined twice"})),
    "reservations.create": ("reservation.create", lambda c, w: (
        c.acme, {"poolId": w["pool"], **SHAPE})),
    "reservations.release": ("reservation.release", lambda c, w: (
        c.acme, {"reservationId": w["rsv"]})),
    "reservations.extend": ("reservation.extend", lambda c, w: (
        c.acme, {"reservationId": w["rsv"], "by": 60_000})),
    "sandboxes.create": ("sandbox.create", lambda c, w: (
        c.root, {"poolId": w["cpuPool"], "vcpus": 2, "memoryGiB": 4})),
    "sandboxes.release": ("sandbox.release", lambda c, w: (
        c.root, {"sandboxId": w["sandbox"]})),
    "sandboxes.exec": ("sandbox.exec", lambda c, w: (
        c.root, {"sandboxId": sandbox_in(w, "running"), "argv": ["true"]})),
    "sandboxes.put": ("sandbox.put", lambda c, w: (
        c.root, {"sandboxId": sandbox_in(w, "running"), "path": "/run/x", "content": "aGk="})),
    "sandboxes.pause": ("sandbox.pause", lambda c, w: (
        c.root, {"sandboxId": sandbox_in(w, "running")})),
    "sandboxes.resume": ("sandbox.resume", lambda c, w: (
        c.root, {"sandboxId": sandbox_in(w, "paused")})),
    "audit.checkpoint": ("audit.checkpoint", lambda c, w: (c.root, {})),
    "images.create": ("image.create", lambda c, w: (
        c.root, {"poolId": w["cpuPool"], "name": "tiny", "kernel": PART, "initrd": PART})),
    "images.delete": ("image.delete", lambda c, w: (c.root, {"imageId": w["unusedImage"]})),
    "maintenance.create": ("node.maintenance", lambda c, w: (
        c.root, {"nodeId": w["node"], "duration": 3_600_000, "startIn": 86_400_000,
                 "reason": "firmware"})),
    "maintenance.cancel": ("node.maintenance.cancel", lambda c, w: (
        c.root, {"windowId": w["window"]})),
    "series.create": ("series.create", lambda c, w: (
        c.root, {"poolId": w["pool"], "devices": [{"class": "gpu", "count": 1}],
                 "every": "weekdays 09:00-10:00", "from": "2027-01-04",
                 "until": "2027-01-08", "horizonDays": 366})),
    "series.release": ("series.release", lambda c, w: (c.root, {"seriesId": w["series"]})),
    "nodes.enroll": ("node.enroll", lambda c, w: (
        c.root, {"poolId": w["pool"], "bmc": "redfish+https://10.9.0.1/redfish/v1/Systems/1",
                 "credentials": {"username": "admin", "password": "pw"}})),
    "nodes.verify": ("node.verify", lambda c, w: (
        c.root, {"nodeId": metal(c, w, "verify-failed")})),
    "nodes.inspect": ("node.inspect", lambda c, w: (
        c.root, {"nodeId": metal(c, w, "manageable")})),
    "nodes.power": ("node.power", lambda c, w: (
        c.root, {"nodeId": metal(c, w, "available"), "state": "on"})),
    "nodes.deploy": ("node.deploy", lambda c, w: (
        c.root, {"nodeId": metal(c, w, "available"), "image": disk_image(c, w, "os"),
                 "ramdisk": disk_image(c, w, "deploy")})),
    "nodes.undeploy": ("node.undeploy", lambda c, w: (
        c.root, {"nodeId": metal(c, w, "adopted"), "reason": "retire the OS"})),
    "nodes.abort": ("node.abort", lambda c, w: (
        c.root, {"nodeId": metal(c, w, "inspect-failed"), "reason": "replaced the BMC"})),
}


def sandbox_in(world: dict[str, str], state: str) -> str:
    """The world's sandbox as its node's signed report (and, paused, the pause asked
    before it) would have made it."""
    from reservations.models import Sandbox

    Sandbox.objects.filter(pk=world["sandbox"]).update(
        state=state, desired="paused" if state == "paused" else "running")
    return world["sandbox"]


# What the node answers to the commands these calls queue (the real answer needs a guest:
# tests/e2e/test_sandboxes.py); this test is about the call's own audit row and events.
NODE_ANSWERS = {"sandboxes.exec": {"pid": 7, "exitCode": 0, "stdout": "", "stderr": ""},
                "sandboxes.put": {"bytes": 2}}


class Clients:
    def __init__(self, root, acme) -> None:
        self.root, self.acme = root, acme


@pytest.fixture
def world(root, acme, pool, cpu_pool) -> dict[str, str]:
    make_node(pool["id"])
    make_provisioner(pool["id"])
    make_node(cpu_pool["id"], gpus=0, domains=())
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    cordoned = make_node(pool["id"])
    root("nodes.cordon", nodeId=cordoned.id)
    return {
        "site": pool["siteId"], "pool": pool["id"], "cpuPool": cpu_pool["id"],
        "node": make_node(pool["id"]).id, "cordoned": cordoned.id,
        "token": acme("tokens.create", name="svc", role="viewer")["id"],
        "webhook": root("webhooks.create", url="https://1.1.1.1/hooks")["id"],
        "joinToken": root("joinTokens.create", poolId=pool["id"], ttl=3_600_000)["id"],
        "rsv": acme("reservations.create", poolId=pool["id"], **SHAPE)["id"],
        "sandbox": root("sandboxes.create", poolId=cpu_pool["id"], vcpus=2,
                        memoryGiB=4)["id"],
        "unusedImage": root("images.create", poolId=pool["id"], name="unused", kernel=PART,
                            initrd=PART)["id"],
        "window": root("maintenance.create", nodeId=make_node(pool["id"]).id,
                       duration=3_600_000, startIn=172_800_000, reason="PSU")["window"]["id"],
        "series": root("series.create", poolId=pool["id"], devices=[{"class": "gpu",
                                                                      "count": 1}],
                       every="daily 09:00-10:00", until="2027-01-02", horizonDays=366,
                       **{"from": "2027-01-01"})["id"],
    }


MUTATING = sorted(f"{g}.{m}" for (g, m), e in REGISTRY.items() if e.mutating)


def test_every_mutating_method_has_a_call_here():
    assert sorted(CALLS) == MUTATING


@pytest.mark.parametrize("name", MUTATING)
def test_a_mutating_call_writes_one_audit_row_and_only_declared_events(name, world, root,
                                                                       acme, monkeypatch):
    endpoint = REGISTRY[tuple(name.split(".", 1))]
    if name in NODE_ANSWERS:
        from reservations.api import sandboxes

        monkeypatch.setattr(sandboxes, "command_wait",
                            lambda command, **_: NODE_ANSWERS[name])
    action, call = CALLS[name]
    client, body = call(Clients(root, acme), world)
    with recorded() as written:
        answer = client.call(name, body)
    assert answer.ok, answer.body
    assert written.audit == [action]
    assert set(written.events) <= set(endpoint.emits), (written.events, endpoint.emits)
    assert written.events or not endpoint.emits, f"{name} wrote none of its events"
