"""The CLI's envelope calls over the standard library (compute.cli.wire), against a real
HTTP server: a kept connection the server closed meanwhile is replaced, not failed and not
sent twice; an error envelope, an answer that is not one, and an unreachable server are
each a clear error."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from compute.cli.wire import Wire
from compute.core.envelope import ApiError, ClientError
from tests.support.processes import free_port


class Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps connections unless told otherwise
    seen: list[tuple[str, dict, int]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recorder.seen.append((self.path, body, self.client_address[1]))
        if self.path.endswith("/broken/call"):
            answer, status = b"<html>not an envelope</html>", 502
        elif self.path.endswith("/refuse/call"):
            answer, status = json.dumps({"ok": False, "requestId": "req_1", "error": {
                "code": "invalid_argument", "message": "no", "details": {"field": "x"}}
            }).encode(), 400
        else:
            answer, status = json.dumps({"ok": True, "result": body}).encode(), 200
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        if body.get("hangUp"):  # the server ends the kept connection after answering
            self.close_connection = True

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Recorder)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/api/compute"
    httpd.shutdown()
    httpd.server_close()


def test_calls_share_a_connection_and_one_the_server_closed_is_replaced(server):
    wire = Wire(server, "biam_tok_x.y", timeout=5, user_agent="test")
    assert wire.call("pools.list", {"n": 1}) == {"n": 1}
    assert wire.call("pools.list", {"n": 2, "hangUp": True}) == {"n": 2, "hangUp": True}
    threading.Event().wait(0.2)  # the server's close arrives
    assert wire.call("pools.list", {"n": 3}) == {"n": 3}
    ports = [port for _, _, port in Recorder.seen]
    assert ports[0] == ports[1] != ports[2]  # kept, then a new one after the hang-up
    assert [body["n"] for _, body, _ in Recorder.seen] == [1, 2, 3]  # none sent twice
    assert Recorder.seen[0][0] == "/api/compute/pools/list"


def test_an_error_envelope_is_an_api_error_with_its_code_and_details(server):
    with pytest.raises(ApiError) as raised:
        Wire(server, "biam_tok_x.y", timeout=5, user_agent="test").call("refuse.call", {})
    assert (raised.value.code, raised.value.status, raised.value.details) == (
        "invalid_argument", 400, {"field": "x"})


def test_an_answer_that_is_not_an_envelope_says_so(server):
    with pytest.raises(ClientError, match="HTTP 502 without a JSON envelope"):
        Wire(server, "biam_tok_x.y", timeout=5, user_agent="test").call("broken.call", {})


def test_an_unreachable_server_is_named():
    url = f"http://127.0.0.1:{free_port()}/api/compute"
    with pytest.raises(ClientError, match=f"cannot reach {url}"):
        Wire(url, "biam_tok_x.y", timeout=5, user_agent="test").call("pools.list", {})


def test_threads_sharing_a_wire_each_get_their_own_connection(server):
    wire = Wire(server, "biam_tok_x.y", timeout=5, user_agent="test")
    failures: list[BaseException] = []

    def calls(n: int) -> None:
        try:
            for i in range(20):
                assert wire.call("pools.list", {"n": n * 100 + i}) == {"n": n * 100 + i}
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=calls, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == []
    assert len(Recorder.seen) == 160
