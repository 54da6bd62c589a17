"""Audit checkpoints at scale: a log of 1,000,000 events.

Prints the time to sign a checkpoint over all of it, the time of the next checkpoint over
10,000 new events (O(new), not O(log)), and for one event the inclusion proof's size, the
time to build it and the time to verify it offline.

    python -m bench.audit [--events 1000000]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta

from bench.common import bench_environment

TENANT = "tnt_01jbx00000000000000000bench"


def fill(start: int, count: int) -> float:
    """COPY `count` well-formed audit events after position `start`; seconds taken."""
    from django.db import connection

    from audit.models import AuditEvent
    from bcd.contract import ids
    from bcd.contract.auditproof import event_leaf

    began = time.perf_counter()
    base = datetime(2026, 1, 1, tzinfo=UTC)
    columns = ("id", "tenant_id", "position", "leaf_hash", "actor_id", "action", "target",
               "allowed", "reason", "decision_id", "request_id", "origin", "data",
               "created_at")
    with connection.cursor() as cursor, cursor.cursor.copy(
            f"COPY audit_auditevent ({', '.join(columns)}) FROM STDIN") as copy:
        for position in range(start + 1, start + count + 1):
            event = AuditEvent(id=ids.new("aud"), tenant_id=TENANT, position=position,
                               actor_id="prn_bench", action="reservation.create",
                               target=f"rsv_{position}", data={"gpus": position % 8 + 1},
                               created_at=base + timedelta(milliseconds=position))
            leaf = event_leaf(event.wire()).hex()
            copy.write_row((event.id, TENANT, position, leaf, event.actor_id, event.action,
                            event.target, True, "", "", "", "api", json.dumps(event.data),
                            event.created_at))
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO audit_audithead (tenant_id, size) VALUES (%s, %s) "
                       "ON CONFLICT (tenant_id) DO UPDATE SET size = EXCLUDED.size",
                       [TENANT, start + count])
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--more", type=int, default=10_000)
    args = parser.parse_args()
    with bench_environment():
        from audit.checkpoints import audit_prove, checkpoint_seal
        from audit.keys import public_key_b64
        from audit.models import AuditEvent
        from bcd.contract.auditproof import check_proof

        print(f"writing {args.events:,} audit events …", flush=True)
        print(f"  filled in {fill(0, args.events):.1f}s", flush=True)
        began = time.perf_counter()
        first = checkpoint_seal(tenant_id=TENANT)
        full = time.perf_counter() - began
        fill(args.events, args.more)
        began = time.perf_counter()
        second = checkpoint_seal(tenant_id=TENANT)
        incremental = time.perf_counter() - began
        event = AuditEvent.objects.get(tenant_id=TENANT, position=args.events // 3)
        began = time.perf_counter()
        proof = audit_prove(tenant_id=TENANT, event_id=event.id)
        build = time.perf_counter() - began
        key = public_key_b64()
        runs = 200
        began = time.perf_counter()
        for _ in range(runs):
            ok, _ = check_proof(proof, key)
        verify = (time.perf_counter() - began) / runs
        assert ok
        size = len(json.dumps(proof).encode())
        print()
        print(f"checkpoint over {first.tree_size:,} events:          {full:8.2f} s")
        print(f"next checkpoint over {args.more:,} new events:       {incremental:8.3f} s "
              f"({incremental / full:.4f} of the full one; log now {second.tree_size:,})")
        print(f"inclusion proof for event {event.position:,}:  {len(proof['auditPath'])} hashes,"
              f" {size:,} bytes as JSON")
        print(f"  built in {build:.2f} s (streams the log once); verified offline in "
              f"{verify * 1000:.3f} ms")


if __name__ == "__main__":
    main()
