"""MIG instances and time-sliced shares as atoms of the ledger, beside whole GPUs.

A whole GPU and its parts are separate device rows; the second EXCLUDE constraint refuses a
whole-GPU booking that overlaps a booking of one of its parts, whatever writes the rows.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from fleet.models import Device
from reservations.models import Booking, Reservation
from reservations.services.holds import hold_of
from tests.conftest import POLICY
from tests.factories import make_node, with_default_image
from tests.reservations.conftest import HOUR, reserve
from tests.support.ledger import overlapping_bookings

SEVEN = ["1g.10gb"] * 7
TWO = ["3g.40gb", "3g.40gb"]


def atoms(device_class, count, profile=None):
    request = {"class": device_class, "count": count}
    return [{**request, "profile": profile} if profile else request]


def book(client, pool, device_class, count, profile=None, duration=HOUR, **extra):
    return client.call("reservations.create", poolId=pool["id"], duration=duration,
                       devices=atoms(device_class, count, profile), **extra)


def booked(rsv_id):
    return list(Booking.objects.filter(allocation__reservation_id=rsv_id,
                                       allocation__ended_at__isnull=True)
                .select_related("device").order_by("device__uuid"))


@pytest.fixture
def sliced(root):
    site = root("sites.create", kind="shared", region="eu-1")
    return with_default_image(root, root(
        "pools.create", siteId=site["id"], gpuModel="H100", **{"class": "metal-host"},
        policy={**POLICY, "timeSlicing": {"replicas": 4}}))


def test_mig_instances_are_booked_as_their_own_atoms(root, pool):
    node = make_node(pool["id"], mig={0: SEVEN, 1: TWO})
    assert Device.objects.filter(node=node, device_class="mig").count() == 9
    rsv = book(root, pool, "mig", 2, "1g.10gb").result
    assert rsv["state"] == "binding"
    assert rsv["devices"] == [{"class": "mig", "count": 2, "topology": "any",
                               "profile": "1g.10gb"}]
    rows = booked(rsv["id"])
    assert [b.device.device_class for b in rows] == ["mig", "mig"]
    assert {b.device.profile for b in rows} == {"1g.10gb"}
    gpu0 = Device.objects.get(node=node, device_class="gpu", index=0)
    assert {b.gpu_id for b in rows} == {gpu0.id}  # written by the trigger
    assert {b.whole for b in rows} == {False}
    # A 1g instance takes 1/7 of a GPU's host share (12 vCPUs, 96 GiB per GPU).
    assert rsv["hostShare"] == {"vcpus": 2 * (12 // 7), "memoryGiB": 2 * (96 // 7)}
    # The hold binds MIG UUIDs as CDI devices.
    allocation = rows[0].allocation
    hold = hold_of(allocation, Reservation.objects.get(pk=rsv["id"]))
    assert hold.gpus == tuple(sorted(b.device.uuid for b in rows))
    assert all(name.startswith("bcd.dev/gpu=MIG-") for name in hold.cdi_devices)


def test_a_whole_gpu_and_its_instances_never_overlap(root, pool):
    make_node(pool["id"], gpus=2, domains=(2,), mig={0: TWO})
    part = book(root, pool, "mig", 1, "3g.40gb").result
    assert part["state"] == "binding"
    # GPU 0 has a booked instance: two whole GPUs do not fit now, one does (GPU 1).
    assert reserve(root, pool, 2).result["state"] == "pending"
    whole = reserve(root, pool, 1).result
    assert whole["state"] == "binding"
    assert booked(whole["id"])[0].device.index == 1
    # GPU 1 is booked whole: its instances (none here) and GPU 0's other instance remain.
    assert book(root, pool, "mig", 1, "3g.40gb").result["state"] == "binding"
    assert book(root, pool, "mig", 1, "3g.40gb").result["state"] == "pending"
    assert overlapping_bookings() == 0


def test_the_constraint_refuses_what_application_code_would_let_through(root, pool):
    """Rows written straight to the table, with gpu/whole lies in them: the trigger writes
    the truth and the second constraint refuses the overlap."""
    node = make_node(pool["id"], mig={0: TWO})
    part = book(root, pool, "mig", 1, "3g.40gb").result
    instance = booked(part["id"])[0]
    gpu0 = Device.objects.get(node=node, device_class="gpu", index=0)
    allocation = instance.allocation
    now = timezone.now()
    with pytest.raises(IntegrityError, match="reservations_booking_gpu_no_overlap"), \
            transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO reservations_booking (allocation_id, device_id, during, gpu_id, whole)"
            " VALUES (%s, %s, %s, %s, false)",
            [allocation.id, gpu0.id, DateTimeTZRange(now, now + timedelta(minutes=5)),
             "dev_not_this_gpu"])
    # Rewriting a part's booking to claim it is whole is rewritten back.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE reservations_booking SET whole = true, gpu_id = %s "
                       "WHERE id = %s", [gpu0.id, instance.id])
    instance.refresh_from_db()
    assert (instance.gpu_id, instance.whole) == (gpu0.id, False)


def test_shares_fill_a_gpu_before_the_next_and_exclude_whole_bookings(root, sliced):
    node = make_node(sliced["id"], gpus=2, domains=(2,))
    shares = Device.objects.filter(node=node, device_class="gpu-share").order_by("uuid")
    assert [d.profile for d in shares if d.index == 0] == ["1/4", "2/4", "3/4", "4/4"]
    first = [book(root, sliced, "gpu-share", 1).result for _ in range(4)]
    assert {r["state"] for r in first} == {"binding"}
    assert {booked(r["id"])[0].device.index for r in first} == {0}
    assert reserve(root, sliced, 2).result["state"] == "pending"  # GPU 0 is sliced now
    two = book(root, sliced, "gpu-share", 2).result
    rows = booked(two["id"])
    assert {b.device.index for b in rows} == {1}
    # A share is held as its GPU, with the shares named for the workload.
    hold = hold_of(rows[0].allocation, Reservation.objects.get(pk=two["id"]))
    gpu1 = Device.objects.get(node=node, device_class="gpu", index=1)
    assert hold.gpus == (gpu1.uuid,)
    assert hold.shares == tuple(sorted(b.device.uuid for b in rows))
    assert hold.env["BCD_GPU_SHARES"] == ",".join(hold.shares)
    assert overlapping_bookings() == 0


def test_earliest_for_a_whole_gpu_waits_for_every_part(root, pool):
    """Parts of one GPU booked over overlapping windows (0-3 h and 1-2 h): the whole GPU
    is free from the latest end, not from the end of the last one to start."""
    make_node(pool["id"], gpus=1, domains=(1,), mig={0: TWO})
    long = book(root, pool, "mig", 1, "3g.40gb", duration=3 * HOUR).result
    short = book(root, pool, "mig", 1, "3g.40gb", duration=HOUR, startIn=HOUR).result
    assert (long["state"], short["state"]) == ("binding", "placed")
    found = root("capacity.earliest", poolId=pool["id"], devices=atoms("gpu", 1),
                 duration=HOUR)
    assert found["found"] is True
    assert found["window"]["start"] == long["end"]
    # Two hours on an instance: the second one's hour before its booking is too short,
    # so its end (2 h), before the first one's (3 h).
    found = root("capacity.earliest", poolId=pool["id"], devices=atoms("mig", 1, "3g.40gb"),
                 duration=2 * HOUR)
    assert found["window"]["start"] == short["end"]


@pytest.mark.parametrize(("devices", "field_says"), [
    (atoms("mig", 1), "names its profile"),
    (atoms("gpu", 1, "1g.10gb"), "only mig requests have a profile"),
    ([{"class": "mig", "count": 1, "profile": "1g.10gb", "topology": "nvlink-all"}],
     "not NVLinked"),
    (atoms("gpu-share", 1), "does not slice its GPUs"),
    (atoms("tpu", 1), "tpu"),
    (atoms("mig", 1, "big"), "profile"),
])
def test_bad_atom_requests_name_what_is_wrong(root, pool, devices, field_says):
    make_node(pool["id"], mig={0: SEVEN})
    answer = root.call("reservations.create", poolId=pool["id"], devices=devices,
                       duration=HOUR)
    assert answer.status == 400, answer.body
    assert field_says in answer.body["error"]["message"]
    assert not Reservation.objects.exists()


def test_each_atom_class_has_its_own_quota(root, pool, acme):
    make_node(pool["id"], mig={0: SEVEN})
    root("pools.offer", poolId=pool["id"], to="acme", quota={"gpu": 8, "mig": 2})
    assert book(acme, pool, "mig", 2, "1g.10gb").result["state"] == "binding"
    refused = book(acme, pool, "mig", 1, "1g.10gb")
    assert (refused.status, refused.code) == (409, "quota_exceeded"), refused.body
    assert "mig quota" in refused.body["error"]["message"]
    assert reserve(acme, pool, 4).result["state"] == "binding"  # whole GPUs: another quota
