"""Signed checkpoints over each tenant's audit log, and their verification and proofs.

A checkpoint continues from the previous one's frontier, so sealing an hour's events costs
O(those events). Verification streams the log once, in position order, recomputing every
leaf from the row's content; memory stays O(log n) however long the log is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from django.utils import timezone

from audit.keys import public_key_b64, sign
from audit.models import AuditEvent, AuditHead, Checkpoint
from audit.sequencer import audit_sequence, audit_sequence_all
from audit.services import audit_exempt, audit_record, audited
from bcd.contract.auditproof import checkpoint_statement, event_leaf, verify_statement
from bcd.contract.merkle import (
    Frontier,
    consistency_ranges,
    hash_ranges,
    inclusion_ranges,
    resolve,
    verify_consistency,
)
from compute.core.db import advisory_xact_lock
from compute.core.errors import NotFound, PreconditionFailed

CHUNK = 5000


def _leaves(tenant_id: str, start: int, end: int | None = None
            ) -> Iterator[tuple[int, bytes]]:
    """(0-based index, stored leaf hash) from position start+1 on, streamed."""
    rows = AuditEvent.objects.filter(tenant_id=tenant_id, position__gt=start)
    if end is not None:
        rows = rows.filter(position__lte=end)
    for position, leaf in rows.order_by("position").values_list("position", "leaf_hash"
                                                                  ).iterator(CHUNK):
        yield position - 1, bytes.fromhex(leaf)


def _statement(checkpoint: Checkpoint) -> bytes:
    return checkpoint_statement(tenant_id=checkpoint.tenant_id,
                                tree_size=checkpoint.tree_size,
                                root_hash=checkpoint.root_hash,
                                previous_id=checkpoint.previous_id,
                                signed_at=checkpoint.signed_at)


def _folded(leaves: Iterator[tuple[int, bytes]], frontier: Frontier
            ) -> Iterator[tuple[int, bytes]]:
    """Pass leaves through while appending them to `frontier`; positions must not skip."""
    for index, leaf in leaves:
        if index != frontier.size:
            raise PreconditionFailed(f"audit position {frontier.size + 1} is missing; run "
                                     "audit verify")
        frontier.append(leaf)
        yield index, leaf


SEAL_ACTION = "audit.checkpoint"


def numbered_end(tenant_id: str) -> int:
    """The tenant's last numbered position. Rows committed after the numbering ran have none
    yet (and sort first, descending): they are the next seal's."""
    return (AuditEvent.objects.filter(tenant_id=tenant_id, position__isnull=False)
            .order_by("-position").values_list("position", flat=True).first() or 0)


@audited
def checkpoint_seal(*, tenant_id: str, actor_id: str = "system") -> Checkpoint | None:
    """Sign a tree head over every committed event of the tenant not yet covered.

    Streams only the new events, continuing from the previous checkpoint's frontier, and
    proves in the same pass that the new tree extends the previous one. Two sealers of one
    tenant serialize on an advisory lock. The seal's own audit row comes after the tree it
    signs, so the next checkpoint covers it; None when nothing but such rows is new.
    """
    advisory_xact_lock(f"audit-checkpoint:{tenant_id}")
    audit_sequence(tenant_id=tenant_id)
    previous = Checkpoint.objects.filter(tenant_id=tenant_id).order_by("-tree_size").first()
    start = previous.tree_size if previous else 0
    end = numbered_end(tenant_id)
    if not (AuditEvent.objects.filter(tenant_id=tenant_id, position__gt=start)
            .exclude(action=SEAL_ACTION).exists()):
        audit_exempt("only positions were given: nothing new to seal")
        return None  # nothing new but earlier seals' own rows
    frontier = (Frontier(previous.tree_size, [bytes.fromhex(p) for p in previous.frontier])
                if previous else Frontier())
    old_peaks = dict(zip(frontier.peak_ranges(), frontier.peaks, strict=True))
    stream = _folded(_leaves(tenant_id, start, end), frontier)
    consistency: list[str] = []
    if previous is not None:
        ranges = consistency_ranges(start, end)
        fresh = sorted({r for r in ranges if r not in old_peaks})
        hashes = {**old_peaks, **hash_ranges(stream, fresh)}
        consistency = [hashes[r].hex() for r in ranges]
    for _ in stream:  # whatever the proof did not need still goes into the tree
        pass
    if frontier.size != end:
        raise PreconditionFailed(f"audit positions after {frontier.size} are missing; run "
                                 "audit verify", tenantId=tenant_id)
    checkpoint = Checkpoint(
        tenant_id=tenant_id, tree_size=frontier.size, root_hash=frontier.root().hex(),
        frontier=[p.hex() for p in frontier.peaks], previous=previous, consistency=consistency,
        signed_at=timezone.now().astimezone(UTC).isoformat(timespec="seconds"))
    checkpoint.signature = sign(_statement(checkpoint))
    checkpoint.save(force_insert=True)
    audit_record(tenant_id=tenant_id, actor_id=actor_id, action=SEAL_ACTION,
                 target=checkpoint.id, data={"treeSize": checkpoint.tree_size,
                                             "rootHash": checkpoint.root_hash})
    return checkpoint


def checkpoint_seal_all() -> list[Checkpoint]:
    """Seal every tenant whose log grew (the hourly job)."""
    audit_sequence_all()
    sealed = []
    for head in AuditHead.objects.order_by("tenant_id"):
        checkpoint = checkpoint_seal(tenant_id=head.tenant_id)
        if checkpoint is not None:
            sealed.append(checkpoint)
    return sealed


@dataclass
class Verification:
    tenant_id: str
    checked: int = 0
    checkpoints: int = 0
    first_bad_position: int | None = None
    problem: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.first_bad_position is None and not self.problem

    def fail(self, position: int | None, problem: str) -> Verification:
        self.first_bad_position, self.problem = position, problem
        return self

    def wire(self) -> dict[str, Any]:
        return {"ok": self.ok, "tenantId": self.tenant_id, "checkedEvents": self.checked,
                "checkedCheckpoints": self.checkpoints,
                "firstBadPosition": self.first_bad_position, "problem": self.problem or None}


def audit_verify(*, tenant_id: str, from_position: int = 1,
                 to_position: int | None = None) -> Verification:
    """Recompute the tenant's log and every checkpoint over it; report the first mismatch.

    Each row's leaf is recomputed from its content and compared with the stored leaf (an
    edited row); positions must run 1, 2, 3… (a deleted, inserted or reordered row); each
    checkpoint's root must equal the tree over the rows, its signature must verify, and
    its consistency proof must link it to the previous checkpoint. Events outside
    [from, to] are still read, since every root covers the log from its start.
    """
    with contextlib.suppress(PreconditionFailed):  # an edited log: what follows names it
        audit_sequence(tenant_id=tenant_id)
    report = Verification(tenant_id=tenant_id)
    public_key = public_key_b64()
    checkpoints = iter(Checkpoint.objects.filter(tenant_id=tenant_id).order_by("tree_size"))
    pending = next(checkpoints, None)
    previous: Checkpoint | None = None
    frontier = Frontier()
    rows = (AuditEvent.objects.filter(tenant_id=tenant_id)
            .exclude(position__isnull=True, txid__isnull=False)  # still in flight
            .order_by("position", "seq"))
    if to_position is not None:
        last_needed = max(to_position, *(c.tree_size for c in Checkpoint.objects.filter(
            tenant_id=tenant_id, tree_size__lte=to_position)), 0)
        rows = rows.filter(position__lte=last_needed)
    expected = 1
    for event in rows.iterator(CHUNK):
        if event.position != expected:
            missing = event.position is None or event.position > expected
            return report.fail(expected, f"position {expected} is "
                               f"{'missing' if missing else 'duplicated'}")
        leaf = event_leaf(event.wire())
        if leaf.hex() != event.leaf_hash:
            return report.fail(*_explain_mismatch(event, expected))
        frontier.append(leaf)
        if from_position <= expected:
            report.checked += 1
        expected += 1
        while pending is not None and pending.tree_size == frontier.size:
            problem = _check_checkpoint(pending, previous, frontier, public_key)
            if problem:
                return report.fail(_first_position(previous), problem)
            report.checkpoints += 1
            previous, pending = pending, next(checkpoints, None)
    if pending is not None and (to_position is None or pending.tree_size <= to_position):
        return report.fail(frontier.size + 1, f"checkpoint {pending.id} covers "
                           f"{pending.tree_size} events but the log has {frontier.size}")
    return report


def _explain_mismatch(event: AuditEvent, position: int) -> tuple[int, str]:
    """Where the log first went wrong, given the first row whose hash does not match."""
    for shift, what in ((-1, "inserted"), (1, "deleted")):
        event.position = position + shift
        moved = event_leaf(event.wire()).hex() == event.leaf_hash
        event.position = position
        if moved:  # the row is intact but renumbered: one was inserted or deleted before it
            at = position - 1 if what == "inserted" else position
            return at, f"an event was {what} at position {at} (later events renumbered)"
    return position, (f"event {event.id} at position {position} does not match its recorded "
                      "hash (edited or moved)")


def _first_position(previous: Checkpoint | None) -> int:
    return previous.tree_size + 1 if previous else 1


def _check_checkpoint(checkpoint: Checkpoint, previous: Checkpoint | None,
                      frontier: Frontier, public_key: str) -> str:
    if not verify_statement(public_key, _statement(checkpoint), checkpoint.signature):
        return f"checkpoint {checkpoint.id} has a signature that does not verify"
    if frontier.root().hex() != checkpoint.root_hash:
        return (f"the log's first {checkpoint.tree_size} events do not hash to checkpoint "
                f"{checkpoint.id}'s signed root")
    if checkpoint.previous_id != (previous.id if previous else None):
        return f"checkpoint {checkpoint.id} does not link to the checkpoint before it"
    if previous is not None and not verify_consistency(
            previous.tree_size, checkpoint.tree_size,
            [bytes.fromhex(h) for h in checkpoint.consistency],
            bytes.fromhex(previous.root_hash), bytes.fromhex(checkpoint.root_hash)):
        return (f"checkpoint {checkpoint.id} is not a consistent extension of "
                f"{previous.id}")
    return ""


def audit_prove(*, tenant_id: str, event_id: str) -> dict[str, Any]:
    """An inclusion proof of one event against the tenant's latest checkpoint."""
    audit_sequence(tenant_id=tenant_id)
    event = AuditEvent.objects.filter(tenant_id=tenant_id, id=event_id).first()
    if event is None:
        raise NotFound(f"audit event {event_id} not found", eventId=event_id)
    checkpoint = (Checkpoint.objects.filter(tenant_id=tenant_id,
                                            tree_size__gte=event.position or 1)
                  .order_by("-tree_size").first())
    if checkpoint is None or event.position is None:
        raise PreconditionFailed(f"no checkpoint covers {event_id} yet; one is signed every "
                                 "hour (or run audit checkpoint)", eventId=event_id)
    index = event.position - 1
    path = resolve(inclusion_ranges(index, checkpoint.tree_size),
                   lambda ranges: hash_ranges(_leaves(tenant_id, 0, checkpoint.tree_size),
                                              ranges))
    return {"version": 1, "event": event.wire(), "leafIndex": index,
            "treeSize": checkpoint.tree_size, "auditPath": [h.hex() for h in path],
            "checkpoint": checkpoint.wire(), "publicKey": public_key_b64()}
