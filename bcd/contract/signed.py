"""What the control plane signs for a node: each NodeSpec generation and each command, with
its join-signing key, whose pin every agent kept at its join. A gateway only relays them, so
it cannot make a node hold, release, boot or run anything. Each payload names its node and
what it is (the generation; the command's id and kind): one meant for another node, or
replayed as another generation or command, is refused like a forged one."""

from __future__ import annotations

import json
from typing import Any

from bcd.contract.crypto import BadSignature, open_document


def spec_payload(node_id: str, generation: int, spec: dict[str, Any]) -> dict[str, Any]:
    """What the control plane signs for one generation of a node's spec."""
    return {"nodeId": node_id, "generation": generation, "spec": spec}


def command_payload(node_id: str, command_id: str, kind: str,
                    params: dict[str, Any]) -> dict[str, Any]:
    """What the control plane signs for one command."""
    return {"nodeId": node_id, "commandId": command_id, "kind": kind, "params": params}


def open_spec(text: str, *, pin: str, node_id: str, generation: int) -> dict[str, Any]:
    """The spec in a signed envelope, once its signature verifies against the pinned key
    and it names this node and this generation; raises BadSignature otherwise."""
    spec: dict[str, Any] = _opened(text, pin, "spec", nodeId=node_id,
                                   generation=generation)["spec"]
    return spec


def open_command(text: str, *, pin: str, node_id: str, command_id: str,
                 kind: str) -> dict[str, Any]:
    """A command's parameters, once signed for this node, this command id and this kind."""
    params: dict[str, Any] = _opened(text, pin, "params", nodeId=node_id,
                                     commandId=command_id, kind=kind)["params"]
    return params


def _opened(text: str, pin: str, body: str, **expected: Any) -> dict[str, Any]:
    try:
        envelope = json.loads(text)
    except ValueError as error:
        raise BadSignature(f"not a signed document: {error}") from None
    if not isinstance(envelope, dict):
        raise BadSignature("not a signed document")
    payload = open_document(envelope, pin=pin)
    for name, value in expected.items():
        if payload.get(name) != value:
            raise BadSignature(f"signed for {name} {payload.get(name)!r}, not {value!r}")
    if not isinstance(payload.get(body), dict):
        raise BadSignature(f"the signed {body} is not an object")
    return payload
