"""Walk the registry: every method refuses other tenants' objects and lists none of them."""

from __future__ import annotations

from typing import Any

import pytest

from audit.models import AuditEvent
from compute.core.api.inputs import PublicIdField
from compute.core.api.registry import REGISTRY
from tests.factories import IMAGE_PART, make_node, with_default_image

# Extra fields a method needs besides `id` to get past validation.
SHAPE = {"devices": [{"class": "gpu", "count": 1}], "duration": 3_600_000}
EXTRA: dict[str, dict[str, Any]] = {
    "pools.offer": {"to": "globex", "quota": {"gpu": 1}},
    "pools.update": {"policy": {"kubernetes": True}},
    "pools.create": {"class": "metal-host", "gpuModel": "H100"},
    "reservations.create": SHAPE,
    "capacity.preview": SHAPE,
    "capacity.earliest": SHAPE,
    "series.create": {"devices": [{"class": "gpu", "count": 1}], "every": "daily 09:00-10:00",
                      "until": "2027-01-02"},
    "reservations.extend": {"by": 60_000},
    "sandboxes.create": {"vcpus": 1, "memoryGiB": 1},
    "joinTokens.create": {"ttl": 3_600_000},
    "nodes.adopt": {"reason": "reseated"},
    "nodes.retire": {"reason": "intruder"},
    "images.create": {"name": "intruder", "kernel": IMAGE_PART, "initrd": IMAGE_PART},
    "sandboxes.logs": {"lines": 5},
    "sandboxes.exec": {"argv": ["true"]},
    "sandboxes.put": {"path": "/run/x", "content": "aGk="},
    "sandboxes.fetch": {"path": "/run/x"},
    "sandboxes.output": {"pid": 7},
    "maintenance.create": {"duration": 3_600_000, "reason": "intruder"},
    "nodes.enroll": {"bmc": "redfish+https://10.9.0.1/redfish/v1/Systems/1",
                     "credentials": {"username": "admin", "password": "pw"}},
    "nodes.power": {"state": "on"},
    "nodes.abort": {"reason": "intruder"},
    "nodes.deploy": {"image": "default", "ramdisk": "default"},
    "nodes.undeploy": {"reason": "intruder"},
}

# Valid bodies for methods that act on the tenant as a whole.
TENANT_LEVEL_BODIES: dict[str, dict[str, Any]] = {
    "system.whoami": {},
    "audit.checkpoint": {},
    "audit.verify": {},
    "audit.checkpoints": {},
    "audit.prove": {"eventId": "aud_01jbx0000000000000000000aa"},
    "pki.show": {},
    "tenants.get": {},
    "tenants.create": {"slug": "intruder"},
    "tokens.create": {"name": "intruder", "role": "admin"},
    "sites.create": {"kind": "shared", "region": "eu-9"},
    "events.list": {},
    "reservations.queue": {},
    "webhooks.create": {"url": "https://1.1.1.1/hooks"},
    "usage.report": {"from": "2026-01-01T00:00:00Z", "to": "2027-01-01T00:00:00Z"},
    "usage.budgets": {},
}


def make_objects(root, acme) -> dict[str, str]:
    """One object of each kind owned by root or acme (never by globex)."""
    site = root("sites.create", kind="shared", region="eu-1")
    pool = with_default_image(root, root("pools.create", siteId=site["id"], gpuModel="H100",
                                         **{"class": "metal-host"}))
    image = root("images.list", poolId=pool["id"])["items"][0]
    node = make_node(pool["id"])
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8})
    rsv = acme("reservations.create", poolId=pool["id"], **SHAPE)
    sandbox = root("sandboxes.create", poolId=pool["id"], vcpus=2, memoryGiB=4)
    token = acme("tokens.create", name="svc", role="viewer")
    join_token = root("joinTokens.create", poolId=pool["id"], ttl=3_600_000)
    window = root("maintenance.create", nodeId=make_node(pool["id"]).id, duration=3_600_000,
                  startIn=172_800_000, reason="PSU swap")["window"]
    series = acme("series.create", poolId=pool["id"], devices=[{"class": "gpu", "count": 1}],
                  every="daily 09:00-10:00", until="2027-01-02", horizonDays=366,
                  **{"from": "2027-01-01"})
    webhook = acme("webhooks.create", url="https://1.1.1.1/hooks")
    audit = AuditEvent.objects.filter(tenant_id=acme.tenant_id).latest("seq")
    return {"site": site["id"], "pool": pool["id"], "tok": token["id"], "tnt": acme.tenant_id,
            "node": node.id, "rsv": rsv["id"], "sbx": sandbox["id"], "aud": audit.id,
            "jtk": join_token["id"], "img": image["id"], "mnt": window["id"],
            "ser": series["id"], "whk": webhook["id"]}


def target(endpoint) -> tuple[str, str] | None:
    """(wire name, id prefix) of the object a method acts on, if it acts on one."""
    for name, field in endpoint.input().fields.items():
        if isinstance(field, PublicIdField) and field.required:
            return endpoint.input.wire_name(name), field.prefix
    return None


def id_prefix(endpoint) -> str | None:
    found = target(endpoint)
    return found[1] if found else None


@pytest.fixture
def world(root, acme, globex):
    return make_objects(root, acme)


def test_every_method_is_covered_by_this_contract():
    for (group, method), endpoint in REGISTRY.items():
        name = f"{group}.{method}"
        assert id_prefix(endpoint) or method == "list" or name in TENANT_LEVEL_BODIES, name


@pytest.mark.parametrize("name", sorted(f"{g}.{m}" for g, m in REGISTRY))
def test_other_tenants_objects_are_invisible(name, world, globex, root):
    endpoint = REGISTRY[tuple(name.split(".", 1))]
    prefix = id_prefix(endpoint)
    if prefix:
        assert prefix in world, f"make_objects must create a {prefix}_ object for {name}"
        field = target(endpoint)[0]
        answer = globex.call(name, {field: world[prefix], **EXTRA.get(name, {})})
        assert (answer.status, answer.code) == (404, "not_found"), (name, answer.body)
    elif endpoint.method == "list":
        answer = globex.call(name)
        assert answer.ok, answer.body
        text = str(answer.result)
        leaked = [v for v in world.values() if v in text]
        assert not leaked, (name, leaked)
    # Acting inside another tenant by naming it is refused.
    body = ({target(endpoint)[0]: world[prefix], **EXTRA.get(name, {})} if prefix
            else dict(TENANT_LEVEL_BODIES.get(name, {})))
    answer = globex.call(name, body, tenantId="acme")
    assert (answer.status, answer.code) == (404, "not_found"), (name, answer.body)


@pytest.mark.parametrize("name", sorted(f"{g}.{m}" for g, m in REGISTRY))
def test_every_method_requires_authentication(name, api, db):
    group, method = name.split(".", 1)
    answer = api.raw(f"/api/compute/{group}/{method}", "{}")
    assert (answer.status, answer.code) == (401, "unauthenticated")
    assert set(answer.body) == {"ok", "error", "requestId"}
    assert set(answer.body["error"]) == {"code", "message", "details"}


@pytest.mark.parametrize(
    "name", sorted(f"{g}.{m}" for (g, m), e in REGISTRY.items() if id_prefix(e)))
def test_wrong_id_prefix_is_invalid_argument(name, root):
    field, prefix = target(REGISTRY[tuple(name.split(".", 1))])
    wrong = ("pool_" if prefix == "node" else "node_") + "01jbx0000000000000000000aa"
    answer = root.call(name, {field: wrong, **EXTRA.get(name, {})})
    assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body


def test_existence_never_leaks_across_tenants(world, globex, acme):
    """Another tenant's object, a random id, a tenant that exists and one that does not:
    the same answers, and the probes are audited in the prober's own log."""
    from audit.models import AuditEvent

    random_rsv = "rsv_01jbx0000000000000000000aa"

    def answer(body, **extra):
        reply = globex.call("reservations.get", body, **extra)
        message = reply.body["error"]["message"].replace(body["reservationId"], "X")
        if "tenantId" in extra:
            message = message.replace(extra["tenantId"], "T")
        return reply.status, reply.code, message

    own_tenant = {answer({"reservationId": world["rsv"]}),
                  answer({"reservationId": random_rsv})}
    assert own_tenant == {(404, "not_found", "reservation X not found")}
    named = {answer({"reservationId": rid}, tenantId=ref)
             for rid in (world["rsv"], random_rsv) for ref in ("acme", "no-such-tenant")}
    assert named == {(404, "not_found", "tenant 'T' not found")}
    acme_denials = AuditEvent.objects.filter(tenant_id=acme.tenant_id, allowed=False).count()
    assert acme_denials == 0  # nothing written into the probed tenant's log
    # Every probe, of an object or a tenant that exists or not: audited alike at home.
    assert AuditEvent.objects.filter(tenant_id=globex.tenant_id, allowed=False,
                                     action="reservations.get").count() == 6
