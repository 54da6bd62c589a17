"""A Postgres restart under a live session: a report that arrives while the database is down
closes the session with a reason, the agent reconnects once it is back, and the report it
resends is recorded (none is lost, none is doubled)."""

from __future__ import annotations

import asyncio
import os

import pytest
from django.db import connections

from fleet.models import Node
from tests.gateway.conftest import diag, session_for
from tests.gateway.test_sessions import joined
from tests.support.waiting import eventually, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                    reason="stops and starts the embedded server; DATABASE_URL names another")
def test_a_report_during_a_postgres_restart_closes_the_session_and_is_resent(
        fleet, embedded_postgres):
    credentials, payload, inventory = joined(fleet)
    node_id = payload["nodeId"]

    def state() -> tuple[int, int]:
        return Node.objects.values_list("inventory_generation", "session_epoch").get(pk=node_id)

    async def scenario():
        session = session_for(fleet, credentials, inventory, await diag(inventory))
        task = asyncio.create_task(session.run(on_welcome=lambda s: session.send_inventory()))
        assert await eventually(
            lambda: Node.objects.get(pk=node_id).provision_state == "adopted", 20)
        before = await asyncio.to_thread(lambda: (state(), connections.close_all())[0])
        await asyncio.to_thread(embedded_postgres.halt)
        try:
            session.send_inventory()  # reaches the gateway while Postgres is down
            reason = await asyncio.wait_for(task, 30)  # before the fix it hung, unserved
        finally:
            await asyncio.to_thread(embedded_postgres.start)  # the suite goes on after this
        again = session_for(fleet, credentials, inventory, await diag(inventory))
        resent: list[str] = []
        second = asyncio.create_task(again.run(
            on_welcome=lambda s: resent.append(again.send_inventory())))
        assert await eventually(lambda: bool(resent) and resent[0] in again.state.acked, 30)
        second.cancel()
        return before, reason

    (generation, epoch), reason = asyncio.run(scenario())
    connections.close_all()  # this thread's connection died with the server
    assert reason == "the control plane could not record a report; reconnect"
    # A new session; the resent report, applied once.
    assert wait_until(lambda: state() == (generation + 1, epoch + 1), 15), state()


def test_the_gateway_serves_a_renewed_certificate_without_a_restart(gateway, tmp_path):
    """A renewal that replaces key.pem and cert.pem on disk is served from the next handshake."""
    import socket
    import ssl

    from cryptography import x509

    from fleet.pki import issue_gateway_certificate

    def served_serial() -> int:
        host, port = gateway.join_target.rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(tmp_path / "gw" / "ca.pem"))
        context.check_hostname = False
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number

    before = served_serial()
    key, cert = issue_gateway_certificate(["localhost", "127.0.0.1"])
    (tmp_path / "gw" / "key.pem").write_text(key)
    (tmp_path / "gw" / "cert.pem").write_text(cert)
    renewed = x509.load_pem_x509_certificate(cert.encode()).serial_number
    assert renewed != before
    assert served_serial() == renewed
