"""A node applies only the desired state and runs only the commands the control plane signed
for it: a gateway that relays them cannot forge, redirect or replay one (the agent's
session refuses it whole)."""

from __future__ import annotations

import asyncio
import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from bcd.contract.crypto import BadSignature, sign_document, spki_pin
from bcd.contract.proto import agent_pb2 as pb
from bcd.contract.signed import command_payload, open_spec, spec_payload
from bcd.session import AgentSession, Credentials

CONTROL_PLANE = ec.generate_private_key(ec.SECP256R1())
PIN = spki_pin(CONTROL_PLANE.public_key())
HOLD = {"allocations": [{"allocationId": "alloc_01m8qrkhzjz9r5qzkh956btdj6",
                         "reservationId": "rsv_01m8qrkhzjz9r5qzkh956btdj6",
                         "gpus": ["GPU-aaaa-0"], "kubernetes": False}], "vms": []}


def signed(spec=HOLD, *, key=CONTROL_PLANE, node="node_a", generation=2) -> str:
    return json.dumps(sign_document(key, spec_payload(node, generation, spec)))


def tampered() -> str:
    envelope = json.loads(signed())
    other = json.loads(signed({"allocations": [], "vms": []}))
    return json.dumps({**envelope, "payload": other["payload"]})


def test_a_spec_signed_for_this_node_and_generation_opens():
    assert open_spec(signed(), pin=PIN, node_id="node_a", generation=2) == HOLD


@pytest.mark.parametrize(("text", "says"), [
    (signed(key=ec.generate_private_key(ec.SECP256R1())), "does not match the pin"),
    (signed(node="node_b"), "for nodeId 'node_b'"),
    (signed(generation=3), "generation 3"),
    (tampered(), "does not verify"),
    (json.dumps(HOLD), "signature"),
    ("not json", "not a signed document"),
], ids=["another key", "another node", "another generation", "tampered", "unsigned",
        "not json"])  # stable ids: the documents hold fresh keys and signatures
def test_forged_redirected_or_replayed_specs_are_refused(text, says):
    with pytest.raises(BadSignature, match=says):
        open_spec(text, pin=PIN, node_id="node_a", generation=2)


def test_the_session_applies_nothing_a_malicious_gateway_sends():
    """The messages a gateway could send: only the control plane's own spec is applied."""
    applied = []

    async def apply_spec(generation, spec):
        applied.append(spec)
        return []

    session = AgentSession(credentials=None, target="", inventory=None, run_command=None,
                           apply_spec=apply_spec, spec_pin=PIN)
    session.state.node_id = "node_a"
    gateway_key = ec.generate_private_key(ec.SECP256R1())
    for forged in (signed(key=gateway_key), signed(node="node_b"), json.dumps(HOLD)):
        assert asyncio.run(session.on_spec(pb.Spec(generation=2, json=forged))) is False
    assert asyncio.run(session.on_spec(pb.Spec(generation=3, json=signed()))) is False  # a replay
    assert applied == []
    assert asyncio.run(session.on_spec(pb.Spec(generation=2, json=signed()))) is True
    assert applied == [HOLD]
    assert session.applied_generation == 2


def test_the_session_runs_only_commands_signed_for_it():
    ran = []

    async def run(command_id, kind, params):
        ran.append((command_id, kind, params))
        return "succeeded", {}

    node_key = ec.generate_private_key(ec.SECP256R1())
    session = AgentSession(credentials=Credentials(node_key, b"", b""), target="",
                           inventory=None, run_command=run, spec_pin=PIN)
    session.state.node_id = "node_a"
    params = {"expect": {"gpuCount": 8}}

    def command(key=CONTROL_PLANE, node="node_a", command_id="cmd_1", kind="diag.nvml"):
        return json.dumps(sign_document(key, command_payload(node, command_id, kind, params)))

    forged = [(command(key=ec.generate_private_key(ec.SECP256R1())), "cmd_1", "diag.nvml"),
              (command(node="node_b"), "cmd_1", "diag.nvml"),
              (command(), "cmd_2", "diag.nvml"),  # replayed under another id
              (command(), "cmd_1", "diag.disk"),  # or as another kind
              (json.dumps(params), "cmd_1", "diag.nvml")]
    for text, command_id, kind in forged:
        asyncio.run(session._command(pb.Command(command_id=command_id, kind=kind, json=text)))
    assert ran == []
    results = [session.control.get_nowait().command_result for _ in forged]
    assert {(r.status, json.loads(r.json)["error"].startswith("refused: ")) for r in results} \
        == {("failed", True)}
    asyncio.run(session._command(pb.Command(command_id="cmd_1", kind="diag.nvml",
                                            json=command())))
    assert ran == [("cmd_1", "diag.nvml", params)]
