"""The typed client: one method per API method (generated, so it cannot drift), a real
round trip against the API, the envelope's errors as exceptions with their request id."""

from __future__ import annotations

import inspect

import httpx
import pytest

from compute.client import ApiError, Client
from compute.client.methods import GROUPS
from compute.client.transport import Transport
from compute.core.api.registry import REGISTRY
from compute.http import clientgen


def test_the_generated_methods_are_what_the_registry_writes_now():
    assert clientgen.TARGET.read_text() == clientgen.render(), (
        "compute/client/methods.py is stale: run python -m compute.http.clientgen")


def test_every_registry_method_has_a_client_method():
    missing = [f"{group}.{method}" for group, method in REGISTRY
               if not hasattr(GROUPS.get(clientgen.python_name(group), object),
                              clientgen.python_name(method))]
    assert missing == []
    create = inspect.signature(GROUPS["reservations"].create)
    assert {"pool_id", "devices", "duration", "idempotency_key"} <= set(create.parameters)
    assert create.parameters["pool_id"].default is inspect.Parameter.empty


@pytest.fixture
def client(live_server, root_token):
    """The client against the API served by a live server in this test's database."""
    with Client(live_server.url, root_token) as made:
        yield made


@pytest.mark.django_db(transaction=True)
def test_a_reservation_round_trip(client):
    from tests.factories import make_node

    site = client.sites.create(kind="shared", region="eu-1")
    pool = client.pools.create(site_id=site["id"], gpu_model="H100", class_="metal-host",
                               policy={"hostShare": {"vcpusPerGpu": 1, "memoryGiBPerGpu": 1}})
    make_node(pool["id"])
    rsv = client.reservations.create(pool_id=pool["id"], duration=3_600_000,
                                     devices=[{"class": "gpu", "count": 2}],
                                     idempotency_key="round-trip")
    again = client.reservations.create(pool_id=pool["id"], duration=3_600_000,
                                       devices=[{"class": "gpu", "count": 2}],
                                       idempotency_key="round-trip")
    assert again["id"] == rsv["id"]  # the key makes the write safe to retry
    assert client.reservations.get(reservation_id=rsv["id"])["state"] == "binding"  # starts now
    listed = client.reservations.list(state="binding")["items"]
    assert [r["id"] for r in listed] == [rsv["id"]]


@pytest.mark.django_db(transaction=True)
def test_an_envelope_error_is_an_exception_with_its_request_id(client):
    with pytest.raises(ApiError) as refused:
        client.reservations.get(reservation_id="rsv_01jbx0000000000000000000zz")
    assert refused.value.code == "not_found"
    assert refused.value.status == 404
    assert refused.value.request_id.startswith("req_")
    assert refused.value.request_id in str(refused.value)


def test_reads_are_retried_after_a_dropped_connection_and_writes_without_a_key_are_not():
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            raise httpx.ConnectError("dropped")
        return httpx.Response(200, json={"ok": True, "result": {"n": len(calls)},
                                         "requestId": "req_x"})

    transport = Transport("http://127.0.0.1:1", "biam_tok_x.y")
    transport.http = httpx.Client(transport=httpx.MockTransport(answer))
    assert transport.call("pools.list", {}, retry=True) == {"n": 2}
    calls.clear()
    with pytest.raises(Exception, match="cannot reach"):
        transport.call("nodes.cordon", {"nodeId": "x"}, retry=False)
    assert len(calls) == 1


def test_the_event_stream_resumes_after_a_cut_without_repeats():
    requested = []

    def answer(request: httpx.Request) -> httpx.Response:
        since = int(request.url.params["since"])
        requested.append(since)
        if since == 0:  # two events, then the connection drops
            def cut():
                yield b'{"seq": 1, "type": "a"}\n\n{"seq": 2, "type": "b"}\n'
                raise httpx.ReadError("cut")
            return httpx.Response(200, content=cut())
        return httpx.Response(200, content=b'{"seq": 3, "type": "c"}\n')

    transport = Transport("http://127.0.0.1:1", "biam_tok_x.y")
    transport.http = httpx.Client(transport=httpx.MockTransport(answer))
    stream = transport.watch()
    assert [next(stream)["seq"] for _ in range(3)] == [1, 2, 3]
    assert requested == [0, 2]
