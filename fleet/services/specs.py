"""Desired state by generation: each change to a node's device assignments writes the next
NodeSpec generation (never edits one), signed for its node; the gateway pushes the newest
to the agent, which applies only what the control plane signed. Commands are signed the
same way when queued."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from bcd.contract.crypto import sign_document
from bcd.contract.profile import SLURMD
from bcd.contract.signed import command_payload, spec_payload
from compute.core.db import CURRENT_TXID
from fleet.models import Node, NodeCommand, NodeSpec
from fleet.pki import pki


def node_spec_change_locked(node: Node, *, add: dict[str, Any] | None = None,
                            remove: str | None = None, vm_add: dict[str, Any] | None = None,
                            vm_desired: tuple[str, str] | None = None,
                            vm_remove: str | None = None, above: int = 0) -> NodeSpec:
    """Write the next generation with hold `add` and VM `vm_add`, `vm_desired` (a sandbox
    and what it should be: running, paused, stopped), without allocation `remove` and
    sandbox `vm_remove` (with none:
    generation 1 of a newly adopted node, or an unchanged copy); the profile of units is
    always the pool's policy's as it is now. The generation is above `above` too.

    A released VM stays in the spec, desired stopped, until its node reports it stopped:
    an agent that never started it (or restarted meanwhile) still learns to say so.

    The caller holds the node row's lock, which orders generations; the unique constraint
    on (node, generation) is the backstop.
    """
    latest = node.specs.order_by("-generation").first()
    spec = latest.spec if latest else {}
    allocations = _changed(spec.get("allocations", []), "allocationId", add, remove)
    vms = [{**vm, "desired": vm_desired[1]} if vm_desired and vm["sandboxId"] == vm_desired[0]
           else vm
           for vm in _changed(spec.get("vms", []), "sandboxId", vm_add, vm_remove)]
    desired_state_changed()
    generation = max((latest.generation + 1) if latest else 1, above + 1)
    spec = {"allocations": allocations, "vms": vms}
    units = policy_units(node.pool.policy or {})
    if units:
        spec["profile"] = {"units": units}
    return NodeSpec.objects.create(node=node, generation=generation, spec=spec,
                                   signed=signed_spec(node.id, generation, spec),
                                   txid=CURRENT_TXID)


def spec_rebase_locked(node: Node, *, above: int) -> tuple[NodeSpec, bool]:
    """The ledger's spec of the (locked) node as a generation above `above`, the newest its
    node applied; True when written now, False when the newest already is above it."""
    latest = node.specs.order_by("-generation").first()
    if latest is not None and latest.generation > above:
        return latest, False
    return node_spec_change_locked(node, above=above), True


def command_create(*, node_id: str, kind: str, payload: dict[str, Any]) -> NodeCommand:
    """Queue a command for the node, signed for it (the agent runs nothing else)."""
    command = NodeCommand(node_id=node_id, kind=kind, payload=payload)
    command.signed = signed_command(node_id, command.id, kind, payload)
    command.save(force_insert=True)
    return command


def signed_command(node_id: str, command_id: str, kind: str, payload: dict[str, Any]) -> str:
    """The command as its node accepts it: signed with the join-signing key it pinned."""
    return json.dumps(sign_document(pki().join_signing_key,
                                    command_payload(node_id, command_id, kind, payload)))


def signed_spec(node_id: str, generation: int, spec: dict[str, Any]) -> str:
    """The spec as its node accepts it: signed with the join-signing key it pinned."""
    return json.dumps(sign_document(pki().join_signing_key,
                                    spec_payload(node_id, generation, spec)))


DESIRED_CHANNEL = "bc_desired"


def desired_state_changed() -> None:
    """Wake the gateways at commit: a node's spec or its queue of commands changed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [DESIRED_CHANNEL])


def _changed(entries: list[dict[str, Any]], key: str, add: dict[str, Any] | None,
             remove: str | None) -> list[dict[str, Any]]:
    gone = {remove, add[key] if add else None} - {None}
    kept = [entry for entry in entries if entry[key] not in gone]
    return [*kept, add] if add else kept


def policy_units(policy: dict[str, Any]) -> list[str]:
    """The units a pool's nodes keep: those its profile names or requires, and `slurmd`
    when it publishes holds to Slurm; each once, in that order."""
    profile = policy.get("profile") or {}
    named = [*profile.get("units", []), *profile.get("required", []),
             *([SLURMD] if policy.get("slurm") else [])]
    return list(dict.fromkeys(named))
