"""What a provisioner hands deploy ramdisks: instructions for the one machine whose identity
matches, once, and a deploy finished only by the key its instructions carried."""

from __future__ import annotations

import http.client
import json
import threading
import time

from bcd.deploys import Deploys, serve_deploys

UUID = "8CF9A7A3-2C1B-4C5E-9D3A-0123456789AB"


def offered(deploys: Deploys, *, serial: str = "", expires_in: float = 60.0
            ) -> threading.Event:
    finished = threading.Event()
    deploys.offer("node_1", {"target": "node_1", "serial": serial, "productUuid": UUID,
                             "image": {"url": "http://x/os.raw", "sha256": "1" * 64},
                             "join": {"token": "bcjt_x.y"}},
                  expires_at=time.time() + expires_in, finish=finished.set)
    return finished


def test_instructions_go_once_to_the_machine_with_that_identity():
    deploys = Deploys()
    offered(deploys, serial="SN-1")
    assert deploys.take(serial="SN-2", product_uuid=UUID) is None  # another serial
    assert deploys.take(serial="SN-1", product_uuid="0" * 32) is None
    # DMI spells the UUID its own way: case and dashes do not matter.
    taken = deploys.take(serial="SN-1", product_uuid=UUID.replace("-", "").lower())
    assert taken["image"]["url"] == "http://x/os.raw"
    assert taken["deployKey"]
    assert deploys.take(serial="SN-1", product_uuid=UUID) is None


def test_expired_or_withdrawn_instructions_are_gone():
    deploys = Deploys()
    offered(deploys, expires_in=-1)
    assert deploys.take(serial="", product_uuid=UUID) is None
    offered(deploys)
    deploys.withdraw("node_1")
    assert deploys.take(serial="", product_uuid=UUID) is None


def test_only_the_instructions_key_finishes_the_deploy_and_only_once():
    deploys = Deploys()
    finished = offered(deploys)
    key = deploys.take(serial="", product_uuid=UUID)["deployKey"]
    assert not deploys.written(target="node_1", key="guessed")
    assert not finished.wait(0.2)
    assert deploys.written(target="node_1", key=key)
    assert finished.wait(5)
    assert not deploys.written(target="node_1", key=key)


def request(port: int, method: str, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request(method, path, body=b"" if method == "POST" else None)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def test_the_lookup_and_the_news_over_http():
    deploys = Deploys()
    finished = offered(deploys)
    server = serve_deploys(deploys, "127.0.0.1:0")
    port = server.server_port
    try:
        assert request(port, "GET", f"/v1/deploy?serial=&productUuid={'0' * 32}")[0] == 404
        status, instructions = request(port, "GET", f"/v1/deploy?serial=&productUuid={UUID}")
        assert (status, instructions["join"]) == (200, {"token": "bcjt_x.y"})
        news = f"/v1/deploy/written?target=node_1&key={instructions['deployKey']}"
        assert request(port, "POST", news) == (200, {"finishing": True})
        assert finished.wait(5)
    finally:
        server.shutdown()
