"""Sandboxes share the host counters with GPU reservations' host share; only the node's
signed VM reports move a sandbox past `placed`, and its counters come back only when the
node says the VM is gone."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from django.db import connection

from bcd.contract.crypto import canonical, public_pem, sign_bytes
from bcd.contract.vms import Vm
from fleet.models import Node, NodeSpec
from reservations.services.binding import BindingRefused
from reservations.services.sandbox_reports import vm_report_record
from tests.factories import IMAGE_PART, make_node
from tests.reservations.conftest import reserve
from tests.support.writes import assert_wrote


def vm_report(key, node_id: str, sandbox_id: str, phase: str, **extra) -> dict[str, str]:
    body = canonical({"sandboxId": sandbox_id, "nodeId": node_id, "phase": phase,
                      "accelerator": "tcg", **extra}).decode()
    return {"node_id": node_id, "body": body, "signature": sign_bytes(key, body.encode())}


@pytest.fixture
def keyed_cpu_node(cpu_pool):
    key = ec.generate_private_key(ec.SECP256R1())
    node = make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    Node.objects.filter(pk=node.pk).update(public_key=public_pem(key.public_key()))
    return key, node


def pool_series(pool_id: str) -> dict[tuple[str, tuple[str, ...]], float]:
    """The sandbox and usage-rate series of root's samples in a pool, by their other labels."""
    from compute.core.db import database_now
    from reservations.metrics import sandbox_series, usage_rate

    families = [*sandbox_series(), usage_rate(database_now())]
    return {(sample.name, tuple(v for k, v in sorted(sample.labels.items())
                                if k not in ("pool", "tenant"))): pytest.approx(sample.value)
            for family in families for sample in family.samples
            if sample.labels == {**sample.labels, "pool": pool_id, "tenant": "root"}}


def counters(node) -> tuple[int, int]:
    node.refresh_from_db()
    return node.vcpus_allocated, node.memory_gib_allocated


def test_create_claims_and_puts_the_vm_in_the_nodes_spec(root, cpu_pool, keyed_cpu_node):
    _, node = keyed_cpu_node
    with assert_wrote(audit="sandbox.create", events=["sandbox.created"]):
        sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=8, memoryGiB=16,
                       forwards=[{"hostPort": 2222, "guestPort": 22}])
    assert (sandbox["nodeId"], sandbox["state"]) == (node.id, "placed")
    assert counters(node) == (8, 16)
    spec = NodeSpec.objects.filter(node=node).latest("generation").spec
    vm = Vm.from_wire(spec["vms"][0])  # what bcd will accept
    assert (vm.sandbox_id, vm.vcpus, vm.memory_mib) == (sandbox["id"], 8, 16 * 1024)
    assert (vm.forwards, vm.listen, vm.kernel.sha256) == (((2222, 22),), "127.0.0.1",
                                                          IMAGE_PART["sha256"])
    answer = root.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=30, memoryGiB=16)
    assert (answer.status, answer.code) == (409, "capacity_conflict")
    assert counters(node) == (8, 16)


def test_only_the_nodes_signed_reports_move_a_sandbox(root, cpu_pool, keyed_cpu_node):
    key, node = keyed_cpu_node
    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=2, memoryGiB=1)
    forged = vm_report(ec.generate_private_key(ec.SECP256R1()), node.id, sandbox["id"],
                       "started")
    with pytest.raises(BindingRefused), assert_wrote(audit="sandbox.report", denied=True):
        vm_report_record(**forged)
    assert root("sandboxes.get", sandboxId=sandbox["id"])["state"] == "placed"
    with assert_wrote(audit="sandbox.start", events=["sandbox.starting"]):
        vm_report_record(**vm_report(key, node.id, sandbox["id"], "starting"))
    with assert_wrote(audit="sandbox.run", events=["sandbox.running"]):
        vm_report_record(**vm_report(key, node.id, sandbox["id"], "started"))
    with assert_wrote(audit=None, events=[]):  # a repeat, and news older than the ledger's
        vm_report_record(**vm_report(key, node.id, sandbox["id"], "started"))
        vm_report_record(**vm_report(key, node.id, sandbox["id"], "starting"))
    running = root("sandboxes.get", sandboxId=sandbox["id"])
    assert (running["state"], running["accelerator"]) == ("running", "tcg")
    assert running["startedAt"] is not None


@pytest.mark.django_db(transaction=True)
def test_release_frees_only_when_the_node_says_stopped_and_meters_the_run(
        root, cpu_pool, keyed_cpu_node):
    key, node = keyed_cpu_node
    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=8, memoryGiB=16)
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "started"))
    with connection.cursor() as cursor:
        cursor.execute("UPDATE reservations_sandbox SET started_at = now() - interval '30 min'")
    with assert_wrote(audit="sandbox.release", events=["sandbox.released"]):
        released = root("sandboxes.release", sandboxId=sandbox["id"])
    assert released["state"] == "stopping"
    assert counters(node) == (8, 16)  # the VM may still run: nothing is freed yet
    [vm] = NodeSpec.objects.filter(node=node).latest("generation").spec["vms"]
    assert (vm["sandboxId"], vm["desired"]) == (sandbox["id"], "stopped")
    assert root.call("sandboxes.release", sandboxId=sandbox["id"]).code == "invalid_state"
    with assert_wrote(audit="sandbox.stop", events=["sandbox.stopped"]):
        vm_report_record(**vm_report(key, node.id, sandbox["id"], "stopped"))
    assert counters(node) == (0, 0)
    assert root("sandboxes.get", sandboxId=sandbox["id"])["state"] == "stopped"
    assert NodeSpec.objects.filter(node=node).latest("generation").spec["vms"] == []
    usage: dict[str, float] = {}
    for record in root("usage.list")["items"]:  # (one per hour the run touched)
        usage[record["meter"]] = usage.get(record["meter"], 0) + float(record["quantity"])
    assert 3.99 < usage["vcpu.hours"] < 4.01
    assert 7.99 < usage["memory.gib-hours"] < 8.01


def test_a_vm_that_exits_on_its_own_fails_the_sandbox_and_frees_it(root, cpu_pool,
                                                                   keyed_cpu_node):
    key, node = keyed_cpu_node
    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=4, memoryGiB=2)
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "started"))
    with assert_wrote(audit="sandbox.fail", events=["sandbox.failed"]):
        vm_report_record(**vm_report(key, node.id, sandbox["id"], "exited", exitStatus=137,
                                     reason="the VM exited on its own (status 137)"))
    failed = root("sandboxes.get", sandboxId=sandbox["id"])
    assert (failed["state"], failed["exitStatus"]) == ("failed", 137)
    assert "137" in failed["failureReason"]
    assert counters(node) == (0, 0)
    assert NodeSpec.objects.filter(node=node).latest("generation").spec["vms"] == []


def test_bounds_images_and_ports_are_refused_before_anything_is_claimed(root, cpu_pool):
    node = make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    root("images.create", poolId=cpu_pool["id"], name="other", kernel=IMAGE_PART,
         initrd=IMAGE_PART)
    Node.objects.filter(pk=node.pk).update(virtualization="tcg")
    from fleet.models import Pool

    Pool.objects.filter(pk=cpu_pool["id"]).update(
        policy={"sandboxes": {"maxVcpus": 8, "maxMemoryGiB": 16, "images": ["default"],
                              "network": "outbound"}})
    cases = [({"vcpus": 9, "memoryGiB": 1}, "maxVcpus (8)"),
             ({"vcpus": 1, "memoryGiB": 17}, "maxMemoryGiB (16)"),
             ({"vcpus": 1, "memoryGiB": 1, "image": "missing"}, "has no image 'missing'"),
             ({"vcpus": 1, "memoryGiB": 1, "image": "other"}, "allows only default"),
             ({"vcpus": 1, "memoryGiB": 1, "forwards": [{"hostPort": 80, "guestPort": 80}]},
              "hostPort"),
             ({"vcpus": 1, "memoryGiB": 1, "network": "none",
               "forwards": [{"hostPort": 2222, "guestPort": 22}]}, "need network outbound")]
    for body, said in cases:
        with assert_wrote(audit=None):
            answer = root.call("sandboxes.create", poolId=cpu_pool["id"], **body)
        assert (answer.status, answer.code) == (400, "invalid_argument"), answer.body
        assert said in answer.body["error"]["message"], answer.body
    forward = [{"hostPort": 2222, "guestPort": 22}]
    assert root.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=1, memoryGiB=1,
                     forwards=forward).ok
    taken = root.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=1, memoryGiB=1,
                      forwards=forward)
    assert taken.code == "capacity_conflict"
    assert "2222" in taken.body["error"]["message"]
    Node.objects.filter(pk=node.pk).update(virtualization="none")
    assert root.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=1,
                     memoryGiB=1).code == "capacity_conflict"
    assert counters(node) == (1, 1)


def test_sandbox_and_gpu_host_share_never_take_each_others(root, pool):
    make_node(pool["id"])  # 96 vCPUs; 12 per GPU
    root("sandboxes.create", poolId=pool["id"], vcpus=60, memoryGiB=64)
    assert reserve(root, pool, 4).result["state"] == "pending"  # 48 > 36 left
    assert reserve(root, pool, 3).result["state"] == "binding"  # 36 fit exactly
    answer = root.call("sandboxes.create", poolId=pool["id"], vcpus=1, memoryGiB=1)
    assert answer.code == "capacity_conflict"


def test_cpu_pool_offering_takes_vcpu_and_memory_quotas(root, cpu_pool, acme):
    make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    root("pools.offer", poolId=cpu_pool["id"], to="acme", quota={"vcpu": 8, "memory": 32})
    assert acme.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=8, memoryGiB=16).ok
    answer = acme.call("sandboxes.create", poolId=cpu_pool["id"], vcpus=1, memoryGiB=1)
    assert answer.code == "quota_exceeded"
    gpu = root.call("pools.offer", poolId=cpu_pool["id"], to="acme", quota={"gpu": 1})
    assert gpu.code == "invalid_argument"


def test_image_catalogue_is_per_pool_and_in_use_images_stay(root, cpu_pool, acme):
    make_node(cpu_pool["id"], gpus=0, vcpus=32, memory_gib=128)
    images = root("images.list", poolId=cpu_pool["id"])["items"]
    assert [i["name"] for i in images] == ["default"]
    dup = root.call("images.create", poolId=cpu_pool["id"], name="default",
                    kernel=IMAGE_PART, initrd=IMAGE_PART)
    assert dup.code == "already_exists"
    bad = root.call("images.create", poolId=cpu_pool["id"], name="x",
                    kernel={"url": "ftp://a/b", "sha256": "z"}, initrd=IMAGE_PART)
    assert bad.status == 400
    assert "kernel" in str(bad.body["error"])
    root("sandboxes.create", poolId=cpu_pool["id"], vcpus=1, memoryGiB=1)
    in_use = root.call("images.delete", imageId=images[0]["id"])
    assert in_use.code == "invalid_state"
    assert "in use" in in_use.body["error"]["message"]
    root("pools.offer", poolId=cpu_pool["id"], to="acme", quota={"vcpu": 8, "memory": 8})
    assert acme("images.list", poolId=cpu_pool["id"])["items"][0]["name"] == "default"
    assert acme.call("images.create", poolId=cpu_pool["id"], name="mine", kernel=IMAGE_PART,
                     initrd=IMAGE_PART).status in (403, 404)


def test_only_the_nodes_report_pauses_a_sandbox_and_its_paused_time_is_metered_lower(
        root, cpu_pool, keyed_cpu_node):
    from datetime import timedelta
    from decimal import Decimal

    from reservations.models import Sandbox, UsageRecord

    key, node = keyed_cpu_node
    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=4, memoryGiB=2)
    refused = root.call("sandboxes.pause", sandboxId=sandbox["id"])  # not booted yet
    assert (refused.status, refused.code) == (409, "invalid_state"), refused.body
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "started"))
    asked = root("sandboxes.pause", sandboxId=sandbox["id"])
    assert (asked["state"], asked["desired"]) == ("running", "paused")
    spec = NodeSpec.objects.filter(node=node).order_by("-generation").first().spec
    assert [vm["desired"] for vm in spec["vms"]] == ["paused"]
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "paused"))
    assert root("sandboxes.get", sandboxId=sandbox["id"])["state"] == "paused"
    assert pool_series(cpu_pool["id"]) == {  # what /metrics says of the pool meanwhile
        ("bc_sandbox_vcpus", ()): 4, ("bc_sandbox_memory_bytes", ()): 2 * 2**30,
        ("bc_sandboxes", ("paused",)): 1, ("bc_usage_rate", ("vcpu.hours",)): 0.4,
        ("bc_usage_rate", ("memory.gib-hours",)): 0.2}
    exec_refused = root.call("sandboxes.exec", sandboxId=sandbox["id"], argv=["true"])
    assert (exec_refused.status, exec_refused.code) == (409, "invalid_state")
    hour_ago = Sandbox.objects.get(pk=sandbox["id"]).metered_from - timedelta(hours=1)
    Sandbox.objects.filter(pk=sandbox["id"]).update(metered_from=hour_ago)  # an hour paused
    root("sandboxes.resume", sandboxId=sandbox["id"])
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "resumed"))
    assert root("sandboxes.get", sandboxId=sandbox["id"])["state"] == "running"
    paused = UsageRecord.objects.filter(subject=sandbox["id"], meter="vcpu.hours",
                                        window_start__gte=hour_ago)  # cut on the hour
    quantity = sum(r.quantity for r in paused)
    assert abs(quantity - Decimal("0.4")) < Decimal("0.001")  # 4 vCPUs x 1 h x 0.1


def test_an_end_reported_late_takes_back_the_hours_closed_after_it(root, cpu_pool,
                                                                    keyed_cpu_node):
    from datetime import timedelta
    from decimal import Decimal

    from compute.core.db import database_now
    from reservations.models import Sandbox, UsageRecord
    from reservations.reconcilers import sweep
    from tests.support.work import run_due_work

    key, node = keyed_cpu_node
    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=4, memoryGiB=2)
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "started"))
    booted = database_now() - timedelta(hours=3, minutes=30)
    Sandbox.objects.filter(pk=sandbox["id"]).update(started_at=booted)
    sweep()
    run_due_work()  # closed on each hour since it booted
    closed = UsageRecord.objects.filter(subject=sandbox["id"], meter="vcpu.hours")
    assert closed.count() >= 3
    root("sandboxes.release", sandboxId=sandbox["id"])
    died = booted + timedelta(hours=1, minutes=15)  # the node says: long ago, reported now
    vm_report_record(**vm_report(key, node.id, sandbox["id"], "stopped",
                                 endedAt=died.timestamp()))

    def total(meter: str) -> Decimal:
        return sum((r.quantity for r in UsageRecord.objects.filter(subject=sandbox["id"],
                                                                   meter=meter)), Decimal(0))

    assert abs(total("vcpu.hours") - Decimal("5.0")) < Decimal("0.0001")  # 4 x 1.25 h
    assert abs(total("memory.gib-hours") - Decimal("2.5")) < Decimal("0.0001")
    corrections = UsageRecord.objects.filter(subject=sandbox["id"], correction=True)
    assert corrections.exists()
    assert all(r.quantity < 0 and r.window_start >= died for r in corrections)
    report = root("usage.report", **{"from": (booted - timedelta(hours=1)).isoformat(),
                                      "to": (database_now() + timedelta(hours=1)).isoformat(),
                                      "groupBy": "meter"})
    assert {r["meter"]: r["quantity"] for r in report["rows"]} == {
        "vcpu.hours": "5.000000", "memory.gib-hours": "2.500000"}
    audit = root("audit.list", action="sandbox.stop")["items"]
    assert audit[-1]["data"]["endedAt"].startswith(died.date().isoformat())


def test_an_end_the_node_dates_in_the_future_or_before_the_boot_is_kept_in_bounds(
        root, cpu_pool, keyed_cpu_node):
    from datetime import timedelta

    from compute.core.db import database_now
    from reservations.models import Sandbox
    from reservations.services.sandbox_reports import reported_end

    sandbox = root("sandboxes.create", poolId=cpu_pool["id"], vcpus=2, memoryGiB=1)
    row = Sandbox.objects.get(pk=sandbox["id"])
    now = database_now()
    assert reported_end({"endedAt": (now + timedelta(days=3)).timestamp()}, row) == now
    assert reported_end({"endedAt": 0}, row) == row.created_at
    assert reported_end({"endedAt": "soon"}, row) is None
    assert reported_end({"endedAt": True}, row) is None
    assert reported_end({"endedAt": 1e300}, row) is None
