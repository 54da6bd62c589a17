from __future__ import annotations

from tests.conftest import POLICY

__all__ = ["HOUR", "POLICY", "gpus", "placed_and_started", "reserve"]
HOUR = 3_600_000


def gpus(count, topology="any"):
    return [{"class": "gpu", "count": count, "topology": topology}]


def reserve(client, pool, count, topology="any", duration=HOUR, **extra):
    return client.call("reservations.create", poolId=pool["id"], devices=gpus(count, topology),
                       duration=duration, **extra)


def placed_and_started(client, pool, count, **extra):
    """A reservation left `placed` though its window has begun, as one is between its
    start and the worker's bind (`reservations.create` binds one that starts at once): it
    is booked a minute ahead, then its window is moved to start now."""
    from django.db import connection

    from reservations.models import Booking, Reservation

    rsv = reserve(client, pool, count, startIn=60_000, **extra).result
    shift = "tstzrange(now(), upper(during) - (lower(during) - now()), '[)')"
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Reservation._meta.db_table} SET during = {shift} "  # noqa: S608
                       "WHERE id = %s", [rsv["id"]])
        cursor.execute(f"UPDATE {Booking._meta.db_table} SET during = {shift} "  # noqa: S608
                       "WHERE allocation_id = %s", [rsv["allocationId"]])
    return client("reservations.get", reservationId=rsv["id"])
